"""Layout ops and casts before a Tensor Core kernel's operand, done by the kernel as it loads it.

Attention in a transformer reshapes the fused Q/K/V projection into heads, slices Q, K and V out
of it, and afterwards puts the heads back side by side; the next dense layer may read a layer
norm's float32 result through a cast to fp16. TVM computed each of those as a kernel that wrote
a copy (five layout kernels and up to three casts per BERT layer). Such ops only say which
element of the source each operand element is (and how it is rounded), so the kernel's
shared-memory stage can read the source itself: the operand becomes one te stage indexing the
source (the ops' index maps composed), which the implicit preparation inlines into the load.

A prologue is taken only where it keeps the load vectorizable: along the axis the kernel's
shared tile stores contiguously (the last axis of A[.., m, k] and of B[.., k, n]), each aligned
run of `RUN` operand elements must be consecutive in the source; K^T (a transpose of the last
two axes) is not, and stays a kernel of its own.
"""

from dataclasses import dataclass

import numpy as np
from tvm import relax, te, tirx

from .graph import op_name, static_shape

RUN = 8  # elements of one 16-byte fp16 copy
MAX_CHECKED = 1 << 24  # largest source whose index table the layout check builds (128 MB)
_OPS = ("relax.reshape", "relax.permute_dims", "relax.strided_slice", "relax.squeeze",
        "relax.broadcast_to", "relax.astype")
# ops TVM's build makes views of (RewriteDataflowReshape), or that copy nothing: broadcast_to
# the shape the value has
_VIEWS = ("relax.reshape", "relax.broadcast_to")


@dataclass(frozen=True, eq=False)
class Prologue:
    """The value a kernel reads for an operand, and `key`: (source shape, source dtype, each op
    turning it into the operand (first applied first) as _describe gives it, the operand's
    shape and dtype); the kernel's signature takes it and `operand` replays it."""

    source: relax.Var
    key: tuple


def _ints(expr):
    """The ints of a Relax tuple of PrimValues / IntImms (strided_slice's axes, begins...)."""
    out = []
    for field in expr.fields:
        value = getattr(field, "value", field)  # a PrimValue's IntImm, an IntImm's int
        out.append(int(getattr(value, "value", value)))
    return out


def _describe(call):
    """(op name, its static arguments) of a prologue op, or None when one is not static."""
    name = op_name(call)
    shape = static_shape(call)
    if name in ("relax.reshape", "relax.broadcast_to"):
        return None if shape is None else (name, tuple(shape))
    if name == "relax.permute_dims":
        axes = call.attrs.axes
        rank = len(static_shape(call.args[0]) or ())
        return (name, tuple(int(a) for a in axes) if axes is not None
                else tuple(range(rank))[::-1])
    if name == "relax.squeeze":
        return None if call.attrs.axis is None else (name, tuple(int(a) for a in call.attrs.axis))
    if name == "relax.strided_slice":
        return _slice(call)
    if name == "relax.astype" and str(call.attrs.dtype) in ("float16", "float32"):
        # between fp16 and fp32 only: widening is exact, so the operand is the source
        # rounded once to fp16, whatever the order of the casts
        return (name, str(call.attrs.dtype))
    return None


def _slice(call):
    """("relax.strided_slice", axes, begins, ends, steps) with every begin inside its axis and
    every step positive (the index map is then begin + i * step), else None."""
    dims = static_shape(call.args[0])
    try:
        parts = [tuple(_ints(a)) for a in call.args[1:5]]
    except (AttributeError, TypeError, ValueError):
        return None
    if dims is None or len(parts) < 3:
        return None
    axes, begins, ends = parts[:3]
    steps = parts[3] if len(parts) > 3 else (1,) * len(axes)
    if not len(axes) == len(begins) == len(ends) == len(steps):
        return None
    for axis, begin, step in zip(axes, begins, steps):
        if not -len(dims) <= axis < len(dims):
            return None
        dim = dims[axis]
        if step <= 0 or not -dim <= begin < dim:
            return None
    return ("relax.strided_slice", axes, begins, ends, steps)


def find(x: relax.Expr, lookup, shape: list, dtype: str) -> Prologue | None:
    """The Prologue from the furthest value `x` is a layout / cast of (through bindings that
    `lookup` gives, each op static) whose replay as `shape` keeps the kernel's loads
    vectorizable and whose source is float16 or float32, or None (no op to fold, or none
    that keeps the loads whole)."""
    descs, cur = [], x
    best = None
    while isinstance(cur, relax.Var):
        value = lookup(cur)
        if op_name(value) not in _OPS or not isinstance(value.args[0], relax.Var):
            break
        desc = _describe(value)
        if desc is None:
            break
        descs.insert(0, desc)
        cur = value.args[0]
        source_shape = static_shape(cur)
        if all(d[0] in _VIEWS for d in descs):
            continue  # reshapes alone are views already (no kernel to save)
        if (source_shape is None or str(cur.ty.dtype) not in ("float16", "float32")
                or not _vectorizable(source_shape, descs, shape)):
            continue
        best = Prologue(cur, (tuple(source_shape), str(cur.ty.dtype), *descs, tuple(shape),
                              dtype))
    return best


