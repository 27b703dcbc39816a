"""A QDQ pair with a scale per channel (NNCF gives one to each depthwise conv's input) made one
per tensor without changing one integer: unit-tvm's activations carry one scale per tensor.

For a pair quantize(x, s[c], z) read only by depthwise convs, with S = max s[c] and
k[c] = S / s[c] >= 1:
- the value becomes x' = x * k[c], quantized with S: round(x' / S) = round(x / s[c]), the file's
  integers;
- each depthwise conv reads one channel per output channel, so its weights take 1 / k[c] per
  channel (the product of the two scales is the file's; an int8 weight stays on its grid, one
  step per channel scaled);
- the multiply goes before the activation that makes x where it commutes with it (a ReLU; a
  clip(y, 0, hi) whose top the integers cap anyway: hi / s[c] >= the top integer), so the
  conv before folds k into its epilogue's per-channel multiplier and writes uint8 directly.

Pairs of any other form (a reader that is not a depthwise conv, an activation that does not
commute with a scale, such as SiLU or hardswish, zero points that differ per channel) keep the
fallback of quantization/qdq.py: one quantization over the union of the channels' ranges. On NNCF's
MobileNetV2 that fallback is as close to the float32 model as the file (cosine 0.99726 against
0.99728 for ONNX Runtime running both forms) but moves unit-tvm away from the file's results
(cosine to ONNX Runtime on the file 0.99724, OpenVINO 0.99776).
"""

from typing import NamedTuple

import numpy as np
import tvm
from tvm import relax

from ..core.graph import (const_value, dataflow_bindings, integer_range, op_name, readers,
    rewrite_functions, vars_in)

_QUANTIZE, _DEQUANTIZE = "relax.quantize", "relax.dequantize"
_AFFINE_OR_CONV = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide",
                   "relax.nn.conv2d")


class _Plan(NamedTuple):
    """How one pair becomes per tensor."""

    source: relax.Var  # the value multiplied by k (before the activation that commutes)
    relu: bool  # whether a ReLU follows the multiply (the activation x had)
    k: np.ndarray  # [C] factors S / s[c]
    scale: float  # S
    zp: np.ndarray  # the zero point as a scalar of the pair's dtype


def _channel_params(q, channels):
    """(scale [C], zero point [C]) of a quantize call along axis 1, or None."""
    scale, zp = const_value(q.args[1]), const_value(q.args[2])
    if scale is None or zp is None or int(q.attrs.axis) != 1:
        return None
    scale, zp = scale.reshape(-1).astype(np.float64), zp.reshape(-1)
    if scale.size not in (1, channels) or zp.size not in (1, channels):
        return None
    return np.broadcast_to(scale, channels), np.broadcast_to(zp, channels)


def _same_params(a, b) -> bool:
    return all(np.array_equal(const_value(x), const_value(y))
               for x, y in zip(a.args[1:], b.args[1:])) and int(a.attrs.axis) == int(b.attrs.axis)


def _depthwise_on(call, data, channels) -> bool:
    """Whether `call` is an NCHW depthwise conv (any channel multiplier) reading `data` with a
    constant weight."""
    if op_name(call) != "relax.nn.conv2d" or not call.args[0].same_as(data):
        return False
    a, w = call.attrs, call.args[1]
    return (int(a.groups) == channels and str(a.data_layout) == "NCHW"
            and str(a.kernel_layout) == "OIHW" and isinstance(w, tvm.ir.expr.Constant)
            and int(w.ty.shape[1]) == 1)


def _commuting_source(x, by_var, uses, scale, zp, top):
    """(source, relu) when x * k[c] can be computed as relu(source * k) or source * k (the
    multiply then folds into the op before it); None otherwise."""
    v = by_var.get(x)
    name = op_name(v)
    if name in _AFFINE_OR_CONV:
        return x, False
    if name not in ("relax.nn.relu", "relax.clip") or not isinstance(v.args[0], relax.Var):
        return None
    if len(uses.get(v.args[0], [])) != 1:
        return None  # another reader of the activation's input would see the multiply
    if name == "relax.clip":
        lo, hi = (float(a.value) for a in v.args[1:])
        # the clip's bottom must be the ReLU's, its top beyond what the integers hold anyway
        if lo != 0.0 or not (hi / scale >= (top - zp) - 0.5 + 1e-3).all():
            return None
    return v.args[0], True


