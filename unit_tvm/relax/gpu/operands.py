"""Layout ops and casts before a Tensor Core kernel's operand, done by the kernel as it loads it.

Attention in a transformer reshapes the fused Q/K/V projection into heads, slices Q, K and V out
of it, and afterwards puts the heads back side by side; the next dense layer may read a layer
norm's float32 result through a cast to fp16. TVM computed each of those as a kernel that wrote
a copy (five layout kernels and up to three casts per BERT layer). The CPU path's bmm reads
such operands where they are (relax/core/views.py: a `StridedView` composed from the same Relax
ops); here the GPU kernel's te operand becomes one stage reading the flat source through that
view and rounding to fp16 (casts between fp16 and fp32 only: widening is exact, so the operand
is the source rounded once), which the implicit preparation inlines into the shared-memory
load.

A view is taken only where the load stays whole 16-byte vectors: the operand's last axis
contiguous in the source (views.read_in_kernel, the CPU rule: K^T is not, and stays one fused
kernel) and every run of RUN elements starting at a multiple of RUN.
"""

import math
from dataclasses import dataclass

from tvm import relax, te

from ...indexing import ravel, unravel
from ..core import views
from ..core.graph import op_name, static_shape

RUN = 8  # elements of one 16-byte fp16 copy
_FLOATS = ("float16", "float32")


@dataclass(frozen=True, eq=False)
class Prologue:
    """A kernel's operand read through `view` from `source` (flat, `source_dtype`), rounded to
    `dtype`; `key` is what the kernel's signature takes."""

    source: relax.Var
    source_size: int
    source_dtype: str
    view: views.StridedView
    dtype: str

    @property
    def key(self) -> tuple:
        return (self.source_size, self.source_dtype, self.view, self.dtype)


def _cast(call) -> bool:
    return op_name(call) == "relax.astype" and str(call.attrs.dtype) in _FLOATS


def _view(source_shape, calls, shape):
    """The view of the operand after `calls` (first applied first) from a row-major source, in
    the operand's `shape` where a view can say it, else in the shape before the reshapes that
    merge axes no view can (a head merge: the operand's index then unravels into it); None
    where a layout op does not make a view."""
    view, merged = views.StridedView.contiguous(source_shape), True
    for call in calls:
        if _cast(call):
            continue
        nxt = views.apply(view, call) if merged else None
        if nxt is None and op_name(call) == "relax.reshape":
            merged = False  # this and what follows reinterpret `view` row-major
        elif nxt is None:
            return None
        else:
            view = nxt
    return (view.reshape(shape) if merged else None) or view


def _whole_vectors(view, shape) -> bool:
    """Whether aligned runs of RUN operand elements are RUN consecutive source elements."""
    return (views.read_in_kernel(view) and view.shape[-1] % RUN == 0 and shape[-1] % RUN == 0
            and view.offset % RUN == 0
            and all(s % RUN == 0 for n, s in zip(view.shape[:-1], view.strides) if n > 1))


def find(x: relax.Expr, lookup, shape: list, dtype: str) -> Prologue | None:
    """The Prologue from the furthest value `x` is a view / fp16-fp32 cast of (through the
    bindings `lookup` gives) that keeps the kernel's loads whole vectors, or None (nothing to
    fold: no such op, or reshapes alone, which are views already)."""
    calls, cur, best = [], x, None
    while isinstance(cur, relax.Var):
        call = views.bound_view_op(lookup(cur), lookup)
        call = lookup(cur) if call is None else call  # not a view op: a cast, or the end
        if (not (op_name(call) in views.VIEW_OPS or _cast(call))
                or not isinstance(call.args[0], relax.Var)):
            break
        calls.insert(0, call)
        cur = call.args[0]
        source_shape = static_shape(cur)
        if source_shape is None or str(cur.ty.dtype) not in _FLOATS:
            continue
        view = _view(source_shape, calls, shape)
        if view is None:
            break
        cast = any(_cast(c) for c in calls)
        if (cast or not view.is_contiguous()) and _whole_vectors(view, shape):
            best = Prologue(cur, math.prod(source_shape), str(cur.ty.dtype), view, dtype)
    return best


def te_operand(prologue: Prologue | None, shape, dtype: str, name: str) -> tuple:
    """(the kernel's input, the operand) in te: one placeholder without a prologue, else the
    flat source and one stage reading it through the view."""
    if prologue is None:
        t = te.placeholder(shape, dtype, name=name)
        return t, t
    src = te.placeholder((prologue.source_size,), prologue.source_dtype, name=f"{name}_source")

    view = prologue.view

    def read(*index):
        if tuple(view.shape) != tuple(int(n) for n in shape):  # row-major into the view's shape
            index = unravel(ravel(index, shape), view.shape)
        value = src[view.flat_index(index)]
        return value if prologue.source_dtype == dtype else value.astype(dtype)

    return src, te.compute(tuple(int(n) for n in shape), read, name=name)


def argument(bb, prologue: Prologue) -> relax.Expr:
    """The source as the kernel takes it: flat (a reshape, which the build makes a view)."""
    return bb.emit(relax.op.reshape(prologue.source, [prologue.source_size]))


def describe_ops(prologue: Prologue | None) -> str:
    """A short label of what the kernel does on loading ("" without a prologue)."""
    if prologue is None:
        return ""
    return (f" (loads {prologue.source_dtype} through strides {prologue.view.strides}"
            f" + {prologue.view.offset})")
