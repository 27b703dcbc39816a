"""The core's loops outside the instruction, as the CPU strategy names them: their extents
(the strategy's input), their loop variables, and which of them are the columns a register
tile's width pads and the channel blocks the instruction's vector operand varies along."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import tvm
from tvm import tirx

from .. import intrinsics
from ..te_expr import loads, substitute
from . import loop_order

if TYPE_CHECKING:
    from unit_tvm.prepare import Prepared


def outer_extents(prepared: Prepared) -> list[int]:
    """Extents of the core's data-parallel loops left outside the instruction (strategy input)."""
    core = prepared.core.op
    mapped = {m.op_index: m for m in prepared.mapping.loops}
    out = []
    for idx in sorted(_kept_axes(prepared)):
        ext = int(core.axis[idx].dom.extent)
        m = mapped.get(idx)
        out.append(ext if m is None else ext // m.intrin_extent)
    return out


def _kept_axes(prepared: Prepared) -> set[int]:
    """Indices of the core's data-parallel axes that leave an outer loop: all but those the
    instruction maps whole."""
    whole = {m.op_index for m in prepared.mapping.loops if m.op_extent == m.intrin_extent}
    return {i for i in range(len(prepared.core.op.axis)) if i not in whole}


def outer_axes(prepared: Prepared) -> list[str]:
    """Loop variable names of the core's outer data-parallel loops (outer_extents' order)."""
    kept = _kept_axes(prepared)
    return [ax.var.name for i, ax in enumerate(prepared.core.op.axis) if i in kept]


def row_loop(prepared: Prepared) -> int | None:
    """Position among outer_extents of the loop tiled_extent sizes (prepare's tile_columns):
    the op's innermost data-parallel loop the instruction does not map (a conv's output columns,
    a dense layer's rows). The core's outer loops start with the op's, in its order."""
    mapped = {m.op_loop for m in prepared.original_mapping.loops}
    free = [p for p, ax in enumerate(prepared.original.op.axis) if ax.var.name not in mapped]
    return free[-1] if free else None


def lanes_loop(prepared: Prepared) -> int | None:
    """Position among outer_extents of the loop the instruction's vector operand varies along
    and its broadcast operand does not (loop_order.lanes_loop), or None."""
    return loop_order.lanes_loop(loop_order.tile_operands(prepared), outer_axes(prepared))


class OuterReduction(NamedTuple):
    """A reduction loop of the core left outside the instruction: its axis, its steps, and
    how many of the axis' values one step covers (the instruction's extent where it is split
    by it, else 1)."""

    axis: tirx.IterVar
    steps: int
    stride: int


def outer_reductions(prepared: Prepared) -> list[OuterReduction]:
    """The core's reduction loops left outside the instruction, outermost first (the loops
    `schedule` passes to `apply` as its reduce loops)."""
    core = prepared.core.op
    n_spatial = len(core.axis)
    mapped = {m.op_index: m for m in prepared.mapping.loops}
    out = []
    for i, ax in enumerate(core.reduce_axis):
        m = mapped.get(n_spatial + i)
        if m is None:
            out.append(OuterReduction(ax, int(ax.dom.extent), 1))
        elif m.op_extent != m.intrin_extent:
            out.append(OuterReduction(ax, int(ax.dom.extent) // m.intrin_extent,
                                      m.intrin_extent))
    return out


def reduce_extents(prepared: Prepared) -> list[int]:
    """Steps of the core's reduction loops left outside the instruction, outermost first."""
    return [r.steps for r in outer_reductions(prepared)]


def broadcast_step_bytes(prepared: Prepared) -> int | None:
    """Bytes the instruction's broadcast operand's address moves per step of the outermost
    reduction loop outside the instruction (a GEMM's row: 4; an NCHW plane per input channel:
    its whole plane), or None (no broadcast operand, no such loop, an index that is not
    affine in it)."""
    intrin = intrinsics.get(prepared.mapping.intrinsic)
    name = next((a.op_tensor for a in prepared.mapping.operands
                 if a.intrin_operand == intrin.broadcast_operand), None)
    outer = outer_reductions(prepared)
    if name is None or not outer:
        return None
    var, step = outer[0].axis.var, outer[0].stride
    analyzer = tvm.sym.Analyzer()
    for load in loads(prepared.core.op.body[0]):
        tensor = load.args[0]
        if tensor.op.name != name:
            continue
        shape = [int(d) for d in tensor.shape]
        flat = sum(idx * math.prod(shape[i + 1:]) for i, idx in enumerate(list(load.args)[1:]))
        others = [(v, tirx.const(0, str(v.ty))) for v in tirx.analysis.undefined_vars(flat)
                  if not v.same_as(var)]
        moved = analyzer.simplify(substitute(flat, [*others, (var, tirx.const(step, str(var.ty)))])
                                  - substitute(flat, [*others, (var, tirx.const(0, str(var.ty)))]))
        if not isinstance(moved, tirx.IntImm):
            return None
        return abs(int(moved)) * tvm.DataType(str(tensor.dtype)).bits // 8
    return None
