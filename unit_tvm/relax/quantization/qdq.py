"""Models that arrive quantized as QuantizeLinear / DequantizeLinear pairs (ONNX "QDQ", what
ONNX Runtime's quantize_static and NNCF write): quantize() computes them as int8 with the
model's own activation scales instead of running the pairs as float32 rounding ops.

TVM's ONNX frontend imports the pairs as relax.quantize / relax.dequantize. `fake_quantization`
removes them before quantize() looks for its chains:
- a dequantize of constants (int8 weights, int32 biases) becomes the float32 constant;
- dequantize(quantize(x)) with one scale and zero point becomes x, and the scale and zero point
  are kept for x: a quantized op reading x takes them as its activation quantization instead of
  calibrating one. The pair also clamps x to the range the integers can hold; ONNX Runtime's
  quantizer relies on that to drop a ReLU, a ReLU6 or any Clip before a pair (a hardtanh(-1, 1)
  lives on only as the pair's range), so the clamp stays: clip(x, lo, hi), which the op before
  it fuses into its epilogue (before its residual add, or after it: chains.py). Where every
  reader of the pair is a conv or matmul with a constant weight, those readers quantize x with
  the pair's scale and so clamp it themselves: then x stays as it is, or a ReLU of x where the
  range starts at 0 (the same kernel as the float32 model's).
- a pair with a scale per channel (NNCF's depthwise inputs) is made one per tensor with the
  same integers where depthwise convs read it and the activation before it commutes with a
  scale (quantization/qdq_channels.py); any other gives one uint8 quantization over the union of its
  channels' ranges (unit-tvm's activations are per tensor), which neither keeps their steps
  nor clamps each channel to its own range;
- a value holding only values of a pair's result (a max-pool, a reshape: NNCF puts no pair
  after a max-pool) has the pair's quantization too.
"""

from typing import NamedTuple

import numpy as np
import tvm
from tvm import relax

from ..core.chains import CONVS
from ..core.graph import const_value, dataflow_bindings, integer_range, op_name, rewrite_functions
from ..core.graph import readers as graph_readers
from ..core.u8_values import QParams, uint8_range
from .qdq_channels import per_tensor_channels

_QUANTIZE, _DEQUANTIZE = "relax.quantize", "relax.dequantize"
# ops whose result holds only values of their input: it keeps the input's quantization
_SAME_VALUES = ("relax.reshape", "relax.permute_dims", "relax.squeeze", "relax.expand_dims",
                "relax.nn.max_pool1d", "relax.nn.max_pool2d", "relax.nn.max_pool3d")
# ops whose result lies within the bounds of their input's values
_WITHIN_INPUT = (*_SAME_VALUES, "relax.nn.avg_pool2d", "relax.mean")


class FakeQuantization(NamedTuple):
    """The module without its quantize / dequantize pairs, and the uint8 quantization the model
    gave each value that such a pair read (keys: variables of the new main)."""

    mod: tvm.IRModule
    scales: dict


def _per_axis(values, ndim, axis):
    """A scale or zero point shaped to broadcast along `axis` of an ndim tensor."""
    values = np.asarray(values)
    if values.ndim == 0 or ndim == 0:
        return values
    shape = [1] * ndim
    shape[axis % ndim] = values.size
    return values.reshape(shape)


def dequantized(data, scale, zp, axis) -> np.ndarray:
    """ONNX DequantizeLinear of constants: (data - zp) * scale (per `axis` where they are
    vectors), in float32."""
    ndim = data.ndim
    real = (data.astype(np.float64) - _per_axis(zp, ndim, axis)) * _per_axis(scale, ndim, axis)
    return real.astype(np.float32)


def _quantized(data, scale, zp, axis, dtype):
    info = np.iinfo(dtype)
    ndim = data.ndim
    q = np.round(data / _per_axis(scale, ndim, axis)) + _per_axis(zp, ndim, axis)
    return np.clip(q, info.min, info.max).astype(dtype)


def _weight(expr, by_var):
    """The constant a weight is (directly, or a dequantize of constants through a transpose or
    reshape, as a QDQ file gives it), or None."""
    for _ in range(3):
        if isinstance(expr, tvm.ir.expr.Constant):
            return expr
        v = by_var.get(expr) if isinstance(expr, relax.Var) else None
        if op_name(v) == _DEQUANTIZE:
            return v.args[0] if all(isinstance(a, tvm.ir.expr.Constant) for a in v.args) \
                else None
        if op_name(v) not in ("relax.permute_dims", "relax.reshape"):
            return None
        expr = v.args[0]
    return None


