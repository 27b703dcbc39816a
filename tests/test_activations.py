"""Smooth activations fused into quantized ops' epilogues (relax/core/activations.py): the spellings
torch's frontends give SiLU, hardswish, sigmoid, tanh and the tanh GELU are found after a conv
or dense layer, the fused module stays as close to the fp32 model as relu's does, and the
tensorized build equals TVM's plain build of the same quantized module."""

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import tirx

import unit_tvm
from unit_tvm import frontends
from unit_tvm.relax import UnitTensorize, quantize, recipes
from unit_tvm.relax.core import activations
from unit_tvm.relax.core.chains import find_chains
from unit_tvm.relax.quantization.ptq import inference_form

from .conftest import require_host
from .test_relax import _cos, _prepare, _run

F = nn.functional


class EfficientBlock(nn.Module):
    """EfficientNet's and MobileNetV3's spellings: conv + bn + SiLU, a depthwise conv + bn +
    hardswish (not fused: chains._grouped), a squeeze-excitation gate (mean, 1x1 conv + SiLU,
    1x1 conv + sigmoid, multiply), a projection with hardswish, then a dense layer with the
    tanh GELU and one with tanh."""

    def __init__(self):
        super().__init__()
        self.expand, self.bn1 = nn.Conv2d(8, 32, 1, bias=False), nn.BatchNorm2d(32)
        self.dw, self.bn2 = nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False), \
            nn.BatchNorm2d(32)
        self.se1, self.se2 = nn.Conv2d(32, 8, 1), nn.Conv2d(8, 32, 1)
        self.project = nn.Conv2d(32, 16, 1)
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 10)

    def forward(self, x):
        y = F.silu(self.bn1(self.expand(x)))
        y = F.hardswish(self.bn2(self.dw(y)))
        gate = torch.sigmoid(self.se2(F.silu(self.se1(y.mean((2, 3), keepdim=True)))))
        y = F.hardswish(self.project(y * gate)).mean((2, 3))
        return torch.tanh(self.fc2(F.gelu(self.fc1(y), approximate="tanh")))


def _activations(mod):
    return sorted(r.get("activation") or "" for _, r in recipes(mod))


def test_spellings_are_found_after_their_ops():
    """Each activation is matched from the ops a torch.export frontend writes for it (SiLU:
    sigmoid then multiply; hardswish: add, two clips, multiply, divide)."""
    model = EfficientBlock()
    mod = inference_form(frontends.from_torch(model, [torch.zeros(1, 8, 12, 12)]))
    found = sorted(c.activation or "" for c in find_chains(mod["main"]))
    assert found == ["", "gelu_tanh", "hardswish", "sigmoid", "silu", "silu", "tanh"], found


def test_a_value_read_elsewhere_too_is_not_an_activation():
    """x * sigmoid(x) where x also feeds another op: the conv's result is needed as it is, so
    nothing is fused after it."""

    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(4, 8, 1)

        def forward(self, x):
            y = self.c(x)
            return y * torch.sigmoid(y) + y

    mod = inference_form(frontends.from_torch(Shared(), [torch.zeros(1, 4, 6, 6)]))
    (chain,) = find_chains(mod["main"])
    assert chain.activation is None and len(chain.members) == 2  # the conv and its bias


def test_fused_activations_equal_plain_build_and_fp32():
    """The quantized module holds every activation but the depthwise conv's in a recipe (no
    sigmoid or tanh left in the graph), stays within relu-like int8 error of the fp32 model,
    and its tensorized build equals TVM's plain build of it."""
    require_host("x86.vpdpbusd")
    model = EfficientBlock()
    cal, xs, refs = _prepare(model, (1, 8, 12, 12))
    mod = frontends.from_torch(model, [torch.tensor(xs[0])])
    qmod = quantize(mod, calibration_data=cal)
    assert _activations(qmod) == ["", "gelu_tanh", "hardswish", "sigmoid", "silu", "silu",
                                  "tanh"]
    script = qmod["main"].script()
    assert not any(f"R.{op}(" in script for op in ("sigmoid", "tanh", "nn.gelu_tanh"))
    assert script.count("R.clip(") == 2  # the depthwise conv's hardswish only
    host = unit_tvm.target.host()
    plain = _run(tvm.compile(qmod, target=host), xs)
    tpass = UnitTensorize(host)
    tensorized = _run(unit_tvm.compiler.build_relax(tpass(qmod), host), xs)
    assert all(instr for _, instr, _ in tpass.report), tpass.report
    for got, base, ref in zip(tensorized, plain, refs):
        np.testing.assert_allclose(got, base, rtol=1e-5, atol=1e-5)
        assert _cos(got, ref) > 0.999


