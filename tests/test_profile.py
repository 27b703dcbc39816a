"""`unit-tvm profile`: a compiled model's kernels, timed as they run in it."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from unit_tvm import frontends, profile

from .conftest import require_host


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(16, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        y = torch.relu(self.conv1(x))
        y = torch.relu(self.conv2(y) + y)
        return self.fc(y.mean((2, 3)))


def test_profile_names_every_kernel_and_its_instruction(tmp_path):
    require_host("x86.vpdpbusd")
    torch.manual_seed(0)
    model = _Block().eval()
    rng = np.random.default_rng(0)
    cal = [rng.standard_normal((1, 16, 12, 12)).astype(np.float32) for _ in range(2)]
    mod = frontends.from_torch(model, [torch.tensor(cal[0])])
    prof = profile.profile_module(mod, cal, cal[0], name="block",
                                  database=str(tmp_path / "db.jsonl"), repeats=2)
    tensorized = [k for k in prof.kernels if k.category.startswith("tensorized")]
    assert len(tensorized) >= 3  # two convs and the dense
    assert all(k.instruction and k.gops > 0 and 0 < k.peak_pct for k in tensorized)
    assert sum(k.share for k in prof.kernels) == pytest.approx(1.0)
    assert prof.end_to_end_ms > 0 and prof.kernel_ms > 0 and prof.copy_gbps > 0
    # a call's first repeat is one of the repeats: never below their best (per run, and so
    # for the least over runs too)
    assert all(k.in_run_us >= k.us_per_call > 0 for k in prof.kernels)
    assert prof.in_run_ms >= prof.kernel_ms
    assert set(prof.peaks) == {k.instruction for k in tensorized}
    # an empty database: every kernel runs the strategy's default, and says so with its tile
    assert all(re.match(r"loops [\dx]+: tile .* \(\d+ acc\), parallel .*\(default\)$", k.config)
               for k in tensorized), [k.config for k in tensorized]
    text = profile.table(prof)
    # the categories, largest share first; which is largest is the host's timing (on a block
    # this small the elementwise kernels can outweigh the convs)
    shares = re.search(r"^by category: (.*)$", text, re.M).group(1).split(", ")
    parsed = [re.fullmatch(r"(.+) (\d+\.\d)%", s).groups() for s in shares]
    assert "tensorized conv2d" in [name for name, _ in parsed], shares
    assert [float(p) for _, p in parsed] == sorted((float(p) for _, p in parsed), reverse=True)
    assert tensorized[0].name in text
    assert f"{prof.in_run_ms:.2f} ms as run in the model" in text
    assert tensorized[0].config in text


def test_config_described_with_its_loops():
    """The tile and the parallel loops a CpuConfig gives a conv, numbered outermost first."""
    from unit_tvm import intrinsics, ops
    from unit_tvm.prepare import prepare
    from unit_tvm.schedules import cpu

    conv = ops.conv2d_nchwc(1, 64, 16, 16, 64, 3, 3)
    prepared = prepare(conv, intrinsics.get("x86.vpdpbusd"), **cpu.prepare_options(None))
    config = cpu.CpuConfig(unroll=((3, 7), (2, 2)), parallel=2, front=2)
    assert cpu.describe(config, prepared) == (
        "loops 1x4x14x14x1: tile L3/7 x L2/2 (14 acc), parallel L2.L1, L2 first")


def test_kernel_categories_follow_the_names():
    assert profile.category("unit_conv2d_3", "x86.vpdpbusd") == "tensorized conv2d"
    assert profile.category("unit_conv2d_3", "") == "int8 loop nest"
    assert profile.category("qconv2d_7", "") == "int8 loop nest"
    assert profile.category("fused_transpose_reshape", "") == "layout change"
    assert profile.category("fused_reshape1_transpose2", "") == "layout change"
    assert profile.category("fused_reshape1_multiply1", "") == "elementwise / other"
    assert profile.category("matmul1", "") == "fp32 compute"
    assert profile.category("fused_softmax_add", "") == "elementwise / other"


def test_isa_level_restricts_the_host_target(monkeypatch):
    from unit_tvm import intrinsics, target

    target.host()  # cached for the native level first: a later level must still count
    monkeypatch.setenv("UNIT_TVM_ISA", "avx512_core")
    restricted = target.host()
    assert "avx512vnni" not in target.features(restricted)
    assert not any(i.name.startswith(("x86.vpdpbusd", "x86.tdp"))
                   for i in intrinsics.for_target(restricted))
    monkeypatch.setenv("UNIT_TVM_ISA", "avx512_vnnni")
    with pytest.raises(ValueError, match="not one of"):
        target.host()
    monkeypatch.delenv("UNIT_TVM_ISA")
    assert "-avx512vnni" not in str(target.host())


def test_macs_count_only_products_of_real_input():
    """A 3x3 window with padding 1 over a 4x4 image: 10 of the 12 (position, tap) pairs per
    axis read the image; a 3x3x3 conv3d over 2 frames: 4 of 6 along the depth too."""
    from unit_tvm.relax.core.recipe import Recipe
    from unit_tvm.relax.cpu.tensorize import macs

    conv = Recipe(kind="conv2d", in_shape=(1, 8, 4, 4), w_shape=(16, 8, 3, 3),
                  out_shape=(1, 16, 4, 4), out_channels=16, stride=(1, 1), dilation=(1, 1),
                  padding=(1, 1, 1, 1))
    assert macs(conv) == 16 * 8 * 10 * 10
    conv3d = Recipe(kind="conv3d", in_shape=(1, 8, 2, 4, 4), w_shape=(16, 8, 3, 3, 3),
                    out_shape=(1, 16, 2, 4, 4), out_channels=16, stride=(1, 1, 1),
                    dilation=(1, 1, 1), padding=(1,) * 6)
    assert macs(conv3d) == 16 * 8 * 4 * 10 * 10
    dense = Recipe(kind="dense", in_shape=(3, 32), w_shape=(10, 32), out_shape=(3, 10),
                   out_channels=10)
    assert macs(dense) == 3 * 10 * 32


def test_vm_call_timer_counts_every_call_of_a_run():
    """The GPU profiler's timer (any target): each function the VM calls, how often per run,
    its mean time and share; the instrument is removed afterwards."""
    import tvm
    from tvm import relax

    from unit_tvm.bench.gpu_profile import time_vm_calls

    x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 16, 8, 8), np.float32))
    mod = frontends.from_torch(_Block().eval(), [x])
    dev = tvm.cpu()
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), dev)
    rows = time_vm_calls(vm, [tvm.runtime.tensor(x.numpy(), dev)], dev, runs=3)
    names = [r.name for r in rows]
    assert len(names) == len(set(names)) and any("conv2d" in n for n in names)
    assert all(r.calls >= 1 and r.mean_us > 0 for r in rows)
    assert abs(sum(r.share for r in rows) - 1.0) < 1e-6
    assert [r.mean_us * r.calls for r in rows] == sorted((r.mean_us * r.calls for r in rows),
                                                         reverse=True)
    out = vm["main"](tvm.runtime.tensor(x.numpy(), dev))  # runs without the instrument
    assert out is not None


def test_fp32_attention_reports_flops_and_fma_peak():
    """Attention kept fp32: its matmuls (one kernel, called for both: the same shapes) run on
    the float32 multiply-add and show GFLOPS (2 x 4 heads x 16 x 16 x 16 each) and a % of
    that instruction's measured peak."""
    require_host("x86.vpdpbusd")
    from .test_relax import TinyTransformer, _prepare

    model = TinyTransformer()
    cal, xs, _ = _prepare(model, (1, 16, 64), n_cal=2)
    mod = frontends.from_torch(model, [torch.tensor(xs[0])])
    prof = profile.profile_module(mod, cal, xs[0], name="block", repeats=2, attention="fp32")
    matmuls = [k for k in prof.kernels if k.category == "tensorized bmm"]
    assert sum(k.calls for k in matmuls) == 2, [(k.name, k.category) for k in prof.kernels]
    for k in matmuls:
        assert k.gops * k.us_per_call * 1e3 == pytest.approx(2 * 4 * 16 * 16 * 16, rel=1e-6)
        assert k.instruction.startswith("x86.vfmadd231ps") and k.peak_pct > 0
        assert k.peak_pct == pytest.approx(100 * k.gops / prof.peaks[k.instruction])
    row = next(line for line in profile.table(prof).splitlines()
               if line.startswith(matmuls[0].name + " "))
    assert f"{matmuls[0].peak_pct:.0f}%" in row and matmuls[0].instruction in row


