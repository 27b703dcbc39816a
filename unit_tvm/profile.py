"""`unit-tvm profile MODEL`: where a compiled model's time goes, kernel by kernel.

Each kernel the Relax VM calls is timed as it runs in the model (the VM's instrument hook runs
it `repeats` times on the model's own tensors before letting the VM continue), so the inputs,
shapes and layouts are the real ones. Two times per call: the best of the repeats (the kernel
alone, its operands in cache) and the first one, which runs where the model runs it, after the
kernel before it (its weights from memory, its input in the cache of the core that wrote it);
what a kernel loses between the two is what running in a sequence costs it. The firsts sum to
near the end-to-end latency (BERT-base on Zen 4: 31.2 of 32.0 ms); for a model of many short
kernels they also pay the worker threads' wake-up after the profiler's own work between calls,
and sum above it (mobilenet_v2: 1.36-1.78 ms against 1.24-1.64). For each kernel: calls, both
times, share of the summed kernel time, what it is (tensorized conv/dense, int8 loop nest,
layout change, leftover fp32 op), the instruction, GOPS and % of that instruction's measured
peak on this host, and for the others the bytes they move per second against a measured copy
bandwidth.
"""

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax
from tvm.s_tir.analysis import estimate_tir_flops

from .bandwidth import copy_bandwidth
from .compiler import build_relax
from .peak import host_threads, peak
from .relax import UnitTensorize, quantize
from .relax.core import views
from .relax.core.recipe import ATTR, Recipe
from .relax.cpu.fused_attention import kernel_infos
from .relax.cpu.tensorize import KernelInfo, macs
from .target import host
from .timing import CallTimer, interleaved
from .tuner import Database, default_path
from .bench.engine_tvm import calibration, relax_module

_LAYOUT = ("transpose", "permute", "reshape", "strided_slice", "concat", "split",
           "layout_transform", "squeeze", "expand_dims", "flatten", views.COPY_KERNEL)
_FP32_COMPUTE = ("matmul", "conv", "dense")


@dataclass(frozen=True)
class KernelTime:
    """One kernel of a compiled model."""

    name: str
    category: str
    calls: int
    us_per_call: float  # minimum over repeats, per call
    in_run_us: float = 0.0  # the first of the repeats: as the kernel runs in the model
    share: float = 0.0  # of the summed kernel time
    instruction: str = ""
    label: str = ""
    gops: float = 0.0
    peak_pct: float = 0.0  # of the instruction's measured peak
    gbps: float = 0.0  # bytes of its arguments per second
    bandwidth_pct: float = 0.0  # of the measured copy bandwidth
    config: str = ""  # the strategy's config of a tensorized kernel, in words


@dataclass(frozen=True)
class Profile:
    """A model's kernels, largest first, and its end-to-end latency."""

    model: str
    end_to_end_ms: float
    kernels: tuple
    copy_gbps: float
    peaks: dict = field(default_factory=dict)  # instruction -> measured GOPS on this host
    threads: int = 0  # TVM's worker threads, read back after the run

    @property
    def kernel_ms(self) -> float:
        """Sum of every kernel's time (the rest is the VM's own work)."""
        return sum(k.us_per_call * k.calls for k in self.kernels) / 1e3

    @property
    def in_run_ms(self) -> float:
        """Sum of every kernel's time as it runs in the model (each call's first repeat)."""
        return sum(k.in_run_us * k.calls for k in self.kernels) / 1e3


def category(name, instruction) -> str:
    """What a kernel is, from the name the compiler gave it."""
    if name.startswith("unit_"):
        return f"tensorized {name.split('_')[1]}" if instruction else "int8 loop nest"
    if name.startswith("q") and name[1:].split("_")[0] in ("conv2d", "dense"):
        return "int8 loop nest"
    low = name.lower()
    if any(k in low for k in _LAYOUT) and not _computes(low):
        return "layout change"
    if "quantize" in low or "requant" in low:
        return "quantization"
    if any(k in low for k in _FP32_COMPUTE):
        return "fp32 compute"
    return "elementwise / other"


