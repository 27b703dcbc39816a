"""Layout ops a bf16 attention matmul absorbs: the reshape / transpose / slice chains that make
its operands out of another tensor, and the transpose that puts its result back.

An attention layer splits one [tokens, 3 x hidden] projection into Q, K^T and V per head and
merges the heads back afterwards: five copies per layer (a 5-D transpose, three slices, K's
transpose) and a sixth after P x V, each a kernel of its own that reads and writes the whole
tensor (BERT-base: 1.9% of its kernel time warm, and each finds its input in another core's
cache in a real run). The bmm kernel packs its run-time operands anyway, so it can read them
where they already are: a `StridedView` says where element [b, i, k] of an operand sits in a
flat source (offset + sum of index x stride), and a permutation of the result's axes says in
which order the kernel writes it. Both are composed from the Relax ops they replace, so the
same walk covers any chain of reshape, permute_dims, strided_slice, squeeze, expand_dims,
same-shape broadcast_to, take of one constant index (torch's x[1]) and a part of a split
(ONNX's Split, torch.chunk) that stays a view (numpy's rule: a reshape that would need a copy
ends the walk).
"""

import math
from dataclasses import dataclass
from typing import NamedTuple

import tvm
import tvm_ffi
from tvm import relax, s_tir, te

from .graph import const_value, op_name, readers, static_shape, type_shape

# the kernel that gathers an operand the bmm cannot read in place (profile: a layout change)
COPY_KERNEL = "view_copy"
VIEW_OPS = ("relax.reshape", "relax.permute_dims", "relax.strided_slice", "relax.squeeze",
             "relax.expand_dims", "relax.broadcast_to", "relax.take")


@dataclass(frozen=True)
class StridedView:
    """Element idx of a tensor of `shape` is element offset + sum(idx * strides) of a flat
    source."""

    shape: tuple
    strides: tuple
    offset: int = 0

    def __post_init__(self):
        if len(self.shape) != len(self.strides):
            raise ValueError(f"{len(self.shape)} dimensions but {len(self.strides)} strides")

    @staticmethod
    def contiguous(shape) -> "StridedView":
        """A row-major tensor of `shape` as a view of itself."""
        strides, step = [], 1
        for n in reversed(shape):
            strides.append(step)
            step *= int(n)
        return StridedView(tuple(int(n) for n in shape), tuple(reversed(strides)))

    def is_contiguous(self) -> bool:
        """Whether this is the row-major layout of its shape from element 0 (nothing to fold)."""
        kept = [(n, s) for n, s in zip(self.shape, self.strides) if n != 1]
        return self.offset == 0 and all(
            s == math.prod(n for n, _ in kept[i + 1:]) for i, (_, s) in enumerate(kept))

    def permute(self, axes) -> "StridedView":
        return StridedView(tuple(self.shape[a] for a in axes),
                           tuple(self.strides[a] for a in axes), self.offset)

    def slice(self, axis, begin, end, step=1) -> "StridedView":
        """[begin:end:step] along `axis` (begin, end already within the extent, step > 0)."""
        shape, strides = list(self.shape), list(self.strides)
        shape[axis] = len(range(begin, end, step))
        offset = self.offset + begin * strides[axis]
        strides[axis] *= step
        return StridedView(tuple(shape), tuple(strides), offset)

    def squeeze(self, axes) -> "StridedView":
        keep = [i for i in range(len(self.shape)) if i not in axes]
        return StridedView(tuple(self.shape[i] for i in keep),
                           tuple(self.strides[i] for i in keep), self.offset)

    def expand(self, axis) -> "StridedView":
        return StridedView(self.shape[:axis] + (1,) + self.shape[axis:],
                           self.strides[:axis] + (0,) + self.strides[axis:], self.offset)

    def broadcast(self, shape) -> "StridedView | None":
        """Broadcast to `shape` (numpy's rule): new leading axes and size-1 axes repeat with
        stride 0; None where the shapes do not broadcast."""
        shape = tuple(int(n) for n in shape)
        lead = len(shape) - len(self.shape)
        if lead < 0:
            return None
        strides = [0] * lead
        for n, s, want in zip(self.shape, self.strides, shape[lead:]):
            if n != want and n != 1:
                return None
            strides.append(s if n == want else 0)
        return StridedView(shape, tuple(strides), self.offset)

    def reshape(self, shape) -> "StridedView | None":
        """The same elements in `shape` (row-major order), or None where that needs a copy:
        each group of old axes merged or split must be contiguous within itself."""
        shape = tuple(int(n) for n in shape)
        if math.prod(shape) != math.prod(self.shape):
            raise ValueError(f"cannot reshape {self.shape} to {shape}")
        old = [(n, s) for n, s in zip(self.shape, self.strides) if n != 1]
        new = [i for i, n in enumerate(shape) if n != 1]
        strides = [0] * len(shape)
        oi = ni = 0
        while oi < len(old) and ni < len(new):
            oj, nj = oi + 1, ni + 1
            o_size, n_size = old[oi][0], shape[new[ni]]
            while o_size != n_size:  # grow the smaller side until both groups hold as much
                if o_size < n_size:
                    o_size, oj = o_size * old[oj][0], oj + 1
                else:
                    n_size, nj = n_size * shape[new[nj]], nj + 1
            if any(old[k][1] != old[k + 1][0] * old[k + 1][1] for k in range(oi, oj - 1)):
                return None  # the old group is not one run: merging it needs a copy
            step = old[oj - 1][1]
            for k in reversed(range(ni, nj)):
                strides[new[k]] = step
                step *= shape[new[k]]
            oi, ni = oj, nj
        return StridedView(shape, tuple(strides), self.offset)

    def flat_index(self, idx):
        """The source element of idx (ints or TIR expressions)."""
        return self.offset + sum(i * s for i, s in zip(idx, self.strides) if s)


