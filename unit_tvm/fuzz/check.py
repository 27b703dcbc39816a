"""Run one fuzz case in this process: unit_tvm.build against TVM's default build of the same op.

Integers must be equal. Floats (bf16/fp16/f32 operands, f32 accumulation) may differ only by
rounding: |unit-tvm - TVM| <= FLOAT_RTOL * M + FLOAT_ATOL, where M is the op evaluated on the
operands' absolute values (for a sum of products, the sum of the products' magnitudes, which
bounds what reordering the additions can change). A wrong term is a difference of the order of M.
"""

import time
import warnings

import numpy as np
import tvm
from tvm import te

from .. import intrinsics, lowering
from ..build import BuildReport, FallbackWarning, build_report, prepare_op
from ..measure import numpy_dtype
from ..rewriter import schedule
from ..target import host, instruction_target
from .attention_case import run_attention_case
from .cases import (ATTENTION_KIND, GPU_MODEL_KIND, MODEL_KIND, QDQ_KIND, SPEECH_KIND,
                    WHOLE_MODEL_KINDS, Case, make_op)
from .gpu_check import run_gpu_model_case
from .model_check import run_model_case
from .outcome import CLASSES, CaseResult, failed  # noqa: F401 - CLASSES: the package's name
from .qdq_check import run_qdq_case

FLOAT_RTOL = 2.0 ** -12
FLOAT_ATOL = 1e-5
EXTREME_SHARE = 0.25  # share of integer operand elements set to 0 or an end of the dtype's range

def operand(shape, dtype, rng):
    """Random operand of a TVM dtype; integers include many 0s and range ends (255, -128, 127)."""
    shape = tuple(int(s) for s in shape)
    if "int" in dtype:
        info = np.iinfo(dtype)
        lo, hi = (max(int(info.min), -1000), min(int(info.max), 1000))
        arr = rng.integers(lo, hi + 1, size=shape, dtype=np.int64)
        ends = rng.random(shape) < EXTREME_SHARE
        arr[ends] = rng.choice(np.array([lo, hi, 0]), size=int(ends.sum()))
        return arr.astype(dtype)
    arr = rng.standard_normal(shape).astype(np.float32)
    arr[rng.random(shape) < 0.05] = 0.0
    return arr.astype(numpy_dtype(dtype))


def _run(module, arrays, out_shape, out_dtype):
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    args.append(tvm.runtime.tensor(np.zeros(out_shape, numpy_dtype(out_dtype)), dev))
    module(*args)
    return args[-1].numpy()


def compare(got, want, magnitude=None):
    """'' when got equals want (exactly for integers, within the float bound otherwise), else
    a one-line account of the difference."""
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if np.issubdtype(want.dtype, np.integer):
        bad = np.flatnonzero(got != want)
        if bad.size == 0:
            return ""
        i = np.unravel_index(bad[0], want.shape)
        return (f"{bad.size} of {want.size} elements differ, first at {tuple(map(int, i))}: "
                f"{got[i]} != {want[i]}")
    g, w = got.astype(np.float64), want.astype(np.float64)
    bound = FLOAT_RTOL * np.abs(magnitude.astype(np.float64)) + FLOAT_ATOL
    bad = np.flatnonzero(~(np.abs(g - w) <= bound) & ~(np.isnan(g) & np.isnan(w)))
    if bad.size == 0:
        return ""
    i = np.unravel_index(bad[0], want.shape)
    return (f"{bad.size} of {want.size} elements outside the rounding bound, first at "
            f"{tuple(map(int, i))}: {g[i]:.6g} != {w[i]:.6g} (bound {bound[i]:.3g})")


def run_case(case: Case, target=None, emulate="") -> CaseResult:
    """Build and compare one case; exceptions are caught and classified, never raised.

    emulate: an instruction this host cannot execute (AMX on a CPU without it): its kernel is
    prepared, scheduled and compiled for a target that has it, and the prepared graph (packs,
    shifts, core, epilogue, without the instruction) runs here against TVM's build of the op,
    which checks everything but the instruction's own emit rule."""
    if case.kind in WHOLE_MODEL_KINDS:
        if emulate:
            raise ValueError(f"fuzz: --emulate checks op-level cases only, not kind "
                             f"'{case.kind}'")
        run = {MODEL_KIND: run_model_case, SPEECH_KIND: run_model_case, QDQ_KIND: run_qdq_case,
               GPU_MODEL_KIND: run_gpu_model_case, ATTENTION_KIND: run_attention_case}[case.kind]
        return run(case, target)
    t0 = time.time()
    target = target or host()
    base = dict(index=case.index, kind=case.kind, description=case.describe(),
                reproduce=case.reproduce() + (f" --emulate {emulate}" if emulate else ""))
    try:
        tensors = make_op(case)
        reference = tvm.tirx.build(te.create_prim_func(tensors), target=target)
    except Exception as e:  # noqa: BLE001 - TVM itself cannot build the op: not unit-tvm's fault
        return failed(base, "invalid", e, t0)
    out = tensors[-1]
    rng = np.random.default_rng(case.seed * 7919 + case.index)
    arrays = [operand(t.shape, str(t.dtype), rng) for t in tensors[:-1]]
    shape, dtype = [int(s) for s in out.shape], str(out.dtype)
    want = _run(reference, arrays, shape, dtype)
    try:
        if emulate:
            report = _emulated(tensors, emulate)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FallbackWarning)
                report = build_report(tensors, target)
        got = _run(report.module, arrays, shape, dtype)
    except Exception as e:  # noqa: BLE001 - every failure of unit-tvm is a finding
        return failed(base, "crash", e, t0)
    magnitude = None
    if not np.issubdtype(want.dtype, np.integer):
        magnitude = _run(reference, [np.abs(a) for a in arrays], shape, dtype)
    diff = compare(got, want, magnitude)
    outcome = "wrong" if diff else ("tensorized-correct" if report.tensorized
                                    else "fallback-correct")
    reason = report.reason.splitlines()[0][:300] if report.reason else ""
    return CaseResult(**base, outcome=outcome, intrinsic=report.intrinsic, mapping=report.mapping,
                      stages=report.stages, detail=diff or reason, seconds=time.time() - t0)


def _emulated(tensors, name):
    """BuildReport whose module is the prepared graph for instruction `name` without the
    instruction, after compiling the tensorized kernel for a target that has it; TVM's build of
    the op itself when the instruction does not apply."""
    intrin = intrinsics.get(name)
    target = instruction_target(intrin)
    inputs, out = tensors[:-1], tensors[-1]
    try:
        prepared = prepare_op(out, intrin, params=inputs, target=target)
        sch = schedule(prepared, intrin, None, target)
    except (ValueError, tvm.s_tir.ScheduleError) as e:
        plain = tvm.tirx.build(te.create_prim_func(list(tensors)), target=host())
        return BuildReport(plain, reason=str(e).splitlines()[0])
    lowering.build(sch.mod, target)  # the kernel must compile for its own CPU
    unscheduled = tvm.tirx.build(te.create_prim_func(prepared.tensors), target=host())
    return BuildReport(unscheduled, intrin.name, prepared.variant, tuple(prepared.stages))