def _computes(low):
    """Whether a fused kernel's name (TVM's FuseOps joins its ops' names) holds an op other than
    layout ones: a reshape fused with a multiply (a squeeze-excitation gate read in channel
    blocks) is arithmetic, not a layout change."""
    rest = low.replace("fused_", "").replace("tir_", "")
    for k in _LAYOUT:
        if "_" in k:
            rest = rest.replace(k, "")
    words = [k for k in _LAYOUT if "_" not in k]
    return any(part and not any(part.startswith(k) for k in words)
               for part in (p.strip("0123456789") for p in rest.split("_")))


def _target():
    return host()


def profile_model(name, *, database=None, tune=False, trials=None, repeats=5,
                  attention=None, batch=1, dtype="int8") -> Profile:
    """Compile the zoo model `name` (or an ONNX file) as bench-model does (int8, or the
    float32 form with dtype="float32"; database configs; tuned when tune=True; attention as
    quantize takes it; a zoo model at `batch`) and profile its inferences kernel by kernel."""
    from .bench.model import make_case  # the engines import torch (optional extra)

    case = make_case(name, 2, batch=batch)
    mod = relax_module(case)  # a file that arrives quantized runs as bench-model runs it
    return profile_module(mod, calibration(case, mod), case.inputs[0], name=case.name,
                          database=database, tune=tune, trials=trials, repeats=repeats,
                          attention=attention, dtype=dtype)


def profile_module(mod, calibration, x, *, name="model", database=None, tune=False,
                   trials=None, repeats=5, attention=None, dtype="int8") -> Profile:
    """Quantize (int8, with `calibration`; `attention` as quantize takes it; or dtype="float32":
    the float32 form unit_tvm.compile builds without quantize), tensorize and compile the
    Relax module `mod`, then profile three inferences on input `x` kernel by kernel."""
    target = _target()
    qmod = quantize(mod, calibration_data=calibration, target=target, attention=attention,
                    dtype=dtype)
    pass_ = UnitTensorize(target, database=Database(database or default_path()), tune=tune,
                          trials=trials)
    # legalized here once: build_relax then finds nothing left to legalize, and the fp32
    # leftovers' kernels are there to count
    tmod = relax.transform.LegalizeOps()(pass_(qmod))
    recipes = {gv.name_hint: Recipe.from_json(str(f.attrs[ATTR]))
               for gv, f in tmod.functions.items()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and ATTR in f.attrs}
    own = kernel_infos(tmod)  # kernels scheduled by unit-tvm's graph passes
    vm = relax.VirtualMachine(build_relax(tmod, target), tvm.cpu())
    arg = tvm.runtime.tensor(np.asarray(x), tvm.cpu())
    e2e = interleaved({name: lambda: vm["main"](arg)}, rounds=5)[name].min_ms
    recorder = _timed_runs(vm, arg, repeats)
    copy = copy_bandwidth(target)
    peaks, kernels, flops = {}, [], _fp32_flops(tmod)
    for sym, secs in recorder.times.items():
        info = pass_.kernels.get(sym)
        if info is None and sym in own:
            info = KernelInfo(sym, str(own[sym]["label"]), str(own[sym]["instruction"]),
                              int(own[sym]["macs"]))
        instr = info.instruction if info else ""
        mac = info.macs if info else (macs(recipes[sym]) if sym in recipes else 0)
        calls = recorder.calls[sym]
        us = 1e6 * secs / calls
        ops = 2 * mac if mac else flops.get(sym, 0.0)
        gops = ops / (us * 1e3)
        if instr and instr not in peaks:
            peaks[instr] = peak(instr, host_threads(), target)["gops"]
        gbps = recorder.nbytes[sym] / (us * 1e3)
        kernels.append(KernelTime(sym, category(sym, instr), calls, us,
                                  1e6 * recorder.firsts[sym] / calls, 0.0, instr,
                                  info.label if info else "", gops,
                                  100 * gops / peaks[instr] if instr else 0.0, gbps,
                                  100 * gbps / copy, info.config if info else ""))
    total = sum(k.us_per_call * k.calls for k in kernels) or 1.0
    kernels = sorted((KernelTime(**{**k.__dict__, "share": k.us_per_call * k.calls / total})
                      for k in kernels), key=lambda k: -k.share)
    threads = int(tvm.get_global_func("runtime.NumThreads")())
    return Profile(name, e2e, tuple(kernels), copy, peaks, threads)


