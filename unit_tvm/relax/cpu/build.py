"""The build of a Relax model once its kernels are chosen: tvm.compile through unit_tvm.lowering's
TIR pipeline, with the operators no instruction covers first given a parallel CPU schedule
(default_schedule.py). Used by unit_tvm.compile, by calibration (the float32 model observed on
this CPU) and by the benchmarks and the profiler, which build the same way."""

import tvm
from tvm import relax

from ... import lowering
from ...target import is_cpu
from .default_schedule import DefaultCPUSchedule
from .fuse_elementwise import fuse_elementwise


def build_relax(mod, target):
    """tvm.compile (unit_tvm.lowering's TIR pipeline), with the leftover operators given a
    parallel CPU schedule first."""
    if is_cpu(target):
        mod = fuse_elementwise(relax.transform.LegalizeOps()(mod))
        # reshapes as views first: scheduled, a reshape kernel no longer has the pattern TVM's
        # build looks for, and copies its tensor (Whisper's 54 MB attention scores, twice per
        # layer: 2.3 ms); one whose result leaves the dataflow block stays a kernel, scheduled
        mod = relax.transform.RewriteDataflowReshape()(mod)
        mod = DefaultCPUSchedule(target)(mod)
    try:
        return lowering.compile_relax(mod, target)
    except Exception as e:  # noqa: BLE001 - re-raised, with the kernel named where one is found
        culprit = failing_kernel(mod, target)
        if culprit is None:
            raise
        raise KernelBuildError(f"TVM could not compile the kernel {culprit[0]!r} (the model's "
                               f"operator of that name, after legalization): {culprit[1]}") from e


class KernelBuildError(RuntimeError):
    """A kernel of the model does not compile; the message names it (TVM's own check names
    neither the kernel nor the operator)."""


def failing_kernel(mod, target):
    """(name, first line of TVM's error) of the first PrimFunc of `mod` that does not build
    alone for `target`, or None when each one does."""
    for gv, func in mod.functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        try:
            lowering.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                           target)
        except Exception as e:  # noqa: BLE001 - any failure names this kernel
            lines = [ln for ln in str(e).splitlines() if ln.strip()]
            return gv.name_hint, (lines[-1] if lines else type(e).__name__)
    return None
