"""ONNX files in the QOperator format (QLinearConv, QLinearMatMul and ONNX Runtime's com.microsoft
QLinear* / QGemm ops, as `quantize_static(quant_format=QOperator)` writes them and as the ONNX
model zoo's int8 models are) rewritten into the QDQ format TVM's importer reads: each quantized
op becomes DequantizeLinear on its inputs, the float op, and QuantizeLinear on its output with
the op's own scales. The value passed between two ops is then a QuantizeLinear read by a
DequantizeLinear with the same scale and zero point, the pair quantization/qdq.py turns into an int8
edge. Ops that only move quantized values (MaxPool, Reshape, Transpose, ...) get the same
wrapping with their input's scale, so the pairs stay adjacent through them.

An op of the com.microsoft domain outside the table below is left as it is (TVM's importer then
names it as unsupported); so are channels-last pools and QLinearSoftmax with the opset 11
semantics over a non-last axis.

QLinearConv and QLinearMatMul are specified as the exact integer sum C (bias included)
times the multiplier x_scale * w_scale / y_scale computed in the scales' own type, rounded
once. Where the QDQ form would not compute that (quantization/qdq.py runs it int8 only where the
input is a pair's value and the weight's integers minus their zero point fit int8), the op
takes its exact integer form instead: input, weight and output get the scale 1, so the op
sums integers (exact in float32 up to 2**24), and a Mul by the multiplier (computed in the
file's type, widened to float32, which holds float16 and bfloat16 exactly) comes before
QuantizeLinear: rint(C * multiplier + y_zp), one float32 rounding as in ONNX Runtime. That is
the form of uint8 weights with a zero point (9-bit integers) and of QLinearMatMul's float16
and bfloat16 scales (opset 21), and it runs float32. The other ops' schemas take float32
scales only; another type there is refused with the op's name.
"""

import numpy as np
from .relax.quantization.qdq import dequantized

# the float types other than float32 (TensorProto.FLOAT16, DOUBLE, BFLOAT16)
_OTHER_FLOATS = (10, 11, 16)
# ops that only move or select quantized values: wrapped with their input's quantization
_VALUE_MOVERS = {"MaxPool", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice",
                 "Split", "Identity", "Gather"}


