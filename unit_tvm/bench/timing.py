"""One timing protocol for every engine: interleaved rounds of single calls.

Each round gives every engine a slot, in an order that rotates from round to round, so that a
noisy neighbour or a frequency change on a shared VM hits all engines alike. A slot starts once
the process is idle: engines' worker threads keep spinning after a call (measured here: TVM's
pool ~200 ms, ONNX Runtime's ~50 ms, PyTorch's ~10 ms, OpenVINO's none), and a spinning pool
takes a core from whichever engine runs next. Then one untimed call, then `per_slot` timed
single calls. Reported: the minimum and the median of those single calls.
"""

import statistics
import time
from dataclasses import dataclass


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