def _becomes_int8(call, data, by_var) -> bool:
    """Whether quantize() will make `call` an int8 op reading `data` (chains.py's rule: a conv
    in its layouts, not a grouped conv3d, or a matmul with a 2-D constant weight)."""
    name = op_name(call)
    if (name not in (*CONVS, "relax.matmul") or not call.args[0].same_as(data)
            or call.args[1].same_as(data)):
        return False
    weight = _weight(call.args[1], by_var)
    if weight is None:
        return False
    if name in CONVS:
        kind, data_layout, kernel_layout = CONVS[name]
        a = call.attrs
        return (str(a.data_layout) == data_layout and str(a.kernel_layout) == kernel_layout
                and (kind != "conv3d" or int(a.groups) == 1))
    return name == "relax.matmul" and len(call.args[1].ty.shape) == 2


def _requantized_by_readers(func):
    """The quantize results whose dequantized values only ops that quantize() makes int8 read,
    as their data: each quantizes its input with the pair's scale, applying the pair's clamp
    itself. Every dequantize of the result counts (a file may give each reader its own)."""
    bindings = dataflow_bindings(func)
    by_var = {b.var: b.value for b in bindings}
    readers = graph_readers(bindings)
    verdict = {}
    for b in bindings:
        if op_name(b.value) != _DEQUANTIZE or not isinstance(b.value.args[0], relax.Var):
            continue
        users = readers.get(b.var, [])
        q = b.value.args[0]
        verdict[q] = verdict.get(q, True) and bool(users) and all(
            _becomes_int8(u.value, b.var, by_var) for u in users)
    return {q for q, int8_only in verdict.items() if int8_only}


