"""Fused attention on a CPU: softmax(Q x K^T * scale) x V in one kernel, the scores of a block
of query rows kept in cache between the two products.

Computed as three matmul-shaped kernels (Q x K^T, softmax, P x V), Whisper-sized attention
(6 heads x 1500 tokens) writes 54 MB of float32 scores, reads them back for the softmax, writes
the probabilities and reads them again for P x V: 12.4 ms per layer on Zen 5 against 5.6 ms
here (docs/RESULTS.md 2026-11-28). Per task (one head, `rows` query rows):

- S = Q x K^T with a broadcast dot-product instruction on bf16 pairs (x86.vdpbf16ps; or on
  u8 x s8 words, x86.vpdpbusd: the int8 stages of cpu_attention_int8.py): Q rows rounded to
  bf16, K packed once per call into [keys / lanes, depth / width, lanes, width] blocks; a
  register tile of `row_tile` rows x `key_blocks` blocks of keys;
- the row maximum, E = exp(S * scale - max) (float32, then rounded to bf16) and the row sum of
  E, row by row in L1 (vectors of partial results for the reductions);
- O = E x V with the same instruction, V packed into [keys / width, depth / lanes, lanes,
  width] blocks, and O / sum.

Rounding: both products take bf16 operands and sum in float32, as the bf16 attention matmuls
do (relax/cpu/qbmm.py); E is rounded before both its sum and the product, so the normalisation
matches what was multiplied. Keys are padded to whole tiles with zero K and V rows and scores
of -inf; query rows to whole register tiles (the padded rows are computed and dropped).

A mask (Operands.mask: causal, padding, ALiBi-like biases added, or a fill value put in place
of the masked scores) is applied to the scaled scores as they are read, in both passes over a
row; it is read where its producer left it, broadcast over heads, rows or keys by its reader,
never materialised per head.

Special values, as torch: a row whose scores are all -inf (every key masked) gives 0 (`safe`,
torch's safe softmax) or NaN (a plain softmax); a NaN or an infinite score makes its row NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tvm import s_tir, te, tirx

from .. import fastmath
from ..indexing import ravel
# the kernel's shape, tiles and operand readers: public here too (callers name them
# cpu_attention.AttentionShape, ...)
from .attention_shapes import AttentionShape, AttentionTiles, Operands  # noqa: F401
from .cpu_attention_int8 import Softmaxed, int8_stages
from .cpu_stages import vectorize_partials

if TYPE_CHECKING:
    from tvm.s_tir.schedule import LoopRV, SBlockRV

    from unit_tvm.intrinsics import Intrinsic

# Accumulators of the two products' register tiles: 4 rows x 4 blocks of 16 lanes (measured
# on Zen 5 at Whisper's size: 4 x 4, 5 x 3 and 5 x 4, and 4, 5 or 6 rows x 4 blocks for E x V,
# within 2%; 4 rows x 6 blocks of keys, 24 accumulators, were stored after every instruction)
ROW_TILE = 4
# blocks of keys per S register tile: the most whose padded key count stays within
# KEY_PADDING of the least padded one (Whisper's 1500 keys: 4 blocks, 1536 keys, 6.0 ms; 2
# blocks, 1504 keys, 6.6 ms)
KEY_BLOCKS = (4, 3, 2)
KEY_PADDING = 1.125
MAX_OUT_BLOCKS = 4
# query rows per task: their scores (rows x keys float32) stay in L2 from S to E; 20 rows of
# 1536 keys are 123 KB (within 2% from 20 to 60 rows at Whisper's size). Their bf16 exps live
# on the worker thread's stack: MAX_TASK_BYTES bounds the scores of one task (and so how many
# keys a fused attention takes: 16384).
MAX_TASK_ROWS = 32
MAX_TASK_BYTES = 256 * 1024
# Scores smaller than this stay in cache between three separate kernels, which then run as fast
# or faster (Zen 5, per layer: BERT-base's 12 x 128 x 128 scores, 768 KB: 95 us separate, 107
# fused; ViT-B/16's 12 x 197 x 197, 1.8 MB: 510 and 324; Whisper's 6 x 1500 x 1500, 54 MB:
# 12.4 ms and 6.0)
MIN_SCORES_BYTES = 1 << 20


OUT_STAGE = "attention_out"  # the result's rows unpadded and its axes permuted


def _ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


def _task_rows_bound(keys_padded: int) -> int:
    return min(MAX_TASK_ROWS, MAX_TASK_BYTES // (4 * keys_padded))


def fits(shape: AttentionShape, lanes: int, width: int) -> bool:
    """Whether the instruction's lanes and width tile the head depths (the reduction of
    Q x K^T in pairs of `width`, the columns of E x V in blocks of `lanes`) and a register
    tile of rows fits one task's bound."""
    return (shape.depth % width == 0 and shape.v_depth % lanes == 0
            and _task_rows_bound(tiles_for(shape, lanes).keys_padded) >= ROW_TILE)