def _ints(expr):
    """A Relax tuple / shape of integer constants as ints, or None."""
    values = getattr(expr, "fields", None) or getattr(expr, "values", None)
    if values is None:
        return None
    out = []
    for v in values:
        v = getattr(v, "value", v)
        v = getattr(v, "value", v)
        if not isinstance(v, int):
            return None
        out.append(v)
    return out


def _axes(value, ndim, attr):
    axes = getattr(value.attrs, attr)
    return None if axes is None else [int(a) % ndim for a in axes]


def apply(view: StridedView, call) -> "StridedView | None":
    """The view of `call`'s result, given the view of its first argument (None: not a view op,
    or not a view)."""
    name = op_name(call)
    out_shape = static_shape(call) if name in VIEW_OPS else None
    if out_shape is None:
        return None
    ndim = len(view.shape)
    if name == "relax.reshape":
        return view.reshape(out_shape)
    if name == "relax.permute_dims":
        axes = _axes(call, ndim, "axes")
        return view.permute(axes if axes is not None else list(reversed(range(ndim))))
    if name == "relax.squeeze":
        axes = _axes(call, ndim, "axis")
        return view.squeeze(axes if axes is not None else
                            [i for i, n in enumerate(view.shape) if n == 1])
    if name == "relax.expand_dims":
        for axis in sorted(int(a) % len(out_shape) for a in call.attrs.axis):
            view = view.expand(axis)
        return view
    if name == "relax.broadcast_to":
        return view.broadcast(out_shape)
    if name == "relax.take":
        return _taken(view, call, out_shape)
    return _strided_slice(view, call, out_shape)


def _taken(view, call, out_shape):
    """take(x, i, axis) with one constant index i (torch's x[i], select): the slice [i] of
    that axis without the axis; None for an index tensor or no axis."""
    index = const_value(call.args[1]) if len(call.args) > 1 else None
    axis = getattr(call.attrs, "axis", None)
    if index is None or index.ndim != 0 or axis is None:
        return None
    axis = int(axis) % len(view.shape)
    i = int(index)
    if not 0 <= i < view.shape[axis]:  # where take's modes (fast, clip, wrap) all agree
        return None
    view = view.slice(axis, i, i + 1).squeeze([axis])
    return view if list(view.shape) == out_shape else None