class _Rewriter:
    """The rewritten graph's nodes and initializers, and each quantized tensor's (scale,
    zero point) names."""

    def __init__(self, graph):
        from onnx import numpy_helper

        self.inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
        self.elem_types = {v.name: v.type.tensor_type.elem_type
                           for v in (*graph.input, *graph.value_info, *graph.output)}
        self.elem_types.update({i.name: i.data_type for i in graph.initializer})
        self.nodes, self.new_inits, self.qparams = [], [], {}
        self._count = 0
        self._dequantized = {}

    def scale_is_float32(self, scale) -> bool:
        """Whether the scale tensor is float32 (or of a type the graph does not say)."""
        from onnx import TensorProto

        return self.elem_types.get(scale, TensorProto.FLOAT) in (TensorProto.FLOAT,
                                                                 TensorProto.UNDEFINED)

    def name(self, base):
        self._count += 1
        return f"{base}__qdq{self._count}"

    def dq(self, x, scale, zp, axis=None):
        """A float tensor: DequantizeLinear of x (per tensor, or per `axis` where given), one
        per (x, scale, zero point, axis): the readers of a value share it, as they share one
        pair in a QDQ file (a conv's epilogue then takes the ReLU or clamp that the pair
        stands for once)."""
        from onnx import helper

        key = (x, scale, zp, axis)
        if key not in self._dequantized:
            self._dequantized[key] = out = self.name(x)
            attrs = {} if axis is None else {"axis": axis}
            self.nodes.append(helper.make_node("DequantizeLinear", [x, scale, zp], [out],
                                               **attrs))
        return self._dequantized[key]

    def pairs_with(self, x, scale, zp) -> bool:
        """Whether x was quantized (by a QuantizeLinear or a rewritten op) with this scale and
        zero point: its DequantizeLinear then makes the pair quantization/qdq.py computes int8."""
        if x not in self.qparams:
            return False
        return all(a == b or (a in self.inits and b in self.inits
                              and np.array_equal(self.inits[a], self.inits[b]))
                   for a, b in zip(self.qparams[x], (scale, zp)))

    def q(self, x, out, scale, zp):
        """QuantizeLinear of the float x into `out`, recorded as quantized."""
        from onnx import helper

        self.nodes.append(helper.make_node("QuantizeLinear", [x, scale, zp], [out]))
        self.qparams[out] = (scale, zp)

    def const(self, base, value):
        from onnx import numpy_helper

        name = self.name(base)
        self.new_inits.append(numpy_helper.from_array(np.asarray(value), name))
        self.inits[name] = np.asarray(value)
        return name

    def bias(self, b, x_scale, w_scale):
        """The float bias of an int32 bias quantized with x_scale * w_scale (zero point 0)."""
        if b not in self.inits or x_scale not in self.inits or w_scale not in self.inits:
            raise ValueError(f"QOperator bias {b}: its scales are not constants")

        scale = self.inits[x_scale].astype(np.float64) * self.inits[w_scale].astype(np.float64)
        return self.const(b, dequantized(self.inits[b], scale, 0, 0))

    def weight(self, w, scale, zp, axis):
        """A float weight: the constant (w - zp) * scale (its scale per channel along `axis`
        or one), or a DequantizeLinear where w is computed at run time."""
        if not all(n in self.inits for n in (w, scale, zp)):
            per_channel = scale not in self.inits or np.size(self.inits[scale]) > 1
            return self.dq(w, scale, zp, axis if per_channel else None)

        return self.const(w, dequantized(*(self.inits[n] for n in (w, scale, zp)), axis))


def _attrs(node, drop=()):
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name not in drop}


def _conv(rw, node):
    x, xs, xz, w, ws, wz, ys, yz, *b = node.input
    bias = b[0] if b and b[0] else ""
    if not _exact_form_needed(rw, x, xs, xz, w, ws, wz, ys, axis=0):
        inputs = [rw.dq(x, xs, xz), rw.weight(w, ws, wz, 0)]
        if bias:
            inputs.append(rw.bias(bias, xs, ws))
        return "Conv", inputs, _attrs(node), (ys, yz)
    if not all(s in rw.inits for s in (xs, ws, ys)):
        return None  # scales computed at run time: TVM's importer names the op
    one = rw.const("one", np.float32(1.0))
    inputs = [rw.dq(x, one, xz), rw.weight(w, one, wz, 0)]
    if bias:  # the int32 bias joins the integer sum before the multiplier, as specified
        inputs.append(rw.const(bias, rw.inits[bias].astype(np.float32)))
    ndim = rw.inits[w].ndim if w in rw.inits else 4
    multiplier = _multiplier(rw, xs, ws, ys).reshape((-1,) + (1,) * (ndim - 2))
    return _times_multiplier(rw, node, "Conv", inputs, _attrs(node),
                             rw.const("multiplier", multiplier), (one, yz))


def _matmul(rw, node):
    a, as_, az, b, bs, bz, ys, yz = node.input
    if not _exact_form_needed(rw, a, as_, az, b, bs, bz, ys, axis=-1):
        return "MatMul", [rw.dq(a, as_, az), rw.weight(b, bs, bz, -1)], {}, (ys, yz)
    one = rw.const("one", np.float32(1.0))
    inputs = [rw.dq(a, one, az), rw.weight(b, one, bz, -1)]
    return _times_multiplier(rw, node, "MatMul", inputs, {},
                             _matmul_multiplier(rw, node.name or b, as_, bs, ys), (one, yz))


