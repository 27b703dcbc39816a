"""Packing one operand for an instruction: the plan (which op loop feeds which instruction loop,
split or gathered), the packed layout, the te stage that builds it (zero where no element exists)
and the index the core reads it with. prepare.py decides which operands are packed."""

from typing import NamedTuple

from tvm import te, tirx

from .indexing import NotAffine, bounds, unit_stride_dim, vars_in
from .te_expr import mutate_expr


class PlanEntry(NamedTuple):
    """How one instruction loop of an operand is laid out in its pack (see pack_plan)."""

    intrin_loop: str  # the instruction's loop variable
    op_loop: str  # the op loop mapped onto it
    dim: int | None  # the operand dimension it steps (None: the operand is broadcast along it)
    extent: int  # the instruction loop's extent
    how: str  # "split", "gather", "row" or "broadcast"
    extra: tuple  # the other loops in that dimension's index (gather / row), else ()


def pack_plan(tensor, op_idx, in_idx, loop_of, extent_of, row_strided):
    """How to lay one operand out for the instruction: a list of PlanEntry in the instruction
    operand's order.

    how: "split" — dimension `dim` steps by one with the op loop alone: it is split by the
    instruction's extent, the inner part innermost; "gather" — the dimension's index mixes the
    op loop with other loops (`extra`, e.g. x + rx in a conv, or a stride): the pack is indexed by
    those loops and the op loop itself (im2col along that dimension), so a block of the
    instruction is always one dense block; "row" — the instruction reads rows with a stride, the
    dimension stays (or, with `extra`, is gathered) outside the inner dims; "broadcast" — the
    operand does not depend on the loop. None when the operand cannot be packed.
    """
    plan = []
    reads = set().union(*[vars_in(i) for i in in_idx]) if in_idx else set()
    broadcast = {ol: extent_of[il] for il, ol in loop_of.items() if il not in reads}
    for pos, iidx in enumerate(in_idx):
        (il,) = vars_in(iidx) or (None,)
        if il is None:
            return None
        ol = loop_of[il]
        dims = [d for d, i in enumerate(op_idx) if ol in vars_in(i)]
        if not dims:
            plan.append(PlanEntry(il, ol, None, extent_of[il], "broadcast", ()))
            continue
        if len(dims) != 1:
            d = unit_stride_dim(op_idx, ol)
            if d is None or not vars_in(op_idx[d]) <= {ol}:
                return None
            dims = [d]
        (d,) = dims
        extra = tuple(sorted(vars_in(op_idx[d]) - {ol}))
        simple = not extra and unit_stride_dim([op_idx[d]], ol) == 0
        if row_strided and pos == 0:
            plan.append(PlanEntry(il, ol, d, extent_of[il], "row", () if simple else extra + (ol,)))
        else:
            # a mapped loop the operand is constant along within a tile (a grouped conv's
            # f // 16 * 16 + rc) gathers by tile, (loop, extent), so the pack stays broadcast
            extra = tuple((v, broadcast[v]) if v in broadcast else v for v in extra)
            plan.append(PlanEntry(il, ol, d, extent_of[il], "split" if simple else "gather", extra))
    return plan


def _max_index(idx, extents):
    """Largest value of an index expression over loops [0, extent) (exact)."""
    return bounds(idx, extents)[1]


class DimAxis(NamedTuple):
    """A pack dimension that is an operand dimension, kept whole."""

    dim: int
    extent: int


class OuterAxis(NamedTuple):
    """The outer part of an operand dimension split by the instruction's extent."""

    dim: int
    extent: int


class LoopAxis(NamedTuple):
    """A pack dimension indexed by an op loop (gathered: the operand's index mixes loops)."""

    loop: str
    extent: int


class LoopOuterAxis(NamedTuple):
    """The outer part of an op loop gathered in steps of `step` (its inner part is a lane)."""

    loop: str
    step: int
    extent: int


class InnerAxis(NamedTuple):
    """One of the instruction's loops, innermost (how it is indexed: `entry`)."""

    entry: PlanEntry
    extent: int


Axis = DimAxis | OuterAxis | LoopAxis | LoopOuterAxis | InnerAxis


