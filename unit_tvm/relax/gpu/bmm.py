"""Matmuls of two activations on the GPU path: attention's scores (Q x K^T) and its weighted sum
(P x V), batched over heads.

TVM's dlight Matmul rule puts a matmul on Tensor Cores only when each of M, N and K exceeds 64,
so at BERT's head size (64) both attention matmuls of every layer ran on CUDA cores. The same
Inspector and Rewriter that tensorize a dense layer map wmma onto a batched matmul as written
here (the batch becomes thread blocks); nothing in the instruction's description changes.
"""

from typing import NamedTuple

import tvm
from tvm import relax, te

from . import operands as gpu_operands


class BatchedShape(NamedTuple):
    """A matmul of two activations, A[batch..., m, k] x B[batch..., k, n], equal batch dims."""

    batch: tuple
    m: int
    n: int
    k: int


def batched_shape(call: relax.Call) -> BatchedShape | None:
    """The BatchedShape of a relax.matmul whose operands are both variables of one float dtype,
    rank 3 or more with equal batch dims (a broadcast batch stays with TVM), else None."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.matmul"):
        return None
    x, y = call.args
    if not (isinstance(x, relax.Var) and isinstance(y, relax.Var)):
        return None
    xs, ys = (getattr(v.ty, "shape", None) for v in (x, y))
    if xs is None or ys is None or len(xs) < 3 or len(xs) != len(ys):
        return None
    if not all(isinstance(s, tvm.tirx.IntImm) for s in (*xs, *ys)):
        return None
    xs, ys = [int(s) for s in xs], [int(s) for s in ys]
    if xs[:-2] != ys[:-2] or xs[-1] != ys[-2]:
        return None
    return BatchedShape(tuple(xs[:-2]), xs[-2], ys[-1], xs[-1])


def batch_matmul_te(shape: BatchedShape, dtype: str, acc: str, prologues=(None, None)) -> list:
    """te A[b, m, k] x B[b, k, n] accumulated in `acc`, the batch dims flattened into b; an
    operand with a gpu_operands.Prologue is read from its source through it."""
    b = 1
    for d in shape.batch:
        b *= d
    x_in, x = gpu_operands.te_operand(prologues[0], (b, shape.m, shape.k), dtype, "A")
    y_in, y = gpu_operands.te_operand(prologues[1], (b, shape.k, shape.n), dtype, "B")
    r = te.reduce_axis((0, shape.k), name="k")
    out = te.compute((b, shape.m, shape.n),
                     lambda z, i, j: te.sum(x[z, i, r].astype(acc) * y[z, r, j].astype(acc),
                                            axis=r), name="bmm")
    return [x_in, y_in, out]
