"""What a fused attention kernel computes and reads (schedules/cpu_attention.py builds it; its
int8 stages, cpu_attention_int8.py, read the same): the shape, the tiles, the operand readers.
A module of its own so that both import it without importing each other."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple

from tvm import te

if TYPE_CHECKING:
    import tvm


class AttentionShape(NamedTuple):
    """softmax(Q x K^T) x V over `batch` independent (flattened) heads: Q [batch, rows, depth],
    K^T [batch, depth, keys], V [batch, keys, v_depth]."""

    batch: int
    rows: int
    depth: int
    keys: int
    v_depth: int


class AttentionTiles(NamedTuple):
    """How the kernel blocks its loops."""

    rows_padded: int  # query rows computed: a multiple of row_tile
    task_rows: int  # query rows per parallel task: divides rows_padded
    row_tile: int
    keys_padded: int  # a multiple of lanes x key_blocks
    key_blocks: int  # blocks of `lanes` keys per S register tile
    out_blocks: int  # blocks of `lanes` output columns per O register tile


class Operands(NamedTuple):
    """How the kernel reads its operands: functions of a (flattened) head and two indices to a
    float32 te expression: q(h, i, d), kt(h, d, j) (K^T: j a key), v(h, j, c); and mask(score,
    h, i, j), the scaled score of row i and key j of head h as the mask leaves it (plus a bias,
    or a fill value in its place; None: no mask)."""

    q: Callable
    kt: Callable
    v: Callable
    mask: Callable | None = None

    def masked(self, score: tvm.ir.Expr, shape: AttentionShape, h: tvm.ir.Expr, i: tvm.ir.Expr,
               j: tvm.ir.Expr) -> tvm.ir.Expr:
        """The scaled `score` of row i and key j of head h as the mask leaves it (a padded row
        or key reads the last one: both products' operands do the same), or `score`."""
        if self.mask is None:
            return score
        return self.mask(score, h, te.min(i, shape.rows - 1), te.min(j, shape.keys - 1))