def _strided_slice(view, call, out_shape):
    axes, begin, end = (_ints(a) for a in call.args[1:4])
    steps = _ints(call.args[4]) if len(call.args) > 4 else None
    if axes is None or begin is None or end is None:
        return None
    for n, axis in enumerate(axes):
        extent = view.shape[axis]
        step = steps[n] if steps else 1
        lo, hi = begin[n], end[n]
        lo, hi = (lo + extent if lo < 0 else lo), (hi + extent if hi < 0 else hi)
        if step <= 0 or not 0 <= lo <= extent or hi < 0:  # counted from the end, as numpy
            return None
        view = view.slice(axis, lo, min(max(hi, lo), extent), step)
    return view if list(view.shape) == out_shape else None


def _inverse(view, call):
    """The view of `call`'s first argument given the view of its result, for the ops that are
    bijections (reshape, permute_dims); None for the rest."""
    name = op_name(call)
    if name == "relax.reshape":
        return view.reshape(static_shape(call.args[0]))
    if name == "relax.permute_dims":
        ndim = len(view.shape)
        axes = _axes(call, ndim, "axes") or list(reversed(range(ndim)))
        return view.permute([axes.index(d) for d in range(ndim)])
    return None


def split_part(item, lookup) -> "relax.Call | None":
    """`item`, a TupleGetItem of a split's result (`lookup`: a variable's bound value, or
    None), as the strided_slice of the split's input it equals (its type inferred), so that
    the walks through view ops go on past it (ONNX's Split and torch's chunk / split cut Q,
    K and V out of one projection this way); None for anything else."""
    if not isinstance(item, relax.TupleGetItem) or not isinstance(item.tuple_value, relax.Var):
        return None
    split = lookup(item.tuple_value)
    if op_name(split) != "relax.split" or not split.args:
        return None
    shape = static_shape(split.args[0])
    fields = getattr(item.tuple_value.ty, "fields", None)
    if shape is None or fields is None:
        return None
    axis = int(split.attrs.axis) % len(shape)
    # the parts' extents as the split's own type gives them (an integer count of sections
    # splits by ceiling division: 10 rows in 3 are 4, 4 and 2)
    sizes = [type_shape(f) for f in fields]
    index = int(item.index)
    if any(size is None for size in sizes) or not 0 <= index < len(sizes):
        return None
    begin = sum(size[axis] for size in sizes[:index])
    part = relax.BlockBuilder().normalize(relax.op.strided_slice(
        split.args[0], [axis], [begin], [begin + sizes[index][axis]]))
    return part if static_shape(part) == sizes[index] else None


def bound_view_op(value, lookup) -> "relax.Call | None":
    """The call `value` is (a split's part as its strided_slice: split_part), if a view op."""
    call = split_part(value, lookup) if isinstance(value, relax.TupleGetItem) else value
    return call if isinstance(call, relax.Call) and op_name(call) in VIEW_OPS else None


def composed(shape, ops) -> "StridedView | None":
    """The view of the last result of `ops` (view ops, last first, each reading the one after
    it; the last of them reads a tensor of `shape`), or None where one is not a view."""
    view = StridedView.contiguous(shape)
    for op in reversed(ops):
        view = apply(view, op)
        if view is None:
            return None
    return view


class OperandView(NamedTuple):
    """A bmm operand read from `source` (a variable whose value survives the rewrite)."""

    source: relax.Expr
    view: StridedView