@relax.expr_functor.mutator
class _StripPairs(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.scales = {}
        self.requantized = _requantized_by_readers(mod["main"])

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        name = op_name(call)
        if name not in (_QUANTIZE, _DEQUANTIZE):
            return call
        consts = [const_value(a) for a in call.args]
        axis = int(call.attrs.axis)
        if all(c is not None for c in consts):
            data, scale, zp = consts
            if name == _DEQUANTIZE:
                return relax.const(dequantized(data, scale, zp, axis))
            return relax.const(_quantized(data, scale, zp, axis, str(call.ty.dtype)))
        if name == _DEQUANTIZE and isinstance(call.args[0], relax.Var):
            stripped = self._pair(call)
            return call if stripped is None else stripped
        return call

    def _pair(self, dq):
        """x for dequantize(quantize(x)), clamped to the pair's range unless its readers all
        quantize x themselves, recording the pair's quantization for x; None where it is not
        such a pair."""
        q = self.lookup_binding(dq.args[0])
        if not _is_pair(q, dq) or integer_range(q) is None:
            return None
        x = q.args[0]
        scale, zp = (const_value(a).astype(np.float64).reshape(-1) for a in q.args[1:])
        qp = self.scales[x] = _per_tensor(scale, zp, integer_range(q))
        lo, hi = _range(qp)
        requantized = dq.args[0] in self.requantized
        low, high = self._bounds(x)
        if (hi == 0.0 or not requantized) and (low < lo or high > hi):
            return relax.op.clip(x, lo, hi)  # the op before it fuses the clamp
        if lo == 0.0 and low < 0.0:
            return relax.op.nn.relu(x)  # its readers clamp the top; the conv before fuses it
        return x

    def _bounds(self, x, depth=4):
        """Bounds x is known to keep: a ReLU's, a clamp's, or those of the input of an op
        whose result lies within its input's values (a pool, a mean, a reshape)."""
        v = self.lookup_binding(x)
        name = op_name(v)
        if name in _WITHIN_INPUT and isinstance(v.args[0], relax.Var) and depth:
            return self._bounds(v.args[0], depth - 1)
        if name == "relax.nn.relu":
            return 0.0, np.inf
        if name == "relax.clip":
            return float(v.args[1].value), float(v.args[2].value)
        return -np.inf, np.inf


def _is_pair(q, dq) -> bool:
    """Whether dequantize `dq` reads quantize `q` of a float32 variable with the same constant
    scale and zero point, into float32: the pair that stands for x itself (a pair of
    float16 values, or whose two halves differ, stays the rounding ops it is)."""
    if (op_name(q) != _QUANTIZE or str(dq.ty.dtype) != "float32"
            or int(q.attrs.axis) != int(dq.attrs.axis)):
        return False
    x = q.args[0]
    params = [const_value(a) for a in (*q.args[1:], *dq.args[1:])]
    if (not isinstance(x, relax.Var) or str(x.ty.dtype) != "float32"
            or any(p is None for p in params)):
        return False
    scale, zp, dq_scale, dq_zp = (p.astype(np.float64).reshape(-1) for p in params)
    return bool(scale.size == zp.size and np.array_equal(scale, dq_scale)
                and np.array_equal(zp, dq_zp) and (scale > 0).all())


def _per_tensor(scale, zp, integer_range) -> QParams:
    """The uint8 quantization of a pair: its own for one scale and zero point; for one per
    channel (NNCF's depthwise inputs), one over the union of the channels' ranges, as
    quantize() calibrates a float32 model's activations."""
    qmin, qmax = integer_range
    if scale.size == 1:
        return QParams(float(scale[0]), int(zp[0]) - qmin)
    return uint8_range(float(((qmin - zp) * scale).min()), float(((qmax - zp) * scale).max()))


def pair_dtypes(mod: tvm.IRModule) -> set:
    """The integer dtypes of main's activation pairs (`_is_pair`: a float32 dequantize of a
    quantize's result with its scale), in any of its blocks (compile takes a main of any
    form)."""
    body = mod["main"].body
    blocks = body.blocks if isinstance(body, relax.SeqExpr) else []
    bindings = [b for block in blocks for b in block.bindings]
    quantized = {b.var: b.value for b in bindings if op_name(b.value) == _QUANTIZE}
    return {str(quantized[b.value.args[0]].ty.dtype) for b in bindings
            if op_name(b.value) == _DEQUANTIZE and b.value.args[0] in quantized
            and _is_pair(quantized[b.value.args[0]], b.value)}


def arrives_quantized(dtypes: set) -> bool:
    """Whether pairs of these dtypes (`pair_dtypes`) make a model that arrives quantized: 8-bit
    ones, which quantize() takes as its activation quantization (16-bit pairs run as the
    float32 rounding ops they are)."""
    return bool(dtypes & {"int8", "uint8"})


def fake_quantization(mod: tvm.IRModule) -> FakeQuantization:
    """`mod` without relax.quantize / relax.dequantize pairs and constants (see the module
    docstring), and the model's quantization of each value a pair read."""
    if pair_dtypes(mod):
        # a file may dequantize one value once per reader (ONNX Runtime's DedicatedQDQPair):
        # one pair per value, so that the op before it fuses its clamp once
        mod = relax.transform.EliminateCommonSubexpr()(mod)
        mod = per_tensor_channels(mod)  # NNCF's depthwise inputs, exactly where possible
    strip = _StripPairs(mod)
    mod = rewrite_functions(mod, strip)
    # the aliases a removed pair leaves would stop the chains' epilogues; both passes keep the
    # other bindings' variables, which the scales are keyed by
    mod = relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(mod))
    return FakeQuantization(mod, _carried(mod["main"], strip.scales))


def _range(q: QParams):
    return -q.zp * q.scale, (255 - q.zp) * q.scale


def _clamps_to(clip, q: QParams) -> bool:
    bounds = tuple(float(a.value) for a in clip.args[1:])
    return bool(np.allclose(bounds, _range(q), rtol=1e-6, atol=0.0))


def _carried(func, scales):
    """The scales also for what a removed pair left in its place (an alias of x, its ReLU, x
    clamped to the pair's range) and for what holds only x's values (a reshape, a max-pool:
    NNCF puts no pair after a max-pool), the variables a quantized op reads."""
    scales = dict(scales)
    for b in dataflow_bindings(func):
        v, name = b.value, op_name(b.value)
        if isinstance(v, relax.Var) and v in scales:
            scales[b.var] = scales[v]
        elif name in (*_SAME_VALUES, "relax.clip", "relax.nn.relu") and isinstance(
                v.args[0], relax.Var):
            q = scales.get(v.args[0])
            if q is not None and b.var not in scales and (
                    name in _SAME_VALUES or (name == "relax.nn.relu" and q.zp == 0)
                    or (name == "relax.clip" and _clamps_to(v, q))):
                scales[b.var] = q
    return scales
