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
from typing import NamedTuple

import tvm
from tvm import te, tirx

from . import intrinsics
from .indexing import vars_in
from .inspector import compute_isomorphism, explain, inspect, rank
from .mapping import Mapping
from .packing import make_pack, pack_index, pack_plan, padding_in_bounds
from .shift import SHIFT, shift_plans
from .te_expr import loads, mutate_expr, placeholders_of

__all__ = ["Prepared", "ZeroPadding", "prepare", "placeholders_of", "SHIFT"]


class ZeroPadding(NamedTuple):
    """Where the core reads padding that is the instruction's zero: indices of `buffer` along
    `axis` outside [lo, hi). A tap reading only those adds nothing, so a strategy may skip it;
    static_only: only where that is known at compile time (a conv2d's columns); per_update: also
    by a test on each update where no test can cover a whole tap (a conv3d's frames)."""

    buffer: str
    axis: int
    lo: int
    hi: int
    static_only: bool = False
    per_update: bool = False


@dataclass
class Prepared:
    """The prepared graph: params (original placeholders), the core, the final output."""

    params: list[te.Tensor]
    core: te.Tensor
    output: te.Tensor
    mapping: Mapping  # of the instruction on `core` (contiguous, unpadded)
    stages: tuple[str, ...]  # names of the preparation computes (packs, shift, compensation)
    shifted: str = ""  # name of the operand shifted by +128, if any
    original: te.Tensor | None = None  # the op as given (reference for checking candidates)
    original_mapping: Mapping | None = None  # the Mapping on the op as given (padding, fit)
    reference: te.Tensor | None = None  # the output computed from the op as given (no packing)
    variant: str = ""  # set for a mapping other than the Inspector's first (part of tuning keys)
    zero_padding: tuple[ZeroPadding, ...] = ()  # ranges the graph's builder vouches for

    @property
    def tensors(self) -> list[te.Tensor]:
        """The kernel's arguments: the original placeholders, then the output."""
        return list(self.params) + [self.output]


# -- packing and padding ------------------------------------------------------------------------
def _tile_columns(cop, mapped, tile_columns):
    """(loop name, extent to compute) of the innermost data-parallel loop not mapped to the
    instruction when tile_columns pads it, else None."""
    free = [ax for ax in cop.axis if ax.var.name not in mapped]
    if tile_columns is None or not free:
        return None
    extent = int(free[-1].dom.extent)
    wanted = tile_columns(extent)
    return (free[-1].var.name, wanted) if wanted != extent else None


def _tile_rows(mapping, tile_rows):
    """(loop name, extent to compute) of the loop mapped to the instruction's first output
    lanes (its M) when tile_rows pads its count of instruction tiles, else None."""
    if tile_rows is None:
        return None
    m = next(m for m in mapping.loops if m.kind == "S")
    tiles = (m.op_extent + m.padding) // m.intrin_extent
    wanted = tile_rows(tiles)
    return (m.op_loop, wanted * m.intrin_extent) if wanted != tiles else None


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

    return mutate_expr(intrin.output.op.body[0].source[0], on_load, {})


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


class Pack(NamedTuple):
    """An operand packed for the instruction: the te stage and how the core indexes it."""

    stage: te.Tensor
    plan: list  # PlanEntry per instruction loop (packing.pack_plan)
    op_idx: list  # the operand's indices in the op's own loop variables
    shape: list  # the operand's shape


@dataclass(frozen=True)
class LoopExtents:
    """The extents the prepared op computes over: padded where the mapping (or a register tile's
    columns) needs more than the op's own."""

    extents: dict  # every loop of the op -> extent computed
    padded: dict  # padded loops (mapped or tiled) -> extent computed
    padded_loops: frozenset  # loops computed past their own extent
    padded_reduce: frozenset  # reduction loops among them

    @staticmethod
    def of(cop, mapping, tile_columns, tile_rows=None) -> "LoopExtents":
        """The extents of compute op `cop` under `mapping` (see prepare's tile_columns and
        tile_rows)."""
        padded = {m.op_loop: m.op_extent + m.padding for m in mapping.loops}
        padded_loops = {m.op_loop for m in mapping.loops if m.padding}
        rows = _tile_rows(mapping, tile_rows)
        if rows is not None:
            padded[rows[0]] = rows[1]
            padded_loops.add(rows[0])
        columns = _tile_columns(cop, padded, tile_columns)
        if columns is not None:
            padded[columns[0]] = columns[1]
            padded_loops.add(columns[0])
        extents = {ax.var.name: padded.get(ax.var.name, int(ax.dom.extent))
                   for ax in list(cop.axis) + list(cop.reduce_axis)}
        reduce = {m.op_loop for m in mapping.loops if m.padding and m.kind == "R"}
        return LoopExtents(extents, padded, frozenset(padded_loops), frozenset(reduce))


