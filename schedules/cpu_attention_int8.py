"""The int8 stages of the fused attention (schedules/cpu_attention.py): both products on a
u8 x s8 dot product into int32 lanes (x86.vpdpbusd), the softmax between them in float32.

Scales are dynamic, one per head and operand: |max| of the head's finite Q, K or V values over
127 (a static per-tensor scale would be set by the largest head of the calibration inputs).
Q's s8 codes are re-based to u8 (+128, shift.py's SHIFT: the instruction's unsigned operand)
and K stays s8, so

    S[i, j] = (sum_d q_u8[i, d] k_s8[j, d] - 128 sum_d k_s8[j, d]) * s_q * s_k * scale,

the second sum (shift.py's correction) once per key (`k_sums`). E = exp(S - max) lies in
(0, 1]: P = E * 255 rounded to u8, V is s8, and O = (P x V) * s_v / sum(P), normalised by the
sum of what was multiplied.
P's step of 1/255 drops exps below 1/510: on Whisper-sized attention with peaked rows (random
Q and K, scores of standard deviation 2.25) the result's cosine to float64 attention is 0.9988
against 0.99999 in bf16 (docs/RESULTS.md 2026-11-28). Scores are finite whatever the operands:
values are quantized as the int8 ops quantize them (NaN to code 0, infinities clipped; their
head's scale counts only finite values), so no row is NaN. A mask is applied to the scaled
scores in float32: keys it makes -inf get exps of 0, a row it leaves no finite score gives 0 (safe
softmax) or NaN (a plain one) as torch, and a NaN in it drops its key (torch: a NaN row).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, NamedTuple

from tvm import te, tirx

from .. import fastmath
from ..shift import SHIFT
from .attention_shapes import AttentionShape, AttentionTiles, Operands

if TYPE_CHECKING:
    import tvm


LEVELS = 127.0  # s8 codes on each side of 0
P_LEVELS = 255.0  # u8 codes of an exp in [0, 1]
# the smallest |max| taken for a head's scale: an all-zero head gets finite scales
TINY = 1e-30


def _abs_max(value: Callable[..., tvm.ir.Expr], extent: tuple[int, int, int],
             name: str) -> te.Tensor:
    """Per head, |max| of value(h, i, c) over its finite values (0 if none) and a floor TINY."""
    batch, rows, cols = extent
    i = te.reduce_axis((0, rows), name=f"{name}_i")
    c = te.reduce_axis((0, cols), name=f"{name}_c")
    f32 = "float32"

    def finite_abs(h):
        a = tirx.abs(value(h, i, c))  # below infinity: neither NaN nor infinite (one compare)
        return tirx.Select(a < tirx.const(math.inf, f32), a, tirx.const(0.0, f32))

    amax = te.compute((batch,), lambda h: te.max(finite_abs(h), axis=[i, c]),
                      name=f"{name}_amax")
    return te.compute((batch,), lambda h: tirx.max(amax[h], tirx.const(TINY, f32)),
                      name=f"{name}_range")


def _codes(x: tvm.ir.Expr, inverse: tvm.ir.Expr) -> tvm.ir.Expr:
    """x * inverse as s8 codes re-based to u8 (+SHIFT; ties to even, clipped)."""
    return fastmath.rounded_to_uint8(x * inverse + tirx.const(float(SHIFT), "float32"))


def _signed(x: tvm.ir.Expr, inverse: tvm.ir.Expr) -> tvm.ir.Expr:
    """x * inverse as s8 (ties to even, clipped to [-128, 127]): the u8 codes re-based back,
    as qarith.quantized does (u8 - 128 is an xor of the sign bit)."""
    return (_codes(x, inverse) ^ tirx.const(SHIFT, "uint8")).astype("int8")


def _per_head(batch: int, value: Callable[[tvm.ir.Expr], tvm.ir.Expr], name: str) -> te.Tensor:
    """A [batch] stage of value(h): a head's scalar, computed once per call."""
    return te.compute((batch,), value, name=name)


class Softmaxed(NamedTuple):
    """What a precision's stages give the ones every precision shares (cpu_attention.py: the
    row sums, P x V, the result): the exps as P x V's first operand ("probs", [batch,
    rows_padded, keys_padded]), V packed ("v_blocks"), the type both are summed in, and
    normalised(weighted, total, h, i, c), the result's value from P x V and the row sums."""

    probs: te.Tensor
    v_blocks: te.Tensor
    accumulator: str
    normalised: Callable


