"""Time the same kernels here and through an RPC server, interleaved: what the fleet's timing
costs or changes. Each Table I conv's default kernel is built once; each round times every kernel
locally and remotely in turn, each after a pause in which the other side's TVM worker threads
stop spinning (~200 ms; a spinning pool takes a core from whatever runs next); the minimum per
side is reported.

    python scripts/fleet/local_vs_remote.py [--rounds 3] [--quick]
        [--rpc-tracker HOST:PORT --rpc-key KEY]   # default: a tracker + 1 server on loopback
"""

import argparse
import contextlib
import sys
import time

import numpy as np
import tvm

from unit_tvm import measure
from unit_tvm.bench import op_level
from unit_tvm.timing import quiesce
from unit_tvm.build import prepare_op
from unit_tvm.fleet import LocalFleet, RpcRunner
from unit_tvm.peak import host_threads
from unit_tvm.prepare import placeholders_of
from unit_tvm.rewriter import schedule
from unit_tvm.runner import LocalRunner
from unit_tvm.target import host
from unit_tvm.testing.workloads import ops_count, workload_op, workloads

SETTLE_S = 0.3  # longer than TVM's worker threads spin after a call


def kernels(quick):
    """(label, lib, arrays, ops) of each Table I conv's default kernel for this host."""
    target, rng = host(), np.random.default_rng(0)
    out = []
    for label, kind, p in workloads(quick, "conv"):
        found = op_level.candidates(kind, p, target)
        if not found:
            continue
        intrin = found[0][0]
        op = workload_op(kind, p, intrin)
        prepared = prepare_op(op, intrin, target=target)
        lib = tvm.tirx.build(schedule(prepared, intrin, None, target).mod, target=target)
        tensors = [*placeholders_of(op), op]
        arrays = [measure.random_array(t.shape, t.dtype, rng) for t in tensors[:-1]]
        arrays.append(np.zeros([int(s) for s in op.shape], str(op.dtype)))
        out.append((label, lib, arrays, ops_count(kind, p)))
    return out


def main(argv=None):
    """Print one row per kernel: local and remote GOPS (min over rounds) and their ratio."""
    a = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--rounds", type=int, default=3)
    a.add_argument("--quick", action="store_true", help="4 layers")
    a.add_argument("--rpc-tracker")
    a.add_argument("--rpc-key")
    args = a.parse_args(argv)
    fleet = (contextlib.nullcontext() if args.rpc_tracker
             else LocalFleet([("local", None)], threads=host_threads()))
    with fleet:
        remote = (RpcRunner(args.rpc_tracker, args.rpc_key) if args.rpc_tracker
                  else RpcRunner(fleet.tracker, "local"))
        local, built = LocalRunner(), kernels(args.quick)
        best = {label: [np.inf, np.inf] for label, *_ in built}
        for _ in range(args.rounds):
            for label, lib, arrays, _ in built:
                for side, runner in enumerate((local, remote)):
                    quiesce()  # this process's pool
                    time.sleep(SETTLE_S)  # the server's pool, which this process cannot see
                    (m,) = runner.measure([lib], arrays, number=10, repeat=5)
                    if not m.ok:
                        sys.exit(f"{label} failed on {m.server}: {m.error}")
                    best[label][side] = min(best[label][side], m.seconds)
    print(f"{'layer':<6} {'local GOPS':>11} {'remote GOPS':>12} {'remote/local time':>18}")
    ratios = []
    for label, _, _, ops in built:
        t_local, t_remote = best[label]
        ratios.append(t_remote / t_local)
        print(f"{label:<6} {ops / t_local / 1e9:11.1f} {ops / t_remote / 1e9:12.1f} "
              f"{t_remote / t_local:18.3f}")
    print(f"geomean remote/local time: {np.exp(np.mean(np.log(ratios))):.3f} "
          f"({args.rounds} interleaved rounds, min of each)")


if __name__ == "__main__":
    main()
