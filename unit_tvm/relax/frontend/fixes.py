"""Repairs of what TVM's model frontends produce, in one place, run by unit_tvm.compile.

- cumsum over booleans with no dtype: PyTorch sums booleans as int64 (GPT-2's position ids are
  `attention_mask.cumsum(-1)`), TVM's torch frontend keeps the bool dtype, and LLVM's codegen then
  stops with a bare check failure naming neither the op nor the layer. The sum is made int64.
- einsum that is a (batched) matrix product, as ONNX exports of attention write it (MaxViT's
  "bhid,bhjd->bhij"): TVM legalizes einsum to one naive loop nest (2.7 GB/s, 38% of
  maxvit_t's time) that no matmul path sees. It becomes permute_dims + matmul + permute_dims,
  which quantize, the attention paths and TVM's own schedules know.
- Clip from ONNX (opset 11 and later: its bounds are inputs) as two call_tirs of TOPI's
  maximum and minimum (MobileNetV2's ReLU6): no quantized op fuses them, so each conv wrote
  float32 for them and the next one quantized it back (mobilenet_v2.onnx ran 4x slower than
  the same model from PyTorch). With constant scalar bounds they become relax's relu / clip,
  which a conv's epilogue takes (`clamps_as_clips`, after constants are folded).
- GELUs spelled out (ONNX before opset 20: Div, Erf, Add, Mul, Mul; Hugging Face's tanh
  "gelu_new") as relax.nn.gelu / gelu_tanh, which a dense layer's epilogue takes
  (spelled_gelu.py).
- a matmul by a 2-D weight broadcast over the batch (torch.export's expand + bmm for a linear
  layer on a non-contiguous 3-D input: nn.MultiheadAttention's packed projection in every
  nn.TransformerEncoderLayer with batch_first): one copy of the weight per row of the sequence
  (300 x 384 x 1152 float32 for one Whisper-sized layer), a batched product the quantizer does
  not take. It becomes the matmul by the 2-D weight, which broadcasts the same way.
- a group norm with one channel per group (wav2vec2's feature encoder, instance norms) as a
  layer norm over the axes after the channels and the channels' scale and shift: TVM's group
  norm kernel took 2.2 ms for wav2vec2's 512 x 3199 values (6 GB/s), 18% of the model; the
  layer norm runs as one pass over rows.
- broadcast_to a tensor's own shape (torch.export's expand before each bmm of attention): a
  copy kernel each, which also kept attention's reshapes from being views. Removed.
- torch's safe softmax (scaled_dot_product_attention, nn.MultiheadAttention: rows that are all
  -inf give 0, not NaN) as five reductions and elementwise passes over the scores besides the
  softmax; one check of the row instead (safe_softmax.py).
- conv1d as a conv2d of height 1 (conv1d_lift.py): the quantizer and the tensorize pass know
  2-D convs.
- full / full_like of an infinite or NaN value (`torch.full((n, n), float("-inf")).triu(1)`,
  the causal mask of many decoders): TVM 0.27's legalization of them stops with a TypeError in
  topi.full (it tests `"float" in dtype` on a PrimType). They become a broadcast_to of the
  scalar, the same tensor.
"""

import math
from typing import NamedTuple

import numpy as np

import tvm
import tvm_ffi
from tvm import relax

from ..core.graph import bound_call, const_value, op_name, rewrite_functions, static_shape
from .conv1d_lift import conv1d_as_conv2d
from .safe_softmax import SafeSoftmaxes
from .spelled_gelu import SpelledGelus


