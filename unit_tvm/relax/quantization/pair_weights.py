"""int8 weights for the pre-VNNI pair and quad forms: bounded so vpmaddubsw is exact.

On a host without VNNI the fast int8 instruction is vpmaddubsw, which sums each pair of u8 x s8
products in int16 and saturates. Other engines shrink the activations or the weights to 7 bits
for it (oneDNN's weight scale adjust, ONNX Runtime's and PyTorch's reduce_range) or accept the
saturation. Here each output channel's weights get the scale that bounds every adjacent pair
instead: max(|w0| + |w1|) / (bound - 1), so that after rounding (at most half a step per value)
|q0| + |q1| <= bound and 255 * 128 = 32640 never saturates. The pairs are those a packed word
holds: neighbouring input channels, and for a conv also neighbouring window columns (the
layout recipe.folds_width picks for an RGB stem), so either packing is exact.

The quad form adds two vpmaddubsw results in int16 before widening: there the bound holds over
the same pair of two consecutive words (|w0| + |w1| + |w4| + |w5| <= 128), a grid up to 4x the
8-bit one. The coarser grids cost some precision. Per layer the fastest bound is kept whose
estimated output cosine to the float32 layer stays within MAX_COSINE_LOSS of the 8-bit
weights'; where none does, the layer keeps its 8-bit weights and runs on the exact int16 form
(vpmaddwd).
"""

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ...intrinsics import PairSumBound

# The most output cosine (to the float32 layer, estimated) a layer may give up for a bounded
# form's speed, by the words its bound spans: the pair form (1.8x the int16 form's peak on Zen 4
# held to AVX2; Gaussian weights lose ~2e-5) and the quad form (1.33x the pair form's; Gaussian
# weights lose ~1e-4: its grid is ~2x the 8-bit one's).
MAX_COSINE_LOSS = {1: 1e-4, 2: 3e-4}


class WeightChoice(NamedTuple):
    """The int8 weights a layer keeps: their per-channel scales and integers, the bound they
    were checked under (None: 8-bit weights, any instruction), and the estimated output cosine
    the bounded weights lose against the 8-bit ones (None: not considered; for 8-bit weights
    kept where bounds were weighed, what the last bound tried would have lost)."""

    scales: np.ndarray
    wq: np.ndarray
    bound: PairSumBound | None
    loss: float | None


def group_views(w: np.ndarray, bound: PairSumBound) -> list[tuple[np.ndarray, PairSumBound]]:
    """w [K, C, *window] (or [N, K]) as (array, bound) whose last axis runs along elements that
    packed words hold together (PairSumBound.group_sums zero-pads it to whole groups), and the
    bound that holds there: input channels (the bound itself), and for a conv also its
    window's columns (pairs: the layout a pair form folds an RGB stem's window into;
    quad-bounded weights obey it too, so any form may run them)."""
    views = [(np.moveaxis(w, 1, -1), bound)]
    if w.ndim > 2:
        views.append((w, PairSumBound(bound.bound)))
    return views


# Output channels handled per pass: the float64 temporaries of the checks below stay a few MB
# instead of 2x the weight (an LLM's tied 128256 x 2048 LM head: 2 GB each, several at once).
CHUNK_ROWS = 1024


def _row_chunks(rows: int) -> list[slice]:
    return [slice(lo, min(lo + CHUNK_ROWS, rows)) for lo in range(0, rows, CHUNK_ROWS)]


def max_group_sums(w: np.ndarray, bound: PairSumBound) -> np.ndarray:
    """Per output channel (axis 0): the largest sum of |w| over a group the bound limits."""
    out = np.zeros(w.shape[0])
    for rows in _row_chunks(w.shape[0]):
        part = w[rows]
        for v, b in group_views(part, bound):
            out[rows] = np.maximum(out[rows],
                                   b.group_sums(v).reshape(part.shape[0], -1).max(axis=1))
    return out


def obey(wq: np.ndarray, bound: PairSumBound) -> bool:
    """Whether the int8 weights `wq` obey `bound` in every packing (group_views)."""
    return all(b.holds(v) for rows in _row_chunks(wq.shape[0])
               for v, b in group_views(wq[rows], bound))


def quantized(w: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """w rounded to int8 on per-output-channel `scales` (clipped to +-127)."""
    per_channel = (-1,) + (1,) * (w.ndim - 1)
    q = w / scales.reshape(per_channel)
    # in place: one weight-sized temporary, not three
    np.round(q, out=q)
    np.clip(q, -127, 127, out=q)
    return q.astype(np.int8)


def estimated_cosine(w: np.ndarray, wq: np.ndarray, scales: np.ndarray,
                     moments: np.ndarray) -> float:
    """The output cosine of a layer with weights wq * scales (int8 per output channel) to one
    with `w`, over inputs whose channels are taken as independent, with second moments
    `moments` [K, C per group] (the input channel each weight meets): the error's energy
    sum(m2 * (approx - w)^2) against the output's sum(m2 * w^2)."""
    m2 = np.asarray(moments, np.float64).reshape(w.shape[:2] + (1,) * (w.ndim - 2))
    per_channel = (-1,) + (1,) * (w.ndim - 1)
    signal = noise = 0.0
    for rows in _row_chunks(w.shape[0]):
        exact = w[rows].astype(np.float64)
        approx = wq[rows] * np.asarray(scales, np.float64)[rows].reshape(per_channel)
        signal += float((m2[rows] * exact ** 2).sum())
        noise += float((m2[rows] * (approx - exact) ** 2).sum())
    return 1.0 / np.sqrt(1.0 + noise / max(signal, 1e-300))


def choose(w: np.ndarray, scales: np.ndarray,
           bounds: Sequence[PairSumBound] | PairSumBound | None, moments: np.ndarray,
           given: bool = False) -> WeightChoice:
    """The int8 weights of a layer whose 8-bit scales are `scales` on a target whose fast
    instructions need `bounds` (fastest first, or one; none: any weights): under the first that
    the 8-bit integers obey already, or whose bounded integers lose at most MAX_COSINE_LOSS
    against them; else the 8-bit integers without a bound. `given`: the weights arrived
    quantized (a QDQ file's): their integers are the model's and are kept, bounded or not."""
    wq = quantized(w, scales)
    loss = None
    bounds = [bounds] if isinstance(bounds, PairSumBound) else list(bounds or ())
    if not bounds:
        return WeightChoice(scales, wq, None, None)
    for bound in bounds:
        if obey(wq, bound):
            return WeightChoice(scales, wq, bound, 0.0)
    if given:
        return WeightChoice(scales, wq, None, None)
    eight_bit = estimated_cosine(w, wq, scales, moments)
    for bound in bounds:
        # rounding adds at most half a step to each of a group's 2 (4) values: 127 + 1 (126 + 2)
        b_scales = np.maximum(max_group_sums(w, bound), 1e-12) / (bound.bound - bound.words)
        bq = quantized(w, b_scales)
        if not obey(bq, bound):  # the rounding argument above says never; checked anyway
            continue
        loss = eight_bit - estimated_cosine(w, bq, b_scales, moments)
        if loss <= MAX_COSINE_LOSS[bound.words]:
            return WeightChoice(b_scales, bq, bound, float(loss))
    return WeightChoice(scales, wq, None, None if loss is None else float(loss))