def _plan_pair(b, by_var, uses):
    """The _Plan of the quantize binding b, or None where quantization/qdq.py's fallback stays."""
    q, x = b.value, b.value.args[0]
    shape = getattr(x.ty, "shape", None) if isinstance(x, relax.Var) else None
    if shape is None or len(shape) != 4 or integer_range(q) is None:
        return None
    channels = int(shape[1])
    params = _channel_params(q, channels)
    if params is None or len(uses.get(x, [])) != 1:
        return None
    scale, zp = params
    if (scale <= 0).any() or not (zp == zp[0]).all() or np.allclose(scale, scale.max()):
        return None
    dqs = uses.get(b.var, [])  # None: the function returns it
    if not dqs or not all(r is not None and op_name(r.value) == _DEQUANTIZE
                          and _same_params(q, r.value) for r in dqs):
        return None
    convs = [(r, c) for r in dqs for c in uses.get(r.var, [])]
    if not convs or not all(c is not None and _depthwise_on(c.value, r.var, channels)
                            for r, c in convs):
        return None
    found = _commuting_source(x, by_var, uses, scale, float(zp[0]), integer_range(q)[1])
    if found is None:
        return None
    s_max = float(scale.max())
    return _Plan(found[0], found[1], s_max / scale, s_max, np.asarray(zp[0]))


@relax.expr_functor.mutator
class _PerTensor(relax.PyExprMutator):
    """Rewrites the planned pairs (quantize, its dequantizes) and the convs that read them."""

    def __init__(self, mod, quantizes, dequantizes, convs):
        super().__init__(mod)
        # the calls to rewrite (as they are in main) -> the _Plan of their pair
        self.quantizes, self.dequantizes, self.convs = quantizes, dequantizes, convs

    def visit_call_(self, call):
        orig = call
        call = self.visit_expr_post_order(call)
        name = op_name(call)
        if name == _QUANTIZE and orig in self.quantizes:
            plan = self.quantizes[orig]
            k = relax.const(plan.k.reshape(1, -1, 1, 1).astype(np.float32))
            x = self.builder_.emit(relax.op.multiply(self.visit_expr(plan.source), k))
            if plan.relu:
                x = self.builder_.emit(relax.op.nn.relu(x))
            return relax.op.quantize(x, *_scalars(plan), axis=1, out_dtype=str(call.ty.dtype))
        if name == _DEQUANTIZE and orig in self.dequantizes:
            plan = self.dequantizes[orig]
            return relax.op.dequantize(call.args[0], *_scalars(plan), axis=1,
                                       out_dtype="float32")
        if name == "relax.nn.conv2d" and orig in self.convs:
            plan = self.convs[orig]
            w = const_value(call.args[1]).astype(np.float64)
            per_out = np.repeat(1.0 / plan.k, w.shape[0] // plan.k.size)
            w = (w * per_out.reshape(-1, 1, 1, 1)).astype(np.float32)
            return relax.Call(call.op, [call.args[0], relax.const(w)], call.attrs, call.ty_args)
        return call


def _scalars(plan):
    return relax.const(np.float32(plan.scale)), relax.const(plan.zp)


def per_tensor_channels(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every pair of a scale per channel that depthwise convs read made per tensor,
    exactly (see the module docstring); other pairs as they are."""
    func = mod["main"]
    bindings = dataflow_bindings(func)
    by_var = {b.var: b.value for b in bindings}
    uses = readers(bindings)
    # a value the function returns has a reader outside the bindings: it must keep its values
    for v in vars_in(func.body.body):
        uses.setdefault(v, []).append(None)
    quantizes, dequantizes, convs = {}, {}, {}
    for b in bindings:
        if op_name(b.value) != _QUANTIZE:
            continue
        plan = _plan_pair(b, by_var, uses)
        if plan is None:
            continue
        quantizes[b.value] = plan
        for r in uses[b.var]:
            dequantizes[r.value] = plan
            for c in uses[r.var]:
                convs[c.value] = plan
    if not quantizes:
        return mod
    mutator = _PerTensor(mod, quantizes, dequantizes, convs)
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, mutator))