def _timed_runs(vm, arg, repeats, runs=3) -> CallTimer:
    """A CallTimer over `runs` VM runs, keeping per kernel the least of the runs' times and of
    their first repeats (each run's first repeats are noisier than its minima)."""
    best = None
    for _ in range(runs):
        recorder = CallTimer(repeats)
        vm.set_instrument(recorder)
        vm["main"](arg)
        if best is None:
            best = recorder
            continue
        for sym in recorder.times:
            best.times[sym] = min(best.times[sym], recorder.times[sym])
            best.firsts[sym] = min(best.firsts[sym], recorder.firsts[sym])
    vm.set_instrument(None)
    return best


def _fp32_flops(legal) -> dict:
    """{kernel name: floating-point operations per call} of the leftover fp32 compute ops
    (attention's matmuls where they stay fp32, a grouped conv3d) of a legalized module,
    counted by TVM's estimate_tir_flops."""
    return {gv.name_hint: float(estimate_tir_flops(tvm.IRModule({"main": f})))
            for gv, f in legal.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc) and category(gv.name_hint, "") == "fp32 compute"}


def by_category(profile: Profile) -> dict:
    """{category: share of the summed kernel time}."""
    out = {}
    for k in profile.kernels:
        out[k.category] = out.get(k.category, 0.0) + k.share
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def table(profile: Profile, top=25) -> str:
    """The profile as text: the largest kernels, then the share of each category."""
    lines = [f"{profile.model}: {profile.end_to_end_ms:.2f} ms end to end (min of single calls, "
             f"{profile.threads} threads), "
             f"kernels sum to {profile.kernel_ms:.2f} ms alone (best of repeats), "
             f"{profile.in_run_ms:.2f} ms as run in the model; copy bandwidth "
             f"{profile.copy_gbps:.1f} GB/s; peaks: "
             + ", ".join(f"{k} {v:.0f} GOPS" for k, v in profile.peaks.items()),
             f"{'kernel':<34}{'calls':>6}{'us/call':>10}{'in run':>8}{'share':>8}  {'what':<20}"
             f"{'GOPS':>8}{'%peak':>7}{'GB/s':>8}{'%bw':>6}  instruction / op; config"]
    for k in profile.kernels[:top]:
        # an fp32 op has no instruction whose peak was measured: its GFLOPS alone
        pct = f"{k.peak_pct:>6.0f}%" if k.instruction else f"{'-':>7}"
        lines.append(f"{k.name[:33]:<34}{k.calls:>6}{k.us_per_call:>10.1f}{k.in_run_us:>8.1f}"
                     f"{100 * k.share:>7.1f}%"
                     f"  {k.category:<20}{k.gops:>8.0f}{pct}{k.gbps:>8.1f}"
                     f"{k.bandwidth_pct:>5.0f}%  {k.instruction} {k.label}"
                     + (f"; {k.config}" if k.config else ""))
    if len(profile.kernels) > top:
        rest = sum(k.share for k in profile.kernels[top:])
        lines.append(f"... {len(profile.kernels) - top} more kernels, {100 * rest:.1f}%")
    lines.append("by category: " + ", ".join(f"{c} {100 * s:.1f}%"
                                               for c, s in by_category(profile).items()))
    return "\n".join(lines)
