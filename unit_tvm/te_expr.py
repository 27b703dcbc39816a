"""te.compute bodies as data: reads, rewriting, and rebuilding a compute with other reads.

In TVM 0.27 a tensor read inside a te.compute body is a Call to `te.tensor_load` whose args
are [Tensor, *indices]; the helpers here are the one place that knows it.
"""

import tvm
import tvm_ffi
from tvm import te, tirx

TENSOR_LOAD = "te.tensor_load"


def is_load(e) -> bool:
    """Whether a te expression node is a tensor read."""
    return type(e).__name__ == "Call" and getattr(e.op, "name", None) == TENSOR_LOAD


def mutate_expr(expr, on_load, var_map):
    """Rewrite a te expression: tensor reads via on_load(tensor, new indices), variables by
    name via var_map."""

    def on_call(call, m):
        if call.op.name == TENSOR_LOAD:
            idx = [m.mutate(x) for x in list(call.args)[1:]]
            return on_load(call.args[0], idx)
        return m.default_mutate(call)

    def on_var(v, _m):
        return var_map.get(v.name, v)

    return tvm_ffi.structural_mutate(expr, [(tvm.ir.expr.Call, on_call), (tirx.Var, on_var)])


def substitute(expr, binds):
    """expr (a PrimExpr, te or TIR) with every variable bound in `binds` ((var, value) pairs)
    replaced by its value."""

    def on_var(var, _mutator):
        return next((value for bound, value in binds if bound.same_as(var)), var)

    return tvm_ffi.structural_mutate(expr, [(tirx.Var, on_var)])


def loads(expr) -> list:
    """Every tensor read in a te expression, in visit order."""
    found = []

    def visit(call):
        if call.op.name == TENSOR_LOAD:
            found.append(call)

    tvm_ffi.structural_walk(expr, [(tvm.ir.expr.Call, visit)])
    return found


def combiner(op) -> str:
    """'sum', 'max', 'min' for a reduction compute, '' for a plain one; ValueError for another
    combiner (a user's comm_reducer)."""
    body = op.body[0]
    if not isinstance(body, tirx.Reduce):
        return ""
    kind = type(body.combiner.result[0]).__name__
    names = {"Add": "sum", "Max": "max", "Min": "min"}
    if kind not in names:
        raise ValueError(f"{op.name} reduces with {kind}, which unit-tvm does not rebuild")
    return names[kind]


_REDUCERS = {"sum": te.sum, "max": te.max, "min": te.min}


def recompute(op, on_load, name=None):
    """The same compute (same axes, same combiner) with tensor reads replaced by
    on_load(tensor, indices)."""
    body = op.body[0]
    names = [ax.var.name for ax in op.axis]
    reducer = _REDUCERS.get(combiner(op))

    def fcompute(*vs):
        vm = dict(zip(names, vs))
        if reducer is None:
            return mutate_expr(body, on_load, vm)
        new_red = [te.reduce_axis((0, int(r.dom.extent)), name=r.var.name) for r in body.axis]
        vm.update({r.var.name: n.var for r, n in zip(body.axis, new_red)})
        return reducer(mutate_expr(body.source[0], on_load, vm), axis=new_red)

    return te.compute([int(ax.dom.extent) for ax in op.axis], fcompute, name=name or op.name)


def placeholders_of(tensor) -> list:
    """All te.placeholder tensors `tensor` depends on, in first-read order (distinct tensors,
    even when they share a name)."""
    out = []

    def visit(t):
        if isinstance(t.op, te.PlaceholderOp):
            if not any(t.same_as(o) for o in out):
                out.append(t)
            return
        for child in t.op.input_tensors:
            visit(child)

    visit(tensor)
    return out