def _exact_form_needed(rw, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, axis) -> bool:
    """Whether a QLinearConv / QLinearMatMul needs its exact integer form (see the module
    docstring) rather than DequantizeLinear -> op -> QuantizeLinear with its own scales, which
    relax/quantization/qdq.py computes int8 where x is a pair's value: needed where a scale is not
    float32 (the multiplier is rounded in its type), where x is no such pair's value (the
    float form would round each product), and where constant weights minus their zero point
    leave the int8 range the int8 form holds exactly (uint8 weights with a zero point)."""
    if not all(rw.scale_is_float32(s) for s in (x_scale, w_scale, y_scale)):
        return True
    if not rw.pairs_with(x, x_scale, x_zp):
        return True
    if w in rw.inits and w_zp in rw.inits:

        centred = dequantized(rw.inits[w], np.float32(1.0), rw.inits[w_zp], axis)
        return bool(np.abs(centred).max(initial=0) > 127)
    return False


def _times_multiplier(rw, node, op, inputs, attrs, multiplier, out_q):
    """The integer op (its float32 values are the exact integer sums while they stay below
    2**24: 258 products of 255 x 255) into a new value, and Mul by the multiplier as the op
    that QuantizeLinear with scale 1 then rounds."""
    from onnx import helper

    product = rw.name(node.output[0])
    rw.nodes.append(helper.make_node(op, inputs, [product], **attrs))
    return "Mul", [product, multiplier], {}, out_q


def _multiplier(rw, x_scale, w_scale, y_scale) -> np.ndarray:
    """x_scale * w_scale / y_scale of constant scales, computed in their own type as the
    ONNX specification does, widened to float32 (which holds float16 and bfloat16 exactly)."""
    x, w, y = (rw.inits[s] for s in (x_scale, w_scale, y_scale))
    return np.asarray(x.reshape(()) * w / y.reshape(())).astype(np.float32)


def _matmul_multiplier(rw, where, a_scale, b_scale, y_scale):
    """The name of QLinearMatMul's a_scale * b_scale / y_scale (one per column of b, or
    one): `_multiplier` of constants, else computed by the graph in the scales' type."""
    from onnx import TensorProto, helper

    if a_scale in rw.inits and np.size(rw.inits[a_scale]) != 1:
        raise ValueError(f"QLinearMatMul {where}: a_scale must be a scalar (ONNX spec), "
                         f"got shape {np.shape(rw.inits[a_scale])}")
    if all(s in rw.inits for s in (a_scale, b_scale, y_scale)):
        return rw.const("multiplier", _multiplier(rw, a_scale, b_scale, y_scale))
    product, quotient, widened = rw.name("scales"), rw.name("scales"), rw.name("multiplier")
    rw.nodes += [helper.make_node("Mul", [a_scale, b_scale], [product]),
                 helper.make_node("Div", [product, y_scale], [quotient]),
                 helper.make_node("Cast", [quotient], [widened], to=TensorProto.FLOAT)]
    return widened


def _gemm(rw, node):
    a, as_, az, b, bs, bz, *rest = node.input
    attrs = _attrs(node)
    inputs = [rw.dq(a, as_, az), rw.weight(b, bs, bz, 0 if attrs.get("transB", 0) else 1)]
    c = rest[0] if rest else ""
    if c:
        inputs.append(rw.bias(c, as_, bs))
    out_q = (rest[1], rest[2]) if len(rest) >= 3 and rest[1] else None
    return "Gemm", inputs, attrs, out_q


def _binary(op):
    def make(rw, node):
        a, as_, az, b, bs, bz, ys, yz = node.input
        return op, [rw.dq(a, as_, az), rw.dq(b, bs, bz)], {}, (ys, yz)

    return make


def _unary(op, drop=()):
    def make(rw, node):
        x, xs, xz, ys, yz = node.input
        attrs = _attrs(node, drop)
        if attrs.pop("channels_last", 0):
            return None
        return op, [rw.dq(x, xs, xz)], attrs, (ys, yz)

    return make


def _softmax(rw, node):
    attrs = _attrs(node)
    if attrs.pop("opset", 13) < 13 and attrs.get("axis", -1) != -1:
        return None  # opset 11 semantics: a 2-D coercion around the axis
    x, xs, xz, ys, yz = node.input
    return "Softmax", [rw.dq(x, xs, xz)], attrs, (ys, yz)