def operand_view(var, by_var, readable) -> "OperandView | None":
    """How far back through view ops the operand `var` can be read, and from where: the
    earliest readable source whose chain of ops to `var` composes into one strided view; None
    when there is none or the view is only a reshape (which costs nothing already)."""
    ops, cur, best = [], var, None

    def lookup(v):
        return by_var[v].value if v in by_var else None

    while cur in by_var and (call := bound_view_op(by_var[cur].value, lookup)) is not None:
        src = call.args[0] if call.args else None
        if not isinstance(src, relax.Var) or not readable(src) or static_shape(src) is None:
            break
        ops.append(call)
        view = composed(static_shape(src), ops)
        if view is None:
            break
        best, cur = OperandView(src, view), src
    return best if best is not None and not best.view.is_contiguous() else None


def read_in_kernel(view: StridedView) -> bool:
    """Whether the kernel reads an operand through `view` (else one copy kernel gathers it
    first): where its last axis is contiguous. The kernel's pack reads along that axis (x's
    reduction, y's output columns); through a transpose (K^T read from K) it gathered scattered
    pairs of columns, and BERT's Q x K^T slowed from 69 to 101 us (Zen 4), more than the three
    copies it saved (~30 us)."""
    return view.strides[-1] == 1


def emit_operand(bb, source, found: OperandView, shape):
    """The argument a bmm kernel takes for an operand read through `found` from `source` (its
    value in the rewritten function): the source flat where the kernel reads the view itself,
    else the operand in `shape` gathered by one copy kernel."""
    size = math.prod(static_shape(found.source))
    flat = bb.emit(relax.op.reshape(source, [size]))  # a reshape: no copy
    if read_in_kernel(found.view):
        return flat
    src = te.placeholder((size,), str(found.source.ty.dtype), name="src")
    out = te.compute([int(n) for n in shape], lambda *i: src[found.view.flat_index(i)],
                     name=COPY_KERNEL)
    func = _copy_schedule(te.create_prim_func([src, out]), found.view.strides)
    return bb.emit(relax.call_tir(_add_copy_kernel(bb, func), [flat],
                                  relax.TensorType(out.shape, out.dtype)))


def _add_copy_kernel(bb, func) -> relax.GlobalVar:
    """The copy kernel's GlobalVar: one already added that does the same gather, else a new one
    named (and exported) view_copy, view_copy1, ... A model whose attention layers have several
    shapes (Swin's windows, MaxViT) needs several, and two exported under one name stop TVM's
    build."""
    func = func.without_attr("global_symbol")
    for gv, existing in bb.get().functions.items():
        if gv.name_hint.startswith(COPY_KERNEL) and tvm_ffi.structural_equal(
                existing.without_attr("global_symbol"), func):
            return gv
    gv = bb.add_func(func, COPY_KERNEL)
    bb.update_func(gv, func.with_attr("global_symbol", gv.name_hint))
    return gv


def _copy_schedule(func, strides, tile=16):
    """A transpose's schedule for the gather: the axis the source holds contiguous and the
    result's last axis split into tiles of `tile`, so that a tile reads `tile` runs of the
    source and writes `tile` whole result vectors, all within L1; the other axes outside,
    largest source stride first; the outer loops in parallel. BERT's K^T (Zen 4, in the model):
    47 us unscheduled (K's 128 tokens read 9 KB apart for every element), 66 us in the
    source's order (each row's writes over 768 lines), 17 us tiled with the source's runs
    innermost, 9.6 us with the result's vectors innermost."""
    sch = s_tir.Schedule(func)
    block = sch.get_sblock(COPY_KERNEL)
    loops = sch.get_loops(block)
    extents = [int(sch.get(lp).extent) for lp in loops]
    dst_axis = len(loops) - 1
    src_axis = min((a for a in range(len(loops)) if extents[a] > 1),
                   key=lambda a: strides[a], default=dst_axis)
    rest = sorted((a for a in range(len(loops)) if a not in (src_axis, dst_axis)),
                  key=lambda a: -strides[a])
    if src_axis == dst_axis or extents[src_axis] % tile or extents[dst_axis] % tile:
        order = rest + sorted({src_axis, dst_axis})
        sch.reorder(*[loops[a] for a in order])
        sch.parallel(loops[order[0]])
    else:
        d_o, d_i = sch.split(loops[dst_axis], [None, tile])
        s_o, s_i = sch.split(loops[src_axis], [None, tile])
        sch.reorder(*[loops[a] for a in rest], s_o, d_o, s_i, d_i)
        sch.parallel(sch.fuse(*[loops[a] for a in rest], s_o) if rest else s_o)
        sch.vectorize(d_i)  # whole result vectors, each gathered from `tile` source runs
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


