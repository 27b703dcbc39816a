"""The core's loops outside the instruction, as the CPU strategy names them: their extents
(the strategy's input), their loop variables, and which of them are the columns a register
tile's width pads and the channel blocks the instruction's vector operand varies along."""

from __future__ import annotations

from typing import TYPE_CHECKING

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