@relax.expr_functor.mutator
class _BoolCumsumAsInt64(relax.PyExprMutator):
    def visit_call_(self, call):  # noqa: D401 - mutator hook
        call = self.visit_expr_post_order(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.cumsum"):
            return call
        data = call.args[0]
        if str(data.ty.dtype) != "bool":
            return call
        attrs = call.attrs
        axis = None if attrs.axis is None else int(attrs.axis)
        dtype = attrs.dtype if attrs.dtype is not None and str(attrs.dtype) not in (
            "", "void", "bool") else "int64"
        return relax.op.cumsum(relax.op.astype(data, dtype), axis=axis, dtype=dtype,
                               exclusive=bool(attrs.exclusive))


class MatmulEinsum(NamedTuple):
    """An einsum equation read as a batched matrix product: the axis orders that make each
    operand [batch..., rows, contracted] and [batch..., contracted, cols], and the one that puts
    the product's [batch..., rows, cols] in the equation's output order (None: already so)."""

    left: list | None
    right: list | None
    out: list | None


def matmul_einsum(subscripts: str) -> MatmulEinsum | None:
    """The product an equation like "bhid,bhjd->bhij" computes, or None: two operands, no
    ellipsis or repeated letter, one contracted letter, one free letter in each operand and
    the batch letters in both."""
    eq = subscripts.replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    if len(terms) != 2 or any(len(set(t)) != len(t) for t in (*terms, out)):
        return None
    a, b = terms
    contracted = [c for c in a if c in b and c not in out]
    rows, cols = [c for c in a if c not in b], [c for c in b if c not in a]
    batch = "".join(c for c in out if c in a and c in b)
    if len(contracted) != 1 or len(rows) != 1 or len(cols) != 1 \
            or sorted(out) != sorted(batch + rows[0] + cols[0]):
        return None

    def order(letters, wanted):
        axes = [letters.index(c) for c in wanted]
        return None if axes == list(range(len(axes))) else axes

    return MatmulEinsum(order(a, batch + rows[0] + contracted[0]),
                        order(b, batch + contracted[0] + cols[0]),
                        order(batch + rows[0] + cols[0], out))


def _permuted(x, axes):
    return x if axes is None else relax.op.permute_dims(x, axes)


@relax.expr_functor.mutator
class _EinsumAsMatmul(relax.PyExprMutator):
    def visit_call_(self, call):  # noqa: D401 - mutator hook
        call = self.visit_expr_post_order(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.einsum"
                and isinstance(call.args[0], relax.Tuple)):
            return call
        form = matmul_einsum(str(call.attrs.subscripts))
        if form is None:
            return call
        x, y = call.args[0].fields
        product = relax.op.matmul(_permuted(x, form.left), _permuted(y, form.right))
        return _permuted(product, form.out)


@relax.expr_functor.mutator
class _BroadcastWeightMatmul(relax.PyExprMutator):
    def visit_call_(self, call):  # noqa: D401 - mutator hook
        call = self.visit_expr_post_order(call)
        if op_name(call) != "relax.matmul" or len(call.args) != 2:
            return call
        x, y = call.args[0], self._unbroadcast(call.args[1])
        x_shape, y_shape, w_shape = (static_shape(e) for e in (x, call.args[1], y))
        # the weight's own shape is the product's last two axes, and x already has the batch
        # axes the broadcast gave it: the 2-D product has the same shape and values
        if (None in (x_shape, y_shape, w_shape) or len(w_shape) != 2 or len(y_shape) < 3
                or w_shape != y_shape[-2:] or x_shape[:-2] != y_shape[:-2]):
            return call
        return relax.op.matmul(x, y, out_dtype=call.attrs.out_dtype)

    def _unbroadcast(self, expr):
        """What a broadcast_to bound to `expr` broadcasts (`expr` itself otherwise)."""
        call = bound_call(expr, self.lookup_binding, "relax.broadcast_to")
        return expr if call is None else call.args[0]


@relax.expr_functor.mutator
class _ChannelGroupNorms(relax.PyExprMutator):
    def visit_call_(self, call):  # noqa: D401 - mutator hook
        call = self.visit_expr_post_order(call)
        if op_name(call) != "relax.nn.group_norm":
            return call
        a, shape = call.attrs, static_shape(call.args[0])
        axes = None if shape is None else sorted(int(v) % len(shape) for v in a.axes)
        if (shape is None or int(a.channel_axis) % len(shape) != 1 or int(a.num_groups)
                != shape[1] or axes != list(range(2, len(shape)))):
            return call
        # one channel per group: each (image, channel)'s own mean and variance over the rest,
        # which is a layer norm over those axes; the channels' scale and shift after it
        x, gamma, beta = call.args
        dtype = str(x.ty.dtype)
        ones, zeros = (relax.const(f(shape[2:], "float32"), dtype) for f in (np.ones, np.zeros))
        y = relax.op.nn.layer_norm(x, ones, zeros, axes=axes, epsilon=float(a.epsilon))
        per_channel = [shape[1]] + [1] * (len(shape) - 2)
        if bool(a.scale):
            y = relax.op.multiply(y, relax.op.reshape(gamma, per_channel))
        if bool(a.center):
            y = relax.op.add(y, relax.op.reshape(beta, per_channel))
        return y


@relax.expr_functor.mutator
class _NoOpBroadcasts(relax.PyExprMutator):
    def visit_call_(self, call):  # noqa: D401 - mutator hook
        call = self.visit_expr_post_order(call)
        if op_name(call) == "relax.broadcast_to":
            shape, to = static_shape(call.args[0]), call.args[1]
            target = [getattr(v, "value", None) for v in getattr(to, "values", [None])]
            if shape is not None and shape == target:
                return call.args[0]
        return call


@relax.expr_functor.mutator
class _NonFiniteFulls(relax.PyExprMutator):
    def visit_call_(self, call):  # noqa: D401 - mutator hook
        call = self.visit_expr_post_order(call)
        name = op_name(call)
        if name not in ("relax.full", "relax.full_like"):
            return call
        fill = const_value(call.args[1])
        dtype = str(call.ty.dtype)
        shape = static_shape(call)
        if fill is None or fill.size != 1 or np.isfinite(fill).all() or shape is None:
            return call
        return relax.op.broadcast_to(relax.const(fill.reshape(()).astype(dtype), dtype), shape)


class ScalarClamp(NamedTuple):
    """A call_tir that computes max(x, bound) ("max") or min(x, bound) ("min") elementwise."""

    kind: str
    x: relax.Expr
    bound: float


def scalar_clamp(call, mod) -> ScalarClamp | None:
    """The clamp a call_tir of `mod` computes, or None: its function stores max or min of its
    first argument (float32) and its second, a constant scalar."""
    if op_name(call) != "relax.call_tir" or not isinstance(call.args[1], relax.Tuple):
        return None
    func = mod.functions.get(call.args[0]) if isinstance(call.args[0], tvm.ir.GlobalVar) else None
    fields = call.args[1].fields
    if not isinstance(func, tvm.tirx.PrimFunc) or len(fields) != 2 or len(func.params) != 3:
        return None
    x, bound = fields
    limit = const_value(bound)
    if limit is None or limit.size != 1 or str(getattr(x.ty, "dtype", "")) != "float32":
        return None
    stores = []
    tvm_ffi.structural_walk(func.body, [(tvm.tirx.BufferStore, stores.append)], order="pre")
    if len(stores) != 1 or not isinstance(stores[0].value, (tvm.tirx.Max, tvm.tirx.Min)):
        return None
    value = stores[0].value
    # in TVM 0.27 a load's source is the function's tensor parameter itself
    sources = [getattr(v, "source", None) for v in (value.a, value.b)]
    if not (any(func.params[0].same_as(v) for v in sources)
            and any(func.params[1].same_as(v) for v in sources)):
        return None
    kind = "max" if isinstance(value, tvm.tirx.Max) else "min"
    return ScalarClamp(kind, x, float(limit.reshape(())))


@relax.expr_functor.mutator
class _ClampsAsClip(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.mod = mod

    def visit_call_(self, call):  # noqa: D401 - mutator hook
        call = self.visit_expr_post_order(call)
        clamp = scalar_clamp(call, self.mod)
        if clamp is None:
            return call
        if clamp.kind == "max":
            return (relax.op.nn.relu(clamp.x) if clamp.bound == 0.0
                    else relax.op.clip(clamp.x, clamp.bound, math.inf))
        inner = self.lookup_binding(clamp.x) if isinstance(clamp.x, relax.Var) else None
        if op_name(inner) == "relax.nn.relu":
            return relax.op.clip(inner.args[0], 0.0, clamp.bound)
        if op_name(inner) == "relax.clip" and float(inner.args[2].value) == math.inf:
            return relax.op.clip(inner.args[0], float(inner.args[1].value), clamp.bound)
        return relax.op.clip(clamp.x, -math.inf, clamp.bound)


@tvm.transform.module_pass(opt_level=0, name="UnitFrontendFixes")
def frontend_fixes(mod, ctx):
    """tvm.transform.Pass: the repairs above on every Relax function of the module."""
    mod = rewrite_functions(mod, _BoolCumsumAsInt64(mod))
    mod = rewrite_functions(mod, _NonFiniteFulls(mod))
    mod = rewrite_functions(mod, _EinsumAsMatmul(mod))
    mod = rewrite_functions(mod, _ChannelGroupNorms(mod))
    mod = rewrite_functions(mod, _NoOpBroadcasts(mod))
    mod = rewrite_functions(mod, _BroadcastWeightMatmul(mod))
    mod = rewrite_functions(mod, SafeSoftmaxes(mod))
    # a spelled-out GELU's ops that nothing else reads are dead once it is one op
    mod = relax.transform.DeadCodeElimination()(rewrite_functions(mod, SpelledGelus(mod)))
    return conv1d_as_conv2d(mod)


def clamps_as_clips(mod: tvm.IRModule) -> tvm.IRModule:
    """The ONNX Clip repair (module docstring) on every Relax function; run after
    FoldConstant: the importer computes each bound through a NaN check of its constant."""
    return rewrite_functions(mod, _ClampsAsClip(mod))
