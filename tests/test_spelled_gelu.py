"""relax/frontend/spelled_gelu.py: the exact GELU spelled out (as ONNX exports write it) becomes
relax.nn.gelu and Hugging Face's tanh GELU relax.nn.gelu_tanh, with the same values; lookalikes
stay as they are; in a quantized model the dense layer before either takes it into its
epilogue."""

import math

import numpy as np
import pytest
import tvm
from onnx import TensorProto
from onnx import helper as h
from tvm import relax

import unit_tvm
from unit_tvm import frontends
from unit_tvm.relax.frontend.fixes import frontend_fixes

from .conftest import require_host
from .test_onnx_import import _const

SHAPE = (2, 3, 16)
R2 = math.sqrt(2.0)


def _c(value):
    return relax.const(value, "float32")


def _erf_sum(bb, x, scaled_by="divide", one_first=False, root=R2, one=1.0, arg=None):
    """1 + erf(arg / root) (or arg * (1 / root)), arg defaulting to x."""
    arg = x if arg is None else arg
    if scaled_by == "divide":
        scaled = bb.emit(relax.op.divide(arg, _c(root)))
    else:
        scaled = bb.emit(relax.op.multiply(_c(1 / root), arg))
    erf = bb.emit(relax.op.erf(scaled))
    return bb.emit(relax.op.add(_c(one), erf) if one_first else relax.op.add(erf, _c(one)))


def _tanh_sum(bb, x, cube="power", scale=math.sqrt(2 / math.pi), cubic=0.044715):
    """1 + tanh(scale * (x + cubic * x^3)), as Hugging Face's NewGELUActivation writes it."""
    if cube == "power":
        x3 = bb.emit(relax.op.power(x, _c(3.0)))
    else:
        x3 = bb.emit(relax.op.multiply(x, bb.emit(relax.op.multiply(x, x))))
    inner = bb.emit(relax.op.add(x, bb.emit(relax.op.multiply(x3, _c(cubic)))))
    tanh = bb.emit(relax.op.tanh(bb.emit(relax.op.multiply(inner, _c(scale)))))
    return bb.emit(relax.op.add(tanh, _c(1.0)))


def _module(spell, half=0.5, sum_=_erf_sum, **kw):
    """main(x) = spell(bb, x, sum, half) with sum = 1 + erf(x / sqrt 2) spelled per kw."""
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(spell(bb, x, sum_(bb, x, **kw), half))
        bb.emit_func_output(out)
    return bb.get()


def _x_times_sum_then_half(bb, x, s, half):  # torch.onnx.export's order
    return bb.emit(relax.op.multiply(bb.emit(relax.op.multiply(x, s)), _c(half)))


def _half_x_then_sum(bb, x, s, half):  # HF's 0.5 * x * (1 + erf(...))
    return bb.emit(relax.op.multiply(bb.emit(relax.op.multiply(_c(half), x)), s))


def _x_times_half_sum(bb, x, s, half):  # x * (0.5 * (1 + erf(...)))
    return bb.emit(relax.op.multiply(x, bb.emit(relax.op.multiply(s, _c(half)))))


