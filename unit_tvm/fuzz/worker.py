"""Worker processes for the fuzzer: a case that kills its process (a segfault in TVM's C++) or
runs past its time limit is recorded, and a fresh worker takes the next case."""

import multiprocessing
import os
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait

from .cases import Case, make_case
from .outcome import CaseResult


def run_one(seed, index, kinds, emulate=""):
    """The default job of a worker: generate case `index` of `seed` and check it."""
    from .check import run_case  # imported in the worker, after its thread count is set

    return run_case(make_case(seed, index, kinds), emulate=emulate)


def _serve(conn, threads, job):
    """Worker loop: receive (seed, index, kinds, emulate), answer job(...) (a CaseResult);
    None ends it."""
    # kernels of parallel workers must not fight over the cores
    os.environ["TVM_NUM_THREADS"] = str(threads)
    while True:
        args = conn.recv()
        if args is None:
            return
        conn.send(job(*args))


@dataclass
class _Slot:
    """One worker process and the case it is running."""

    process: object
    conn: object
    case: Case = None
    started: float = 0.0


def _start(ctx, threads, job):
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, threads, job), daemon=True)
    proc.start()
    child.close()
    return _Slot(proc, parent)


def _failed(case, outcome, detail, seconds):
    return CaseResult(case.index, case.kind, case.describe(), outcome, detail=detail,
                      seconds=seconds, reproduce=case.reproduce())


def run_cases(seed, indices, kinds, *, workers=1, timeout=300.0, on_result=None, job=run_one,
              emulate=""):
    """Run the cases `indices` of `seed` over `workers` processes; returns [CaseResult] in
    completion order. on_result(result) is called as each case ends. job: what a worker runs
    per case (a module-level function of (seed, index, kinds, emulate); tests pass one that
    crashes). emulate: see check.run_case."""
    ctx = multiprocessing.get_context("spawn")
    threads = max(1, len(os.sched_getaffinity(0)) // max(1, workers))
    pending = deque(make_case(seed, i, kinds) for i in indices)
    slots = [_start(ctx, threads, job) for _ in range(max(1, min(workers, len(pending))))]
    results = []

    def finish(slot, result, restart=False):
        results.append(result)
        if on_result:
            on_result(result)
        slot.case = None
        if restart:
            slot.process.kill()
            slot.process.join()
            fresh = _start(ctx, threads, job)
            slot.process, slot.conn = fresh.process, fresh.conn

    try:
        while pending or any(s.case for s in slots):
            for slot in slots:
                if slot.case is None and pending:
                    slot.case, slot.started = pending.popleft(), time.time()
                    slot.conn.send((slot.case.seed, slot.case.index, tuple(kinds), emulate))
            busy = [s for s in slots if s.case]
            wait([s.conn for s in busy] + [s.process.sentinel for s in busy], timeout=1.0)
            for slot in busy:
                elapsed = time.time() - slot.started
                if slot.conn.poll():
                    try:
                        finish(slot, slot.conn.recv())
                        continue
                    except EOFError:
                        pass
                if not slot.process.is_alive():
                    finish(slot, _failed(slot.case, "hard-crash",
                                         f"worker died (exit code {slot.process.exitcode})",
                                         elapsed), restart=True)
                elif elapsed > timeout:
                    finish(slot, _failed(slot.case, "timeout", f"over {timeout:.0f} s", elapsed),
                           restart=True)
    finally:
        for slot in slots:
            try:
                slot.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            slot.process.join(timeout=5)
            if slot.process.is_alive():
                slot.process.kill()
    return results
