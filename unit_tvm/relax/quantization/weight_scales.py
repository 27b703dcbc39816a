"""Per-output-channel int8 weight scales. A float32 model's weight gets max|w| / 127 per output
channel. A weight that arrived quantized (a QDQ model's int8 weight, dequantized by qdq.py,
with its batch norm or per-channel scale folded in or not) lies on an int8 grid already: it keeps
that grid, so its integers are the file's and rounding them again loses nothing. Requantizing
a per-tensor int8 weight on the max / 127 grid instead moved each value by up to half a step
again: an Inception block from ONNX Runtime's quantize_static (weights per tensor) ended 1.35x
as far from the float32 model as ONNX Runtime running the file (the first sweep of
`unit-tvm fuzz --kinds qdq`).
"""

import numpy as np

# how far from an integer a value on the grid may be, in steps: a dequantized int8 weight is
# q * scale rounded to float32 (|q| <= 127: ~1e-5 steps off), a float32 weight's values are not
# near any grid
_TOLERANCE = 1e-3
# values per channel tried against each candidate grid before a full check
_SAMPLE = 16
# output channels checked per block (bounds the temporaries' memory)
_ROWS = 1024


def int8_weight_scales(w: np.ndarray) -> np.ndarray:
    """Scale per output channel (axis 0) of `w`: the step of the coarsest int8 grid (at most
    127 steps from 0 to max|w|) every value of the channel lies on, else max|w| / 127."""
    flat = w.reshape(w.shape[0], -1).astype(np.float64, copy=False)
    # max |w| without an |w| copy (an LLM's LM head holds a quarter of a billion weights)
    top = np.maximum(np.maximum(flat.max(axis=1), -flat.min(axis=1)), 1e-12)
    scales = top / 127.0
    sample = flat[:, :_SAMPLE] / top[:, None]
    found = np.zeros(len(top), bool)
    for steps in range(1, 128):  # top / steps: coarsest first
        r = sample * steps
        rows = np.flatnonzero(~found & (np.abs(r - np.round(r)) < _TOLERANCE).all(axis=1))
        if not rows.size:
            continue
        q = flat[rows] * (steps / top[rows, None])
        on_grid = rows[(np.abs(q - np.round(q)) < _TOLERANCE).all(axis=1)]
        scales[on_grid] = top[on_grid] / steps
        found[on_grid] = True
    return scales


def on_grid(w: np.ndarray, scales: np.ndarray) -> bool:
    """Whether every value of `w` lies on its channel's int8 grid of step `scales` (a weight
    that arrived quantized: its integers are the file's)."""
    per_channel = (-1,) + (1,) * (w.ndim - 1)
    scales = scales.reshape(per_channel)
    # in blocks of output channels: the temporaries of a whole LM head would not fit in memory
    for start in range(0, w.shape[0], _ROWS):
        q = w[start:start + _ROWS].astype(np.float64) / scales[start:start + _ROWS]
        if not (np.abs(q - np.round(q)) < _TOLERANCE).all():
            return False
    return True
