"""Float32 multiply-add as an instruction (intrinsics/fma.py): described like the int8 ones,
mapped by the Inspector onto float32 ops, and what float32 models compile onto."""

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

import unit_tvm
from unit_tvm import frontends, intrinsics, ops
from unit_tvm.build import build_report
from unit_tvm.cross import aarch64
from unit_tvm.relax.core.recipe import has_float32_instruction
from unit_tvm.target import host, restricted

from .conftest import require_host

WIDEST = "x86.vfmadd231ps.512"
AVX2 = "x86.vfmadd231ps"


def _f32(rng, shape):
    return rng.standard_normal(shape).astype("float32")


def _relative(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_fma_descriptions_read_off_their_semantics():
    """Each form is one broadcast element times a vector of weights: lanes = output channels,
    a reduction of extent 1, the activation the broadcast operand."""
    for name, lanes, arch in ((WIDEST, 16, "x86_64"), (AVX2, 8, "x86_64"),
                              ("arm.fmla", 4, "aarch64")):
        intrin = intrinsics.get(name)
        assert (intrin.lanes, intrin.reduction_width, intrin.arch) == (lanes, 1, arch)
        assert intrin.input_dtypes == ("float32", "float32")
        assert intrin.output_dtype == "float32"
        assert intrin.broadcast_operand == "a" and not intrin.tile and not intrin.lanewise
        assert intrin.channel_blocks == (1, lanes)
        assert intrin.ops_per_instruction == 2 * lanes
        wise = intrinsics.get(name + ".lanewise")
        assert wise.lanewise and not wise.broadcast_operand and wise.lanes == lanes
        assert wise.channel_blocks == (lanes, lanes) and wise.reduction_width == 1


def _check_dense(target, rng, want_intrin):
    op = ops.dense(37, 72, 45, "float32", "float32", "float32")  # odd: padded rows and k
    rep = build_report([*op.op.input_tensors, op], target)
    assert rep.intrinsic == want_intrin, rep.reason
    a, b = _f32(rng, (37, 45)), _f32(rng, (72, 45))
    out = tvm.runtime.tensor(np.zeros((37, 72), "float32"))
    rep.module(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    assert _relative(out.numpy(), want) < 1e-5


def test_float32_dense_runs_on_the_widest_fma(rng):
    require_host(WIDEST)
    _check_dense(host(), rng, WIDEST)


def test_float32_dense_runs_on_avx2_fma(rng):
    """The 8-lane form where AVX512 is turned off (an AVX2 server's target)."""
    require_host(AVX2)
    _check_dense(restricted("avx2"), rng, AVX2)


@pytest.mark.parametrize("c,h,k,r,stride", [(16, 12, 32, 3, 1), (3, 21, 24, 7, 2),
                                            (40, 9, 48, 1, 1)])
def test_float32_conv_runs_on_fma(c, h, k, r, stride, rng):
    require_host(AVX2)
    op = ops.conv2d_nchw(c, h, k, r, stride=stride, a="float32", b="float32", acc="float32")
    rep = build_report([*op.op.input_tensors, op], host())
    assert rep.intrinsic in (WIDEST, AVX2), rep.reason
    d, w = _f32(rng, (1, c, h, h)), _f32(rng, (k, c, r, r))
    out = tvm.runtime.tensor(np.zeros([int(s) for s in op.shape], "float32"))
    rep.module(tvm.runtime.tensor(d), tvm.runtime.tensor(w), out)
    want = torch.nn.functional.conv2d(torch.tensor(d, dtype=torch.float64),
                                      torch.tensor(w, dtype=torch.float64), stride=stride)
    assert _relative(out.numpy(), want.numpy()) < 1e-5


@pytest.mark.skipif(bool(aarch64.missing_tools()),
                    reason=f"cannot run aarch64 code: missing {aarch64.missing_tools()}")
def test_float32_dense_runs_on_fmla_under_qemu(rng):
    op = ops.dense(10, 12, 9, "float32", "float32", "float32")
    mod = unit_tvm.build([*op.op.input_tensors, op], aarch64.target(), intrinsic="arm.fmla")
    a, b = _f32(rng, (10, 9)), _f32(rng, (12, 9))
    got = aarch64.run(mod, [a, b, np.zeros((10, 12), "float32")])
    assert _relative(got, a.astype(np.float64) @ b.astype(np.float64).T) < 1e-5
    assert aarch64.instruction_count(mod, "fmla") >= 1


class _SmallNet(nn.Module):
    """Convs with batch norm, a residual, a strided conv, a pool and two linear layers."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16))
        self.down = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.fc = nn.Sequential(nn.Linear(32, 24), nn.GELU(), nn.Linear(24, 10))

    def forward(self, x):
        y = self.stem(x)
        y = torch.relu(self.body(y) + y)
        y = self.down(y).mean(dim=(2, 3))
        return self.fc(y)


def _compiled_output(model, x, target=None):
    mod = frontends.from_torch(model, [torch.tensor(x)])
    report = []
    ex = unit_tvm.compile(mod, target, report=report)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x))
    out = out[0] if isinstance(out, tvm.ir.Array) or not hasattr(out, "numpy") else out
    return out.numpy(), report


@pytest.mark.parametrize("level", [None, "avx2"])
def test_float32_model_compiles_onto_fma_within_1e4(level, rng):
    """compile() without quantize: every conv and linear layer on the float32 instruction (no
    op left to TVM's default schedule), the output within 1e-4 relative of PyTorch fp32."""
    require_host(AVX2)
    target = host() if level is None else restricted(level)
    torch.manual_seed(0)
    model = _SmallNet().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    x = _f32(rng, (1, 3, 20, 20))
    got, report = _compiled_output(model, x, target)
    with torch.no_grad():
        want = model(torch.tensor(x)).numpy()
    assert _relative(got, want) < 1e-4
    used = {row[1] for row in report}
    assert used == {WIDEST if level is None and intrinsics.get(WIDEST).supported() else AVX2}, \
        report


class _InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise, 1x1 project, residual; then a strided
    depthwise conv with a channel count no block divides."""

    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(16, 96, 1), nn.BatchNorm2d(96), nn.ReLU6(),
            nn.Conv2d(96, 96, 3, padding=1, groups=96), nn.BatchNorm2d(96), nn.ReLU6(),
            nn.Conv2d(96, 16, 1), nn.BatchNorm2d(16))
        self.tail = nn.Conv2d(16, 20, 1)
        self.down = nn.Conv2d(20, 20, 3, stride=2, padding=1, groups=20)

    def forward(self, x):
        return self.down(self.tail(x + self.block(x)))


def test_float32_depthwise_convs_run_lanewise(rng):
    """Depthwise convs take the multiply-add's lanewise form (one window tap per instruction on
    NCHW[y]c), the other convs the broadcast one; within 1e-4 of PyTorch fp32."""
    require_host(AVX2)
    torch.manual_seed(0)
    model = _InvertedResidual().eval()
    x = _f32(rng, (1, 16, 14, 14))
    got, report = _compiled_output(model, x)
    with torch.no_grad():
        want = model(torch.tensor(x)).numpy()
    assert _relative(got, want) < 1e-4
    lanewise = [row for row in report if row[1] and row[1].endswith(".lanewise")]
    assert len(lanewise) == 2 and all(row[1] for row in report), report


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


def test_float32_attention_stays_float32(rng):
    """A float32 model's attention matmuls run in float32 (never rounded to bf16, even where
    the CPU has a bf16 dot product), and the result stays within 1e-4 of PyTorch's."""
    require_host(AVX2)
    torch.manual_seed(0)
    model = _Attention().eval()
    x = _f32(rng, (1, 24, 32))
    got, report = _compiled_output(model, x)
    with torch.no_grad():
        want = model(torch.tensor(x)).numpy()
    assert _relative(got, want) < 1e-4
    assert "x86.vdpbf16ps" not in {row[1] for row in report}


def test_no_float32_instruction_leaves_the_model_to_tvm():
    """A target without a float32 multiply-add instruction (plain x86-64) keeps compile's old
    path: no float32 form, TVM's schedules."""
    plain = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64"})
    assert not has_float32_instruction(plain)
    assert has_float32_instruction(aarch64.target())
