"""Whether the int8 fused attention may compute an attention: its arithmetic
(schedules/cpu_attention_int8.py) in numpy, on the operands the attention took on the
calibration inputs, against float attention.

The kernel's scales are taken per head at run time, so calibration sets none of them; what it
can tell is how much the kernel's rounding costs on values like the model's. Sharp attention
over long rows loses most: an exp below 1/510 of its row's largest rounds to code 0 (P's step
is 1/255), and a row's many small weights go with it. Where the cosine to float attention falls
below qbmm.MIN_COSINE (the bound the unfused int8 matmuls are held to), quantize computes that
attention in bf16, or leaves it to separate kernels where the target has no bf16 one.
"""

import numpy as np
from tvm import relax

from ...schedules.cpu_attention_int8 import LEVELS, P_LEVELS, TINY
from ...shift import SHIFT
from ..core.graph import const_value
from .fused_attention import AttentionPlan, Mask, Operand
from .qbmm import MIN_COSINE, cosine


def _codes(x, inverse):
    """x * inverse re-based by SHIFT, rounded half to even and clipped to [0, 255]; NaN to 0."""
    with np.errstate(invalid="ignore"):
        c = np.clip(np.rint(x * inverse + SHIFT), 0, 255)
    return np.where(np.isnan(c), 0, c)


def _signed_codes(x):
    """x as the kernel's s8 codes (float32), with the per-head range they were taken over."""
    with np.errstate(invalid="ignore"):
        finite = np.where(np.isfinite(x), np.abs(x), 0)
    head_range = np.maximum(finite.max(axis=(-2, -1), keepdims=True), TINY)
    inverse = np.float32(LEVELS) / head_range.astype(np.float32)
    return (_codes(x, inverse) - SHIFT).astype(np.float32), head_range.astype(np.float32)


def int8_attention(q, kt, v, scale: float, mask=None) -> np.ndarray:
    """The fused int8 kernel's arithmetic (q [batch, rows, depth], kt [batch, depth, keys],
    v [batch, keys, v_depth], mask None or a function of the scaled scores [batch, rows,
    keys] to the masked ones, as mask_values gives it):
    per-head ranges of the finite values, s8 codes, integer products, exps rounded to codes
    of 1/255 (0 where the shifted score is NaN: a row without a finite score), the sum of
    those codes as the normaliser (a plain softmax's NaN where it is 0). float32 numpy (Q x
    K's integer sums are exact in it; Whisper's attention takes half the time of float64),
    the kernel's own accumulator types aside."""
    q, kt, v = (np.asarray(a, np.float32) for a in (q, kt, v))
    (qc, rq), (kc, rk), (vc, rv) = (_signed_codes(a) for a in (q, kt, v))
    s = _masked((qc @ kc) * (rq * rk * np.float32(scale / LEVELS / LEVELS)), mask)
    with np.errstate(invalid="ignore"):
        x = s - s.max(-1, keepdims=True)
        p = np.where(np.isnan(x), 0, np.rint(np.exp(x) * np.float32(P_LEVELS)))
        return (p @ vc) * (rv / np.float32(LEVELS)) / p.sum(-1, keepdims=True)


def _masked(scores, mask):
    return scores if mask is None else mask(scores)


def float_attention(q, kt, v, scale: float, mask=None) -> np.ndarray:
    """softmax(masked(q x kt * scale)) x v in float32 numpy (mask as int8_attention's)."""
    q, kt, v = (np.asarray(a, np.float32) for a in (q, kt, v))
    s = _masked((q @ kt) * np.float32(scale), mask)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def mask_values(mask: Mask, flat: np.ndarray):
    """The mask the kernel applies, from its source's flat values: a function of the scores
    ([batch, rows, keys]) to the masked ones (the mask added, or mask.fill in place of the
    masked scores)."""
    full = np.broadcast_to(np.asarray(flat).reshape(mask.shape), mask.scores_shape)
    full = full.reshape(-1, *mask.scores_shape[-2:])
    if mask.fill is None:
        added = full.astype(np.float32)
        return lambda scores: scores + added
    hit = full.astype(bool) == mask.when
    return lambda scores: np.where(hit, np.float32(mask.fill), scores)


def observed(plan: AttentionPlan) -> list:
    """The variables whose calibration values int8_cosine takes: q's, kt's and v's sources,
    and the mask's where it is a variable (a constant mask is read from the plan)."""
    found = [op.source for op in (plan.q, plan.kt, plan.v)]
    mask = plan.mask
    return found + ([mask.source] if mask is not None and isinstance(mask.source, relax.Var)
                    else [])


def operand_values(operand: Operand, flat: np.ndarray) -> np.ndarray:
    """The [batch, rows, cols] operand the kernel reads from one input's flat source values
    (its own factor not applied: q's and kt's are in the plan's scale, v's is the caller's)."""
    view, flat = operand.view, np.ascontiguousarray(flat)
    return np.lib.stride_tricks.as_strided(
        flat[view.offset:], shape=view.shape,
        strides=[s * flat.itemsize for s in view.strides],
        writeable=False).reshape(-1, *view.shape[-2:])  # batch axes kept apart: flattened


def int8_cosine(plan: AttentionPlan, *values) -> float:
    """Cosine between the kernel's int8 result and float attention over the calibration
    inputs (`values`: the values of `observed(plan)`, each flattened over all inputs, as
    calibration.observe gives them); 0 where either is not finite (NaN or infinite operands:
    the int8 kernel quantizes them, float attention propagates them; a row a mask leaves
    without a finite score)."""
    sources = observed(plan)
    mask = plan.mask
    if mask is not None and not isinstance(mask.source, relax.Var):  # the same every input
        values = (*values, np.tile(const_value(mask.source).reshape(-1), len(values[0])
                                   // int(np.prod(plan.q.source.ty.shape))))
        sources = [*sources, mask.source]
    per_input = [v.reshape(-1, int(np.prod(src.ty.shape))) for v, src in zip(values, sources)]
    want, got = [], []
    for q_flat, kt_flat, v_flat, *mask_flat in zip(*per_input):
        q, kt = operand_values(plan.q, q_flat), operand_values(plan.kt, kt_flat)
        v = operand_values(plan.v, v_flat) * np.float32(plan.v.scale)
        m = mask_values(mask, mask_flat[0]) if mask_flat else None
        with np.errstate(all="ignore"):
            want.append(float_attention(q, kt, v, plan.scale, m).reshape(-1))
            got.append(int8_attention(q, kt, v, plan.scale, m).reshape(-1))
    want, got = np.concatenate(want), np.concatenate(got)
    if not (np.isfinite(want).all() and np.isfinite(got).all()):
        return 0.0
    return cosine(want, got)


def fits_int8(plan: AttentionPlan, *values) -> bool:
    """Whether the int8 kernel stays within MIN_COSINE of float attention on the calibration
    inputs (int8_cosine's arguments)."""
    return int8_cosine(plan, *values) >= MIN_COSINE
