"""torch's safe softmax, read back as one row-wise kernel.

scaled_dot_product_attention and nn.MultiheadAttention use aten._safe_softmax: a softmax whose
rows that are all -inf (every key masked) give 0 instead of NaN. torch.export decomposes it and
TVM's importer writes `all(x == -inf)` as equal, logical_not, a cast, a max reduction, a cast
and logical_not, then full_like and where: besides the softmax, three kernels over the scores
(Whisper-sized attention, 6 x 1500 x 1500 scores: 5 ms per layer on Zen 5, as much as the
softmax itself). Here it is one te.compute of five stages over the softmax's (last) axis: the
row's maximum, whether any element is not -inf, the exps, their sum, and the quotients (0 for a
row with none), which the default CPU schedule runs row by row in L1 (relax/cpu/rows.py) and
TVM's GPU rules as one reduction kernel. The stages are TOPI's softmax's, so a row with a
finite element gets the same values; a NaN is not -inf, so its row keeps the softmax's NaNs, as
in torch.
"""

import math

import tvm
from tvm import relax, te

from ..core.graph import bound_call, op_name, scalar_const, static_shape

# PrimFunc attribute marking the kernel (relax/cpu/fused_attention.py reads attention through it)
SAFE_SOFTMAX_ATTR = "unit_tvm.safe_softmax"


def _axis(axis, ndim):
    return int(axis) % ndim


def _is_neg_inf(expr):
    value = scalar_const(expr)
    return value is not None and value == -math.inf


def _is_zero(expr, lookup):
    full = bound_call(expr, lookup, "relax.full_like")
    if full is not None:
        return scalar_const(full.args[1]) == 0.0
    return bound_call(expr, lookup, "relax.zeros_like") is not None


def _all_neg_inf(cond, lookup):
    """x when `cond` is the importer's all(x == -inf) over one axis, keepdims: logical_not of
    (a cast of (a max over that axis of a cast of (logical_not of (x == -inf))))."""
    steps = ["relax.logical_not", "relax.astype", "relax.max", "relax.astype",
             "relax.logical_not", "relax.equal"]
    calls, expr = [], cond
    for name in steps:
        call = bound_call(expr, lookup, name)
        if call is None:
            return None, None
        calls.append(call)
        expr = call.args[0]
    equal, reduction = calls[-1], calls[2]
    if not _is_neg_inf(equal.args[1]) or not bool(reduction.attrs.keepdims):
        return None, None
    axes = reduction.attrs.axis
    if axes is None or len(axes) != 1:
        return None, None
    return equal.args[0], int(axes[0])


def safe_softmax_parts(call, lookup):
    """(x, softmax call) when `call` is where(all(x == -inf), 0, softmax(x)) over the softmax's
    axis as TVM's torch importer writes it, else None."""
    if op_name(call) != "relax.where" or len(call.args) != 3:
        return None
    cond, zeros, value = call.args
    softmax = bound_call(value, lookup, "relax.nn.softmax")
    if softmax is None or not _is_zero(zeros, lookup):
        return None
    x, axis = _all_neg_inf(cond, lookup)
    shape = static_shape(softmax.args[0])
    if x is None or shape is None or not x.same_as(softmax.args[0]):
        return None
    if _axis(axis, len(shape)) != _axis(softmax.attrs.axis, len(shape)):
        return None
    return x, softmax


def safe_softmax_te(x: te.Tensor) -> te.Tensor:
    """The safe softmax of `x` over its last axis (module docstring) as a te.compute."""
    *rows, length = x.shape

    def over_row(body, name):
        k = te.reduce_axis((0, length), name="k")
        return te.compute(rows, lambda *r: body(r, k), name=name)

    row_max = over_row(lambda r, k: te.max(x[(*r, k)], axis=k), "row_max")
    neg_inf = tvm.tirx.const(-math.inf, x.dtype)
    live = over_row(lambda r, k: te.max(tvm.tirx.Select(x[(*r, k)] == neg_inf, 0, 1), axis=k),
                    "row_live")
    exps = te.compute(x.shape, lambda *i: te.exp(x[i] - row_max[i[:-1]]), name="exps")
    total = over_row(lambda r, k: te.sum(exps[(*r, k)], axis=k), "row_sum")
    return te.compute(x.shape, lambda *i: tvm.tirx.Select(
        live[i[:-1]] > 0, exps[i] / total[i[:-1]], tvm.tirx.const(0, x.dtype)),
        name="safe_softmax")


@relax.expr_functor.mutator
class SafeSoftmaxes(relax.PyExprMutator):
    """The rewrite of the module docstring on every match over the last axis (the old check's
    ops are then dead)."""

    def visit_call_(self, call):  # noqa: D401 - mutator hook
        call = self.visit_expr_post_order(call)
        parts = safe_softmax_parts(call, self.lookup_binding)
        if parts is None:
            return call
        x, softmax = parts
        if _axis(softmax.attrs.axis, len(static_shape(x))) != len(static_shape(x)) - 1:
            return call
        return self.builder_.call_te(safe_softmax_te, x, primfunc_name_hint="safe_softmax",
                                     primfunc_attrs={SAFE_SOFTMAX_ATTR: True})
