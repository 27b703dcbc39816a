"""Where built kernels are run and timed: this machine (LocalRunner) or the servers of a TVM RPC
tracker (unit_tvm.fleet.RpcRunner). The tuner, `peak` and `bench-op` measure only through a
Runner, so one code path serves a laptop and a fleet."""

import functools
import math
import os
from typing import NamedTuple, Protocol, Sequence

import numpy as np
import tvm

from . import intrinsics
from .measure import to_device
from .target import as_target
from .timing import evaluator_rounds

# the timing every tuner candidate gets: the best of 5 means of 3 calls
NUMBER, REPEAT = 3, 5


class Measurement(NamedTuple):
    """One kernel's outcome on a device."""

    seconds: float  # per call (best of `repeat` means of `number` calls); inf when it failed
    error: str = ""  # why it failed: wrong output, a runtime error ('' when it ran correctly)
    server: str = "local"  # where it ran: 'local' or the RPC server's host:port

    @property
    def ok(self) -> bool:
        """The kernel ran and (when a reference was given) matched it."""
        return not self.error and math.isfinite(self.seconds)


class Runner(Protocol):
    """Runs built kernels on a device and times them."""

    name: str  # the device kind, recorded with every tuning result

    def target(self) -> tvm.target.Target:
        """The target kernels for this device are built for."""

    def measure(self, libs: Sequence, arrays: Sequence[np.ndarray], expected=None, *,
                number: int = NUMBER, repeat: int = REPEAT) -> list[Measurement]:
        """Run each lib on `arrays` plus an output buffer shaped like `expected` (or, with
        `expected` None, `arrays` alone: the last array is the output), compare with
        `expected` when given, and time it."""


def target_for(target, runner=None) -> tvm.target.Target:
    """The target kernels are built for: the one given, else the runner's device's, else this
    host."""
    return as_target(target if target is not None or runner is None else runner.target())


def outputs_match(got: np.ndarray, expected: np.ndarray) -> bool:
    """Integers exactly; floats within 1e-3 (relative and absolute)."""
    if np.issubdtype(expected.dtype, np.integer):
        return np.array_equal(got, expected)
    return np.allclose(got.astype(np.float64), expected.astype(np.float64), rtol=1e-3, atol=1e-3)


def failure(error: BaseException) -> str:
    """One line naming an exception: its type and its message's first line."""
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}"


def run_checked(lib, dev, arrays, expected, number, repeat, func="main") -> float:
    """Seconds per call of `lib` on `dev` after checking its output against `expected`
    (AssertionError when it differs). The device may be local or an RPC session's."""
    out = [np.zeros_like(expected)] if expected is not None else []
    args = to_device(list(arrays) + out, dev)
    lib(*args)
    if expected is not None and not outputs_match(args[-1].numpy(), expected):
        raise AssertionError("output differs from the reference")
    # the checked call above was the warm-up: each tuning candidate runs once untimed, not twice
    return min(evaluator_rounds(lib, args, dev, number=number, repeat=repeat, func=func,
                                warmup=False))


@functools.cache
def prepare_host() -> None:
    """Make this process ready to run kernels on this machine. TVM's worker count: TVM's runtime
    halves hardware_concurrency() on x86 (it assumes SMT siblings), which leaves half the cores
    idle on VMs whose vCPUs are real cores, so TVM_NUM_THREADS becomes the number of CPUs this
    process may run on unless the user chose (TVM_NUM_THREADS / OMP_NUM_THREADS); it must be set
    before TVM's thread pool starts, and child processes inherit it. And what the OS must grant
    before an instruction runs (each Intrinsic's host check: AMX tile data). Called by compile,
    build, load, quantize (before calibration's kernels, often a process's first), UnitTensorize,
    LocalRunner, the CLI and RPC servers, not on import; it runs once per process (3-4 ms: the
    host checks of every instruction), however often they call it."""
    if "TVM_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
        os.environ["TVM_NUM_THREADS"] = str(len(os.sched_getaffinity(0)))
    intrinsics.for_target(None)  # runs the host checks, which ask for the permissions


class LocalRunner:
    """Kernels run on this machine's device (`dev`: tvm.cpu() or a CUDA device)."""

    name = "local"

    def __init__(self, dev=None, target=None):
        prepare_host()
        self.dev = dev if dev is not None else tvm.cpu()
        self._target = target

    def target(self) -> tvm.target.Target:
        """This host (or the target the runner was made with)."""
        return as_target(self._target)

    def measure(self, libs, arrays, expected=None, *, number=NUMBER, repeat=REPEAT):
        """Each lib in turn on this machine (see Runner.measure)."""
        out = []
        for lib in libs:
            try:
                out.append(Measurement(run_checked(lib, self.dev, arrays, expected, number,
                                                   repeat)))
            except Exception as e:  # noqa: BLE001 - a failed kernel is a result, not a crash
                out.append(Measurement(math.inf, failure(e)))
        return out
