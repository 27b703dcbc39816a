"""The elementwise ops after a Tensor Core kernel that go into its write-back on the GPU path.

After a conv or dense layer the fp16 model runs a per-channel bias add, maybe a residual add and
an activation; TVM fused them into one kernel after the wmma kernel (about 20 in resnet18, one
per layer). Here such a chain, each value read only by the next op, becomes te stages over the
kernel's result (`stages`), which preparation folds into the kernel's write-back
(`build.prepare_op`, `epilogue.find`): the layer is one kernel, its output written once.

A transformer's chains have reshapes between their ops (views: the channels stay the last axis),
cast to float32 before the residual add (ToMixedPrecision keeps the residual stream and the layer
norms in float32) and end in a GELU; attention's scores are scaled by 1 / sqrt(d) and cast to
float32 for the softmax, and a CNN's last activation is cast to float32 for the global pool. Each
of those was a kernel of its own.
"""

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, te, tirx

from ..core import activations
from ..core.graph import const_value, dataflow_bindings, op_name, readers, scalar_const, uses


@dataclass(frozen=True, eq=False)
class Chain:
    """The ops after a Tensor Core call that its kernel computes: a per-channel bias (numpy,
    one value per output channel, or None), a scalar scale ("relax.divide" or
    "relax.multiply", the constant; or None: attention's 1 / sqrt(d)), a cast (the dtype, or
    None), a residual (the Var added, or None), a clamp's bounds (lo, hi; None when there is
    none, hi None for ReLU) or a smooth activation ("gelu" for erf's, else an
    activations.NAMES entry), and the shape of the last op's value (reshapes inside the chain
    are views)."""

    end: relax.Call  # the last op of the chain in the original function
    bias: np.ndarray | None
    residual: relax.Var | None = None
    bounds: tuple | None = None
    cast: str | None = None
    activation: str | None = None
    shape: tuple = ()
    scale: tuple | None = None
    cast_last: str | None = None  # a cast to float32 after the residual add / activation


def _channels(expr, channels):
    """A constant's values as one per output channel (the last axis), or None."""
    value = const_value(expr)
    if value is None or value.size != channels:
        return None
    if value.ndim and any(s != 1 for s in value.shape[:-1]):
        return None
    return value.reshape(-1)


def find_chains(func: relax.Function, starts) -> dict:
    """{start call: Chain} for the calls `starts` (conv2d / matmul bindings' values) whose single
    reader adds a per-channel constant or scales by a scalar one (or both, in that order); the
    chain then takes a cast to float32, a residual add of another value of the same shape and
    dtype, then a ReLU, a clip (maximum with 0, then maybe minimum) or a smooth activation,
    each read once, with reshapes that keep the channels last between them. A binding joins
    one chain at most (the first in program order)."""
    bindings = dataflow_bindings(func)
    count, reader = uses(bindings, func), readers(bindings)
    var_of = {b.value: b.var for b in bindings}
    binding_of = {b.var: b for b in bindings}
    claimed, out = set(), {}
    for call in starts:
        var = var_of.get(call)
        if var is None:
            continue
        chain = _Follow(binding_of, count, reader, claimed, int(call.ty.shape[-1])).chain(var)
        if chain is not None:
            out[call] = chain
    return out


class _Follow:
    """Walks one chain from a kernel's result; `taken` holds the variables it consumed."""

    def __init__(self, binding_of, count, reader, claimed, channels):
        self.binding_of = binding_of
        self.count, self.reader, self.claimed = count, reader, claimed
        self.channels = channels
        self.taken = []

    def _single_reader(self, var):
        """The binding that reads `var`, when it is its only read and in no chain yet."""
        found = self.reader.get(var, [])
        if self.count.get(var, 0) != 1 or len(found) != 1 or found[0].var in self.claimed:
            return None
        return found[0]

    def _next(self, var):
        """(the first reader of `var` past reshapes that keep the channels last, the reshapes'
        variables), or (None, ())."""
        views, b = [], self._single_reader(var)
        while (b is not None and op_name(b.value) == "relax.reshape"
               and int(b.var.ty.shape[-1]) == self.channels):
            views.append(b.var)
            b = self._single_reader(b.var)
        return b, tuple(views)

    def _take(self, b, views):
        self.taken += [*views, b.var]
        return b

    def chain(self, var):
        end, (nxt, views) = None, self._next(var)
        bias = None
        if nxt is not None and op_name(nxt.value) == "relax.add":
            a, c = nxt.value.args
            bias = _channels(c if a.same_as(views[-1] if views else var) else a, self.channels)
            if bias is not None:
                end = self._take(nxt, views)
                nxt, views = self._next(end.var)
        scale = _scale(nxt, views[-1] if views else (end.var if end else var))
        if scale is not None:
            end = self._take(nxt, views)
            nxt, views = self._next(end.var)
        if end is None:
            return None
        cast = None
        if self._widening(nxt, end):
            cast, end = "float32", self._take(nxt, views)
            nxt, views = self._next(end.var)
        residual = self._residual(nxt, end, views)
        if residual is not None:
            end = self._take(nxt, views)
            nxt, views = self._next(end.var)
        bounds, activation, end = self._activation(nxt, views, end)
        cast_last = None
        if cast is None and (bounds or activation or residual is not None):
            nxt, views = self._next(end.var)
            if self._widening(nxt, end):  # a value the next op reads in float32 (a mean)
                cast_last, end = "float32", self._take(nxt, views)
        self.claimed.update(self.taken)
        return Chain(end.value, bias, residual, bounds, cast, activation,
                     tuple(int(s) for s in end.var.ty.shape), scale, cast_last)

    @staticmethod
    def _widening(b, end):
        """Whether binding `b` casts `end`'s fp16 value to float32."""
        return (b is not None and op_name(b.value) == "relax.astype"
                and str(b.value.attrs.dtype) == "float32"
                and str(end.var.ty.dtype) == "float16")

    @staticmethod
    def _residual(b, end, views):
        """The other operand of `b` when it adds a value of the shape and dtype of the chain's
        value it reads (`end`'s, past `views`)."""
        if b is None or op_name(b.value) != "relax.add":
            return None
        cur = views[-1] if views else end.var
        a, r = b.value.args
        other = r if a.same_as(cur) else a
        if (isinstance(other, relax.Var) and not other.same_as(cur)
                and str(other.ty.dtype) == str(cur.ty.dtype)
                and [int(s) for s in other.ty.shape] == [int(s) for s in cur.ty.shape]):
            return other
        return None

    def _activation(self, nxt, views, end):
        """(bounds, activation name, the chain's new end) for what `nxt` starts."""
        name = op_name(nxt.value) if nxt is not None else ""
        if name == "relax.nn.relu":
            return (0.0, None), None, self._take(nxt, views)
        if name == "relax.nn.gelu":
            return None, "gelu", self._take(nxt, views)
        if name == "relax.maximum" and scalar_const(nxt.value.args[1]) == 0.0:
            end = self._take(nxt, views)
            top = self._single_reader(end.var)
            if top is not None and op_name(top.value) == "relax.minimum":
                hi = scalar_const(top.value.args[1])
                if hi is not None:
                    return (0.0, hi), None, self._take(top, ())
            return (0.0, None), None, end
        found = activations.match(views[-1] if views else end.var, self.reader, self.count)
        if found is None or any(v in self.claimed for v in found.members):
            return None, None, end
        self.taken += [*views, *found.members]
        return None, found.name, self.binding_of[found.end]


