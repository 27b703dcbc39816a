"""Which loop a CPU default config runs outermost (CpuConfig.front): the order that re-reads
the fewer bytes. A register tile of a broadcast instruction reads two operands: the vector one
(weights: they vary along the blocks of output channels or columns, the "lanes loop") and the
broadcast one (activations: they vary along the rows or pixels). With the lanes loop outermost
the vector operand is read once and the broadcast one once per step of that loop; with the
rows outermost, the other way round. Kelefouras-style: sizes decide, not a search."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import tvm
from tvm import tirx

from .. import intrinsics
from ..target import l2_bytes as l2_size
from ..te_expr import loads

if TYPE_CHECKING:
    from unit_tvm.prepare import Prepared


@dataclass(frozen=True)
class Operand:
    """One input of the instruction on the core: the loop variables its indices use and its
    size in bytes."""

    axes: frozenset[str]
    nbytes: int


@dataclass(frozen=True)
class TileOperands:
    """The vector and the broadcast operand of a broadcast instruction's core."""

    vector: Operand
    broadcast: Operand


def tile_operands(prepared: Prepared) -> TileOperands | None:
    """The core's vector and broadcast operands, or None (no broadcast operand, or other
    than one vector operand: a tile or lanewise instruction)."""
    intrin = intrinsics.get(prepared.mapping.intrinsic)
    tensor_of = {o.intrin_operand: o.op_tensor for o in prepared.mapping.operands}
    broadcast = tensor_of.get(intrin.broadcast_operand or "")
    vector = [t for t in tensor_of.values() if t != broadcast]
    if broadcast is None or len(vector) != 1:
        return None
    axes: dict[str, set[str]] = {}
    sizes: dict[str, int] = {}
    for load in loads(prepared.core.op.body[0]):
        tensor = load.args[0]
        names = axes.setdefault(tensor.op.name, set())
        for index in list(load.args)[1:]:
            names.update(v.name for v in tirx.analysis.undefined_vars(index))
        dtype = tvm.DataType(str(tensor.dtype))
        sizes[tensor.op.name] = (math.prod(int(s) for s in tensor.shape)
                                 * dtype.bits * dtype.lanes // 8)
    return TileOperands(Operand(frozenset(axes.get(vector[0], ())), sizes.get(vector[0], 0)),
                        Operand(frozenset(axes.get(broadcast, ())), sizes.get(broadcast, 0)))



def weights_in_l2(prepared: Prepared, target: tvm.target.Target) -> bool:
    """Whether the instruction's vector operand (a conv's or dense layer's weights) fits in
    the target's L2: where it does not, a model reads it from memory."""
    operands = tile_operands(prepared)
    return operands is not None and operands.vector.nbytes <= l2_size(target)

def lanes_loop(operands: TileOperands | None, axes: Sequence[str]) -> int | None:
    """Position in `axes` (the core's outer loop variables, outermost first) of the first loop
    the vector operand varies along and the broadcast one does not (a conv's blocks of output
    channels, a dense layer's blocks of columns), or None."""
    if operands is None:
        return None
    return next((p for p, a in enumerate(axes)
                 if a in operands.vector.axes and a not in operands.broadcast.axes), None)


def front(operands: TileOperands | None, axes: Sequence[str], steps: Sequence[int],
          l2_bytes: int, l1_bytes: int = 0) -> int:
    """CpuConfig.front for outer loops `axes` taking `steps` register tiles each: the lanes
    loop (the broadcast operand re-read once per further step of it) or the rows (the first
    loop only the broadcast operand varies along: the vector operand re-read per row step),
    whichever re-reads fewer bytes from beyond a core's L2 (an operand larger than
    `l2_bytes`), then from beyond its L1 (larger than `l1_bytes`), then fewer bytes in all; -1
    where that loop is outermost already, or where a loop moves both operands (a batched
    matmul's batch) or either is missing. Measured (Zen 5,
    1 MB L2, fp32, 2 threads, % of the peak): ResNet-50's 1x1 convs whose input outgrows L2
    (512 -> 128 at 28x28, 256 -> 64 at 56x56, 256 -> 512 stride 2) 82-85 with blocks first,
    88-90 with rows; 3x3 convs of 64 channels at 56x56 and 128 at 28x28 93-95 with blocks
    first, 86-87 with rows; 1024 -> 2048 stride 2 at 14x14 (8 MB of weights) 91 with blocks,
    79 with rows; BERT's dense layers chose their column blocks first in every tuning run.
    ResNet's stem (37 KB of weights, an L1's worth on Zen 5, re-read per row; 635 KB of input
    re-read per pair of channel blocks), in the model, min of 2 runs: 571 us blocks first,
    480 rows first."""
    lanes = lanes_loop(operands, axes)
    if operands is None or lanes is None or steps[lanes] <= 1:
        return -1
    vec, bc = operands.vector, operands.broadcast
    live = [p for p, n in enumerate(steps) if n > 1]
    if any(axes[p] in vec.axes and axes[p] in bc.axes for p in live):
        return -1
    rows = next((p for p in live if axes[p] in bc.axes and axes[p] not in vec.axes), None)
    if rows is None:
        return -1

    def rereads(operand: Operand, times: int) -> tuple[int, int, int]:
        extra = (times - 1) * operand.nbytes
        return (extra if operand.nbytes > l2_bytes else 0,
                extra if operand.nbytes > l1_bytes else 0, extra)

    first = lanes if rereads(bc, steps[lanes]) <= rereads(vec, steps[rows]) else rows
    return -1 if first == live[0] else first