@dataclass(frozen=True)
class CoreLayout:
    """How the core lays its output out: the op's data-parallel loops (mapped ones split by the
    instruction's extent) then the instruction's output lanes."""

    names: list  # the op's data-parallel loop names, outermost first
    lanes: list  # (op loop, instruction extent) of each mapped data-parallel loop

    @property
    def split(self) -> dict:
        return dict(self.lanes)

    def index(self, var_of):
        """The core's index for op loop values var_of (name -> expression)."""
        split = self.split
        idx = [tirx.floordiv(var_of[n], split[n]) if n in split else var_of[n]
               for n in self.names]
        return idx + [tirx.floormod(var_of[ol], ext) for ol, ext in self.lanes]


def _make_packs(bind, mapping, intrin, loops, separable) -> dict:
    """operand name -> Pack for every operand that is strided, broadcast or reads a padded loop
    (or, separable, whose indices mix loops); the others are read in place."""
    loop_of = {m.intrin_loop: m.op_loop for m in mapping.loops}
    extent_of = {m.intrin_loop: m.intrin_extent for m in mapping.loops}
    access = {a.intrin_operand: a for a in mapping.operands}
    packs = {}
    for name, (tensor, op_idx, in_idx) in bind.items():
        reads_padded = any(vars_in(i) & loops.padded_loops for i in op_idx) and not (
            padding_in_bounds(tensor, op_idx, loops.padded_loops, loops.padded_reduce,
                              loops.extents))
        mixed = separable and any(len(vars_in(i)) > 1 for i in op_idx)
        if access[name].contiguous and not reads_padded and not mixed:
            continue
        plan = pack_plan(tensor, op_idx, in_idx, loop_of, extent_of, name in intrin.strided)
        if plan is None:
            raise ValueError(f"{tensor.op.name} cannot be packed for {intrin.name}: no dimension "
                             "steps by one along the mapped loop")
        packs[tensor.op.name] = Pack(make_pack(tensor, plan, op_idx, loops.extents, separable),
                                     plan, op_idx, [int(x) for x in tensor.shape])
    return packs