def _scale(b, cur):
    """(op name, constant) when binding `b` divides `cur` by a scalar constant or multiplies it
    by one, else None."""
    name = op_name(b.value) if b is not None else ""
    if name not in ("relax.divide", "relax.multiply"):
        return None
    a, c = b.value.args
    if not a.same_as(cur):
        if name == "relax.divide":
            return None
        a, c = c, a
    value = scalar_const(c) if a.same_as(cur) else None
    return None if value is None else (name, value)


def _added(y, other, name):
    return te.compute(y.shape, lambda *i: y(*i) + other(*i), name=name)


def _bounded(y, lo, hi, dtype):
    def body(*i):
        v = tvm.te.max(y(*i), tirx.const(lo, dtype))
        return v if hi is None else tvm.te.min(v, tirx.const(hi, dtype))
    return te.compute(y.shape, body, name="activated")


def _smooth(y, name, dtype):
    """The activation `name` of y, computed in float32 (erf's GELU by the device's erf)."""
    def body(*i):
        v = y(*i).astype("float32")
        if name == "gelu":
            half = tirx.const(0.5, "float32")
            act = half * v * (tirx.const(1.0, "float32")
                              + tirx.erf(v * tirx.const(0.7071067811865476, "float32")))
        else:
            act = activations.expr(name, v)
        return act.astype(dtype)
    return te.compute(y.shape, body, name="activated")


def out_dtype(chain: Chain, dtype: str) -> str:
    """The dtype a kernel computing `chain` writes (the model's `dtype` unless it casts)."""
    return chain.cast_last or chain.cast or dtype


def stages(out: te.Tensor, chain: Chain, dtype: str, dequantize: bool = False) -> tuple:
    """(placeholders, result): te stages computing `chain` over a kernel's accumulator `out`
    (channels on its last axis) in `dtype`, as the model did: cast (int8, `dequantize`: times
    a per-channel scale in float32 first, as gpu_int8.dequantized), + bias, scale, maybe a
    cast to float32, + residual, activation."""
    shape, inputs = [int(s) for s in out.shape], []
    value = out
    if dequantize:
        scale = te.placeholder((shape[-1],), "float32", name="dequantize")
        inputs.append(scale)
        value = te.compute(shape, lambda *i: out(*i).astype("float32") * scale[i[-1]],
                           name="dequantized")
    if chain.bias is not None:
        bias = te.placeholder((shape[-1],), dtype, name="bias")
        inputs.append(bias)
        y = te.compute(shape, lambda *i: value(*i).astype(dtype) + bias[i[-1]], name="biased")
    else:
        y = te.compute(shape, lambda *i: value(*i).astype(dtype), name="rounded")
    if chain.scale is not None:
        op, value = chain.scale
        c = tirx.const(value, dtype)
        y = te.compute(shape, (lambda *i: y(*i) / c) if op == "relax.divide"
                       else (lambda *i: y(*i) * c), name="scaled")
    if chain.cast is not None:
        y = te.compute(shape, lambda *i: y(*i).astype(chain.cast), name="cast")
    dtype = chain.cast or dtype  # the residual add and activation's dtype
    if chain.residual is not None:
        residual = te.placeholder(shape, dtype, name="residual")
        inputs.append(residual)
        y = _added(y, residual, "residual_added")
    if chain.bounds is not None:
        y = _bounded(y, *chain.bounds, dtype)
    if chain.activation is not None:
        y = _smooth(y, chain.activation, dtype)
    if chain.cast_last is not None:
        y = te.compute(shape, lambda *i: y(*i).astype(chain.cast_last), name="cast_last")
    return inputs, y
