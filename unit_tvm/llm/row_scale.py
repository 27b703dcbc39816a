"""A matmul input quantized per token, in one kernel: each row's RMSNorm (where the input is a
normed hidden state), its largest magnitude, its scale and the row divided by that scale.

Written as Relax ops, the same work was five kernels per input (the norm, an abs, a max, the
scale, the division), each a parallel launch reading and writing the whole tensor: 4 inputs
per layer, 20 launches. Here one task per row reads the row three times while it sits in L1
(sum of squares, largest magnitude, division) and writes it once.

PrimFunc(x [rows, width], weight [width] (only with a norm), out [rows, width], scale
[rows, 1]): y = x * rsqrt(mean(x^2) + eps) * weight with a norm (Hugging Face's RMSNorm in
float32), else y = x; scale = max(max |y|, 1e-30) / 127, the per-token scale of
graph.PER_TOKEN; out = y / scale, which the int8 matmul rounds to [-127, 127].
"""

from typing import NamedTuple

import tvm
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from ..target import as_target, float_lanes, is_cpu
from .cache_attention import largest_divisor

_F32 = "float32"
TINY = 1e-30  # the smallest row peak: an all-zero row gets a finite scale
LEVELS = 127.0  # symmetric int8: the peak maps to 127


class RowScale(NamedTuple):
    """What one row-scale kernel computes."""

    rows: int
    width: int
    eps: float | None  # the RMSNorm's epsilon; None: no norm


def for_target(shape: RowScale, target) -> tvm.tirx.PrimFunc | None:
    """The kernel on `target`, or None off a CPU (the step then keeps the Relax ops)."""
    target = as_target(target)
    if not is_cpu(target):
        return None
    return row_scale_func(shape, largest_divisor(shape.width, float_lanes(target)))


def row_scale_func(shape: RowScale, lanes: int) -> tvm.tirx.PrimFunc:
    """The kernel of `shape`, `lanes` columns per vector (a divisor of the width)."""
    if shape.width % lanes:
        raise ValueError(f"row_scale_func: {lanes} lanes do not divide width {shape.width}")
    n, w = shape.rows, shape.width
    with IRBuilder() as ib:
        with T.prim_func():
            # one symbol per shape: a step holds several (its widths, the LM head's one row)
            T.func_name(f"{'norm_' if shape.eps is not None else ''}row_scale_{n}x{w}")
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
            x = T.arg("x", T.buffer((n, w), _F32))
            weight = T.arg("weight", T.buffer((w,), _F32)) if shape.eps is not None else None
            out = T.arg("out", T.buffer((n, w), _F32))
            scale = T.arg("scale", T.buffer((n, 1), _F32))
            with T.sblock("root"):
                # a decode step's single row runs where it is: no parallel launch for it
                loop = T.parallel if n > 1 else T.serial
                with loop(0, n) as row:
                    acc = T.alloc_buffer((lanes,), _F32, scope="local")
                    stat = T.alloc_buffer((1,), _F32, scope="local")
                    _row(x, weight, out, scale, row, shape, lanes, acc, stat)
    return ib.get()


def _reduce(acc, stat, lanes, combine, init):
    """stat[0] = combine over the lanes of acc, starting from init."""
    T.buffer_store(stat, tirx.const(init, _F32), [0])
    with T.serial(0, lanes) as lane:
        T.buffer_store(stat, combine(stat[0], acc[lane]), [0])


def _vector_pass(width, lanes, body):
    """body(column, lane) over a row, `lanes` columns at a time, vectorized."""
    with T.serial(0, width // lanes) as block:
        with T.vectorized(0, lanes) as lane:
            body(block * lanes + lane, lane)


def _fill(acc, lanes, value):
    with T.vectorized(0, lanes) as lane:
        T.buffer_store(acc, tirx.const(value, _F32), [lane])


def _row(x, weight, out, scale, row, shape: RowScale, lanes, acc, stat):
    """One row: the norm into `out` (when there is one), the scale, then out = y / scale."""
    w = shape.width
    source = x
    if shape.eps is not None:
        _fill(acc, lanes, 0.0)
        _vector_pass(w, lanes, lambda col, lane: T.buffer_store(
            acc, acc[lane] + x[row, col] * x[row, col], [lane]))
        _reduce(acc, stat, lanes, lambda a, b: a + b, 0.0)
        inv = tirx.const(1.0, _F32) / tirx.sqrt(
            stat[0] / tirx.const(float(w), _F32) + tirx.const(shape.eps, _F32))
        T.buffer_store(stat, inv, [0])
        _vector_pass(w, lanes, lambda col, lane: T.buffer_store(
            out, x[row, col] * stat[0] * weight[col], [row, col]))
        source = out
    _fill(acc, lanes, 0.0)
    _vector_pass(w, lanes, lambda col, lane: T.buffer_store(
        acc, tirx.max(acc[lane], tirx.abs(source[row, col])), [lane]))
    _reduce(acc, stat, lanes, tirx.max, 0.0)
    T.buffer_store(scale, tirx.max(stat[0], tirx.const(TINY, _F32)) / tirx.const(LEVELS, _F32),
                   [row, 0])
    _vector_pass(w, lanes, lambda col, lane: T.buffer_store(
        out, source[row, col] / scale[row, 0], [row, col]))
