"""The stages of a prepared graph around its core on a CPU: producers (packs, pads, shifts,
compensation) inlined where nothing else reads them, or run once in parallel with their channel
vectors copied whole; padding loops marked for TVM's LoopPartition; row reductions as vectors of
partial results."""

from __future__ import annotations

from typing import TYPE_CHECKING

import tvm
from tvm import s_tir, tirx

if TYPE_CHECKING:
    from tvm.s_tir.schedule import LoopRV, SBlockRV

    from unit_tvm.intrinsics import Intrinsic
    from unit_tvm.prepare import Prepared


def vectorize_lanes(sch: s_tir.Schedule, block: SBlockRV,
                    widths: tuple[int, ...] = (8, 16, 32, 64)) -> None:
    """Vectorise a block's innermost loop (split into vectors of the widest of `widths` that
    divides it) when every buffer it touches along that loop is contiguous there (its last axis
    of more than one element only): an epilogue into a blocked layout (NCHW16c) reads the
    accumulator lanes and writes the output lanes in place; a pad/copy stage between two blocked
    layouts copies whole channel vectors. Scattering accesses keep scalar code."""
    loops = sch.get_loops(block)
    if not loops:
        return
    extent = int(sch.get(loops[-1]).extent)
    width = next((w for w in sorted(widths, reverse=True) if extent % w == 0), None)
    if width is None:
        return
    loop = sch.get(loops[-1])
    realize = loop.body
    stmt = sch.get(block)
    if not hasattr(realize, "iter_values") or not realize.block.same_as(stmt):
        return
    bound = [iv.var for iv, value in zip(stmt.iter_vars, realize.iter_values)
             if any(v.same_as(loop.loop_var) for v in tvm.tirx.analysis.undefined_vars(value))]
    if len(bound) != 1:
        return
    if any(iv.var.same_as(bound[0]) and iv.iter_type != iv.DataPar for iv in stmt.iter_vars):
        return  # a reduction loop (a compensation's sum) does not vectorise this way
    # indices simplified within the block's iteration domain: a residual read in 16-channel
    # blocks by an 8- or 16-lane output block, (ko * 16 + ki) // 16, is ko there, not a lane
    ana = tvm.sym.Analyzer()
    for iv in stmt.iter_vars:
        ana.bind(iv.var, iv.dom)
    for region in list(stmt.reads) + list(stmt.writes):
        axes = [tvm.tirx.analysis.undefined_vars(ana.simplify(r.min)) for r in region.region]
        # the last axis of more than one element is the contiguous one (a per-channel gate
        # [N, C, 1, 1] read at channel ko * 16 + ki is a run of lanes)
        shape = [int(n) if isinstance(n, tirx.IntImm) else -1 for n in region.source.shape]
        last = max([i for i, n in enumerate(shape) if n != 1], default=len(axes) - 1)
        if any(any(v.same_as(bound[0]) for v in a) for i, a in enumerate(axes) if i != last):
            return
    if extent != width:
        # a wider row (a 256-channel block, an im2col row, a 6-block register tile of a
        # dense's results) goes one vector of the widest width that divides it at a time
        loops = [*loops[:-1], *sch.split(loops[-1], [None, width])]
    sch.vectorize(loops[-1])


def parallel_stage(sch: s_tir.Schedule, block: SBlockRV, min_extent: int = 64) -> None:
    """Run a preparation stage (pack, shift, compensation) once, its leading data-parallel loops
    fused until there is enough parallel work (batch 1 and one channel block are extent 1)."""
    loops = sch.get_loops(block)
    kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    if len(kinds) != len(loops):
        return
    lead, total = 0, 1
    while lead < len(loops) and kinds[lead] == 0 and total < min_extent:
        total *= int(sch.get(loops[lead]).extent)
        lead += 1
    if lead == 0 or total < 2:
        return
    sch.parallel(sch.fuse(*loops[:lead]) if lead > 1 else loops[0])
    if lead < len(loops):
        vectorize_lanes(sch, block)  # a copy along contiguous channel blocks (NCHW16c)
        partition_padding(sch, block, sch.get_loops(block)[1:])


def partition_padding(sch: s_tir.Schedule, block: SBlockRV, inner_loops: list[LoopRV]) -> None:
    """Mark the first inner loop of a padding stage (a pack or copy that writes the pad value
    outside the input: if_then_else(i >= pad and j < w + pad ..., x[...], pad)) for TVM's
    LoopPartition pass, which splits it into left pad, interior and right pad: the interior
    runs without the guard and vectorises (measured: the ResNet stem's quantize + pad + pack
    39 us -> 5.4 us, Zen 5)."""
    value = getattr(sch.get(block).body, "value", None)
    if not (isinstance(value, tvm.ir.expr.Call) and value.op.name.endswith("if_then_else")):
        return
    if inner_loops and sch.get(inner_loops[0]).kind != tirx.ForKind.VECTORIZED:
        sch.annotate(inner_loops[0], "pragma_loop_partition_hint", 1)


def producer_stages(sch: s_tir.Schedule, prepared: Prepared) -> list[str]:
    """Blocks computed once per call before the core: packs, shifts, compensation, and any
    producer the op itself has (e.g. a fused input quantization)."""
    skip = {prepared.core.op.name, prepared.output.op.name}
    root = sch.get_sblock("root")
    return [sch.get(b).name_hint for b in sch.get_child_blocks(root)
            if sch.get(b).name_hint not in skip]


def inline_copy_stages(sch: s_tir.Schedule, prepared: Prepared, intrin: Intrinsic) -> None:
    """Inline producer stages read by nothing but other producers (a pad or a +128 shift feeding
    a pack): one pass less, and no buffer dies before the core. That matters for instructions
    that take their operands by pointer (AMX, vdpbf16ps): TVM's storage rewrite would lay a
    later buffer (the accumulator, a pack) into a dead buffer of another dtype (a u8 shift, a
    bf16 pad it re-typed to f32), and the pointer then fails to lower. ValueError when such an
    instruction meets a stage that cannot be inlined."""
    keep = {prepared.core.op.name, prepared.output.op.name}
    changed = True
    while changed:
        changed = False
        readers: dict[str, set[str]] = {}
        for b in sch.get_child_blocks(sch.get_sblock("root")):
            for r in sch.get(b).reads:
                readers.setdefault(r.source.name, set()).add(sch.get(b).name_hint)
        for name in producer_stages(sch, prepared):
            written = sch.get(sch.get_sblock(name)).writes[0].source.name
            if readers.get(written, set()) & keep or not readers.get(written):
                continue
            try:
                sch.compute_inline(sch.get_sblock(name))
            except s_tir.ScheduleError:
                if intrin.pointer_operands:
                    raise ValueError(f"stage {name} cannot be inlined into the stage that reads "
                                     f"it, and {intrin.name} takes its operands by pointer "
                                     "(TVM's storage rewrite could re-type them)") from None
                continue
            changed = True
            break


def vectorize_partials(sch: s_tir.Schedule, rf: SBlockRV) -> None:
    """An rfactor block (a row reduction's vector of partial results) computed at its row:
    compute_at lays its loops out in its iteration order, [lanes (data parallel), steps
    (reduction)]; the lanes go innermost, vectorised, the init before the steps."""
    lanes, steps = sch.get_loops(rf)[-2:]
    sch.reorder(steps, lanes)
    sch.vectorize(lanes)
    sch.decompose_reduction(rf, steps)