def _run(mod, x):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _same_values(mod, fixed):
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32) * 3
    np.testing.assert_allclose(_run(fixed, x), _run(mod, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spell", [_x_times_sum_then_half, _half_x_then_sum, _x_times_half_sum])
@pytest.mark.parametrize("scaled_by, one_first", [("divide", False), ("multiply", True)])
def test_spelled_erf_gelus_become_one_gelu_with_the_same_values(spell, scaled_by, one_first):
    mod = _module(spell, scaled_by=scaled_by, one_first=one_first)
    fixed = frontend_fixes(mod)
    script = fixed["main"].script()
    assert "R.nn.gelu(x)" in script and "R.erf" not in script and "R.multiply" not in script
    _same_values(mod, fixed)


@pytest.mark.parametrize("spell", [_half_x_then_sum, _x_times_sum_then_half])
@pytest.mark.parametrize("cube", ["power", "products"])
def test_spelled_tanh_gelus_become_one_gelu_tanh_with_the_same_values(spell, cube):
    mod = _module(spell, sum_=_tanh_sum, cube=cube)
    fixed = frontend_fixes(mod)
    script = fixed["main"].script()
    assert "R.nn.gelu_tanh(x)" in script and "R.tanh" not in script, script
    assert "R.multiply" not in script and "R.power" not in script
    _same_values(mod, fixed)


@pytest.mark.parametrize("change", [{"half": 0.6}, {"root": 2.0}, {"one": 2.0}, "other_arg",
                                    {"sum_": _tanh_sum, "cubic": 0.05},
                                    {"sum_": _tanh_sum, "scale": 0.8}])
def test_lookalikes_are_left_alone(change):
    """Another factor, divisor or constant, or erf of another tensor than the one multiplied:
    not a GELU, nothing rewritten."""
    if change == "other_arg":
        def spell(bb, x, _s, half):
            y = bb.emit(relax.op.multiply(x, _c(2.0)))
            return _x_times_sum_then_half(bb, x, _erf_sum(bb, x, arg=y), half)
        mod = _module(spell)
    else:
        mod = _module(_x_times_sum_then_half, **change)
    assert "gelu" not in frontend_fixes(mod)["main"].script()


def test_onnx_gelu_between_denses_is_the_first_dense_epilogue():
    """MatMul, Add, then GELU as ONNX opset 17 spells it, then MatMul: after quantize the first
    dense's recipe computes the GELU and no erf is left; int8 output close to ONNX Runtime."""
    require_host("x86.vpdpbusd")
    ort = pytest.importorskip("onnxruntime")
    from unit_tvm.relax import quantize, recipes

    rng = np.random.default_rng(0)
    nodes = [h.make_node("MatMul", ["x", "w1"], ["m"]), h.make_node("Add", ["b1", "m"], ["a"]),
             h.make_node("Div", ["a", "r2"], ["d"]), h.make_node("Erf", ["d"], ["e"]),
             h.make_node("Add", ["e", "one"], ["s"]), h.make_node("Mul", ["a", "s"], ["p"]),
             h.make_node("Mul", ["p", "half"], ["g"]), h.make_node("MatMul", ["g", "w2"], ["y"])]
    inits = [_const("w1", rng.standard_normal((64, 128)) / 8, np.float32),
             _const("b1", rng.standard_normal(128) * 0.1, np.float32),
             _const("r2", R2, np.float32), _const("one", 1.0, np.float32),
             _const("half", 0.5, np.float32),
             _const("w2", rng.standard_normal((128, 32)) / 11, np.float32)]
    graph = h.make_graph(nodes, "dense_gelu_dense",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9)
    xs = [rng.standard_normal((1, 16, 64)).astype(np.float32) for _ in range(4)]
    qmod = quantize(frontends.from_onnx(model), calibration_data=xs)
    assert "erf" not in qmod.script()
    assert [r["gelu"] for _, r in recipes(qmod)] == [True, False]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    vm = relax.VirtualMachine(unit_tvm.compile(frontends.from_onnx(model),
                                               quantize={"calibration_data": xs}), tvm.cpu())
    for x in xs:
        got, ref = vm["main"](tvm.runtime.tensor(x)).numpy(), session.run(None, {"x": x})[0]
        assert float((got * ref).sum() / np.linalg.norm(got) / np.linalg.norm(ref)) > 0.99


def test_torch_written_tanh_gelu_is_the_dense_epilogue():
    """A feed-forward block with Hugging Face's gelu_new written out in torch, from
    torch.export: after quantize the first dense computes gelu_tanh and no tanh is left; int8
    output close to PyTorch's."""
    require_host("x86.vpdpbusd")
    torch = pytest.importorskip("torch")
    from unit_tvm.relax import quantize, recipes

    class FeedForward(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = torch.nn.Linear(64, 128), torch.nn.Linear(128, 32)

        def forward(self, x):
            u = self.up(x)
            inner = math.sqrt(2.0 / math.pi) * (u + 0.044715 * torch.pow(u, 3.0))
            return self.down(0.5 * u * (1.0 + torch.tanh(inner)))

    torch.manual_seed(0)
    model = FeedForward().eval()
    xs = [torch.randn(1, 16, 64) for _ in range(5)]
    mod = frontends.from_torch(model, [xs[0]])
    cal = [x.numpy() for x in xs[:4]]
    qmod = quantize(mod, calibration_data=cal)
    assert "tanh" not in qmod["main"].script()
    assert [r.get("activation") for _, r in recipes(qmod)] == ["gelu_tanh", None]
    vm = relax.VirtualMachine(unit_tvm.compile(mod, quantize={"calibration_data": cal}),
                              tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(xs[4].numpy()))
    got = (got[0] if not hasattr(got, "numpy") else got).numpy()
    with torch.no_grad():
        ref = model(xs[4]).numpy()
    assert float((got * ref).sum() / np.linalg.norm(got) / np.linalg.norm(ref)) > 0.99