def int8_stages(read: Operands, shape: AttentionShape, tiles: AttentionTiles, scale: float,
                safe: bool, lanes: int, width: int) -> Softmaxed:
    """The stages of the module note up to P over the operands `read` gives
    (cpu_attention.Operands, its mask applied to the scaled scores), blocked as `tiles`
    (cpu_attention.AttentionTiles) for an instruction of `lanes` x `width`; a row that the
    mask leaves no finite score gives 0 where `safe` (torch's safe softmax), else NaN."""
    b, n, np_, last = shape.batch, shape.keys, tiles.keys_padded, shape.rows - 1
    f32, i32 = "float32", "int32"
    q_range = _abs_max(read.q, (b, shape.rows, shape.depth), "q")
    k_range = _abs_max(lambda h, j, d: read.kt(h, d, j), (b, n, shape.depth), "k")
    v_range = _abs_max(read.v, (b, n, shape.v_depth), "v")
    q_inverse = _per_head(b, lambda h: LEVELS / q_range[h], "q_inverse")
    k_inverse = _per_head(b, lambda h: LEVELS / k_range[h], "k_inverse")
    v_inverse = _per_head(b, lambda h: LEVELS / v_range[h], "v_inverse")
    # the float32 factors of S and of O
    s_factor = _per_head(b, lambda h: q_range[h] * k_range[h] * (scale / LEVELS / LEVELS),
                         "s_factor")
    o_factor = _per_head(b, lambda h: v_range[h] / LEVELS, "o_factor")

    def key(j):  # a padded key reads the last one (and is zero)
        return te.min(j, n - 1)

    qb = te.compute((b, tiles.rows_padded, shape.depth), lambda h, i, d: _codes(
        read.q(h, te.min(i, last), d), q_inverse[h]), name="q_rows")
    zero8 = tirx.const(0, "int8")
    kp = te.compute((b, np_ // lanes, shape.depth // width, lanes, width),
                    lambda h, jo, dp, jl, w: te.if_then_else(
                        jo * lanes + jl < n, _signed(read.kt(h, dp * width + w,
                                                              key(jo * lanes + jl)),
                                                     k_inverse[h]), zero8), name="k_blocks")
    vp = te.compute((b, np_ // width, shape.v_depth // lanes, lanes, width),
                    lambda h, jp, do, dl, w: te.if_then_else(
                        jp * width + w < n, _signed(read.v(h, key(jp * width + w),
                                                           do * lanes + dl), v_inverse[h]),
                        zero8), name="v_blocks")
    dd = te.reduce_axis((0, shape.depth), name="dd")
    k_sums = te.compute((b, np_), lambda h, j: te.sum(
        kp[h, j // lanes, dd // width, j % lanes, dd % width].astype(i32), axis=dd),
        name="k_sums")
    d = te.reduce_axis((0, shape.depth), name="d")
    scores = te.compute((b, tiles.rows_padded, np_), lambda h, i, j: te.sum(
        qb[h, i, d].astype(i32) * kp[h, j // lanes, d // width, j % lanes, d % width].astype(i32),
        axis=d), name="scores")

    def score(h, i, j):
        centred = scores[h, i, j] - tirx.const(SHIFT, i32) * k_sums[h, j]
        return read.masked(centred.astype(f32) * s_factor[h], shape, h, i, j)

    def exp_of(h, i, j):
        x = score(h, i, j) - row_max[h, i]
        value = fastmath.exp_nonpositive_bf16(x)
        if read.mask is None:  # no -inf score, no NaN x
            return value
        # a row the mask leaves without a finite score has a maximum of -inf (x NaN: its
        # exps 0, its sum 0); a NaN in the mask drops its key
        return tirx.Select(tirx.isnan(x), tirx.const(0.0, f32), value)

    k = te.reduce_axis((0, np_), name="k")
    row_max = te.compute((b, tiles.rows_padded), lambda h, i: te.max(
        tirx.Select(k < n, score(h, i, k), tirx.const(-math.inf, f32)), axis=k), name="row_max")
    # a Select, not an if_then_else: a padded key's score is in the buffer, and a condition on
    # the lane made every load in the exp masked, the head's factor a gather (ViT's 197 tokens:
    # the int8 kernel then lost to the bf16 one)
    exps = te.compute((b, tiles.rows_padded, np_), lambda h, i, j: tirx.Select(
        j < n, exp_of(h, i, j), tirx.const(0.0, f32)), name="exps")
    probs = te.compute((b, tiles.rows_padded, np_), lambda h, i, j: fastmath.rounded_to_uint8(
        exps[h, i, j] * tirx.const(P_LEVELS, f32)), name="probs")

    def normalised(weighted, total, h, i, c):
        # a row's largest exp is 1, 255 codes: the sum is 0 only where a mask left no finite
        # score, and there the value is 0 * inf, NaN as a plain softmax's
        value = weighted[h, i, c].astype(f32) * (o_factor[h] / total[h, i].astype(f32))
        if safe and read.mask is not None:
            return tirx.Select(total[h, i] > tirx.const(0, i32), value, tirx.const(0.0, f32))
        return value

    return Softmaxed(probs, vp, i32, normalised)
