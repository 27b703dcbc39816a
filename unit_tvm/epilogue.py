"""Elementwise stages after a reduction (bias, activation, requantization), found in a te graph
and folded into the tensorized kernel's write-back, as the graph pass does for whole models.

A layer written at op level is several te.computes: conv -> + bias -> relu -> requantize. The
instruction fits the reduction only; the stages after it read the reduction's result (at any
index) and other tensors, and are inlined into one expression of that result.
"""

from dataclasses import dataclass

from tvm import te, tirx

from .te_expr import mutate_expr


@dataclass(frozen=True)
class Epilogue:
    """The reduction inside an elementwise chain and how to compute the chain's output from it."""

    core: te.Tensor  # the one reduction the chain reads
    stages: tuple  # names of the elementwise computes folded into the write-back, output last
    shape: tuple
    dtype: str
    name: str

    def spec(self, output):
        """prepare(..., epilogue=...) form: (shape, dtype, fn(value, indices), name)."""

        def fn(value, indices):
            return _inline(output, list(indices), self.core, value)

        return (self.shape, self.dtype, fn, self.name)


def _is_reduction(op):
    return isinstance(op, te.ComputeOp) and isinstance(op.body[0], tirx.Reduce)


def find(output) -> "Epilogue | None":
    """The Epilogue when `output` is elementwise computes over exactly one reduction (read any
    number of times) and placeholders; None for a reduction itself or any other graph."""
    if not isinstance(output.op, te.ComputeOp) or _is_reduction(output.op):
        return None
    cores, stages = [], []

    def visit(t):
        op = t.op
        if isinstance(op, te.PlaceholderOp):
            return True
        if not isinstance(op, te.ComputeOp) or len(op.body) != 1:
            return False
        if _is_reduction(op):
            if not any(t.same_as(c) for c in cores):
                cores.append(t)
            return True
        if any(op.same_as(s) for s in stages):
            return True
        stages.append(op)
        return all(visit(child) for child in op.input_tensors)

    if not visit(output) or len(cores) != 1:
        return None
    core = cores[0]
    return Epilogue(core, tuple(s.name for s in reversed(stages)),
                    tuple(int(s) for s in output.shape), str(output.dtype), output.op.name)


def _inline(tensor, indices, core, value):
    """tensor's value at `indices` as one expression: reads of `core` become value(idx), reads of
    placeholders stay, reads of other elementwise computes are inlined."""
    op = tensor.op
    var_map = {ax.var.name: i for ax, i in zip(op.axis, indices)}

    def on_load(t, idx):
        if t.same_as(core):
            return value(idx)
        if isinstance(t.op, te.PlaceholderOp):
            return t(*idx)
        return _inline(t, idx, core, value)

    return mutate_expr(op.body[0], on_load, var_map)
