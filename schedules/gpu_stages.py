"""The stages of the GPU strategy's kernel around its Tensor Core core: operands staged through
shared memory into fragments (copies bound to the block's threads, 16-byte vectors where the
reads allow, padded rows, the operand's preparation inlined for implicit GEMM), the cp.async
pipeline, split-K across thread blocks, the block's result tile and the other blocks of the
prepared graph as elementwise kernels. `schedules.gpu.apply` arranges them per GpuConfig."""

from typing import NamedTuple

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule import LoopRV, SBlockRV

from ..te_expr import substitute
from .gpu_config import PAD_BYTES, GpuConfig


def _bind_copy(sch: s_tir.Schedule, block: SBlockRV, at: LoopRV, threads_y: int,
               vector: int = 1) -> None:
    """All threads of the block copy a tile (its loops under `at`): fused and split over
    threadIdx.y x threadIdx.x, `vector` contiguous elements per thread and step (the lanes split
    off first, so a partial last step is predicated on whole vectors)."""
    loops = sch.get_loops(block)
    at_loop = sch.get(at)
    own = loops[next(i for i, lp in enumerate(loops) if sch.get(lp).same_as(at_loop)) + 1:]
    fused = sch.fuse(*own) if len(own) > 1 else own[0]
    if vector > 1:
        fused, lanes = sch.split(fused, [None, vector])
        sch.vectorize(lanes)
    _, ty, tx = sch.split(fused, [None, threads_y, 32])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")


