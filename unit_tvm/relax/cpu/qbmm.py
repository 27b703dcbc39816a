"""Matmuls between two activations (attention's Q x K^T and P x V) in int8 or bf16: how they are
quantized, checked and fed. bf16 (`bf16_bmm`) rounds both operands in the kernel and needs
no calibration; the rest of this note is about int8.

- The first operand is quantized like every activation (per tensor, asymmetric uint8, from the
  calibration range), the second per tensor symmetric int8 (scale max|y| / 127, zero point 0):
  the instructions take u8 x s8, and a zero point on the second operand would need a per-row
  term as well. For P x V the first operand is a softmax, so its zero point is 0 and no term is
  needed at all.
- The second operand is quantized once per call by Relax ops (`quantized_y`); its int8 values
  feed both the kernel (which packs them) and the zero-point term x_zp * sum_k yq[b, k, n], a
  small Relax reduction (`zero_point_term`) the kernel subtracts in its epilogue like a
  constant op's.
- Accuracy guard: on the calibration inputs the int8 product is compared with the fp32 one
  (`fits_int8`); below MIN_COSINE the matmul stays fp32 (reported as such by compile)."""

from typing import NamedTuple

import numpy as np
from tvm import relax

from ..core import views
from ..core.chains import epilogue_fields
from ..core.recipe import QuantizedOp, Recipe, out_shape

# cosine between the int8 and the fp32 product on the calibration inputs below which a
# matmul stays fp32. Measured on a 4-head encoder layer: Q x K^T 0.99990, P x V 0.99958 at 128
# tokens and 0.99936 at 197 (the softmax's many small probabilities get few uint8 levels)
MIN_COSINE = 0.999


class BmmQuantization(NamedTuple):
    """What calibration decided for one bmm."""

    y_scale: float
    cosine: float  # int8 vs fp32 product on the calibration inputs


def y_scale_of(values: np.ndarray) -> float:
    """The symmetric int8 scale of the second operand's observed values."""
    peak = float(np.abs(values).max()) if values.size else 0.0
    return peak / 127.0 if peak > 0 else 1.0


def fits_int8(x, y, x_scale, x_zp, y_scale) -> float:
    """Cosine between x @ y and the product of their int8 forms (x: [S, ..., M, K] and
    y: [S, ..., K, N] for S calibration samples), in float64."""
    xq = np.clip(np.round(x / x_scale) + x_zp, 0, 255)
    yq = np.clip(np.round(y / y_scale), -127, 127)
    want = np.matmul(x.astype(np.float64), y.astype(np.float64))
    return cosine(want, np.matmul(xq - x_zp, yq) * (x_scale * y_scale))


def cosine(want, got) -> float:
    """Cosine between two results (any shape, flattened, in float64): 1 where both are zero,
    0 where one is (nothing of it is left)."""
    want, got = (np.asarray(a, np.float64).reshape(-1) for a in (want, got))
    norms = np.linalg.norm(want), np.linalg.norm(got)
    if min(norms) == 0:
        return 1.0 if max(norms) == 0 else 0.0
    return float(want @ got / (norms[0] * norms[1]))


def calibrate(x_values, y_values, x_shape, y_shape, x_scale, x_zp) -> BmmQuantization:
    """The second operand's scale and the guard's cosine, from the flattened values both
    operands took on the calibration inputs (one sample after another)."""
    y_scale = y_scale_of(y_values)
    x = x_values.reshape((-1, *x_shape))
    y = y_values.reshape((-1, *y_shape))
    return BmmQuantization(y_scale, fits_int8(x, y, x_scale, x_zp, y_scale))


def quantized_y(y: relax.Expr, y_scale: float) -> relax.Expr:
    """y [B, K, N] fp32 -> int8 in [-127, 127], zero point 0 (round half away from zero, like
    the activations' quantization)."""
    yq = relax.op.clip(relax.op.round(relax.op.multiply(
        y, relax.const(np.float32(1.0 / y_scale)))), -127.0, 127.0)
    return relax.op.astype(yq, "int8")


def zero_point_term(yq: relax.Expr, x_zp: int) -> relax.Expr:
    """[B, N] int32: x_zp * sum over k of the int8 yq [B, K, N]."""
    total = relax.op.sum(relax.op.astype(yq, "int32"), axis=1)
    return relax.op.multiply(total, relax.const(np.int32(x_zp)))


def _bmm_fields(chain) -> dict:
    """The recipe fields of a bmm chain that do not depend on its precision: batch dimensions
    flattened around the kernel, the fused epilogue."""
    x_shape = [int(s) for s in chain.x.ty.shape]
    y_shape = [int(s) for s in chain.y.ty.shape]
    batch = int(np.prod(x_shape[:-2]))
    m, k, n = x_shape[-2], x_shape[-1], y_shape[-1]
    fields = dict(kind="bmm", in_shape=[batch, m, k], w_shape=[batch, k, n],
                  out_shape=[batch, m, n], out_channels=n, **epilogue_fields(chain))
    if len(x_shape) != 3:
        fields["nd_in_shape"] = x_shape
    return fields


def _recipe(chain, fields) -> Recipe:
    """The Recipe of `fields`, reshaped to the chain's end where the kernel writes its result
    in another shape."""
    recipe = Recipe.from_dict(fields)
    if chain.end_shape != out_shape(recipe):
        recipe = recipe.replace(nd_out_shape=chain.end_shape)
    return recipe


def _view_fields(chain) -> dict:
    """The recipe fields of the layouts a bmm chain folded in (relax/core/views.py): its operands'
    views of their flat sources, its result's axis order."""
    fields = {}
    for key, found in (("x_view", chain.x_view), ("w_view", chain.y_view)):
        if found is not None and views.read_in_kernel(found.view):
            size = int(np.prod([int(s) for s in found.source.ty.shape]))
            fields[key] = [size, found.view.offset, list(found.view.strides)]
    if chain.x_view is not None:  # x arrives flat or gathered, not in its own N-D shape
        fields["nd_in_shape"] = None
    if chain.out_axes is not None:
        fields["out_axes"] = list(chain.out_axes)
    return fields


def quantized_bmm(chain, x_values, y_values, x_scale: float, x_zp: int) -> QuantizedOp | None:
    """The QuantizedOp of a bmm chain (its recipe; constants: the dequantization multiplier
    and the bias per output column), or None when its int8 product strays from the fp32 one on
    the calibration inputs."""
    x_shape = [int(s) for s in chain.x.ty.shape]
    y_shape = [int(s) for s in chain.y.ty.shape]
    q = calibrate(x_values, y_values, x_shape, y_shape, x_scale, x_zp)
    if q.cosine < MIN_COSINE:
        return None
    fields = dict(_bmm_fields(chain), x_scale=x_scale, x_zp=x_zp, y_scale=q.y_scale)
    consts = [(x_scale * q.y_scale * chain.scale).astype(np.float32),
              chain.shift.astype(np.float32)]
    return QuantizedOp(chain, _recipe(chain, fields), consts)


def float_bmm(chain, dtype: str = "bfloat16") -> QuantizedOp:
    """The QuantizedOp of a bmm chain in a float form: bf16 (both operands rounded to bf16 in
    the kernel) or float32 (as they are), float32 sums; constants: the chain's scale and bias
    per output column. No guard: a bf16 operand keeps 8 significant bits and the sum is
    float32, as in a bf16 dense layer."""
    fields = dict(_bmm_fields(chain), dtype=dtype, **_view_fields(chain))
    consts = [chain.scale.astype(np.float32), chain.shift.astype(np.float32)]
    return QuantizedOp(chain, _recipe(chain, fields), consts)
