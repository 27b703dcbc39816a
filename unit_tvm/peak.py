"""Measured peak of an instruction on this host, from a TVM-generated register-blocked kernel."""

import functools

import numpy as np
import tvm

from . import intrinsics, lowering, measure, microkernel
from .runner import LocalRunner
from .target import as_target, host, is_host

# Register blocks (rows of broadcast operand x columns of shared operand) tried: enough
# independent accumulators to cover latency x throughput of every x86 dot instruction
# (4-5 cycles x 2/cycle) while leaving registers for the operands.
BLOCK_CHOICES = ((12, 1), (6, 2), (4, 4), (6, 4), (4, 6), (8, 3))
# tile instructions (AMX) have 8 tile registers: 2x2 accumulator tiles + 2 + 2 operand tiles
TILE_BLOCK_CHOICES = ((1, 1), (2, 1), (2, 2))


@functools.lru_cache(maxsize=None)
def _measure(name, threads, target_json, runner):
    target = tvm.target.Target(target_json)
    intrin = intrinsics.get(name)
    best = None
    rng = np.random.default_rng(0)
    blocks = (BLOCK_CHOICES if intrin.broadcast_operand or intrin.lanewise
              else TILE_BLOCK_CHOICES)
    for rows, cols in blocks:
        func, ins, out, ops = microkernel.peak_kernel(intrin, threads, rows=rows, cols=cols)
        lib = lowering.build(func, target)
        arrays = [measure.random_array(t.shape, t.dtype, rng) for t in ins]
        arrays.append(np.zeros([int(s) for s in out.shape], measure.numpy_dtype(out.dtype)))
        (m,) = runner.measure([lib], arrays, number=5, repeat=15)
        if not m.ok:
            raise RuntimeError(f"the {name} peak kernel failed on {m.server}: {m.error}")
        gops = ops / m.seconds / 1e9
        if best is None or gops > best["gops"]:
            best = {"intrinsic": name, "threads": threads, "gops": gops, "block": f"{rows}x{cols}",
                    "ops_per_instruction": intrin.ops_per_instruction, "device": m.server}
    return best


@functools.cache
def _local_runner() -> LocalRunner:
    """This host's runner, one per process so that _measure's cache keys on it; made on first
    use, not on import (it prepares the host, which reads the ISA level `--isa` sets)."""
    return LocalRunner()


def peak(intrinsic, threads=1, target=None, runner=None):
    """{'gops', 'block', ...}: best GOPS of `intrinsic` over register-block shapes.

    Runs on this host, or on the device of `runner` (unit_tvm.fleet.RpcRunner; `target` then
    defaults to its servers'); raises ValueError when that device cannot execute the instruction.
    """
    intrin = intrinsics.get(intrinsic) if isinstance(intrinsic, str) else intrinsic
    local = runner is None or isinstance(runner, LocalRunner)
    if local:
        target = as_target(target)
        if not is_host(target):
            raise ValueError(f"peak is measured on this host (or through an RPC runner); "
                             f"{target} is not this host")
    else:
        target = as_target(target) if target is not None else runner.target()
    missing = intrin.missing_features(target)
    if missing:
        raise ValueError(f"{intrin.name} cannot run on {'this host' if local else runner}"
                         f": missing {', '.join(missing)}")
    return dict(_measure(intrin.name, int(threads), str(target),
                         _local_runner() if local else runner))


def host_threads():
    """Number of worker threads TVM uses on this host (the target's num-cores)."""
    return int(host().attrs.get("num-cores", 1))