def _copy_vector(sch, block):
    """Elements per 16-byte copy of a shared stage, if its rows hold whole vectors and every
    value it reads comes from whole aligned vectors (else 1). TVM's CUDA code for a vector
    gathered from scattered elements (an inlined pack or im2col whose lanes cross a row of its
    source) does not compile, so such a stage copies element by element; a 16-lane int8 select
    (an int8 gather with padding) does not either, so such a stage copies 4 bytes."""
    blk = sch.get(block)
    buf = blk.writes[0].source
    vector = PAD_BYTES // (tvm.DataType(str(buf.dtype)).bits // 8)
    column = blk.iter_vars[-1]
    if int(column.dom.extent) % vector or int(buf.shape[-1]) % vector:
        return 1
    ana = tvm.sym.Analyzer()
    for iv in blk.iter_vars[:-1]:
        ana.bind(iv.var, iv.dom)
    dtype = column.var.ty
    step, lane = tirx.Var("step", dtype), tirx.Var("lane", dtype)
    ana.bind(step, tvm.ir.Range(0, int(column.dom.extent) // vector))
    ana.bind(lane, tvm.ir.Range(0, vector))
    loads, selects = [], []
    tvm_ffi.structural_walk(blk.body, [(tvm.ir.expr.TensorLoad, loads.append),
                                       (tvm.ir.expr.Call, selects.append)], order="pre")
    if vector > 8 and any(c.op.name == "prim.if_then_else" for c in selects):
        # TVM writes a 16-lane int8 zero as make_int4 of 16 values, which CUDA rejects; four
        # lanes are one char4
        vector = 4
    for load in loads:
        at_first = [substitute(i, [(column.var, step * vector)]) for i in load.indices]
        at_nth = [substitute(i, [(column.var, step * vector + lane)]) for i in load.indices]
        whole = (int(load.source.shape[-1]) % vector == 0
                 and ana.can_prove(at_nth[-1] - at_first[-1] == lane)
                 and ana.can_prove(tirx.floormod(at_first[-1], vector) == 0)
                 and all(ana.can_prove(a == b) for a, b in zip(at_first[:-1], at_nth[:-1])))
        if not whole:
            return 1
    return vector


def pipeline_stages(sch: s_tir.Schedule, k_loop: LoopRV) -> None:
    """Two shared-memory stages per operand: while the warps multiply the tiles of one k step,
    cp.async copies the next step's (TVM's InjectSoftwarePipeline doubles the buffers; the
    copies become cp.async where the build enables async copies, lowering.build does for CUDA).
    The k loop's children are the A copy, the B copy and the fragment loop, in that order."""
    sch.annotate(k_loop, "software_pipeline_stage", [0, 0, 1])
    sch.annotate(k_loop, "software_pipeline_order", [0, 1, 2])
    sch.annotate(k_loop, "software_pipeline_async_stages", [0])


def _pad_rows(sch: s_tir.Schedule, block: SBlockRV) -> None:
    """Pad the rows of a shared stage so that consecutive rows start 16 bytes apart modulo 32:
    a row of 32, 64, ... bytes gets 16 more, a row of 16 bytes (already conflict-free) none.
    wmma needs the stride in 16-byte multiples, whatever the stage's copies move."""
    buf = sch.get(block).writes[0].source
    if len(buf.shape) < 2:
        return
    pad = PAD_BYTES // (tvm.DataType(str(buf.dtype)).bits // 8)
    # storage_align holds for the compacted tile too (the rows the stage really copies), where
    # a stride from the full buffer's shape would not
    sch.storage_align(block, 0, len(buf.shape) - 2, factor=2 * pad, offset=pad)


def _bind_elementwise(sch: s_tir.Schedule, block: SBlockRV) -> None:
    loops = sch.get_loops(block)
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    bx, tx = sch.split(fused, [None, 128])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _read_index(sch: s_tir.Schedule, block: SBlockRV, name: str) -> int:
    for i, region in enumerate(sch.get(block).reads):
        if region.source.name == name:
            return i
    raise ValueError(f"{name} is not read by the core")


def tensorize_tile_copy(sch: s_tir.Schedule, block: SBlockRV, helper: str, rows: int,
                        cols: int) -> None:
    """Tensorize a fragment load/store: its last two loops split into rows x cols tiles."""
    loops = sch.get_loops(block)
    r_o, r_i = sch.split(loops[-2], [None, rows])
    c_o, c_i = sch.split(loops[-1], [None, cols])
    sch.reorder(r_o, c_o, r_i, c_i)
    sch.tensorize(r_i, helper)


def _inline_preparation(sch: s_tir.Schedule, stage: SBlockRV) -> None:
    """Implicit preparation: every data-parallel producer of a shared-memory stage (the im2col
    gather, an operand pack, and theirs in turn) is inlined into it, so the stage reads the
    function's inputs directly and the gathered operand never exists in global memory."""
    todo = list(sch.get_producers(stage))
    while todo:
        producer = todo.pop()
        if any(iv.iter_type != 0 for iv in sch.get(producer).iter_vars):
            continue  # a reduction is computed once, not per stage
        todo += list(sch.get_producers(producer))
        sch.compute_inline(producer)


def _in_block(sch: s_tir.Schedule, consumer: SBlockRV, block_loop: LoopRV,
              threads_y: int) -> None:
    """A consumer of the block's tile (the split-K sum of the slices' partials, the write of the
    output) computed by that thread block after the tile: every thread computes some of its
    elements (a reduction innermost)."""
    sch.reverse_compute_at(consumer, block_loop, preserve_unit_loops=True)
    loops = sch.get_loops(consumer)
    kinds = [iv.iter_type for iv in sch.get(consumer).iter_vars]
    inner = loops[len(loops) - len(kinds):]
    spatial = [lp for lp, kind in zip(inner, kinds) if kind == 0]
    reduce = [lp for lp, kind in zip(inner, kinds) if kind != 0]
    sch.reorder(*spatial, *reduce)
    fused = sch.fuse(*spatial)
    _, ty, tx = sch.split(fused, [None, threads_y, 32])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")


class StageLoops(NamedTuple):
    """Where an operand's stages go: shared tiles per k step (`k_step_loop`), fragments per
    reduction fragment (`fragment_loop`), copied by `warps` warps."""

    k_step_loop: object
    fragment_loop: object
    warps: int


def stage_operand(sch: s_tir.Schedule, block: SBlockRV, name: str, frag_scope: str, load: str,
                  shape: tuple[int, int], loops: StageLoops, config: GpuConfig,
                  pad_rows: bool) -> int:
    """Stage operand `name` of the core: a shared tile per k step (its preparation inlined when
    implicit, vector copies where they apply, padded rows), then a fragment per reduction
    fragment through the `load` helper. Returns the elements per copy of the shared stage."""
    shared = sch.cache_read(block, _read_index(sch, block, name), "shared")
    sch.compute_at(shared, loops.k_step_loop)
    if config.implicit:
        _inline_preparation(sch, shared)
    vector = _copy_vector(sch, shared) if config.vector_copy else 1
    if pad_rows:
        _pad_rows(sch, shared)
    _bind_copy(sch, shared, loops.k_step_loop, loops.warps, vector)
    copy = sch.cache_read(block, _read_index(sch, block, shared_name(sch, shared)), frag_scope)
    sch.compute_at(copy, loops.fragment_loop)
    tensorize_tile_copy(sch, copy, load, *shape)
    return vector


def bind_other_blocks(sch: s_tir.Schedule, core: SBlockRV,
                      block_epilogue: bool) -> list[SBlockRV]:
    """Every block but the core (and, with the block epilogue, the ops that read the core's
    fragments: the output's write) becomes an elementwise kernel of its own: packs, producers,
    the output's copy. Returns the blocks left to the core's kernel."""
    epilogue = list(sch.get_consumers(core)) if block_epilogue else []
    skip = {sch.get(b).name_hint for b in [core, *epilogue]}
    for other in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(other).name_hint not in skip:
            _bind_elementwise(sch, other)
    return epilogue


def split_k_across_blocks(sch: s_tir.Schedule, block: SBlockRV, loops: list[LoopRV], k_pos: int,
                          slices: int) -> tuple[SBlockRV, list[LoopRV], list[LoopRV]]:
    """(core, its loops, [slice loop]): with `slices` > 1 the reduction loop at `k_pos` is cut
    into that many contiguous slices, each accumulated by its own thread blocks into a global
    buffer of partials (rfactor: the core keeps its loops, the slice loop now data-parallel);
    the original block becomes a kernel of its own that sums the slices, one output element
    per thread. A small layer at batch 1 fills a few of the GPU's SMs with long serial
    reductions otherwise (Table I's 7x7 layer: 48 output fragments, 66 fragments of K)."""
    if slices == 1:
        return block, loops, []
    slice_loop, _ = sch.split(loops[k_pos], [slices, None])
    slice_sum, block = block, sch.rfactor(slice_loop, 0)
    sum_loops = sch.get_loops(slice_sum)
    outputs = sch.fuse(*sum_loops[:-1]) if len(sum_loops) > 2 else sum_loops[0]
    bx, tx = sch.split(outputs, [None, 128])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    loops = sch.get_loops(block)
    return block, loops, [loops[k_pos]]


def result_tile(sch: s_tir.Schedule, acc: SBlockRV, write_back: SBlockRV | None,
                epilogue: list[SBlockRV], block_loop: LoopRV, threads_y: int) -> str:
    """Where the block's result goes once `acc` stores its fragments: with the block epilogue
    the tile (the fragments, or the split-K sum of them) stays in shared memory and the block's
    threads write the output from it; otherwise the tile is a global buffer of whole fragments
    that a second kernel copies into the output. Returns the store helper's name."""
    if epilogue:
        sch.set_scope(write_back if write_back is not None else acc, 0, "shared")
    for consumer in ([write_back] if write_back is not None else []) + epilogue:
        _in_block(sch, consumer, block_loop, threads_y)
    return "store_shared" if write_back is not None or epilogue else "store"


def shared_name(sch: s_tir.Schedule, block: SBlockRV) -> str:
    """Name of the buffer a cache stage block writes."""
    return sch.get(block).writes[0].source.name
