"""Per-kernel times of a zoo model compiled by unit-tvm for the first CUDA GPU.

    python -m unit_tvm.bench.gpu_profile MODEL [--int8] [--calls N] [--top K] [--out DIR]

The model is built as `unit_tvm.compile(mod, cuda)` builds it, without CUDA graphs, and each
kernel call the VM makes (one PrimFunc: a gather, a Tensor Core GEMM, a TVM-scheduled leftover)
is run N times on its own arguments, each between two device synchronizations, and the mean
kept (`unit_tvm.timing.CallTimer`, the CPU profiler's timer; the VM's builtins are left
out). The times include one launch each (a few microseconds), so their sum exceeds the
CUDA-graph latency of `bench-model --target cuda`; they say which functions take the time, not
what the model costs.
"""

import argparse
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from ..timing import CallTimer
from .. import frontends, lowering
from ..compiler import scheduled_for_cuda
from ..relax.frontend.fixes import frontend_fixes
from ..target import cuda_target


@dataclass
class KernelTime:
    """One VM-called function: calls per model run and mean microseconds per call."""

    name: str
    calls: int
    mean_us: float
    share: float


def profile_model(name: str, *, int8: bool = False, calls: int = 10, database=None,
                  log=print) -> list[KernelTime]:
    """KernelTimes of zoo model `name` on cuda(0), slowest total first."""
    import torch
    import tvm
    from tvm import relax

    from ..testing import zoo  # torch (optional extra)

    module, shape = zoo.get(name)
    x = zoo.inputs(shape, 1)[0]
    mod = frontend_fixes(frontends.from_torch(module.cpu(), [torch.from_numpy(x)]))
    dev = tvm.cuda(0)
    target = cuda_target(dev)
    quantize = {"calibration_data": zoo.inputs(shape, 4)} if int8 else None
    mod = scheduled_for_cuda(mod, target, quantize=quantize, database=database)
    vm = relax.VirtualMachine(lowering.compile_relax(mod, target), dev)
    rows = time_vm_calls(vm, [tvm.runtime.tensor(x, dev)], dev, calls)
    whole = sum(r.mean_us * r.calls for r in rows)
    log(f"{name}{' int8' if int8 else ''}: {whole / 1e3:.3f} ms per run in "
        f"{sum(r.calls for r in rows)} timed calls")
    return rows


def time_vm_calls(vm, args: list, dev, runs: int = 10) -> list[KernelTime]:
    """KernelTimes of every kernel `vm["main"](*args)` calls, each call run `runs` times
    between two synchronizations of `dev` after one warm-up run (any target)."""
    vm["main"](*args)  # warm-up: module loading, first launches
    timer = CallTimer(runs, sync=dev.sync, reduce=statistics.mean)
    vm.set_instrument(timer)
    try:
        vm["main"](*args)
    finally:
        vm.set_instrument(None)
    whole = sum(timer.times.values()) or 1.0
    return sorted((KernelTime(s, timer.calls[s], 1e6 * timer.times[s] / timer.calls[s],
                              timer.times[s] / whole) for s in timer.times),
                  key=lambda r: -r.mean_us * r.calls)


def main(argv=None):
    """CLI: print the slowest functions and write DIR/gpu_profile_MODEL.json."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--int8", action="store_true")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--database")
    ap.add_argument("--out", default=".")
    a = ap.parse_args(argv)
    rows = profile_model(a.model, int8=a.int8, calls=a.calls, database=a.database)
    for r in rows[:a.top]:
        print(f"  {r.mean_us:9.1f} us x{r.calls:<3} {100 * r.share:5.1f}%  {r.name}")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    path = Path(a.out) / f"gpu_profile_{a.model}{'_int8' if a.int8 else ''}.json"
    path.write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
