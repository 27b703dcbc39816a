"""Cache blocks of a long reduction: the loops around the register tile sized from L1
(PolyDL's and Kelefouras's outer loops, BLIS's kc). A tile reads, per step of the reduction, a
vector of the weights per channel block it holds; over a reduction of 1024 input channels two
blocks of 16 float32 lanes are a 128 KB panel, which L1 cannot keep while the tile moves on to
the next pixels, so every tile streams it again from L2, with a line of the input per step
where the input steps from plane to plane (NCHW). Split into chunks of the reduction
that fit half of L1, every tile below the chunk loop re-reads the chunk's panel from L1; the
accumulators go to memory and back once per chunk (a few vectors per hundred instructions).

Measured on Zen 5 (float32, 2 threads, Table I's 1024 -> 512 1x1 conv at 14x14, % of the
peak): 67-76% as one block, 92.7% in chunks of 128 channels (the accumulators held in
registers across a chunk: the tile's prefetch calls, which LLVM must assume write memory,
are left out there, else it kept them in memory and ran at 33%). Where the default keeps a
reduction whole (weights beyond L2, an input that stays in a line), the tuner measures it
in blocks right after the default (schedules.cpu.seeds)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import tvm

from .. import intrinsics
from ..target import l1_bytes
from . import loop_order
from .cpu_loops import broadcast_step_bytes, lanes_loop, reduce_extents

if TYPE_CHECKING:
    from unit_tvm.prepare import Prepared

LINE_BYTES = 64  # a cache line
MIN_CHUNK = 32  # reduction steps per chunk at least: the accumulators' trip to memory amortised
L1_SHARE = 2  # the chunk's panel takes at most this part of L1 (the rest: the broadcast lines)


def reduction_chunk(reduce_extents: Sequence[int], panel_step_bytes: int, l1_bytes: int,
                    tiles_below: int, broadcast_step: int | None,
                    weights_in_l2: bool = True) -> int | None:
    """Steps of the outermost reduction loop (extent reduce_extents[0]) per cache block, or
    None where the whole reduction's panel fits in 1 / L1_SHARE of L1, where no tile below the
    block would re-read it (tiles_below < 2), where no divisor of at least MIN_CHUNK fits, or
    where the broadcast operand stays in a cache line for several steps (`broadcast_step`,
    its bytes per step, under LINE_BYTES: a GEMM's rows). There the weights' vectors are all
    a step streams from L2, the hardware prefetcher follows long rows, and chunks only cut
    them short: GEMM 128 x 2048 x 4096 ran 96.7% in one block, 85.5% in chunks of 128, 95.5%
    of 256 (Zen 5). Nor where the weights outgrow L2 (`weights_in_l2` False): there they
    come from memory in a model, a panel ahead is prefetched (unit_tvm.prefetch), and
    ResNet-50's 1x1 convs at 7x7 held to AVX2 (1-4 MB of weights, chunks of 32 steps) ran
    499-536 us in one block in the model and 586-641 in chunks, alone the same (Zen 5).
    panel_step_bytes: the vector operand's bytes the register tile reads per step of the
    innermost reduction (its channel blocks' vectors); the other reduction loops (a window's
    taps) run inside each step of the outermost one."""
    if (not reduce_extents or l1_bytes <= 0 or tiles_below < 2 or broadcast_step is None
            or broadcast_step < LINE_BYTES or not weights_in_l2):
        return None
    budget = l1_bytes // L1_SHARE
    per_step = panel_step_bytes * math.prod(reduce_extents[1:])
    outer = reduce_extents[0]
    if per_step * outer <= budget:
        return None
    fits = [d for d in range(MIN_CHUNK, outer) if outer % d == 0 and d * per_step <= budget]
    return max(fits) if fits else None


def tile_chunk(prepared: Prepared, target: tvm.target.Target, unroll: dict[int, int],
               steps: Sequence[int], order: Sequence[int], threads: int,
               anywhere: bool = False) -> int | None:
    """The cache block (reduction_chunk) of the prepared op's register tile `unroll` (loop
    position -> factor), whose outer loops take `steps` tiles each and run in `order` (those
    of one step left out), or None: only where its channel blocks' loop runs outermost,
    alone in the parallel loop with a step per thread. anywhere: whatever the input's step
    and the weights' size (a candidate for the tuner)."""
    lanes = lanes_loop(prepared)
    if lanes is None or not order or order[0] != lanes or steps[lanes] < threads:
        return None
    intrin = intrinsics.get(prepared.mapping.intrinsic)
    vector = [t for t in intrin.inputs if t.op.name != intrin.broadcast_operand]
    if len(vector) != 1:
        return None
    step_bytes = (math.prod(int(d) for d in vector[0].shape)
                  * tvm.DataType(str(vector[0].dtype)).bits // 8)
    in_l2 = loop_order.weights_in_l2(prepared, target)
    return reduction_chunk(reduce_extents(prepared), step_bytes * unroll.get(lanes, 1),
                           l1_bytes(target), math.prod(steps[p] for p in order[1:]),
                           LINE_BYTES if anywhere else broadcast_step_bytes(prepared),
                           anywhere or in_l2)
