"""ONNX files in the QOperator format (QLinearConv, QLinearMatMul and ONNX Runtime's com.microsoft
QLinear* / QGemm ops, as `quantize_static(quant_format=QOperator)` writes them and as the ONNX
model zoo's int8 models are) rewritten into the QDQ format TVM's importer reads: each quantized
op becomes DequantizeLinear on its inputs, the float op, and QuantizeLinear on its output with
the op's own scales. The value passed between two ops is then a QuantizeLinear read by a
DequantizeLinear with the same scale and zero point, the pair relax/qdq.py turns into an int8
edge. Ops that only move quantized values (MaxPool, Reshape, Transpose, ...) get the same
wrapping with their input's scale, so the pairs stay adjacent through them.

An op of the com.microsoft domain outside the table below is left as it is (TVM's importer then
names it as unsupported); so are channels-last pools and QLinearSoftmax with the opset 11
semantics over a non-last axis.
"""

import numpy as np

# ops that only move or select quantized values: wrapped with their input's quantization
_VALUE_MOVERS = {"MaxPool", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice",
                 "Split", "Identity", "Gather"}


class _Rewriter:
    """The rewritten graph's nodes and initializers, and each quantized tensor's (scale,
    zero point) names."""

    def __init__(self, graph):
        from onnx import numpy_helper

        self.inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
        self.nodes, self.new_inits, self.qparams = [], [], {}
        self._count = 0
        self._dequantized = {}

    def name(self, base):
        self._count += 1
        return f"{base}__qdq{self._count}"

    def dq(self, x, scale, zp):
        """A float tensor: DequantizeLinear of x (per tensor), one per (x, scale, zero point):
        the readers of a value share it, as they share one pair in a QDQ file (a conv's
        epilogue then takes the ReLU or clamp that the pair stands for once)."""
        from onnx import helper

        key = (x, scale, zp)
        if key not in self._dequantized:
            self._dequantized[key] = out = self.name(x)
            self.nodes.append(helper.make_node("DequantizeLinear", [x, scale, zp], [out]))
        return self._dequantized[key]

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
        from .relax.qdq import dequantized

        scale = self.inits[x_scale].astype(np.float64) * self.inits[w_scale].astype(np.float64)
        return self.const(b, dequantized(self.inits[b], scale, 0, 0))

    def weight(self, w, scale, zp, axis):
        """A float weight: the constant (w - zp) * scale (its scale per channel along `axis`
        or one), or a DequantizeLinear where w is computed at run time."""
        if not all(n in self.inits for n in (w, scale, zp)):
            if np.size(self.inits.get(scale, 0)) > 1:
                raise ValueError(f"QOperator weight {w}: per-channel scales on a run-time value")
            return self.dq(w, scale, zp)
        from .relax.qdq import dequantized

        return self.const(w, dequantized(*(self.inits[n] for n in (w, scale, zp)), axis))


def _attrs(node, drop=()):
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name not in drop}


def _conv(rw, node):
    x, xs, xz, w, ws, wz, ys, yz, *b = node.input
    inputs = [rw.dq(x, xs, xz), rw.weight(w, ws, wz, 0)]
    if b and b[0]:
        inputs.append(rw.bias(b[0], xs, ws))
    return "Conv", inputs, _attrs(node), (ys, yz)


def _matmul(rw, node):
    a, as_, az, b, bs, bz, ys, yz = node.input
    return "MatMul", [rw.dq(a, as_, az), rw.weight(b, bs, bz, -1)], {}, (ys, yz)


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


def _rewrite_node(rw, node) -> bool:
    """Append node's QDQ form to rw; False where it has none (kept as it is)."""
    from onnx import helper

    if node.op_type in _QUANTIZED_OPS and node.domain in ("", "ai.onnx", "com.microsoft"):
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


def is_qoperator(model) -> bool:
    """Whether the ONNX model holds QOperator ops (QLinearConv, QLinearMatMul, QGemm, ...)."""
    return any(n.op_type in _QUANTIZED_OPS for n in model.graph.node)


def qoperator_as_qdq(model):
    """The ONNX model with its QOperator ops as DequantizeLinear -> float op -> QuantizeLinear
    (see the module docstring); the model itself where it has none."""
    from onnx import helper

    if not is_qoperator(model):
        return model
    rw = _Rewriter(model.graph)
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
