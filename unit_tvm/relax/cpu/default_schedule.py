"""A default CPU schedule for the operators no instruction covers (pooling, softmax, layer norm,
elementwise ops left by legalization, int8 depthwise convs): TVM's TIR is a serial loop nest, which
at batch 1 can cost more than all the tensorized convolutions. Each block's leading data-parallel
loops are fused and parallelised, and its innermost data-parallel loop vectorised when it is the
last loop; a reduction's single elementwise consumer (a requantization) runs on each vector of
results inside the same loop; exp and erf become arithmetic that vectorises (unit_tvm.fastmath)
instead of libm calls."""

import math
from typing import NamedTuple

import tvm
from tvm import s_tir

from ... import fastmath
from ...target import arch, vector_registers
from .rows import row_fused

MIN_PARALLEL = 64  # below this many iterations threads cost more than they save


class Widths(NamedTuple):
    """The vector shapes the schedule uses on one ISA: float32 lanes of a vectorised loop (and
    the narrower width for extents it does not divide), how many float32 lanes one vector
    register holds, and how many registers a register tile's accumulators may take."""

    lanes: int
    narrow: int
    register: int
    accumulators: int = 24  # of 32 zmm, 32 NEON q


X86 = Widths(16, 8, 16)  # one zmm of float32
AVX2 = Widths(8, 4, 8, 12)  # one ymm of float32; 16 ymm registers
NEON = Widths(8, 4, 4)  # two q registers: loads and FMAs in pairs, 128-bit NEON


def widths_for(target) -> Widths:
    """NEON widths for an aarch64 target, AVX2's for an x86 one without AVX-512 (16 ymm
    registers), else (AVX-512, or no target) the AVX-512 ones."""
    if target is None:
        return X86
    if arch(target) == "aarch64":
        return NEON
    return AVX2 if vector_registers(target) == 16 else X86


def _region_axes(region):
    """[names of the variables in each axis' index] of a block's read or write region."""
    return [{v.name for v in tvm.tirx.analysis.undefined_vars(r.min)} for r in region.region]


def _read_axes(block):
    """(reduction variable names, [per read: [names of the variables in each axis' index]])."""
    red = {iv.var.name for iv in block.iter_vars if iv.iter_type == 2}
    return red, [_region_axes(region) for region in block.reads]


def _gathers(block, var):
    """Whether vectorising `var` would gather: something read with a reduction variable on its
    last (contiguous) axis has `var` on another axis."""
    red, reads = _read_axes(block)
    return any(axes and axes[-1] & red and any(var in a for a in axes[:-1]) for axes in reads)


def _contiguous_reduction(block):
    """Whether the reduction variable is the last (contiguous) axis of everything it indexes."""
    red, reads = _read_axes(block)
    used = [(i, len(axes)) for axes in reads for i, a in enumerate(axes) if a & red]
    return bool(used) and all(i == n - 1 for i, n in used)


def _on_trailing_axes(block, positions):
    """Whether the block's iteration variables at `positions` (innermost loops, in order) alone
    index the last axes of every buffer that depends on them, in that order and over whole
    extents: their loops fused then walk one contiguous run. A mean over H and W (squeeze-
    excitation's pool) reduces such a run per channel; an elementwise op on rows of 14 pixels
    vectorises over H x W (a broadcast read of one value per channel depends on neither)."""
    ivs = [block.iter_vars[p] for p in positions]
    names, extents = [{iv.var.name} for iv in ivs], [int(iv.dom.extent) for iv in ivs]
    mine, k, found = {iv.var.name for iv in ivs}, len(ivs), False
    for region in list(block.reads) + list(block.writes):
        axes = _region_axes(region)
        if not any(a & mine for a in axes):
            continue
        if (len(axes) < k or axes[-k:] != names or any(a & mine for a in axes[:-k])
                or [int(n) for n in region.source.shape[-k:]] != extents):
            return False
        found = True
    return found


def _parallel_prefix(loops, extents, minimum=MIN_PARALLEL):
    """The leading loops worth fusing into one parallel loop ([] when fewer than `minimum`
    iterations)."""
    par, total = [], 1
    for lp, ext in zip(loops, extents):
        par.append(lp)
        total *= ext
        if total >= 4 * MIN_PARALLEL:
            break
    return par if total >= minimum else []