def worth_fusing(shape: AttentionShape) -> bool:
    """Whether the fused kernel is expected to beat separate ones: scores of at least
    MIN_SCORES_BYTES."""
    return 4 * shape.batch * shape.rows * shape.keys >= MIN_SCORES_BYTES


def tiles_for(shape: AttentionShape, lanes: int) -> AttentionTiles:
    """The blocking of the module note for `shape` (keys padded to whole blocks of `lanes`,
    which also makes them whole pairs)."""
    padded = {b: _ceil_to(shape.keys, lanes * b) for b in KEY_BLOCKS}
    least = min(padded.values())
    blocks = next(b for b in KEY_BLOCKS if padded[b] <= KEY_PADDING * least)
    rows_padded = _ceil_to(shape.rows, ROW_TILE)
    tiles = rows_padded // ROW_TILE
    bound = max(_task_rows_bound(padded[blocks]), ROW_TILE)
    per_task = max(t for t in range(1, tiles + 1) if tiles % t == 0 and t * ROW_TILE <= bound)
    out = max(b for b in range(1, MAX_OUT_BLOCKS + 1) if (shape.v_depth // lanes) % b == 0)
    return AttentionTiles(rows_padded, per_task * ROW_TILE, ROW_TILE, padded[blocks], blocks,
                          out)


def attention_te(read: Operands, shape: AttentionShape, tiles: AttentionTiles, scale: float,
                 safe: bool, lanes: int, width: int, dtype: str,
                 out_axes: Sequence[int] | None = None,
                 result_dims: Sequence[int] | None = None) -> te.Tensor:
    """The stages of the module note as te.computes over the operands `read` gives (of `shape`,
    the batch flattened), the products' operands of `dtype`: "bfloat16", or "uint8" for the
    int8 stages (cpu_attention_int8.py; there `safe` matters only where a mask makes every
    score of a row -inf);
    returns the output, [batch, rows, v_depth] (or `result_dims`: the batch unflattened) with
    its axes in `out_axes` order (None: as they are)."""
    if dtype == "uint8":
        front = int8_stages(read, shape, tiles, scale, safe, lanes, width)
    else:
        front = _bf16_stages(read, shape, tiles, scale, safe, lanes, width, dtype)
    b, np_, acc = shape.batch, tiles.keys_padded, front.accumulator
    probs, vp = front.probs, front.v_blocks
    k = te.reduce_axis((0, np_), name="k2")
    total = te.compute((b, tiles.rows_padded), lambda h, i: te.sum(
        probs[h, i, k].astype(acc), axis=k), name="row_sum")
    j = te.reduce_axis((0, np_), name="j")
    weighted = te.compute((b, tiles.rows_padded, shape.v_depth), lambda h, i, c: te.sum(
        probs[h, i, j].astype(acc)
        * vp[h, j // width, c // lanes, c % lanes, j % width].astype(acc), axis=j),
        name="weighted")
    out = te.compute((b, tiles.rows_padded, shape.v_depth),
                     lambda h, i, c: front.normalised(weighted, total, h, i, c), name="attention")
    return _laid_out(out, shape, tiles, out_axes, result_dims)


def _bf16_stages(read: Operands, shape: AttentionShape, tiles: AttentionTiles, scale: float,
                 safe: bool, lanes: int, width: int, dtype: str) -> Softmaxed:
    """The bf16 stages of the module note up to E rounded to bf16."""
    b, n, np_ = shape.batch, shape.keys, tiles.keys_padded
    f32, zero = "float32", tirx.const(0.0, "float32")
    neg_inf = tirx.const(-math.inf, f32)
    last = shape.rows - 1
    qb = te.compute((b, tiles.rows_padded, shape.depth),
                    lambda h, i, d: read.q(h, te.min(i, last), d).astype(dtype), name="q_rows")

    def key(j):  # a padded key reads the last one (and is masked)
        return te.min(j, n - 1)

    kp = te.compute((b, np_ // lanes, shape.depth // width, lanes, width),
                    lambda h, jo, dp, jl, w: te.if_then_else(
                        jo * lanes + jl < n, read.kt(h, dp * width + w, key(jo * lanes + jl)),
                        zero).astype(dtype), name="k_blocks")
    vp = te.compute((b, np_ // width, shape.v_depth // lanes, lanes, width),
                    lambda h, jp, do, dl, w: te.if_then_else(
                        jp * width + w < n, read.v(h, key(jp * width + w), do * lanes + dl),
                        zero).astype(dtype), name="v_blocks")
    d = te.reduce_axis((0, shape.depth), name="d")
    scores = te.compute((b, tiles.rows_padded, np_), lambda h, i, j: te.sum(
        qb[h, i, d].astype(f32) * kp[h, j // lanes, d // width, j % lanes, d % width].astype(f32),
        axis=d), name="scores")
    k = te.reduce_axis((0, np_), name="k")
    row_max = te.compute((b, tiles.rows_padded), lambda h, i: te.max(
        tirx.Select(k < n, read.masked(scores[h, i, k] * scale, shape, h, i, k), neg_inf),
        axis=k), name="row_max")

    def exp_of(h, i, j):
        s = read.masked(scores[h, i, j] * scale, shape, h, i, j)
        x = s - row_max[h, i]
        # x is NaN for a NaN score, an infinite one (inf - inf), which make the row NaN as in
        # torch, and throughout a row of -inf scores, whose exps are 0 (the maximum alone cannot
        # tell: te.max, like LLVM's maxnum, drops NaNs, and a row of NaNs has a maximum of -inf
        # too). A condition on the row alone in the if_then_else would split the vector loop in
        # two, and TVM's vectorizer then rejects the exp's Let bindings, copied into both.
        nan = tirx.const(math.nan, f32)
        special = tirx.Select(tirx.any(tirx.isnan(s), row_max[h, i] != neg_inf), nan, zero)
        # x <= 0, and E is rounded to bf16: the shorter exp (measured 6% of the kernel)
        value = tirx.Select(tirx.isnan(x), special, fastmath.exp_nonpositive_bf16(x))
        return te.if_then_else(j < n, value, zero)

    # float32 first, then rounded in a stage of its own: TVM's bf16 rounding reads its operand
    # twice, and a copy of the exp's Let bindings fails to vectorize
    exps = te.compute((b, tiles.rows_padded, np_), exp_of, name="exps")
    probs = te.compute((b, tiles.rows_padded, np_), lambda h, i, j: exps[h, i, j].astype(dtype),
                       name="probs")

    def normalised(weighted, total, h, i, c):
        value = weighted[h, i, c] / total[h, i]  # a row of -inf: 0 / 0, NaN as a softmax's
        if safe:  # ... and 0 as torch's safe softmax's (a NaN row stays NaN)
            t = total[h, i]
            return tirx.Select(tirx.any(t > zero, tirx.isnan(t)), value, zero)
        return value

    return Softmaxed(probs, vp, f32, normalised)


def _laid_out(out: te.Tensor, shape: AttentionShape, tiles: AttentionTiles,
              out_axes: Sequence[int] | None,
              result_dims: Sequence[int] | None = None) -> te.Tensor:
    """The normalised result `out` without its padded rows, of `result_dims` ([batch, rows,
    v_depth] or with the batch axes unflattened) with its axes in `out_axes` order."""
    logical = tuple(result_dims or (shape.batch, shape.rows, shape.v_depth))
    axes = tuple(out_axes) if out_axes is not None else tuple(range(len(logical)))
    if tiles.rows_padded == shape.rows and axes == (0, 1, 2):
        return out

    def unpermuted(*idx):
        at = [None] * len(logical)
        for axis, i in zip(axes, idx):
            at[axis] = i
        return out[ravel(at[:-2], logical[:-2]), at[-2], at[-1]]

    return te.compute([logical[a] for a in axes], unpermuted, name=OUT_STAGE)


def _partial_sums(sch: s_tir.Schedule, block: SBlockRV, lanes: int) -> SBlockRV:
    """A reduction (over a row, or a head's values) as `lanes` vectors of partial results
    (rfactor, the lanes after the result's own axes): returns that block."""
    _, lane = sch.split(sch.get_loops(block)[-1], [None, lanes])
    return sch.rfactor(lane, factor_axis=len(sch.get(block).writes[0].region))


def _register_tiled(sch: s_tir.Schedule, block: SBlockRV, tile_rows: int, tile_cols: int,
                    lanes: int, width: int, cols_first: bool) -> LoopRV:
    """The product `block` ([rows, cols, reduction] innermost loops) as register tiles of
    tile_rows x tile_cols blocks of `lanes` columns around the instruction's (lanes, width)
    loops; the tile written back once per tile. Returns the instruction's outer loop."""
    rows, cols, red = sch.get_loops(block)[-3:]
    r_out, r_in = sch.split(rows, [None, tile_rows])
    c_blocks, c_lane = sch.split(cols, [None, lanes])
    c_out, c_in = sch.split(c_blocks, [None, tile_cols])
    steps, w = sch.split(red, [None, width])
    outer = (c_out, r_out) if cols_first else (r_out, c_out)
    sch.reorder(*outer, steps, r_in, c_in, c_lane, w)
    write_back = sch.cache_write(block, 0, "global")
    sch.reverse_compute_at(write_back, outer[1])
    # the copy unrolled into whole vectors: LLVM then stores the accumulators straight to the
    # result; as a loop it stored them to the stack and copied them from there (the int8
    # kernel at Whisper's size: 3.64 against 3.83 ms)
    wb_rows, wb_cols = sch.get_loops(write_back)[-2:]
    wb_blocks, wb_lane = sch.split(wb_cols, [None, lanes])
    sch.unroll(wb_rows)
    sch.unroll(wb_blocks)
    sch.vectorize(wb_lane)
    sch.unroll(r_in)
    sch.unroll(c_in)
    sch.decompose_reduction(block, steps)
    return c_lane


def _parallel_pack(sch: s_tir.Schedule, name: str) -> None:
    # its innermost loops as vectors (a block's lanes x width) measured slower: gathers
    loops = sch.get_loops(sch.get_sblock(name))
    sch.parallel(sch.fuse(loops[0], loops[1]))


def _int8_preludes(sch: s_tir.Schedule, lanes: int, width: int) -> None:
    """The int8 stages' passes over whole heads (cpu_attention_int8.py): each operand's |max|
    as vectors of partial results, heads in parallel, and K's sums per key."""
    for name in ("q_amax", "k_amax", "v_amax"):
        rf = _partial_sums(sch, sch.get_sblock(name), lanes)
        loops = sch.get_loops(rf)
        sch.parallel(loops[0])
        sch.vectorize(loops[-1])
        sch.decompose_reduction(rf, loops[1])
    # K's sums: 16 keys at a time, along the packed blocks' lanes
    sums = sch.get_sblock("k_sums")
    head, key, depth = sch.get_loops(sums)
    _, key_lane = sch.split(key, [None, lanes])
    steps, step = sch.split(depth, [None, width])
    sch.reorder(steps, step, key_lane)
    sch.parallel(head)
    sch.vectorize(key_lane)
    sch.decompose_reduction(sums, steps)


def _softmax_by_rows(sch: s_tir.Schedule, partial: dict[str, SBlockRV], lanes: int) -> None:
    """The softmax row by row inside the task: its reductions and exps while the row is in
    L1, vectorised."""
    probs, exps = sch.get_sblock("probs"), sch.get_sblock("exps")
    row = sch.get_loops(probs)[-2]
    sch.compute_at(exps, row, preserve_unit_loops=False)
    sch.compute_at(sch.get_sblock("row_max"), row, preserve_unit_loops=False)
    sch.compute_at(partial["row_max"], row, preserve_unit_loops=False)
    sch.reverse_compute_at(partial["row_sum"], row, preserve_unit_loops=False)
    sch.reverse_compute_at(sch.get_sblock("row_sum"), row, preserve_unit_loops=False)
    for rf in partial.values():
        vectorize_partials(sch, rf)
    for block in (exps, probs):
        sch.vectorize(sch.split(sch.get_loops(block)[-1], [None, lanes])[1])


def schedule(func: tirx.PrimFunc, tiles: AttentionTiles, intrin: Intrinsic,
             lanes: int) -> tirx.PrimFunc:
    """The PrimFunc of attention_te's stages scheduled as the module note says, the products
    tensorized with `intrin` (an Intrinsic of `lanes` x its reduction width: bf16 pairs, or
    u8 x s8 words for the int8 stages)."""
    sch = s_tir.Schedule(func)
    width = intrin.reduction_width
    for name in ("q_rows", "k_blocks", "v_blocks"):
        _parallel_pack(sch, name)
    if _has(sch, "k_sums"):  # the int8 stages: per-head scales and K's sums, before the tasks
        _int8_preludes(sch, lanes, width)
    partial = {name: _partial_sums(sch, sch.get_sblock(name), lanes)
               for name in ("row_max", "row_sum")}
    final = sch.get_sblock("attention")
    head, rows, cols = sch.get_loops(final)
    rows_out, _ = sch.split(rows, [None, tiles.task_rows])
    task = sch.fuse(head, rows_out)
    sch.parallel(task)
    for name in ("weighted", "row_sum", "row_sum.rf", "probs", "exps", "row_max", "row_max.rf",
                 "scores"):
        block = partial[name[:-3]] if name.endswith(".rf") else sch.get_sblock(name)
        sch.compute_at(block, task, preserve_unit_loops=False)
    _softmax_by_rows(sch, partial, lanes)
    # S: each panel of key blocks stays in L1 while the task's row tiles pass it
    core = _register_tiled(sch, sch.get_sblock("scores"), tiles.row_tile, tiles.key_blocks,
                           lanes, width, cols_first=True)
    sch.tensorize(core, intrin.tensor_intrin)
    core = _register_tiled(sch, sch.get_sblock("weighted"), tiles.row_tile, tiles.out_blocks,
                           lanes, width, cols_first=False)
    sch.tensorize(core, intrin.tensor_intrin)
    sch.vectorize(sch.split(sch.get_loops(final)[-1], [None, lanes])[1])
    # E in a scope of its own: TVM's StorageRewrite would otherwise place it in a dead float32
    # buffer of the same scope (a tile of S), as a bf16 view, and the instruction's bf16 pointer
    # to it then fails to lower (seen with 16 keys)
    sch.set_scope(sch.get_sblock("probs"), 0, "local")
    if _has(sch, OUT_STAGE):  # written per task, from the task's rows in cache
        # the task's normalised rows in a scope of their own too: sharing a buffer with them
        # (StorageRewrite's choice), P x V's accumulator tile was left in memory, stored after
        # every instruction (Whisper: 9.8 ms against 6.0)
        sch.set_scope(final, 0, "local")
        out = sch.get_sblock(OUT_STAGE)
        sch.reverse_compute_at(out, task, preserve_unit_loops=False)
        sch.vectorize(sch.split(sch.get_loops(out)[-1], [None, lanes])[1])
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def _has(sch: s_tir.Schedule, name: str) -> bool:
    try:
        sch.get_sblock(name)
        return True
    except s_tir.ScheduleError:
        return False