def _concat(rw, node):
    ys, yz, *parts = node.input
    inputs = [rw.dq(*parts[i:i + 3]) for i in range(0, len(parts), 3)]
    return "Concat", inputs, _attrs(node), (ys, yz)


_QUANTIZED_OPS = {
    "QLinearConv": _conv, "QLinearMatMul": _matmul, "QGemm": _gemm,
    "QLinearAdd": _binary("Add"), "QLinearMul": _binary("Mul"),
    "QLinearSigmoid": _unary("Sigmoid"), "QLinearLeakyRelu": _unary("LeakyRelu"),
    "QLinearAveragePool": _unary("AveragePool"),
    "QLinearGlobalAveragePool": _unary("GlobalAveragePool"),
    "QLinearSoftmax": _softmax, "QLinearConcat": _concat,
}


def _check_float32_scales(rw, node):
    """The ops other than QLinearMatMul take float32 scales only: refuse another type with
    the op's name rather than let it meet float32 constants in TVM's importer."""
    if node.op_type == "QLinearMatMul":
        return
    for name in node.input:
        if rw.elem_types.get(name) in _OTHER_FLOATS:
            raise ValueError(f"{node.op_type} {node.name or node.output[0]}: scale "
                             f"{name} is not float32 (its schema takes float32 scales)")


def _rewrite_node(rw, node) -> bool:
    """Append node's QDQ form to rw; False where it has none (kept as it is)."""
    from onnx import helper

    if node.op_type in _QUANTIZED_OPS and node.domain in ("", "ai.onnx", "com.microsoft"):
        _check_float32_scales(rw, node)
        made = _QUANTIZED_OPS[node.op_type](rw, node)
        if made is None:
            return False
        op, inputs, attrs, out_q = made
        if out_q is None:
            rw.nodes.append(helper.make_node(op, inputs, list(node.output), **attrs))
            return True
        y = rw.name(node.output[0])
        rw.nodes.append(helper.make_node(op, inputs, [y], **attrs))
        rw.q(y, node.output[0], *out_q)
        return True
    if node.op_type in _VALUE_MOVERS and node.domain in ("", "ai.onnx") and node.input \
            and node.input[0] in rw.qparams:
        scale, zp = rw.qparams[node.input[0]]
        floats = [rw.name(o) for o in node.output]
        inputs = [rw.dq(node.input[0], scale, zp), *node.input[1:]]
        rw.nodes.append(helper.make_node(node.op_type, inputs, floats, **_attrs(node)))
        for f, out in zip(floats, node.output):
            rw.q(f, out, scale, zp)
        return True
    return False


def _with_types(model):
    """The model with ONNX's inferred types of its intermediate values where inference runs
    (it may not know com.microsoft ops: then the types the file itself gives)."""
    from onnx import shape_inference

    try:
        return shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - any failure of inference leaves the file's own types
        return model


def is_qoperator(model) -> bool:
    """Whether the ONNX model holds QOperator ops (QLinearConv, QLinearMatMul, QGemm, ...)."""
    return any(n.op_type in _QUANTIZED_OPS for n in model.graph.node)


def qoperator_as_qdq(model):
    """The ONNX model with its QOperator ops as DequantizeLinear -> float op -> QuantizeLinear
    (see the module docstring); the model itself where it has none."""
    from onnx import helper

    if not is_qoperator(model):
        return model
    rw = _Rewriter(_with_types(model).graph)
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and len(node.input) == 3:
            rw.qparams[node.output[0]] = (node.input[1], node.input[2])
        if not _rewrite_node(rw, node):
            rw.nodes.append(node)
    graph = helper.make_graph(rw.nodes, model.graph.name, model.graph.input,
                              model.graph.output, [*model.graph.initializer, *rw.new_inits])
    out = helper.make_model(graph, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    return out