def _vectorize_by_rfactor(sch, block, loops, lead, lanes):
    """A row reduction (softmax max/sum, layer-norm moments) as `lanes` partial results per
    row, accumulated with contiguous vector loads, then summed per row: both run row-parallel."""
    extents = [int(sch.get(lp).extent) for lp in loops]
    # long rows (a global pool's 3136 or 12544 pixels) are worth a thread each even when few
    minimum = 2 if extents[lead] >= 16 * MIN_PARALLEL else MIN_PARALLEL
    _, ki = sch.split(loops[lead], [None, lanes])
    rf = sch.rfactor(ki, factor_axis=lead)
    for blk in (rf, block):
        lps = sch.get_loops(blk)
        par = _parallel_prefix(lps[:lead], extents, minimum)
        if par:
            sch.parallel(sch.fuse(*par) if len(par) > 1 else par[0])
    lps = sch.get_loops(rf)
    sch.vectorize(lps[-1])
    sch.decompose_reduction(rf, lps[-2])


def _lanes_after_reduction(block, lead, widths=X86):
    """Whether the block reduces over axes that sit just before a trailing axis of channel
    lanes (a mean over H and W of NCHW[16]c: squeeze-excitation's pool on a float32 region in
    blocks, relax/cpu/f32_blocks.py): every read indexed by the reduction has the reduction's
    variables, in order, then the last data-parallel variable on its last axes, the result has
    that variable on its last axis, and it is whole vectors wide (16 lanes: one zmm, two ymm)."""
    ivs = block.iter_vars
    lane = ivs[lead - 1]
    if lead < 2 or lead == len(ivs) or int(lane.dom.extent) % widths.lanes:
        return False
    red = [{iv.var.name} for iv in ivs[lead:]]
    lane_name = {lane.var.name}
    for region in block.reads:
        axes = _region_axes(region)
        if any(a & {n for r in red for n in r} for a in axes) and (
                axes[-len(red) - 1:] != red + [lane_name]):
            return False
    write = _region_axes(block.writes[0])
    return write[-1] == lane_name and not any(lane_name & a for a in write[:-1])


def _blocked_reduction(sch, block, loops, lead):
    """Schedule a reduction over the axes before a vector of lanes (_lanes_after_reduction):
    the loops above the lanes fused and parallel; the reduction, fused into one loop, split
    into P (8, 4 or 2) interleaved partial sums (rfactor: P independent vector additions per
    step instead of one chain of dependent ones), then the partials summed and the consumer
    (the mean's division) applied per vector, under a second parallel loop."""
    if lead > 2:
        sch.fuse(*loops[:lead - 1])
    lane, red = loops[lead - 1], loops[lead:]
    k = sch.fuse(*red) if len(red) > 1 else red[0]
    total = int(sch.get(k).extent)
    parts = next((p for p in (8, 4, 2) if total % p == 0 and total >= 4 * p), 1)
    consumer = _elementwise_consumer(sch, block)
    stages = [block]
    if parts > 1:
        ko, ki = sch.split(k, [None, parts])
        sch.reorder(ko, ki, lane)
        # the partial sums' nest: head, ko, ki, lane; the block sums them: head, ki, lane
        stages = [sch.rfactor(ki, factor_axis=lead - 1), block]
    else:
        sch.reorder(k, lane)
    if consumer is not None:
        sch.reverse_compute_at(consumer, sch.get_loops(block)[0])
    for stage in stages:
        head = sch.get_loops(stage)[0]
        if int(sch.get(head).extent) > 1:
            sch.parallel(head)  # before decompose_reduction: parallel needs whole blocks
    for stage in stages + ([consumer] if consumer is not None else []):
        sch.vectorize(sch.get_loops(stage)[-1])
    if parts > 1:
        sch.unroll(sch.get_loops(stages[0])[-2])
    for stage in stages:
        sch.decompose_reduction(stage, sch.get_loops(stage)[1])


def _vector_width(extent, widths=X86):
    """Lanes of a vector loop over `extent` (a multiple of widths.narrow): a whole vector when
    the extent allows, else the narrow one."""
    return widths.lanes if extent % widths.lanes == 0 else widths.narrow