def pack_layout(plan, shape, op_idx, extents, separable=False) -> list:
    """The pack's dimensions, outermost first, as Axis values.

    separable: an unmapped dimension whose index mixes loops (y + ry, 2 * y + ry) is gathered
    into one pack dimension per loop, so that every index of the pack is a single loop.
    """
    by_dim = {p.dim: p for p in plan if p.dim is not None}
    outer, row, inner = [], [], []
    for d, ext in enumerate(shape):
        entry = by_dim.get(d)
        if entry is None:
            mixed = sorted(vars_in(op_idx[d]))
            if separable and len(mixed) > 1:
                outer += [LoopAxis(v, extents[v]) for v in mixed]
            else:
                outer.append(DimAxis(d, max(ext, _max_index(op_idx[d], extents) + 1)))
            continue
        ol, iext, how, extra = entry.op_loop, entry.extent, entry.how, entry.extra
        if how == "split":
            outer.append(OuterAxis(d, -(-ext // iext)))
        elif how == "gather":
            outer += [LoopOuterAxis(v[0], v[1], -(-extents[v[0]] // v[1])) if isinstance(v, tuple)
                      else LoopAxis(v, extents[v]) for v in extra]
            outer.append(LoopOuterAxis(ol, iext, -(-extents[ol] // iext)))
        elif how == "row" and not extra:
            row.append(DimAxis(d, max(ext, _max_index(op_idx[d], extents) + 1)))
        else:  # gathered rows: the other loops outside, the row loop itself as the row dim
            outer += [LoopAxis(v, extents[v]) for v in extra[:-1]]
            row.append(LoopAxis(ol, extents[ol]))
    for entry in plan:
        if entry.how in ("split", "gather", "broadcast"):
            inner.append(InnerAxis(entry, entry.extent))
    return outer + row + inner


def make_pack(tensor, plan, op_idx, extents, separable=False):
    """P: tensor in the instruction's layout (see pack_plan), zero where no element exists.

    Every read is guarded by the tensor's real extent, so padded loops never read out of bounds.
    """
    shape = [int(s) for s in tensor.shape]
    layout = pack_layout(plan, shape, op_idx, extents, separable)

    def fcompute(*q):
        loops, dims, outers = {}, {}, {}
        for axis, v in zip(layout, q):
            if isinstance(axis, DimAxis):
                dims[axis.dim] = v
            elif isinstance(axis, OuterAxis):
                outers[axis.dim] = v
            elif isinstance(axis, LoopAxis):
                loops[axis.loop] = v
            elif isinstance(axis, LoopOuterAxis):
                loops[axis.loop] = v * axis.step + loops.get(axis.loop, 0)
        for axis, v in zip(layout, q):
            if not isinstance(axis, InnerAxis):
                continue
            if axis.entry.how == "split":
                dims[axis.entry.dim] = outers[axis.entry.dim] * axis.entry.extent + v
            elif axis.entry.how == "gather":
                loops[axis.entry.op_loop] = loops[axis.entry.op_loop] + v
        idx = []
        for d in range(len(shape)):
            if d in dims:
                idx.append(dims[d])
            else:  # gathered: the op's own index expression of the packed loops
                idx.append(mutate_expr(op_idx[d], lambda t, i: t(*i), loops))
        conds = [tirx.all(i >= 0, i < n) if not isinstance(i, tirx.Var) else i < n
                 for i, n in zip(idx, shape)]
        cond = conds[0]
        for c in conds[1:]:
            cond = tirx.all(cond, c)
        return tirx.if_then_else(cond, tensor(*idx), tirx.const(0, tensor.dtype))

    return te.compute([axis.extent for axis in layout], fcompute, name=f"{tensor.op.name}_packed")


def padding_in_bounds(tensor, op_idx, padded_loops, padded_reduce, extents):
    """True when the operand can be read in place although loops are padded: only data-parallel
    loops are (their extra outputs are cropped, so any value read there is harmless) and every
    padded read stays inside the tensor (a producer that already laid rows out to the padded
    extent, e.g. an im2col buffer)."""
    if any(vars_in(i) & padded_reduce for i in op_idx):
        return False
    try:
        return all(0 <= bounds(i, extents)[0] and bounds(i, extents)[1] < int(n)
                   for i, n in zip(op_idx, tensor.shape) if vars_in(i) & padded_loops)
    except NotAffine:  # an index that is not affine arithmetic (or too large to check): pack
        return False


def pack_index(op_idx, orig_idx, plan, var_of, shape, extents, separable=False):
    """Index into a pack for the op indices op_idx (vars already renamed to the core's);
    orig_idx: the same indices in the op's own vars (they decide the pack's layout)."""
    out = []
    for axis in pack_layout(plan, shape, orig_idx, extents, separable):
        if isinstance(axis, DimAxis):
            out.append(op_idx[axis.dim])
        elif isinstance(axis, OuterAxis):
            iext = next(p.extent for p in plan if p.dim == axis.dim)
            out.append(tirx.floordiv(op_idx[axis.dim], iext))
        elif isinstance(axis, LoopAxis):
            out.append(var_of[axis.loop])
        elif isinstance(axis, LoopOuterAxis):
            out.append(tirx.floordiv(var_of[axis.loop], axis.step))
        else:
            entry = axis.entry
            src = op_idx[entry.dim] if entry.how == "split" else var_of[entry.op_loop]
            out.append(tirx.floormod(src, entry.extent))
    return out