class ResultLayout(NamedTuple):
    """A bmm result written transposed: the kernel writes its [B, M, N] result with its axes
    in `axes` order, which is `end`'s value once reshaped; `members` are the ops it replaces."""

    end: relax.Var
    members: tuple
    axes: tuple


def result_layout(end, logical_shape, users, uses) -> "ResultLayout | None":
    """The longest run of single-use reshapes and transposes after `end` whose result is the
    bmm's logical result with its axes permuted, the last axis (N) staying last; None when the
    run is empty or only reshapes."""
    run, cur = [], end
    while uses.get(cur, 0) == 1 and cur in users:
        b = users[cur]
        call = b.value
        if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)
                and call.op.name in ("relax.reshape", "relax.permute_dims")
                and call.args[0].same_as(cur) and static_shape(b.var) is not None):
            break
        run.append(b)
        cur = b.var
    for k in range(len(run), 0, -1):
        view = StridedView.contiguous(static_shape(run[k - 1].var))
        for b in reversed(run[:k]):
            view = _inverse(view, b.value)
            if view is None:
                break
        view = view and view.reshape(logical_shape)
        axes = _permutation(view) if view is not None else None
        if axes is not None and list(axes) != sorted(axes):
            return ResultLayout(run[k - 1].var, tuple(b.var for b in run[:k]), axes)
    return None


def _permutation(view):
    """The axis order that makes `view` the row-major layout of its permuted shape (N last),
    or None."""
    axes = tuple(sorted(range(len(view.shape)), key=lambda a: -view.strides[a]))
    if axes[-1] != len(view.shape) - 1 or view.offset:
        return None
    return axes if view.permute(axes).is_contiguous() else None


def fold_bmm_layouts(bindings, uses, bmms, chains) -> None:
    """Let each bf16 bmm chain of `bmms` write its result transposed through the reshapes and
    transposes after it (its end moves past them) and read each operand through the view ops
    before it (chain.x_view / y_view), from a variable that still exists after the rewrite (not
    inside another of `chains`). The ops left without readers are dropped by the rewrite's
    dead-code elimination."""
    users = {v: bs[0] for v, bs in readers(bindings).items()}  # each var's first reader
    logical = {}
    for chain in bmms:
        xs, ys = static_shape(chain.x), static_shape(chain.y)
        logical[chain] = (math.prod(xs[:-2]), *xs[-2:]), (math.prod(ys[:-2]), *ys[-2:])
        x_shape, y_shape = logical[chain]
        layout = result_layout(chain.end, (*x_shape[:2], y_shape[-1]), users, uses)
        if layout is not None:
            chain.members += list(layout.members)
            chain.end, chain.out_axes = layout.end, layout.axes
    # after the result folds: an operand is not read from an op one of them took
    inner = {v for c in chains for v in c.members if not v.same_as(c.end)}
    by_var = {b.var: b for b in bindings}
    for chain in bmms:
        x_shape, y_shape = logical[chain]
        chain.x_view = _batched(operand_view(chain.x, by_var, lambda v: v not in inner), x_shape)
        chain.y_view = _batched(operand_view(chain.y, by_var, lambda v: v not in inner), y_shape)


def _batched(found, shape):
    """found (an OperandView or None) with its view in `shape` (batch dimensions as one)."""
    view = found.view.reshape(shape) if found is not None else None
    return found._replace(view=view) if view is not None else None