def _row_lanes(extent, widths=X86):
    """Partial results per row of a row reduction: _vector_width where the extent allows, else
    a whole vector whose last step is predicated (197): every extent vectorises (197 / 200
    tokens ran scalar, 2.6x the time per element of 192)."""
    return _vector_width(extent, widths) if extent % widths.narrow == 0 else widths.lanes


def _vectorize(sch, loop, extent, widths=X86):
    """Split off and vectorise the inner lanes of loop: widths.lanes 32-bit lanes when the
    extent allows, else widths.narrow; an extent that is a multiple of neither (197 tokens) is
    partitioned into a vectorised body of whole vectors and a scalar tail (peeled)."""
    if extent % widths.narrow:
        body = extent - extent % widths.lanes
        loop = sch.loop_partition(loop, [body, None])[0]
        extent = body
    _, lanes = sch.split(loop, [None, _vector_width(extent, widths)])
    sch.vectorize(lanes)


def _register_block(extent, outer_work, most=8):
    """Rows of vector accumulators kept in registers: the largest divisor of extent <= most
    that leaves enough parallel iterations (outer_work: iterations of the loops above the
    vector loop, this one included)."""
    return next(d for d in range(min(most, extent), 0, -1) if extent % d == 0 and (
        d == 1 or outer_work // d >= MIN_PARALLEL or outer_work < MIN_PARALLEL))




def _register_tile(sch, block, loops, extents, lead, vec, widths=X86):
    """Organise a matmul-like reduction around a register tile of f rows x v vectors: the
    vector loop is cut into tiles of v vectors (lanes wide), the reduction runs inside a tile
    and the f rows and v vectors are unrolled, so f * v accumulators stay in registers while
    each loaded row vector serves f rows and each broadcast value v vectors. Returns (the loop
    over row tiles, the loop over column tiles, the tile's width in elements)."""
    ext = extents[vec]
    lanes = _vector_width(ext, widths)
    v = next(d for d in (4, 3, 2, 1) if (ext // lanes) % d == 0)
    registers = v * max(1, lanes // widths.register)  # a tile row's accumulator registers
    f = _register_block(extents[vec - 1], math.prod(extents[:vec]),
                        most=min(8, widths.accumulators // registers))
    row_loop = loops[vec - 1]
    rows = []
    if f > 1:
        row_loop, row = sch.split(row_loop, [None, f])
        rows = [row]
    tile, col = sch.split(loops[vec], [None, v * lanes])
    sch.reorder(*loops[:vec - 1], row_loop, tile, *loops[lead:], *rows, col)
    vectors, lane = sch.split(col, [None, lanes])
    for lp in rows + [vectors]:
        if int(sch.get(lp).extent) > 1:
            sch.unroll(lp)
    sch.vectorize(lane)
    return row_loop, tile, v * lanes


def _elementwise_consumer(sch, block):
    """The single consumer of block that reads its result elementwise (the same index as it
    writes, e.g. a requantization after a conv), or None."""
    consumers = sch.get_consumers(block)
    if len(consumers) != 1:
        return None
    prod, cons = sch.get(block), sch.get(consumers[0])
    if any(iv.iter_type != 0 for iv in cons.iter_vars) or len(prod.writes) != 1:
        return None
    out = prod.writes[0].source
    spatial = [iv for iv in prod.iter_vars if iv.iter_type == 0]
    for region in cons.reads:
        if region.source.same_as(out):
            if len(region.region) != len(spatial) or len(cons.iter_vars) != len(spatial):
                return None
            for r, iv in zip(region.region, cons.iter_vars):
                if not (isinstance(r.min, tvm.tirx.Var) and r.min.same_as(iv.var)):
                    return None
    return consumers[0]


def _loop_nest(sch, block):
    """(loops, iteration kinds, lead): the block's loops, their kinds (0 data parallel, 2
    reduction) and how many leading loops are data parallel; lead 0 when the loops do not map
    one to one onto the block's iteration variables (then nothing is done to it)."""
    loops = sch.get_loops(block)
    kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    if not loops or len(kinds) != len(loops):
        return loops, kinds, 0
    lead = 0
    while lead < len(kinds) and kinds[lead] == 0:
        lead += 1
    return loops, kinds, lead


def _pad_vector_axes(sch, root):
    """Pad the two inner data-parallel axes of matmul-like reductions whose extents are not
    multiples of the register tile (attention's 197 tokens: 10x slower than 192 or 200) — the
    vector axis to PAD_COLUMNS, the rows above it to PAD_ROWS — with TVM's pad_einsum (a
    zero-padded copy of the operands, the reduction on the padded extents, the valid part copied
    out), so that the register tile below applies instead of a scalar or one-row loop nest."""
    for block in sch.get_child_blocks(root):
        loops, kinds, lead = _loop_nest(sch, block)
        if lead < 2 or lead == len(loops) or any(k != 2 for k in kinds[lead:]):
            continue
        cols, rows = (int(sch.get(loops[i]).extent) for i in (lead - 1, lead - 2))
        if cols < 16 or _gathers(sch.get(block), sch.get(block).iter_vars[lead - 1].var.name):
            continue
        padding = [1] * len(loops)
        if cols % 8:
            padding[lead - 1] = PAD_COLUMNS
        if rows >= 2 * PAD_ROWS and _register_block(rows, rows) < PAD_ROWS // 2:
            padding[lead - 2] = PAD_ROWS
        if padding == [1] * len(loops):
            continue
        try:
            sch.pad_einsum(block, padding)
        except (tvm.s_tir.ScheduleError, tvm.error.InternalError):
            continue  # not an einsum (e.g. a fused epilogue): keep the loop nest as it is


PAD_COLUMNS = 16  # one zmm of float32 (197 -> 208)
PAD_ROWS = 8  # the register tile's rows (197 -> 200)


def _static_shapes(func) -> bool:
    """Whether every buffer of `func` has a shape known at compile time (the schedules here
    read extents as integers)."""
    # a parameter without a shape is a scalar: a shape variable passed at run time
    shapes = [getattr(p, "shape", None) for p in func.params]
    return all(s is not None and all(isinstance(d, tvm.tirx.IntImm) for d in s) for s in shapes)


def _schedule(func, widths=X86):
    rows = row_fused(func, widths, MIN_PARALLEL,
                     lambda sch, loop, extent: _vectorize(sch, loop, extent, widths))
    if rows is not None:
        return rows
    sch = s_tir.Schedule(func)
    root = sch.get_sblock("root")
    _pad_vector_axes(sch, root)
    fused = set()
    for block in sch.get_child_blocks(root):
        if sch.get(block).name_hint in fused:
            continue
        loops, _, lead = _loop_nest(sch, block)
        if lead == 0:
            continue
        extents = [int(sch.get(lp).extent) for lp in loops]
        reduction = lead < len(loops)
        if reduction and _lanes_after_reduction(sch.get(block), lead, widths):
            fused.update(sch.get(c).name_hint for c in sch.get_consumers(block))
            _blocked_reduction(sch, block, loops, lead)
            continue
        # the last data-parallel loop is vectorised: innermost already for elementwise blocks; for
        # reductions across rows (matmul) the reduction loops move outside it. A reduction along
        # memory rows (softmax, layer norm: the last axis) would make that vector a strided gather
        # and leave too few outer loops to parallelise: its rows run in parallel instead.
        # (an elementwise block's odd last extent is peeled: see _vectorize)
        if (not reduction and lead >= 3 and extents[lead - 1] % widths.lanes
                and _on_trailing_axes(sch.get(block), [lead - 2, lead - 1])):
            # rows of 14 or 7 pixels (a late CNN stage) merge with their column axis: 196 is
            # 12 whole vectors and a tail, where 14 alone left the loop scalar
            loops = loops[:lead - 2] + [sch.fuse(*loops[lead - 2:lead])] + loops[lead:]
            extents = [int(sch.get(lp).extent) for lp in loops]
            lead -= 1
        vec = lead - 1 if lead >= 2 and (extents[lead - 1] % widths.narrow == 0 or (
            not reduction and extents[lead - 1] >= 16)) else None
        if vec is not None and reduction and _gathers(
                sch.get(block), sch.get(block).iter_vars[vec].var.name):
            vec = None
        contiguous = vec is None and _contiguous_reduction(sch.get(block))
        if vec is None and len(loops) > lead + 1 and _on_trailing_axes(
                sch.get(block), list(range(lead, len(loops)))):
            loops, contiguous = loops[:lead] + [sch.fuse(*loops[lead:])], True
            extents = [int(sch.get(lp).extent) for lp in loops]
        if contiguous and len(loops) == lead + 1 and extents[lead] >= 4 * widths.lanes:
            _vectorize_by_rfactor(sch, block, loops, lead, _row_lanes(extents[lead], widths))
            continue
        head, head_ext = loops[:lead if vec is None else vec], extents
        outer = loops[vec - 1] if vec is not None else None  # the loop above the vector loop
        width, tile = (extents[vec] if vec is not None else 0), None
        if vec is not None and reduction:
            outer, tile, width = _register_tile(sch, block, loops, extents, lead, vec, widths)
            head = [lp for lp in head if not lp.same_as(loops[vec - 1])] + [outer]
            head_ext = extents[:vec - 1] + [int(sch.get(outer).extent)]
        par = _parallel_prefix(head, head_ext)
        if par:
            fused_loop = sch.fuse(*par) if len(par) > 1 else par[0]
            sch.parallel(fused_loop)
            if par[-1].same_as(outer):
                outer = fused_loop
        if vec is not None and not reduction:
            _vectorize(sch, loops[vec], extents[vec], widths)
        consumer = _elementwise_consumer(sch, block) if reduction and vec is not None else None
        if consumer is not None and outer is not None:
            # the consumer (requantization, bias, activation) runs on each tile of results
            # while it is in registers, instead of a second pass over an int32 buffer
            fused.add(sch.get(consumer).name_hint)
            sch.reverse_compute_at(consumer, tile if tile is not None else outer)
            _vectorize(sch, sch.get_loops(consumer)[-1], width, widths)
        if reduction and vec is not None:
            # the init moves above the reduction loops (their RVs survive the fuse and split)
            sch.decompose_reduction(block, loops[lead])
    return sch.mod["main"]


def _elements(region):
    return math.prod(int(n) for n in region.source.shape)


def inline_stages(func):
    """func with each data-parallel stage computed where its readers read it, when they write
    as many elements as it does (a fused chain of elementwise ops: one pass instead of one per
    op); a stage read by a broadcast (a squeeze-excitation gate's sigmoid, one value per
    channel) or by a reduction is kept, since inlining would recompute it per reader."""
    sch = s_tir.Schedule(func)
    for block in sch.get_child_blocks(sch.get_sblock("root"))[:-1]:
        stmt = sch.get(block)
        readers = sch.get_consumers(block)
        if (any(iv.iter_type != 0 for iv in stmt.iter_vars) or len(stmt.writes) != 1
                or not readers or any(_elements(sch.get(r).writes[0]) != _elements(
                    stmt.writes[0]) for r in readers)):
            continue
        try:
            sch.compute_inline(block)
        except s_tir.ScheduleError:
            continue
    return sch.mod["main"]


@tvm.transform.module_pass(opt_level=0, name="UnitDefaultCPUSchedule")
class DefaultCPUSchedule:
    """tvm.transform.Pass: parallel/vector schedule for unscheduled CPU PrimFuncs of a module,
    with the vector widths of `target` (None: x86's)."""

    def __init__(self, target=None):
        self.widths = widths_for(target)

    def transform_module(self, mod, ctx):  # noqa: D401 - tvm pass hook
        updates = {}
        for gv, func in mod.functions.items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            if func.attrs is not None and "tirx.is_scheduled" in func.attrs:
                continue  # tensorized kernels (and anything scheduled before us)
            if not _static_shapes(func):
                continue  # shapes known only at run time (a slice up to an input): TVM's own
            # exp/erf become vector arithmetic whether or not the loops below can be scheduled
            func = fastmath.vectorizable(func)
            updates[gv] = func  # TVM's loop nest for anything unusual
            # stages inlined where that schedules; else as they are (softmax of 1-wide rows)
            for form in (inline_stages, lambda f: f):
                try:
                    updates[gv] = _schedule(form(func), self.widths).with_attr(
                        "tirx.is_scheduled", True)
                    break
                except (tvm.s_tir.ScheduleError, tvm.error.InternalError, ValueError):
                    continue
        for gv, f in updates.items():
            mod[gv] = f
        return mod