def _replay_numpy(values, descs):
    for desc in descs:
        name, args = desc[0], desc[1:]
        if name in ("relax.reshape", "relax.broadcast_to"):
            values = (np.reshape if name == "relax.reshape" else np.broadcast_to)(values, args[0])
        elif name == "relax.permute_dims":
            values = np.transpose(values, args[0])
        elif name == "relax.squeeze":
            values = np.squeeze(values, axis=args[0])
        elif name == "relax.strided_slice":
            index = [slice(None)] * values.ndim
            for axis, begin, end, step in zip(*args):
                index[axis] = slice(begin, end, step)
            values = values[tuple(index)]
    return values


def _vectorizable(source_shape, descs, shape):
    """Whether each aligned run of RUN elements along the operand's last axis is RUN
    consecutive source elements, starting at a multiple of RUN (a whole vector copy)."""
    if all(d[0] in ("relax.reshape", "relax.astype") for d in descs):
        return True  # the identity layout
    if np.prod(source_shape) > MAX_CHECKED:
        return False  # not worth an index table that large; the ops stay kernels
    try:
        flat = _replay_numpy(np.arange(int(np.prod(source_shape))).reshape(source_shape), descs)
        flat = np.reshape(flat, shape)
    except ValueError:
        return False
    if shape[-1] % RUN:
        return False
    runs = flat.reshape(*shape[:-1], shape[-1] // RUN, RUN)
    return bool(np.all(np.diff(runs, axis=-1) == 1) and np.all(runs[..., 0] % RUN == 0))


def te_operand(prologue: Prologue | None, shape, dtype: str, name: str) -> tuple:
    """(the kernel's input, the operand) in te: one placeholder without a prologue."""
    if prologue is None:
        t = te.placeholder(shape, dtype, name=name)
        return t, t
    return operand(prologue, name)


def operand(prologue: Prologue, name: str) -> tuple:
    """(placeholder for the source, the operand as one te stage over it, named `name`): the
    ops' index maps composed, so the kernel's load reads the source directly."""
    source_shape, source_dtype, *descs, shape, dtype = prologue.key
    src = te.placeholder(source_shape, source_dtype, name=f"{name}_source")
    shapes = [list(source_shape)]  # the value's shape before each op, and after the last
    probe = np.empty(source_shape, np.bool_)
    for desc in descs:
        probe = _replay_numpy(probe, [desc])
        shapes.append(list(probe.shape))

    def body(*index):
        idx = _unravel(_flat(list(index), list(shape)), shapes[-1])  # the final reshape
        for desc, before, after in reversed(list(zip(descs, shapes, shapes[1:]))):
            if desc[0] != "relax.astype":  # casts between fp16 and fp32: one at the end
                idx = _index_before(desc, idx, before, after)
        value = src[tuple(idx)]
        return value.astype(dtype) if str(value.dtype) != dtype else value

    return src, te.compute(tuple(shape), body, name=name)


def _flat(idx, shape):
    flat = tirx.const(0, "int32")
    for i, d in zip(idx, shape):
        flat = flat * d + i
    return flat


def _unravel(flat, shape):
    out = []
    for d in reversed(shape):
        out.append(tirx.floormod(flat, d))
        flat = tirx.floordiv(flat, d)
    return out[::-1]


def _index_before(desc, idx, before, after):
    """The index into an op's input that its output element `idx` reads."""
    kind, args = desc[0], desc[1:]
    if kind == "relax.reshape":
        return _unravel(_flat(idx, after), before)
    if kind == "relax.permute_dims":
        out = [None] * len(before)
        for d, axis in enumerate(args[0]):
            out[axis] = idx[d]
        return out
    if kind == "relax.strided_slice":
        out = list(idx)
        for axis, begin, _, step in zip(*args):
            axis = axis % len(before)
            out[axis] = (begin % before[axis] if begin < 0 else begin) + idx[axis] * step
        return out
    if kind == "relax.squeeze":
        dropped = {a % len(before) for a in args[0]}
        it = iter(idx)
        return [tirx.const(0, "int32") if d in dropped else next(it) for d in range(len(before))]
    if kind == "relax.broadcast_to":
        lead = len(after) - len(before)
        return [tirx.const(0, "int32") if b == 1 and after[lead + d] != 1 else idx[lead + d]
                for d, b in enumerate(before)]
    raise ValueError(f"no index map for {kind}")


def describe_ops(prologue: Prologue | None) -> str:
    """A short label of what the kernel does on loading ("" without a prologue)."""
    if prologue is None:
        return ""
    names = [d[0].split(".")[-1] for d in prologue.key[2:-2]]
    return f" (loads {prologue.key[1]} through {'/'.join(names)})"