def test_float32_model_profile_shows_the_multiply_add_peak():
    """profile --fp32: the float32 model as compile builds it without quantize; every dense
    layer and attention matmul on the multiply-add, each with its % of that peak."""
    require_host("x86.vfmadd231ps")
    from .test_relax import TinyTransformer, _prepare

    model = TinyTransformer()
    _, xs, _ = _prepare(model, (1, 16, 64), n_cal=1)
    mod = frontends.from_torch(model, [torch.tensor(xs[0])])
    prof = profile.profile_module(mod, (), xs[0], name="block", repeats=2, dtype="float32")
    compute = [k for k in prof.kernels if k.category.startswith("tensorized")]
    assert len(compute) >= 4 and not [k for k in prof.kernels if k.category == "fp32 compute"]
    for k in compute:
        assert k.instruction.startswith("x86.vfmadd231ps") and 0 < k.peak_pct <= 110


_THREADS_SCRIPT = """
import sys
import numpy as np
import torch
import tvm
from tvm import relax
from unit_tvm import frontends, profile

# TVM fixes a host thread's pool size when that thread first asks for it: ask as the first
# VirtualMachine (calibration's) is made, i.e. before any of profile_module's kernels run
pools, make = [], relax.VirtualMachine.__init__
def first_pool(self, *args, **kwargs):
    pools.append(tvm.get_global_func("runtime.NumThreads")())
    make(self, *args, **kwargs)
relax.VirtualMachine.__init__ = first_pool
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU()).eval()
cal = [np.random.default_rng(0).standard_normal((1, 16, 12, 12)).astype(np.float32)]
mod = frontends.from_torch(model, [torch.tensor(cal[0])])
if sys.argv[2] == "profile":
    threads = profile.profile_module(mod, cal, cal[0], database=sys.argv[1], repeats=1).threads
else:  # quantized first, then compiled and run
    import unit_tvm
    from unit_tvm.relax import quantize
    ex = unit_tvm.compile(quantize(mod, calibration_data=cal), database=sys.argv[1])
    relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(cal[0]))
    threads = tvm.get_global_func("runtime.NumThreads")()
print(pools[0], threads)
"""


@pytest.mark.parametrize("entry", ["profile", "quantize"])
def test_kernels_run_on_every_cpu_of_the_process(tmp_path, entry):
    """A fresh process that only calls profile_module, or quantize then compile, runs its
    kernels on all of its CPUs (TVM's runtime alone takes half of them on x86, for good at a
    thread's first parallel kernel: calibration's), and profile says how many it read back."""
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, str(tmp_path / "db.jsonl"),
                          entry], env={**env, "UNIT_TVM_QUIET": "1"}, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    first_pool, read_back = (int(v) for v in out.stdout.split()[-2:])
    assert first_pool == read_back == len(os.sched_getaffinity(0))