def _make_core(cop, intrin, bind, layout, loops, packs, separable, name):
    """The core: the op's reduction in the instruction's operand order, reading the packs, its
    output in the instruction's layout (CoreLayout)."""
    sp_ext = {ax.var.name: int(ax.dom.extent) for ax in cop.axis}
    split = layout.split
    computed = {n: loops.padded.get(n, sp_ext[n]) for n in layout.names}
    shape = [(-(-computed[n] // split[n])) if n in split else computed[n]
             for n in layout.names] + [ext for _, ext in layout.lanes]
    red = cop.body[0]
    source = _in_instruction_order(intrin, bind)
    n_outer = len(layout.names)

    def core_compute(*vs):
        var_of = dict(zip(layout.names, vs[:n_outer]))
        for (ol, ext), q in zip(layout.lanes, vs[n_outer:]):
            var_of[ol] = var_of[ol] * ext + q
        new_red = [te.reduce_axis((0, loops.padded.get(r.var.name, int(r.dom.extent))),
                                  name=r.var.name) for r in red.axis]
        var_of.update({r.var.name: n.var for r, n in zip(red.axis, new_red)})

        def on_load(tensor, idx):
            pack = packs.get(tensor.op.name)
            if pack is None:
                return tensor(*idx)
            return pack.stage(*pack_index(idx, pack.op_idx, pack.plan, var_of, pack.shape,
                                          loops.extents, separable))

        return te.sum(mutate_expr(source, on_load, var_of), axis=new_red)

    return te.compute(shape, core_compute, name=name)


def _make_output(op, core, layout, shift, epilogue, name):
    """(output, reference): the user's result read back from the core (crop, unpack, the
    shift's compensation, then `epilogue`), and the same computed from op as given."""

    def value(op_indices, analyzer=None):
        """op's result at op_indices, read from the core. analyzer: bounds of the output's loop
        variables, to simplify the core's indices (a block that matches the core's lanes then
        reads them in place, which vectorises)."""
        idx = layout.index(dict(zip(layout.names, op_indices)))
        if analyzer is not None:
            idx = [analyzer.simplify(i) for i in idx]
        result = core(*idx)
        return shift.corrected(result, list(op_indices)) if shift is not None else result

    if epilogue is None:
        return te.compute([int(s) for s in op.shape], lambda *vs: value(vs), name=name), op
    shape, _dtype, fn, _ = epilogue

    def out_body(*vs):
        analyzer = tvm.sym.Analyzer()
        for v, ext in zip(vs, shape):
            # an extent-1 variable is left unbound: bound, it would simplify to 0 and vanish
            # from the core's indices, and reverse_compute_at then cannot place the block
            if int(ext) > 1:
                analyzer.bind(v, tvm.ir.Range(0, int(ext)))
        return fn(lambda idx: value(idx, analyzer), vs)

    output = te.compute(list(shape), out_body, name=name)
    reference = te.compute(list(shape), lambda *vs: fn(lambda idx: op(*idx), vs),
                           name=epilogue[3] + "_reference")
    return output, reference


def _contiguous_core_mapping(core, intrin, layout, op_name):
    """The instruction's Mapping on the core: unpadded, contiguous, on the core's lane loops;
    ValueError when preparation did not give one."""
    lanes = [core.op.axis[len(layout.names) + i].var.name for i in range(len(layout.lanes))]
    for m in inspect(core, intrin):
        if (not m.padded and all(a.contiguous for a in m.operands)
                and [x.op_loop for x in m.loops if x.kind == "S"] == lanes):
            return m
    raise ValueError(f"preparing {op_name} for {intrin.name} did not give a contiguous core")


def _checked_params(params, output, op):
    """The function's inputs: `params` when they are exactly output's placeholders (default:
    those, in first-read order)."""
    found = placeholders_of(output)
    if params is None:
        return found
    if sorted(t.op.name for t in params) != sorted(t.op.name for t in found) or len(
            params) != len(found):
        raise ValueError(f"inputs {[t.op.name for t in params]} are not the placeholders "
                         f"{[t.op.name for t in found]} that {op.op.name} reads")
    return params


def prepare(op, intrin, mapping=None, params=None, separable=False, epilogue=None,
            tile_columns=None, tile_rows=None) -> Prepared:
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
    instruction does not map (a register tile's columns, e.g. register_tiles.tiled_extent): the
    core computes the extra columns from zero padding and the epilogue crops them.
    tile_rows: instruction tiles -> tiles to compute along the loop mapped to the
    instruction's first output lanes (its M; e.g. schedules.gpu_config.paired_tiles: 13 -> 14,
    so that two fragments per warp fit), padded and cropped the same way.
    """
    intrin = intrinsics.get(intrin) if isinstance(intrin, str) else intrin
    stages, shifted_name, shift, work = [], "", None, op
    if mapping is None:
        shift, mapping = _best_form(op, intrin)
        if shift is not None:
            work, shifted_name = shift.op, ",".join(shift.shifted)
            stages += list(shift.stages)
    _check_distinct_names(work.op)
    cop = work.op
    bind = compute_isomorphism(cop, intrin)
    loops = LoopExtents.of(cop, mapping, tile_columns, tile_rows)
    packs = _make_packs(bind, mapping, intrin, loops, separable)
    stages += [f"{name}_packed" for name in packs]
    # the working op (shifted or not) has the same axes as op
    layout = CoreLayout([ax.var.name for ax in cop.axis],
                        [(m.op_loop, m.intrin_extent) for m in mapping.loops if m.kind == "S"])
    taken = _stage_names(op)
    core_name = _unique(f"{op.op.name}_core", taken)
    core = _make_core(cop, intrin, bind, layout, loops, packs, separable, core_name)
    out_name = _unique(op.op.name if epilogue is None else epilogue[3],
                       taken - {op.op.name} | {core_name})
    output, reference = _make_output(op, core, layout, shift, epilogue, out_name)
    core_mapping = _contiguous_core_mapping(core, intrin, layout, op.op.name)
    return Prepared(_checked_params(params, output, op), core, output, core_mapping,
                    tuple(stages), shifted_name, op, mapping, reference)
