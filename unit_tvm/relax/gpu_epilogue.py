"""The elementwise ops after a Tensor Core kernel that go into its write-back on the GPU path.

After a conv or dense layer the fp16 model runs a per-channel bias add, maybe a residual add and
a ReLU / ReLU6; TVM fused them into one kernel after the wmma kernel (about 20 in resnet18, one
per layer). Here such a chain, each value read only by the next op, becomes te stages over the
kernel's result (`stages`), which preparation folds into the kernel's write-back
(`build.prepare_op`, `epilogue.find`): the layer is one kernel, its output written once in fp16.
"""

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, te, tirx

from .graph import const_value, dataflow_bindings, op_name, readers, scalar_const, uses


@dataclass(frozen=True, eq=False)
class Chain:
    """The ops after a conv / dense call that its kernel computes: a per-channel bias (numpy,
    one value per output channel), a residual (the Var added, or None) and an activation's
    bounds (lo, hi; None when there is no activation, hi None for ReLU)."""

    end: relax.Call  # the last op of the chain in the original function
    bias: np.ndarray
    residual: relax.Var | None = None
    bounds: tuple | None = None


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
    reader adds a per-channel constant; the chain then takes a residual add of another value of
    the same shape and a ReLU or a clip (maximum with 0, then maybe minimum), each read once. A
    binding joins one chain at most (the first in program order)."""
    bindings = dataflow_bindings(func)
    count, reader = uses(bindings, func), readers(bindings)
    var_of = {b.value: b.var for b in bindings}
    claimed, out = set(), {}
    for call in starts:
        var = var_of.get(call)
        if var is None:
            continue
        chain = _follow(var, call, count, reader, claimed)
        if chain is not None:
            out[call] = chain
    return out


def _single_reader(var, count, reader, claimed):
    """The binding that reads `var`, when it is its only read and in no chain yet."""
    found = reader.get(var, [])
    if count.get(var, 0) != 1 or len(found) != 1 or found[0].var in claimed:
        return None
    return found[0]


def _follow(var, call, count, reader, claimed):
    channels = int(call.ty.shape[-1])
    b = _single_reader(var, count, reader, claimed)
    if b is None or op_name(b.value) != "relax.add":
        return None
    a, c = b.value.args
    bias = _channels(c if a.same_as(var) else a, channels)  # the constant on either side
    if bias is None:
        return None
    taken, end, residual, bounds = [b.var], b, None, None
    nxt = _single_reader(end.var, count, reader, claimed)
    if nxt is not None and op_name(nxt.value) == "relax.add":
        a, r = nxt.value.args
        other = r if a.same_as(end.var) else a
        if (isinstance(other, relax.Var) and not other.same_as(end.var)
                and str(other.ty.dtype) == str(end.var.ty.dtype)
                and [int(s) for s in other.ty.shape] == [int(s) for s in end.var.ty.shape]):
            residual, end = other, nxt
            taken.append(nxt.var)
            nxt = _single_reader(end.var, count, reader, claimed)
    if nxt is not None and op_name(nxt.value) == "relax.nn.relu":
        bounds, end = (0.0, None), nxt
        taken.append(nxt.var)
    elif (nxt is not None and op_name(nxt.value) == "relax.maximum"
          and scalar_const(nxt.value.args[1]) == 0.0):
        bounds, end = (0.0, None), nxt
        taken.append(nxt.var)
        top = _single_reader(end.var, count, reader, claimed)
        if top is not None and op_name(top.value) == "relax.minimum":
            hi = scalar_const(top.value.args[1])
            if hi is not None:
                bounds, end = (0.0, hi), top
                taken.append(top.var)
    claimed.update(taken)
    return Chain(end.value, bias, residual, bounds)


def _added(y, other, name):
    return te.compute(y.shape, lambda *i: y(*i) + other(*i), name=name)


def _bounded(y, lo, hi, dtype):
    def body(*i):
        v = tvm.te.max(y(*i), tirx.const(lo, dtype))
        return v if hi is None else tvm.te.min(v, tirx.const(hi, dtype))
    return te.compute(y.shape, body, name="activated")


def stages(out: te.Tensor, chain: Chain, dtype: str) -> tuple:
    """(placeholders, result): te stages computing `chain` over a kernel's accumulator `out`
    (channels on its last axis) in `dtype`, as the model did: cast, + bias, + residual,
    activation."""
    shape = [int(s) for s in out.shape]
    bias = te.placeholder((shape[-1],), dtype, name="bias")
    inputs = [bias]
    y = te.compute(shape, lambda *i: out(*i).astype(dtype) + bias[i[-1]], name="biased")
    if chain.residual is not None:
        residual = te.placeholder(shape, dtype, name="residual")
        inputs.append(residual)
        y = _added(y, residual, "residual_added")
    if chain.bounds is not None:
        y = _bounded(y, *chain.bounds, dtype)
    return inputs, y
