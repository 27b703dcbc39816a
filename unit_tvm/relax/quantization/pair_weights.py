"""int8 weights for the pre-VNNI pair form: adjacent pairs bounded so vpmaddubsw is exact.

On a host without VNNI the fast int8 instruction is vpmaddubsw, which sums each pair of u8 x s8
products in int16 and saturates. Other engines shrink the activations or the weights to 7 bits
for it (oneDNN's weight scale adjust, ONNX Runtime's and PyTorch's reduce_range) or accept the
saturation. Here each output channel's weights get the scale that bounds every adjacent pair
instead: max(|w0| + |w1|) / (bound - 1), so that after rounding (at most half a step per value)
|q0| + |q1| <= bound and 255 * 128 = 32640 never saturates. The pairs are those a packed word
holds: neighbouring input channels, and for a conv also neighbouring window columns (the
layout recipe.folds_width picks for an RGB stem), so either packing is exact.

The coarser grid costs some precision (up to 2x the step of max|w| / 127). Per layer it is kept
only where its estimated output cosine to the float32 layer stays within PAIR_MAX_COSINE_LOSS
of the 8-bit weights'; elsewhere the layer keeps its 8-bit weights and runs on the exact int16
form (vpmaddwd).
"""

from typing import NamedTuple

import numpy as np

from ...intrinsics import PairSumBound

# The most output cosine (to the float32 layer, estimated) a layer may give up for the pair
# form's speed (1.8x the int16 form's peak on Zen 4 held to AVX2). Gaussian weights lose ~2e-5.
PAIR_MAX_COSINE_LOSS = 1e-4


class WeightChoice(NamedTuple):
    """The int8 weights a layer keeps: their per-channel scales and integers, the pair bound
    they were checked under (None: 8-bit weights, any instruction), and the estimated output
    cosine the pair-bounded weights lose against the 8-bit ones (None: not considered)."""

    scales: np.ndarray
    wq: np.ndarray
    pair_bound: int | None
    pair_loss: float | None


def _even(v: np.ndarray) -> np.ndarray:
    """v zero-padded along its last axis to an even length."""
    if v.shape[-1] % 2 == 0:
        return v
    return np.concatenate([v, np.zeros(v.shape[:-1] + (1,), v.dtype)], axis=-1)


def pair_views(w: np.ndarray) -> list[np.ndarray]:
    """w [K, C, *window] (or [N, K]) as arrays whose last axis runs along elements that a packed
    word holds together: input channels, and for a conv also its window's columns; each [K,
    ..., even extent]."""
    views = [_even(np.moveaxis(w, 1, -1))]
    if w.ndim > 2:
        views.append(_even(w))
    return views


def max_pair_sums(w: np.ndarray) -> np.ndarray:
    """Per output channel (axis 0): the largest |w0| + |w1| over the adjacent pairs."""
    out = np.zeros(w.shape[0])
    for v in pair_views(np.abs(w.astype(np.float64))):
        sums = (v[..., 0::2] + v[..., 1::2]).reshape(w.shape[0], -1)
        out = np.maximum(out, sums.max(axis=1))
    return out


def pairs_obey(wq: np.ndarray, bound: PairSumBound) -> bool:
    """Whether every adjacent pair of the int8 weights `wq`, in either packing, obeys `bound`."""
    return all(bound.holds(v) for v in pair_views(wq))


def quantized(w: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """w rounded to int8 on per-output-channel `scales` (clipped to +-127)."""
    per_channel = (-1,) + (1,) * (w.ndim - 1)
    q = w / scales.reshape(per_channel)
    # in place: one weight-sized temporary, not three
    np.round(q, out=q)
    np.clip(q, -127, 127, out=q)
    return q.astype(np.int8)


def estimated_cosine(w: np.ndarray, approx: np.ndarray, moments: np.ndarray) -> float:
    """The output cosine of a layer with weights `approx` to one with `w`, over inputs whose
    channels are taken as independent, with second moments `moments` [K, C per group] (the
    input channel each weight meets): the error's energy sum(m2 * (approx - w)^2) against the
    output's sum(m2 * w^2)."""
    m2 = np.asarray(moments, np.float64).reshape(w.shape[:2] + (1,) * (w.ndim - 2))
    signal = float((m2 * w.astype(np.float64) ** 2).sum())
    noise = float((m2 * (approx.astype(np.float64) - w) ** 2).sum())
    return 1.0 / np.sqrt(1.0 + noise / max(signal, 1e-300))


def choose(w: np.ndarray, scales: np.ndarray, bound: PairSumBound | None,
           moments: np.ndarray, given: bool = False) -> WeightChoice:
    """The int8 weights of a layer whose 8-bit scales are `scales` on a target whose fast
    instruction needs `bound` (None: any weights): the 8-bit integers when they obey it already,
    else the pair-bounded ones where they lose at most PAIR_MAX_COSINE_LOSS, else the 8-bit
    ones without the bound. `given`: the weights arrived quantized (a QDQ file's): their
    integers are the model's and are kept, bounded or not."""
    wq = quantized(w, scales)
    if bound is None:
        return WeightChoice(scales, wq, None, None)
    if pairs_obey(wq, bound):
        return WeightChoice(scales, wq, bound.bound, 0.0)
    if given:
        return WeightChoice(scales, wq, None, None)
    per_channel = (-1,) + (1,) * (w.ndim - 1)
    pair_scales = np.maximum(max_pair_sums(w), 1e-12) / (bound.bound - 1)
    pq = quantized(w, pair_scales)
    if not pairs_obey(pq, bound):  # the rounding argument above says never; checked anyway
        return WeightChoice(scales, wq, None, None)
    loss = (estimated_cosine(w, wq * scales.reshape(per_channel), moments)
            - estimated_cosine(w, pq * pair_scales.reshape(per_channel), moments))
    if loss <= PAIR_MAX_COSINE_LOSS:
        return WeightChoice(pair_scales, pq, bound.bound, float(loss))
    return WeightChoice(scales, wq, None, float(loss))
