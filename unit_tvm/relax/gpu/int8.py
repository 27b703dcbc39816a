"""int8 models on Tensor Cores: the quantization the GPU path applies to the ops it tensorizes.

wmma's integer form multiplies s8 by s8 into s32 (`cuda.wmma.s8s32`), so both operands are
symmetric: an op's input is quantized per tensor (scale = largest magnitude seen on the
calibration inputs / 127, zero point 0, so the conv's zero padding stays exact) and its constant
weight per output channel; the s32 result is dequantized by one multiply per channel, which TVM
fuses with what follows. Calibration runs the fp32 model on this machine's CPU (as the CPU
quantizer does), on the NHWC module the pass rewrites, so every op's scale is keyed by its call.
"""

from typing import NamedTuple

import numpy as np
from tvm import relax, tirx

from ...target import host
from ..quantization.calibration import observe

QMAX = 127  # symmetric: -127..127, so negation and the zero point are exact


class Int8Calibration(NamedTuple):
    """What calibrates an int8 GPU model: the inputs, and how a scale is read off the values."""

    samples: list
    method: str = "minmax"  # or "percentile": that percentile of |x| instead of its maximum
    percentile: float = 99.99


def calibration_from(quantize: dict) -> Int8Calibration:
    """The Int8Calibration of unit_tvm.compile's `quantize` dict; ValueError for an option the
    GPU path does not have (it quantizes to int8 only, weights per channel)."""
    allowed = {"calibration_data", "method", "percentile", "dtype"}
    unknown = sorted(set(quantize) - allowed)
    if unknown:
        raise ValueError(f"unit_tvm.compile: on CUDA, quantize takes {sorted(allowed)}; "
                         f"{unknown} are CPU-only")
    if quantize.get("dtype", "int8") != "int8":
        raise ValueError("unit_tvm.compile: on CUDA, quantize's dtype is int8 (fp16 is the "
                         "default without quantize)")
    samples = list(quantize.get("calibration_data", ()))
    if not samples:
        raise ValueError("calibration_data is empty: at least one input is needed")
    method = quantize.get("method", "minmax")
    if method not in ("minmax", "percentile"):
        raise ValueError(f"calibration method must be 'minmax' or 'percentile', got {method!r}")
    return Int8Calibration(samples, method, float(quantize.get("percentile", 99.99)))


def activation_scale(values: np.ndarray, calibration: Int8Calibration) -> float:
    """The per-tensor scale of an op's input from the values it took."""
    magnitude = np.abs(values.astype(np.float64))
    top = (float(magnitude.max()) if calibration.method == "minmax"
           else float(np.percentile(magnitude, calibration.percentile)))
    return top / QMAX if top > 0 else 1.0


def calibrate(mod, calls: list, calibration: Int8Calibration) -> dict:
    """call -> its input's scale, for each call in `calls` (calls of mod's main whose first
    argument is a variable), from the fp32 model run on this CPU."""
    values = observe(mod, [c.args[0] for c in calls], calibration.samples, host())
    return {c: activation_scale(v, calibration) for c, v in zip(calls, values)}


def weight_s8(weight: np.ndarray, channel_axis: int) -> tuple:
    """(int8 weight, float32 scale per output channel): symmetric per-channel quantization."""
    other = tuple(a for a in range(weight.ndim) if a != channel_axis % weight.ndim)
    top = np.abs(weight.astype(np.float64)).max(axis=other, keepdims=True)
    scale = np.where(top > 0, top / QMAX, 1.0)
    q = np.clip(np.round(weight / scale), -QMAX, QMAX).astype("int8")
    return q, scale.reshape(-1).astype("float32")


def quantized_input(x: relax.Expr, scale: float) -> relax.Expr:
    """x as int8 at `scale` (clipped to the symmetric range, rounded half up). The rounding is
    floor(v + 0.5): once ToMixedPrecision makes it fp16 (after this pass), TVM writes round as
    `hnearbyint`, which CUDA does not have, where floor is `hfloor`."""
    dtype = str(x.ty.dtype)
    scaled = relax.op.multiply(x, relax.const(1.0 / scale, dtype))
    clipped = relax.op.clip(scaled, -QMAX, QMAX)
    return relax.op.astype(relax.op.floor(relax.op.add(clipped, relax.const(0.5, dtype))),
                           "int8")


def quantized_value(value, inv_scale):
    """quantized_input's arithmetic on one te / TIR value (its dtype's), `inv_scale` being 1 /
    scale in that dtype: for a kernel that quantizes its input as it gathers it."""
    dtype = str(value.dtype)
    clipped = tirx.max(tirx.min(value * inv_scale, tirx.const(QMAX, dtype)),
                       tirx.const(-QMAX, dtype))
    return tirx.floor(clipped + tirx.const(0.5, dtype)).astype("int8")


def dequantized(acc: relax.Expr, x_scale: float, w_scale: np.ndarray, dtype: str) -> relax.Expr:
    """The s32 result (channels last) as `dtype`: times x_scale x the channel's weight scale."""
    return relax.op.astype(relax.op.multiply(
        relax.op.astype(acc, "float32"),
        relax.const((x_scale * w_scale).astype("float32"))), dtype)
