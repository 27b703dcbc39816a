"""The output columns an op computes for its default register tile, decided from the prepared op
as the graph pass decides them from its recipe: where the tile reuses operands (16 vector
registers, register_tiles.reuses_operands), register_tiles.tiled_extent widens the columns
to a count its 12-accumulator tile divides, given the channel blocks and whether a window
reads the columns. The op-level path (rewriter.prepare_for) prepares an op once with the
plain rule, asks here, and prepares it again where the answer differs. One difference from
the graph pass: an op on its own reads widened columns from a padded copy of its NCHW input
(prepare's producer stage), which a strided 1x1 conv with weights in L2 does not repay, so it
keeps its columns; the graph pass copies its producer's channel blocks, which measured cheap
(ResNet-50's stride-2 projections held to AVX2, widened: 93% of the peak), and widens them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import tvm
from tvm import tirx

from .. import intrinsics
from ..te_expr import loads, substitute
from .cpu_loops import lanes_loop, outer_extents, row_loop
from .loop_order import weights_in_l2
from .register_tiles import reuses_operands, tile_registers, tiled_extent

if TYPE_CHECKING:
    from unit_tvm.intrinsics import Intrinsic
    from unit_tvm.prepare import Prepared


def tile_columns(prepared: Prepared, intrin: Intrinsic,
                 target: tvm.target.Target | None) -> int | None:
    """Output columns the default tile wants computed where they differ from the prepared
    op's, else None. Measured on Zen 5 held to AVX2 (Table I in float32, min of 5 interleaved
    rounds, % of 262 GFLOPS): L1 288 -> 384 3x3 stride 2 at 17 columns 66.8 -> 95.3% (18
    columns, 4 x 3), L8 1024 -> 512 1x1 at 14 81.3 -> 92.7% (15), L13 576 -> 128 75.0 ->
    86.3%, L3 1056 -> 192 1x1 at 7 70.2 -> 78.4% (8 columns, 6 x 2); a 128 x 2048 x 4096
    GEMM's rows 128 -> 132 (6 rows x 2 blocks) 80.4 -> 93.4% (3 rows x 4 blocks on 129,
    the operands of 17 registers, 75.2%)."""
    if target is None or prepared.original is None or not reuses_operands(intrin, target):
        return None
    lanes, row = lanes_loop(prepared), row_loop(prepared)
    if lanes is None or row is None or lanes == row:
        return None
    column = prepared.original.op.axis[row]
    extents = outer_extents(prepared)
    window = _window_reads(prepared, column.var.name)
    if not window and _strided_columns(prepared, column.var) and weights_in_l2(prepared, target):
        return None
    wanted = tiled_extent(int(column.dom.extent), reuse=True, blocks=extents[lanes],
                          registers=tile_registers(intrin, target) or 0,
                          window=window, columns_inner=row > lanes)
    return wanted if wanted != extents[row] else None


# A strided 1x1 conv computed on more columns than its output has reads them from a padded
# copy of its whole input, stride^2 times the pixels it reads. Measured on Zen 5 held to AVX2
# (min of 5 interleaved rounds, two runs, % of 258.9 GFLOPS): 64 -> 128 stride 2 at 56x56
# (Table I's L15) 28 columns in 2 x 4 tiles 84.6-91.0% against 45-79% widened to 30 for
# 4 x 3; 128 -> 128 79.7-87.5% against 50-51.5%; 64 -> 64 72.4% against 27.1%; 256 -> 512
# (512 KB of weights) 67-83% against 71-73%. With weights beyond L2 the kernel is slow
# enough that the 12-accumulator tile pays: 512 -> 1024 stride 2 at 28x28 (2 MB) 81.0%
# widened to 15 columns against 70.4% on 14, 1024 -> 2048 at 14x14 61.3 against 59.7%.
def _strided_columns(prepared: Prepared, column: tirx.Var) -> bool:
    """Whether the instruction's broadcast operand reads the columns with a stride above 1
    (an index that steps by more than one element per column)."""
    analyzer = tvm.sym.Analyzer()
    for index in _broadcast_indices(prepared):
        free = list(tirx.analysis.undefined_vars(index))
        if not any(v.same_as(column) for v in free):
            continue
        at = [(v, tirx.const(0, str(v.ty))) for v in free if not v.same_as(column)]
        one = substitute(index, at + [(column, tirx.const(1, str(column.ty)))])
        zero = substitute(index, at + [(column, tirx.const(0, str(column.ty)))])
        step = analyzer.simplify(one - zero)
        if isinstance(step, tirx.IntImm) and abs(int(step)) > 1:
            return True
    return False



def _window_reads(prepared: Prepared, column: str) -> bool:
    """Whether the instruction's broadcast operand reads the columns through a window: one of
    its indices combines the column variable with a reduction of more than one step (a conv's
    s * j + rs),
    as tensorized_graph's `window` (a kernel of more than one pixel) says for the graph pass."""
    op = prepared.original.op
    reduce = {ax.var.name for ax in op.reduce_axis if int(ax.dom.extent) > 1}
    for index in _broadcast_indices(prepared):
        names = {v.name for v in tirx.analysis.undefined_vars(index)}
        if column in names and names & reduce:
            return True
    return False


def _broadcast_indices(prepared: Prepared) -> list:
    """The indices of every load of the instruction's broadcast operand in the original op."""
    intrin = intrinsics.get(prepared.mapping.intrinsic)
    tensor = next((a.op_tensor for a in prepared.original_mapping.operands
                   if a.intrin_operand == intrin.broadcast_operand), None)
    return [index for load in loads(prepared.original.op.body[0])
            if load.args[0].op.name == tensor for index in list(load.args)[1:]]
