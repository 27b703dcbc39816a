"""Operand preparation (UNIT §IV-B): turn an operation into one whose core the instruction computes.

Done on the te graph, before scheduling, so that every step is an ordinary te.compute the
schedule can place (weights packed once per call, never per tile):
- s8 x s8 on a u8 x s8 instruction: shift the data operand by +128 to u8 and subtract
  128 * sum(weights) afterwards (exact in int32);
- packing: an operand whose instruction region is strided (or broadcast) is copied into the
  instruction's layout: each dimension carrying a mapped loop is split by the instruction's extent
  and the inner parts go innermost, in the instruction operand's order;
- padding: loops whose extent is not a multiple of the instruction's are extended; packed
  operands are zero outside the original extent, so the extra terms add nothing;
- the core writes an accumulator tensor laid out like the instruction's output; an epilogue
  computes the user's output from it (crop, unpack, compensation).
"""

from dataclasses import dataclass

import tvm
from tvm import te, tirx

from . import intrinsics
from .indexing import NotAffine, bounds, unit_stride_dim, vars_in
from .inspector import compute_isomorphism, explain, inspect, rank
from .shift import SHIFT, shift_plans
from .te_expr import loads, placeholders_of
from .te_expr import mutate_expr as _mutate_expr

__all__ = ["Prepared", "prepare", "placeholders_of", "SHIFT"]


@dataclass
class Prepared:
    """The prepared graph: params (original placeholders), the core, the final output."""

    params: list
    core: te.Tensor
    output: te.Tensor
    mapping: object  # Mapping of the instruction on `core` (contiguous, unpadded)
    stages: tuple  # names of the preparation computes (packs, shift, compensation)
    shifted: str = ""  # name of the operand shifted by +128, if any
    original: object = None  # the op as given (reference for checking candidates)
    original_mapping: object = None  # the Mapping on the op as given (padding, fit)
    reference: object = None  # the output computed from the op as given (no packing, no core)
    variant: str = ""  # set for a mapping other than the Inspector's first (part of tuning keys)

    @property
    def tensors(self):
        return list(self.params) + [self.output]


