"""Row-wise operators (softmax, layer norm) scheduled as one parallel pass over their rows.

TVM legalizes softmax into four loop nests (row max, exp, row sum, divide) and layer norm into
two (the moments, the normalisation). Scheduled one by one, each is a parallel region of its
own over the whole tensor: four fork-joins of the thread pool per softmax, and the exps written
to a buffer as large as the input and read back. Here every stage is computed inside the final
stage's parallel loop over rows, so a row's values stay in L1 from the first stage to the last;
inside a row, elementwise stages are vectorised and a row reduction accumulates vectors of
partial results (rfactor) where the row length allows.
"""

import math

import tvm
from tvm import s_tir

from ...schedules.cpu_stages import vectorize_partials


def row_fused(func, widths, min_rows, vectorize) -> "tvm.tirx.PrimFunc | None":
    """`func` scheduled row by row (see the module note), or None when it is not a row-wise
    operator: every stage iterates over the same leading row axes as the last one plus one
    inner axis (the row), reads the other stages' results at its own row only, and there are
    at least `min_rows` rows. `vectorize(sch, loop, extent)` splits off and vectorises a loop's
    lanes."""
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    rows = _row_extents(sch, blocks)
    if rows is None or len(blocks) < 2 or math.prod(rows) < min_rows:
        return None
    try:
        partials = [_partial_sums(sch, b, widths) for b in blocks[:-1]]
        final = sch.get_loops(blocks[-1])
        row = sch.fuse(*final[:len(rows)]) if len(rows) > 1 else final[0]
        sch.parallel(row)
        stages = [s for b, rf in zip(blocks[:-1], partials) for s in (rf, b) if s is not None]
        for block in reversed(stages):
            sch.compute_at(block, row, preserve_unit_loops=False)
        for block in [*stages, blocks[-1]]:
            if any(s is not None and s.same_as(block) for s in partials):
                vectorize_partials(sch, block)
            elif all(iv.iter_type == 0 for iv in sch.get(block).iter_vars):
                loops = sch.get_loops(block)  # the row loop, then the stage's own (if any:
                loop = loops[-1]  # compute_at drops an extent-1 one)
                if len(loops) > 1 and int(sch.get(loop).extent) >= widths.narrow:
                    vectorize(sch, loop, int(sch.get(loop).extent))
    except (s_tir.ScheduleError, tvm.error.InternalError, ValueError):
        return None
    return sch.mod["main"]


def _partial_sums(sch, block, widths):
    """A row reduction as vectors of partial results (rfactor: the returned block) summed per
    row by `block`; None for any other stage (an elementwise one, a short row, a reduction of
    two values at once: those stay scalar, in L1 all the same). The vector is the widest of
    the register's, the narrow one and 4 lanes that divides the row (Whisper's 1500 frames: 4);
    ValueError for a row that none divides (ViT's 197 tokens): compute_at drops the predicate
    of a last, partial vector (TVM 0.27), and the sums then read past the row."""
    loops = sch.get_loops(block)
    if sch.get(block).iter_vars[-1].iter_type == 0:
        return None
    extent = int(sch.get(loops[-1]).extent)
    width = next((w for w in (widths.lanes, widths.narrow, 4) if extent % w == 0), None)
    if width is None:
        raise ValueError(f"a row of {extent} is no multiple of {widths.narrow} or 4 lanes")
    if extent < 2 * width:
        return None
    _, lanes = sch.split(loops[-1], [None, width])
    try:
        return sch.rfactor(lanes, factor_axis=len(sch.get(block).iter_vars) - 1)
    except s_tir.ScheduleError:
        return None


def _row_extents(sch, blocks):
    """The row axes' extents shared by every block, or None (see row_fused)."""
    last = sch.get(blocks[-1])
    if any(iv.iter_type != 0 for iv in last.iter_vars) or len(last.iter_vars) < 2:
        return None
    rows = [int(iv.dom.extent) for iv in last.iter_vars[:-1]]
    written = {w.source for b in blocks[:-1] for w in sch.get(b).writes}
    for b in blocks:
        stmt = sch.get(b)
        ivs = stmt.iter_vars
        if (len(ivs) != len(rows) + 1 or [int(iv.dom.extent) for iv in ivs[:-1]] != rows
                or any(iv.iter_type != 0 for iv in ivs[:-1])
                or len(sch.get_loops(b)) != len(ivs)):
            return None
        for region in stmt.reads:
            if region.source in written and not _at_own_row(region, ivs, len(rows)):
                return None
    return rows


def _at_own_row(region, ivs, n_rows):
    """Whether a read region indexes the leading n_rows axes by the block's own row variables
    (one element each): then computing the producer per row computes each element once."""
    return len(region.region) >= n_rows and all(
        isinstance(r.min, tvm.tirx.Var) and r.min.same_as(iv.var) and int(r.extent) == 1
        for r, iv in zip(region.region[:n_rows], ivs[:n_rows]))