class ClipMlp(nn.Module):
    """CLIP's quick GELU, x * sigmoid(1.702 x) as Hugging Face writes it, after a conv and
    after the first dense layer of an MLP; then once with the constant on the other side."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(8, 16, 1)
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 10)

    def forward(self, x):
        y = self.c(x)
        y = (y * torch.sigmoid(1.702 * y)).mean((2, 3))
        h = self.fc1(y)
        return self.fc2(h * torch.sigmoid(h * 1.702))


def test_quick_gelu_is_fused_and_exact():
    """Both quick GELUs become recipe activations (no sigmoid left in the graph); the
    tensorized build equals TVM's plain build and stays close to the fp32 model."""
    require_host("x86.vpdpbusd")
    model = ClipMlp()
    cal, xs, refs = _prepare(model, (1, 8, 6, 6))
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal)
    assert _activations(qmod) == ["", "quick_gelu", "quick_gelu"]
    assert "R.sigmoid(" not in qmod["main"].script()
    host = unit_tvm.target.host()
    plain = _run(tvm.compile(qmod, target=host), xs)
    tensorized = _run(unit_tvm.compiler.build_relax(UnitTensorize(host)(qmod), host), xs)
    for got, base, ref in zip(tensorized, plain, refs):
        np.testing.assert_allclose(got, base, rtol=1e-5, atol=1e-5)
        assert _cos(got, ref) > 0.999


@pytest.mark.parametrize("name", activations.NAMES)
def test_activation_expressions_equal_torch(name, host_target):
    """Each activation's TIR (through the vectorizable fastmath) equals torch's float32 op
    within 1e-6 absolute over [-12, 12]."""
    torch_fn = {"silu": F.silu, "hardswish": F.hardswish, "sigmoid": torch.sigmoid,
                "tanh": torch.tanh, "quick_gelu": lambda t: t * torch.sigmoid(1.702 * t),
                "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[name]
    xs = np.linspace(-12, 12, 4801).astype("float32")
    x = tvm.te.placeholder(xs.shape, "float32", name="x")
    y = tvm.te.compute(xs.shape, lambda i: activations.expr(name, x[i]), name="y")
    lib = tvm.compile(tvm.IRModule({"main": tvm.te.create_prim_func([x, y])}),
                      target=host_target)
    out = tvm.runtime.tensor(np.zeros_like(xs))
    lib(tvm.runtime.tensor(xs), out)
    ref = torch_fn(torch.tensor(xs, dtype=torch.float64)).numpy()
    assert np.max(np.abs(out.numpy() - ref) / np.maximum(1.0, np.abs(ref))) < 1e-6


def test_unknown_activation_is_refused():
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        activations.expr("swish", tirx.const(1.0, "float32"))


def _onnx_conv_then(activation_nodes, rng):
    """An ONNX model: a 1x1 conv (8 -> 16 channels) on [1, 8, 6, 6], then `activation_nodes`
    (reading "c", writing "y"); and its weight."""
    from onnx import TensorProto, helper

    w = (rng.standard_normal((16, 8, 1, 1)) * 0.5).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"]), *activation_nodes], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 6, 6])],
        [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel().tolist())])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w


@pytest.mark.parametrize("spelling", ["hardswish", "silu"])
def test_onnx_spellings_are_fused_and_correct(spelling, rng):
    """ONNX's HardSwish (read by TVM as add, clip, divide, then the multiply) and SiLU as
    Sigmoid + Mul are found after a conv, and the int8 module stays close to numpy's fp32."""
    from onnx import helper

    nodes = ([helper.make_node("HardSwish", ["c"], ["y"])] if spelling == "hardswish" else
             [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"],
                                                                         ["y"])])
    model, w = _onnx_conv_then(nodes, rng)
    mod = frontends.from_onnx(model)
    (chain,) = find_chains(inference_form(mod)["main"])
    assert chain.activation == spelling
    xs = [rng.standard_normal((1, 8, 6, 6)).astype("float32") for _ in range(3)]
    ex = unit_tvm.compile(mod, quantize={"calibration_data": xs})
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    for x in xs:
        c = np.einsum("oc,nchw->nohw", w[:, :, 0, 0], x)
        ref = (c * np.clip(c + 3, 0, 6) / 6 if spelling == "hardswish"
               else c / (1 + np.exp(-c)))
        got = vm["main"](tvm.runtime.tensor(x))
        got = got.numpy() if hasattr(got, "numpy") else got[0].numpy()
        assert _cos(got, ref) > 0.999