# -- packing and padding ------------------------------------------------------------------------
def _pack_plan(tensor, op_idx, in_idx, loop_of, extent_of, row_strided):
    """How to lay one operand out for the instruction: a list of entries
    (instruction loop, op loop, dim, extent, how, extra) in the instruction operand's order.

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
            plan.append((il, ol, None, extent_of[il], "broadcast", ()))
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
            plan.append((il, ol, d, extent_of[il], "row", () if simple else extra + (ol,)))
        else:
            # a mapped loop the operand is constant along within a tile (a grouped conv's
            # f // 16 * 16 + rc) gathers by tile, (loop, extent), so the pack stays broadcast
            extra = tuple((v, broadcast[v]) if v in broadcast else v for v in extra)
            plan.append((il, ol, d, extent_of[il], "split" if simple else "gather", extra))
    return plan


def _max_index(idx, extents):
    """Largest value of an index expression over loops [0, extent) (exact)."""
    return bounds(idx, extents)[1]


def _pack_layout(plan, shape, op_idx, extents, separable=False):
    """[(kind, payload, extent)] of the pack's dimensions, outermost first.

    separable: an unmapped dimension whose index mixes loops (y + ry, 2 * y + ry) is gathered
    into one pack dimension per loop, so that every index of the pack is a single loop.
    """
    by_dim = {p[2]: p for p in plan if p[2] is not None}
    outer, row, inner = [], [], []
    for d, ext in enumerate(shape):
        entry = by_dim.get(d)
        if entry is None:
            mixed = sorted(vars_in(op_idx[d]))
            if separable and len(mixed) > 1:
                outer += [("loop", v, extents[v]) for v in mixed]
            else:
                outer.append(("dim", d, max(ext, _max_index(op_idx[d], extents) + 1)))
            continue
        _, ol, _, iext, how, extra = entry
        if how == "split":
            outer.append(("outer", d, -(-ext // iext)))
        elif how == "gather":
            outer += [("loop_outer", v, -(-extents[v[0]] // v[1])) if isinstance(v, tuple)
                      else ("loop", v, extents[v]) for v in extra]
            outer.append(("loop_outer", (ol, iext), -(-extents[ol] // iext)))
        elif how == "row" and not extra:
            row.append(("dim", d, max(ext, _max_index(op_idx[d], extents) + 1)))
        else:  # gathered rows: the other loops outside, the row loop itself as the row dim
            outer += [("loop", v, extents[v]) for v in extra[:-1]]
            row.append(("loop", ol, extents[ol]))
    for entry in plan:
        _, ol, d, iext, how, _ = entry
        if how in ("split", "gather", "broadcast"):
            inner.append(("inner", entry, iext))
    return outer + row + inner


def _make_pack(tensor, plan, op_idx, extents, separable=False):
    """P: tensor in the instruction's layout (see _pack_plan), zero where no element exists.

    Every read is guarded by the tensor's real extent, so padded loops never read out of bounds.
    """
    shape = [int(s) for s in tensor.shape]
    layout = _pack_layout(plan, shape, op_idx, extents, separable)

    def fcompute(*q):
        loops, dims, outers = {}, {}, {}
        for (kind, payload, _), v in zip(layout, q):
            if kind == "dim":
                dims[payload] = v
            elif kind == "outer":
                outers[payload] = v
            elif kind == "loop":
                loops[payload] = v
            elif kind == "loop_outer":
                ol, iext = payload
                loops[ol] = v * iext + loops.get(ol, 0)
        for (kind, payload, _), v in zip(layout, q):
            if kind != "inner":
                continue
            _, ol, d, iext, how, _ = payload
            if how == "split":
                dims[d] = outers[d] * iext + v
            elif how == "gather":
                loops[ol] = loops[ol] + v
        idx = []
        for d in range(len(shape)):
            if d in dims:
                idx.append(dims[d])
            else:  # gathered: the op's own index expression of the packed loops
                idx.append(_mutate_expr(op_idx[d], lambda t, i: t(*i), loops))
        conds = [tirx.all(i >= 0, i < n) if not isinstance(i, tirx.Var) else i < n
                 for i, n in zip(idx, shape)]
        cond = conds[0]
        for c in conds[1:]:
            cond = tirx.all(cond, c)
        return tirx.if_then_else(cond, tensor(*idx), tirx.const(0, tensor.dtype))

    return te.compute([e for *_, e in layout], fcompute, name=f"{tensor.op.name}_packed")


def _padding_in_bounds(tensor, op_idx, padded_loops, padded_reduce, extents):
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


def _pack_index(op_idx, orig_idx, plan, var_of, shape, extents, separable=False):
    """Index into a pack for the op indices op_idx (vars already renamed to the core's);
    orig_idx: the same indices in the op's own vars (they decide the pack's layout)."""
    out = []
    for kind, payload, _ in _pack_layout(plan, shape, orig_idx, extents, separable):
        if kind == "dim":
            out.append(op_idx[payload])
        elif kind == "outer":
            iext = next(p[3] for p in plan if p[2] == payload)
            out.append(tirx.floordiv(op_idx[payload], iext))
        elif kind == "loop":
            out.append(var_of[payload])
        elif kind == "loop_outer":
            ol, iext = payload
            out.append(tirx.floordiv(var_of[ol], iext))
        else:
            _, ol, d, iext, how, _ = payload
            src = op_idx[d] if how == "split" else var_of[ol]
            out.append(tirx.floormod(src, iext))
    return out


def _tile_columns(cop, mapped, tile_columns):
    """(loop name, extent to compute) of the innermost data-parallel loop not mapped to the
    instruction when tile_columns pads it, else None."""
    free = [ax for ax in cop.axis if ax.var.name not in mapped]
    if tile_columns is None or not free:
        return None
    extent = int(free[-1].dom.extent)
    wanted = tile_columns(extent)
    return (free[-1].var.name, wanted) if wanted != extent else None


def _best_form(op, intrin):
    """(Shift or None, Mapping): the op as written, or with its 8-bit operands re-based
    (unit_tvm.shift), whichever the instruction maps best (Inspector rank: least padding, then
    contiguity, then innermost loops; ties keep fewer shifts). ValueError when none maps."""
    n_loops = len(op.op.axis) + len(op.op.reduce_axis)
    forms = [(None, m) for m in inspect(op, intrin)[:1]]
    for plan in shift_plans(op, intrin):
        forms += [(plan, m) for m in inspect(plan.op, intrin)[:1]]
    if not forms:
        raise ValueError(explain(op, intrin))
    return min(forms, key=lambda f: (rank(f[1], n_loops), len(f[0].shifted) if f[0] else 0))


def _check_distinct_names(op):
    """ValueError when two different tensors the op reads share a name: preparation keys packs
    by name (te.placeholder's default name is 'placeholder' for every tensor)."""
    seen = {}
    for call in loads(op.body[0].source[0] if isinstance(op.body[0], tirx.Reduce) else op.body[0]):
        t = call.args[0]
        if t.op.name in seen and not seen[t.op.name].same_as(t):
            raise ValueError(f"{op.name} reads two different tensors named {t.op.name!r}; give "
                             "each te.placeholder its own name")
        seen[t.op.name] = t
    return seen


def _in_instruction_order(intrin, bind):
    """The op's reduction source written as the instruction's (its reads in their places): the
    Inspector matches b * a to a * b, tensorize compares trees as written."""

    def on_load(t, _idx):
        tensor, op_idx, _ = bind[t.op.name]
        return tensor(*op_idx)

    return _mutate_expr(intrin.output.op.body[0].source[0], on_load, {})


def _stage_names(op):
    """Names of every tensor in op's graph, op included."""
    names, todo = set(), [op]
    while todo:
        t = todo.pop()
        if t.op.name not in names:
            names.add(t.op.name)
            todo += list(t.op.input_tensors)
    return names


def _unique(name, taken):
    """`name`, or name_2, name_3 ... the first not taken: the scheduler finds the core and the
    output by name, and TVM renames the later of two blocks with one name."""
    n, out = 1, name
    while out in taken:
        n += 1
        out = f"{name}_{n}"
    return out


def prepare(op, intrin, mapping=None, params=None, separable=False, epilogue=None,
            tile_columns=None):
    """Prepared graph computing `op` (a te.Tensor) with `intrin`, or ValueError why not.

    mapping: a Mapping of intrin on op (default: the Inspector's best). params: the order of the
    function's input parameters (default: placeholders in first-read order); must be exactly op's
    placeholders. separable: also pack operands whose indices mix loops (a conv window x + rx,
    y + ry), one pack dimension per loop: needed where operands are staged through copies that
    are tensorized, whose bindings must then be single loops (GPU
    fragment loads), whose loop variables are then data coordinates.
    epilogue: (shape, dtype, fn, name) to fuse elementwise work into the write-back: the output is
    te.compute(shape, lambda *i: fn(value, i)) where value(op_indices) is op's result there.
    Default: op's own shape and values.
    tile_columns: extent -> extent to compute for the innermost data-parallel loop the
    instruction does not map (a register tile's columns, e.g. schedules.cpu.tiled_extent): the
    core computes the extra columns from zero padding and the epilogue crops them.
    """
    intrin = intrinsics.get(intrin) if isinstance(intrin, str) else intrin
    stages = []
    shifted_name = ""
    shift = None
    work = op
    if mapping is None:
        shift, mapping = _best_form(op, intrin)
        if shift is not None:
            work, shifted_name = shift.op, ",".join(shift.shifted)
            stages += list(shift.stages)
    _check_distinct_names(work.op)
    cop = work.op
    bind = compute_isomorphism(cop, intrin)
    loop_of = {m.intrin_loop: m.op_loop for m in mapping.loops}
    extent_of = {m.intrin_loop: m.intrin_extent for m in mapping.loops}
    padded = {m.op_loop: m.op_extent + m.padding for m in mapping.loops}
    padded_loops = {m.op_loop for m in mapping.loops if m.padding}
    columns = _tile_columns(cop, padded, tile_columns)
    if columns is not None:
        padded[columns[0]] = columns[1]
        padded_loops.add(columns[0])
    padded_reduce = {m.op_loop for m in mapping.loops if m.padding and m.kind == "R"}
    access = {a.intrin_operand: a for a in mapping.operands}
    all_extents = {ax.var.name: padded.get(ax.var.name, int(ax.dom.extent))
                   for ax in list(cop.axis) + list(cop.reduce_axis)}

    # 1. packs for operands that are strided, broadcast or read a padded loop
    packs = {}
    for name, (tensor, op_idx, in_idx) in bind.items():
        reads_padded = any(vars_in(i) & padded_loops for i in op_idx) and not _padding_in_bounds(
            tensor, op_idx, padded_loops, padded_reduce, all_extents)
        mixed = separable and any(len(vars_in(i)) > 1 for i in op_idx)
        if access[name].contiguous and not reads_padded and not mixed:
            continue
        plan = _pack_plan(tensor, op_idx, in_idx, loop_of, extent_of, name in intrin.strided)
        if plan is None:
            raise ValueError(f"{tensor.op.name} cannot be packed for {intrin.name}: no dimension "
                             "steps by one along the mapped loop")
        packs[tensor.op.name] = (_make_pack(tensor, plan, op_idx, all_extents, separable), plan,
                                 op_idx, [int(x) for x in tensor.shape])
        stages.append(f"{tensor.op.name}_packed")

    # 2. the core: output in the instruction's layout (spatial mapped loops split, lanes inner)
    out_loops = [(il, ol, ext) for il, ol, ext in
                 ((m.intrin_loop, m.op_loop, m.intrin_extent) for m in mapping.loops
                  if m.kind == "S")]
    sp_names = [ax.var.name for ax in cop.axis]
    sp_ext = {ax.var.name: int(ax.dom.extent) for ax in cop.axis}
    split_sp = {ol: ext for _, ol, ext in out_loops}
    core_shape = [(-(-sp_ext[n] // split_sp[n])) if n in split_sp else padded.get(n, sp_ext[n])
                  for n in sp_names]
    core_shape += [ext for *_, ext in out_loops]
    red = cop.body[0]
    source = _in_instruction_order(intrin, bind)
    n_outer = len(sp_names)

    def core_compute(*vs):
        outer, inner = vs[:n_outer], vs[n_outer:]
        var_of = dict(zip(sp_names, outer))
        for (_, ol, ext), q in zip(out_loops, inner):
            var_of[ol] = var_of[ol] * ext + q
        new_red = [te.reduce_axis((0, padded.get(r.var.name, int(r.dom.extent))), name=r.var.name)
                   for r in red.axis]
        var_of.update({r.var.name: n.var for r, n in zip(red.axis, new_red)})

        def on_load(tensor, idx):
            if tensor.op.name in packs:
                pack, plan, orig_idx, shape = packs[tensor.op.name]
                return pack(*_pack_index(idx, orig_idx, plan, var_of, shape, all_extents,
                                          separable))
            return tensor(*idx)

        return te.sum(_mutate_expr(source, on_load, var_of), axis=new_red)

    taken = _stage_names(op)
    core_name = _unique(f"{op.op.name}_core", taken)
    core = te.compute(core_shape, core_compute, name=core_name)

    # 3. the epilogue: user layout, crop, compensation
    out_names = sp_names  # the working op (shifted or not) has the same axes as op

    def value(op_indices, analyzer=None):
        """op's result at op_indices, read from the core (crop, unpack, compensation).
        analyzer: bounds of the output's loop variables, to simplify the core's indices (a block
        that matches the core's lanes then reads them in place, which vectorises)."""
        var_of = dict(zip(out_names, op_indices))
        idx = [tirx.floordiv(var_of[n], split_sp[n]) if n in split_sp else var_of[n]
               for n in out_names]
        idx += [tirx.floormod(var_of[ol], ext) for _, ol, ext in out_loops]
        if analyzer is not None:
            idx = [analyzer.simplify(i) for i in idx]
        result = core(*idx)
        return shift.corrected(result, list(op_indices)) if shift is not None else result

    if epilogue is None:
        output = te.compute([int(s) for s in op.shape], lambda *vs: value(vs),
                            name=_unique(op.op.name, taken - {op.op.name} | {core_name}))
        reference = op
    else:
        shape, _dtype, fn, name = epilogue

        def out_body(*vs):
            analyzer = tvm.sym.Analyzer()
            for v, ext in zip(vs, shape):
                # an extent-1 variable is left unbound: bound, it would simplify to 0 and vanish
                # from the core's indices, and reverse_compute_at then cannot place the block
                if int(ext) > 1:
                    analyzer.bind(v, tvm.ir.Range(0, int(ext)))
            return fn(lambda idx: value(idx, analyzer), vs)

        output = te.compute(list(shape), out_body,
                            name=_unique(name, taken - {op.op.name} | {core_name}))
        reference = te.compute(list(shape), lambda *vs: fn(lambda idx: op(*idx), vs),
                               name=name + "_reference")
    core_maps = [m for m in inspect(core, intrin)
                 if not m.padded and all(a.contiguous for a in m.operands)
                 and [x.op_loop for x in m.loops if x.kind == "S"] == [
                     core.op.axis[n_outer + i].var.name for i in range(len(out_loops))]]
    if not core_maps:
        raise ValueError(f"preparing {op.op.name} for {intrin.name} did not give a contiguous core")
    found_params = placeholders_of(output)
    if params is None:
        params = found_params
    elif sorted(t.op.name for t in params) != sorted(t.op.name for t in found_params) or len(
            params) != len(found_params):
        raise ValueError(f"inputs {[t.op.name for t in params]} are not the placeholders "
                         f"{[t.op.name for t in found_params]} that {op.op.name} reads")
    return Prepared(params, core, output, core_maps[0], tuple(stages), shifted_name, op, mapping,
                    reference)
