"""How unit-tvm times anything, in one place: every benchmark, the profiler, the tuner's runners
and the fleet's servers call these.

- `interleaved`: whole models of several engines (bench-model, bench-gpu-model, profile's
  end-to-end figure): rounds of single calls. Each round gives every engine a slot, in an
  order that rotates from round to round, so that a noisy neighbour or a frequency change on
  a shared VM hits all engines alike. A slot starts once the process is idle: engines' worker
  threads keep spinning after a call (measured here: TVM's pool ~200 ms, ONNX Runtime's
  ~50 ms, PyTorch's ~10 ms, OpenVINO's none), and a spinning pool takes a core from whichever
  engine runs next. Then one untimed call, then `per_slot` timed single calls. Reported: the
  minimum and the median of those single calls.
- `evaluator_rounds`: one built kernel (peak, bench-op, the tuner's candidates, RPC servers):
  TVM's time_evaluator after one warm-up call, per-call seconds of each of `repeat` rounds of
  `number` calls (on the device, remote or not, without Python in the loop).
- `call_rounds`: one Python callable of another engine's op (PyTorch's int8 op, cuDNN through
  PyTorch): rounds of back-to-back calls, synchronised where a device runs asynchronously.
- `CallTimer`: each kernel of a Relax VM run on its real arguments (the profilers).
Minimum: what the code costs without interference (the shared VM's noise only adds); the
median is reported beside it where a distribution is kept.
"""

import statistics
import time
from dataclasses import dataclass

import numpy as np
import tvm


@dataclass(frozen=True)
class Timing:
    """Single-call latencies of one engine, in milliseconds."""

    min_ms: float
    median_ms: float
    calls: int

    def __str__(self):
        return f"{self.min_ms:8.2f} ms (median {self.median_ms:.2f}, {self.calls} calls)"


def quiesce(limit_s=1.0, step_s=0.01, busy_share=0.05):
    """Wait until this process's threads use under busy_share of a core over step_s (worker
    pools stopped spinning), at most limit_s; the seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit_s:
        c0 = time.process_time()
        time.sleep(step_s)
        if time.process_time() - c0 < busy_share * step_s:
            break
    return time.perf_counter() - start


def interleaved(calls, rounds=10, per_slot=3, warmup=2, gap_s=0.02, budget_s=None):
    """{name: Timing} for {name: zero-argument callable}. budget_s: stop after the round in
    which this many seconds have passed (at least 2 rounds)."""
    names = list(calls)
    for name in names:
        for _ in range(warmup):
            calls[name]()
    samples = {name: [] for name in names}
    start = time.perf_counter()
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = calls[name]
            if len(names) > 1:
                quiesce()
                time.sleep(gap_s)
                fn()
            for _ in range(per_slot):
                t0 = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t0)
        if budget_s is not None and r >= 1 and time.perf_counter() - start > budget_s:
            break
    return {name: Timing(1e3 * min(s), 1e3 * statistics.median(s), len(s))
            for name, s in samples.items()}


def evaluator_rounds(lib, args, dev, *, number=10, repeat=5, func="main", warmup=True) -> list:
    """Per-call seconds of each of `repeat` rounds of `number` calls of `lib[func]` on `dev`
    (TVM's time_evaluator; one untimed call first unless the caller has just made one)."""
    if warmup:
        lib(*args)
    timer = lib.time_evaluator(func, dev, number=number, repeat=repeat)
    return list(timer(*args).results)


def call_rounds(fn, repeat, *, number=None, sync=None, warmup=3, target_s=0.05) -> list:
    """Per-call seconds of each of `repeat` rounds of `number` back-to-back calls of `fn`,
    between two `sync()` (a GPU stream's: its launches return before the work ends). number
    None: as many calls as take about target_s (1 to 50), from one timed call."""
    sync = sync or (lambda: None)
    for _ in range(warmup):
        fn()
    if number is None:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        number = max(1, min(50, int(target_s / max(time.perf_counter() - t0, 1e-6))))
    out = []
    for _ in range(repeat):
        sync()
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        sync()
        out.append((time.perf_counter() - t0) / number)
    return out


class CallTimer:
    """A VM instrument that times every kernel call on its real arguments: it runs the call
    `repeats` times, each between two `sync()`s (a GPU's launch returns before its kernel ends),
    and keeps `reduce` of those times (min: the kernel alone; a mean: its cost on average). The
    VM's own builtins are not timed. `times` / `firsts` (the first repeat's) / `calls` /
    `nbytes` per symbol, for one VM run."""

    def __init__(self, repeats, sync=None, reduce=min):
        self.repeats, self.reduce = repeats, reduce
        self.sync = sync or (lambda: None)
        self.times, self.firsts, self.calls, self.nbytes = {}, {}, {}, {}

    def __call__(self, func, symbol, before_run, ret_value, *args):
        if before_run and not symbol.startswith("vm."):  # kernels, not the VM's builtins
            seconds = []
            for _ in range(self.repeats):
                self.sync()
                t0 = time.perf_counter()
                func(*args)
                self.sync()
                seconds.append(time.perf_counter() - t0)
            self.times[symbol] = self.times.get(symbol, 0.0) + self.reduce(seconds)
            self.firsts[symbol] = self.firsts.get(symbol, 0.0) + seconds[0]
            self.calls[symbol] = self.calls.get(symbol, 0) + 1
            self.nbytes[symbol] = sum(_nbytes(a) for a in args)
        return 0  # let the VM run the call as usual


def _nbytes(arg):
    shape = getattr(arg, "shape", None)
    if shape is None:
        return 0
    return int(np.prod([int(s) for s in shape])) * tvm.runtime.DataType(str(arg.dtype)).bits // 8
