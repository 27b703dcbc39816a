"""Float32 regions in channel blocks (relax/cpu/f32_blocks.py): a depthwise conv's float32 result,
its activation, a squeeze-excitation gate's mean and multiply and the projection conv reading it
run on NCHW[16]c where every reader can; anything else that reads a value of the region keeps
it NCHW. Either way the tensorized build equals TVM's plain build of the same quantized module.
Also the default CPU schedule of the region's mean (cpu_default._blocked_reduction)."""

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

import unit_tvm
from unit_tvm import frontends
from unit_tvm.relax import UnitTensorize, quantize, recipes
from unit_tvm.relax.cpu.default_schedule import DefaultCPUSchedule
from unit_tvm.relax.cpu.fuse_elementwise import fuse_elementwise

from unit_tvm.testing import zoo

from .conftest import require_host
from .test_relax import _assert_equals_plain_int8, _run

F = nn.functional


class SqueezeExcite(nn.Module):
    """EfficientNet's MBConv tail (MobileNetV3's with hardswish): a depthwise conv and its
    activation, the squeeze-excitation gate, the projection conv. `variant` adds a reader:
    "residual" (another conv adds the gated value in its epilogue: it can read blocks), or one
    that cannot: "returned" (the activation is an output too), "branch" (the gated value is
    multiplied by another conv's NCHW result), "divided" (divided by a per-channel value: a
    partly full last block's padding lanes would divide by zero)."""

    def __init__(self, channels=32, act="silu", variant=""):
        super().__init__()
        self.variant = variant
        self.act = F.silu if act == "silu" else F.hardswish
        self.gate = torch.sigmoid if act == "silu" else F.hardsigmoid
        self.expand = nn.Conv2d(8, channels, 1)
        self.dw = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.se1, self.se2 = nn.Conv2d(channels, 8, 1), nn.Conv2d(8, channels, 1)
        self.side = nn.Conv2d(8, channels, 1)
        self.project = nn.Conv2d(channels, 16, 1)

    def forward(self, x):
        y = self.act(self.dw(F.relu(self.expand(x))))
        g = self.gate(self.se2(F.silu(self.se1(y.mean((2, 3), keepdim=True)))))
        gated = y * g
        if self.variant == "residual":
            gated = self.side(x) + gated
        elif self.variant == "branch":
            gated = gated * torch.sigmoid(self.side(x))
        elif self.variant == "divided":
            gated = gated / (g + 0.5)
        out = self.project(gated)
        return (out, y) if self.variant == "returned" else out


def _blocked_f32(mod):
    """How many bindings of main hold a float32 NCHW[b]c (5-D) value."""
    found = []

    def visit(e):
        ty = getattr(e, "ty", None)
        if (isinstance(e, relax.Var) and isinstance(ty, relax.TensorType)
                and ty.dtype == "float32" and ty.ndim == 5):
            found.append(e)

    relax.analysis.post_order_visit(mod["main"], visit)
    return len(found)


def _run_all(ex, xs):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    outs = []
    for x in xs:
        out = vm["main"](tvm.runtime.tensor(x, tvm.cpu()))
        outs.append([o.numpy() for o in out] if len(out) > 1 else [out[0].numpy()])
    return outs


def _compiled(model, shape=(1, 8, 14, 14)):
    """(quantized module, tensorized module, its executable, inputs)."""
    zoo._randomize(model, 0)
    model.eval()
    cal, xs = zoo.inputs(shape, 3, seed=1), zoo.inputs(shape, 3, seed=2)
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal)
    host = unit_tvm.target.host()
    tmod = UnitTensorize(host)(qmod)
    return qmod, tmod, unit_tvm.compiler.build_relax(tmod, host), xs


@pytest.mark.parametrize("act,variant,channels", [
    ("silu", "", 32), ("hardswish", "", 32), ("silu", "residual", 32), ("silu", "", 24),
    ("hardswish", "", 40), ("silu", "divided", 32)])
def test_squeeze_excitation_runs_in_blocks_and_equals_plain_build(act, variant, channels):
    """The depthwise conv writes float32 blocks; its activation's ops and the mean read them
    (four 5-D float32 values at least: the conv's result, the activation's two, the mean's
    blocked sum); the projection conv reads the activation's blocks and multiplies them by the
    gate itself (or, where a conv adds the gated value as its residual or the gated value is
    divided, the multiply runs on the blocks); 24 and 40 channels leave the last block partly
    full. The result equals TVM's plain build of the quantized module."""
    require_host("x86.vpdpbusd")
    model = SqueezeExcite(channels, act=act, variant=variant)
    qmod, tmod, ex, xs = _compiled(model)
    with torch.no_grad():
        refs = [model(torch.tensor(x)).numpy() for x in xs]
    assert _blocked_f32(qmod) == 0
    assert _blocked_f32(tmod) >= 4, tmod["main"].script()
    gated = [r for _, r in recipes(tmod) if r.get("x_gate")]
    assert len(gated) == (0 if variant in ("residual", "divided") else 1), tmod["main"].script()
    _assert_equals_plain_int8(ex, qmod, xs, refs)


@pytest.mark.parametrize("variant,channels", [("returned", 32), ("branch", 32), ("divided", 24)])
def test_a_reader_that_cannot_read_blocks_keeps_the_region_nchw(variant, channels):
    """A value of the region returned by the model, multiplied by a value from outside the
    region, or divided by a per-channel value where the last block is partly full (24 of 16):
    no float32 value is blocked, and the result still equals the plain build."""
    require_host("x86.vpdpbusd")
    model = SqueezeExcite(channels, variant=variant)
    qmod, tmod, ex, xs = _compiled(model)
    assert _blocked_f32(tmod) == 0, tmod["main"].script()
    plain = _run_all(tvm.compile(qmod, target=unit_tvm.target.host()), xs)
    for got, base in zip(_run_all(ex, xs), plain):
        for g, b in zip(got, base):
            np.testing.assert_allclose(g, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("blocks,hw", [(9, 56), (3, 14), (2, 7), (1, 6), (4, 2)])
def test_blocked_mean_is_scheduled_and_exact(blocks, hw):
    """The mean over H and W of NCHW[16]c gets the parallel, vectorised schedule (8, 4, 2 or
    one partial sums: 3136, 196, 49, 36 and 4 pixels) and equals numpy's mean."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, blocks, hw, hw, 16], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.mean(x, axis=[2, 3], keepdims=True))
        bb.emit_func_output(out)
    host = unit_tvm.target.host()
    mod = DefaultCPUSchedule(host)(fuse_elementwise(relax.transform.LegalizeOps()(bb.get())))
    script = mod["mean"].script()
    assert "T.vectorized(T.int64(16))" in script, script
    assert ("T.parallel" in script) == (blocks > 1), script
    a = np.random.default_rng(0).standard_normal((1, blocks, hw, hw, 16)).astype("float32")
    (got,) = _run(unit_tvm.lowering.compile_relax(mod, host), [a])
    np.testing.assert_allclose(got, a.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)
