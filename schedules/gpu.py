"""GPU strategy around a Tensor Core core (UNIT §III-C GPU tuning, Fig. 6).

The Rewriter's prepared core has the instruction's m x n fragment loops innermost. Around them:
- thread blocks: the data-parallel loops outside the fragments (batch, the M and N tiles);
- warps: each warp accumulates a p x p window of 16x16 fragments as an outer product (p fragments
  of A and p of B loaded per reduction step feed p*p mma), so every fragment is reused p times;
- shared memory: per reduction step, the block's A and B tiles are staged in shared memory by all
  threads and reused by every warp of the block;
- options: `fuse_spatial` folds every data-parallel loop outside M/N (a conv's output rows) into
  one block index with the M/N tiles (off: they go to blockIdx.y); `k_step` reduction fragments
  staged per shared tile; `implicit` inlines each operand's preparation (an im2col gather, a
  pack) into its shared-memory stage, so the stage reads the function's inputs and no gathered
  copy goes through global memory (implicit GEMM); `vector_copy` moves 16 bytes per thread per
  copy step into shared tiles whose rows are padded by 16 bytes, so the fragment loads of a warp
  do not fall on the same banks. Fragments span output rows when the graph pass writes a conv
  as a GEMM over fused pixels (relax/gpu/conv.py);
- `pipeline`: the shared stages are doubled and the next k step's tiles arrive by cp.async
  while the warps multiply the current ones (TVM's software pipelining);
- split-K: `split_k` groups of warps each accumulate one slice of the reduction (rfactor), store
  their partial fragments to shared memory, and the block's threads sum the slices from there;
- `block_epilogue`: the accumulators (or the summed slices) stay in shared memory and the
  block's threads write its output tile in the op's own layout, so the kernel writes the result
  once (off: the fragments go to a global buffer of whole fragments and a second kernel copies
  them into the output, dropping the padding).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
from tvm import s_tir, te

from . import gpu_stages
from .gpu_config import (  # noqa: F401 - also the strategy's public names
    GRID_SPLITS, MAX_THREADS, PAD_BYTES, SHARED_LIMIT, Fragment, GpuConfig, config_space, fit,
    fits_device, fragment_of, paired_tiles)

if TYPE_CHECKING:
    from unit_tvm.intrinsics import Intrinsic
    from unit_tvm.prepare import Prepared


def _fragment(prepared: Prepared) -> Fragment:
    """The Fragment of the instruction mapped on a Prepared op's core (loops M, N, K)."""
    return Fragment(*(m.intrin_extent for m in prepared.mapping.loops))


def tiles(prepared: Prepared) -> tuple[int, int, int]:
    """(M, N, K) of a Prepared op's core in fragments."""
    core_op = prepared.core.op
    _, _, k_match = prepared.mapping.loops
    orig = prepared.original_mapping.loops
    m_tiles = int(core_op.axis[orig[0].op_index].dom.extent)
    n_tiles = int(core_op.axis[orig[1].op_index].dom.extent)
    k_ext = int(core_op.reduce_axis[k_match.op_index - len(core_op.axis)].dom.extent)
    return m_tiles, n_tiles, k_ext // k_match.intrin_extent


def _operand_bytes(prepared: Prepared) -> tuple[int, int, int]:
    a, b = (tvm.DataType(str(t.dtype)).bits // 8 for t in prepared.core.op.input_tensors[:2])
    return a, b, tvm.DataType(str(prepared.core.dtype)).bits // 8


def _other_blocks(prepared: Prepared) -> int:
    """Thread blocks from the data-parallel loops outside M and N."""
    core_op = prepared.core.op
    m_match, n_match, _ = prepared.mapping.loops
    orig = prepared.original_mapping.loops
    skip = {m_match.op_index, n_match.op_index, orig[0].op_index, orig[1].op_index}
    return math.prod(int(ax.dom.extent) for i, ax in enumerate(core_op.axis) if i not in skip)


# thread blocks that fill the data-center GPUs this targets once (A100: 108 SMs, H100 and
# H200: 132): the default takes two fragments per warp only where that keeps this many
FILL_BLOCKS = 128


def _blocks(config: GpuConfig, m_tiles: int, n_tiles: int, other_blocks: int) -> int:
    """Thread blocks of a fitted config."""
    return ((m_tiles // (config.p * config.warps_m)) * (n_tiles // (config.p * config.warps_n))
            * other_blocks * config.grid_split_k)


def _block_slices(k_tiles: int) -> int:
    """The default's split-K in the block: 4 slices of warps for 64 or more fragments of K, 2
    for 32 or more (on an H200 the fastest one-kernel configs of Table I had 4 at K = 72-144, 2
    at 38-64, 1 at 36)."""
    return 4 if k_tiles >= 64 else 2 if k_tiles >= 32 else 1


# -- the tuning interface every strategy offers (the tuner calls only these) --------------------
def default(prepared: Prepared, target: tvm.target.Target | None = None) -> GpuConfig:
    """The default config: the layer in one kernel (the block epilogue writes the output; fp16
    operands gathered by the shared-memory stages, int8 ones by a pass of their own, whose
    padded gather would copy 4 bytes per thread), 16-byte copies with the cp.async pipeline,
    1x2 warps of one fragment, split-K in the block by K's length (`_block_slices`), up to 8
    fragments of K per stage over the slices (at most 4 per slice, fewer where shared memory
    would overflow), two fragments per warp only where FILL_BLOCKS blocks remain. On an H200
    (RESULTS 2026-11-27, `python -m unit_tvm.bench.gpu_configs`) the median sampled config
    with the one-kernel options was 1.82x faster than the former default (2x2 warps of 2x2
    fragments, the gather and the output copy as kernels of their own) over Table I."""
    m_tiles, n_tiles, k_tiles = tiles(prepared)
    frag, sizes = _fragment(prepared), _operand_bytes(prepared)

    def staged(config):
        # the stage's depth from the slices K took (fit may give fewer than asked), then less
        # while the pipelined stages, the partials and the output tile overflow shared memory
        # (the schedule would drop the epilogue and the pipeline instead)
        config = fit(dataclasses.replace(config, k_step=min(4, 8 // config.split_k)), m_tiles,
                     n_tiles, k_tiles)
        while (config.shared_bytes(frag, *sizes, padded=True) > SHARED_LIMIT
               and config.k_step > 1):
            config = fit(dataclasses.replace(config, k_step=config.k_step - 1), m_tiles,
                         n_tiles, k_tiles)
        return config

    config = staged(fit(GpuConfig(p=1, warps_m=1, warps_n=2, split_k=_block_slices(k_tiles),
                                  implicit=sizes[0] == sizes[1] == 2, pipeline=True,
                                  block_epilogue=True), m_tiles, n_tiles, k_tiles))
    # two fragments per warp where the blocks still fill the GPU and the stages keep their
    # depth in shared memory (a 128-token dense layer of BERT would drop to k_step 1)
    wide = staged(dataclasses.replace(config, p=2))
    if (wide.p == 2 and _blocks(wide, m_tiles, n_tiles, _other_blocks(prepared)) >= FILL_BLOCKS
            and wide.k_step >= config.k_step
            and wide.shared_bytes(frag, *sizes, padded=True) <= SHARED_LIMIT):
        return wide
    return config


# the default's neighbours, one knob changed each: what the tuner measures first (seeds) and
# what `python -m unit_tvm.bench.gpu_configs` times beside the default
NEIGHBOURS = {
    "split-K 1": lambda c: dataclasses.replace(c, split_k=1),
    "split-K 4": lambda c: dataclasses.replace(c, split_k=4),
    "k_step 1": lambda c: dataclasses.replace(c, k_step=1),
    "k_step 4": lambda c: dataclasses.replace(c, k_step=4),
    "warps 2x2": lambda c: dataclasses.replace(c, warps_m=2),
    "warps 1x1": lambda c: dataclasses.replace(c, warps_n=1),
    "p 2": lambda c: dataclasses.replace(c, p=2),
    "no pipeline": lambda c: dataclasses.replace(c, pipeline=False),
    "implicit toggled": lambda c: dataclasses.replace(c, implicit=not c.implicit),
    "no block epilogue": lambda c: dataclasses.replace(c, block_epilogue=False),
    "K over 4 blocks": lambda c: dataclasses.replace(c, grid_split_k=4),
}


def seeds(prepared: Prepared, target: tvm.target.Target | None = None) -> list[GpuConfig]:
    """The configs the tuner measures right after the default, before sampling the space at
    random: the default's NEIGHBOURS, fitted, distinct, within the device's limits."""
    first = default(prepared, target)
    fitted = (fit(change(first), *tiles(prepared)) for change in NEIGHBOURS.values())
    out: list[GpuConfig] = []
    for c in fitted:
        if c != first and c not in out and fits_device(c, _fragment(prepared),
                                                        *_operand_bytes(prepared)):
            out.append(c)
    return out


def space(prepared: Prepared, target: tvm.target.Target | None = None) -> list[GpuConfig]:
    """Every config the tuner may try for a Prepared op (p, warps, k_step, split-K, spatial
    fusion, implicit preparation), the default first."""
    first = default(prepared, target)
    rest = config_space(*tiles(prepared), _fragment(prepared), *_operand_bytes(prepared))
    return [first] + [c for c in rest if c != first]


def from_key(d: dict[str, Any]) -> GpuConfig:
    """The config a database record's key describes."""
    return GpuConfig.from_key(d)


def weight_panel(config: GpuConfig, prepared: Prepared) -> int:
    """1: a thread block's warps read their fragments' blocks wherever they lie."""
    return 1


def describe(config: GpuConfig, prepared: Prepared | None = None) -> str:
    """e.g. 'p2, warps 2x2, k_step 2, split_k 1, fused HW, implicit' (for `unit-tvm profile`)."""
    return (f"p{config.p}, warps {config.warps_m}x{config.warps_n}, k_step {config.k_step}, "
            f"split_k {config.split_k}" + (", fused HW" if config.fuse_spatial else "")
            + (", implicit" if config.implicit else "")
            + (", element copies" if not config.vector_copy else "")
            + (", cp.async pipeline" if config.pipeline else "")
            + (", block epilogue" if config.block_epilogue else "")
            + (f", {config.grid_split_k} K slices across blocks" if config.grid_split_k > 1
               else ""))


def features(config: GpuConfig, prepared: Prepared,
             target: tvm.target.Target | None = None) -> np.ndarray:
    """Numeric features of a GpuConfig for a Prepared op (input of the tuner's cost model)."""
    m_tiles, n_tiles, k_tiles = tiles(prepared)
    c = fit(config, m_tiles, n_tiles, k_tiles)
    blocks = _blocks(c, m_tiles, n_tiles, _other_blocks(prepared))
    steps = k_tiles // (c.k_step * c.split_k * c.grid_split_k)
    shared = c.shared_bytes(_fragment(prepared), *_operand_bytes(prepared))
    return np.array([c.p, c.warps_m, c.warps_n, c.k_step, c.split_k, float(c.fuse_spatial),
                     float(c.implicit), float(c.vector_copy), float(c.pipeline),
                     float(c.block_epilogue), c.grid_split_k,
                     c.threads(), shared / 1024.0,
                     math.log2(max(blocks, 1)), math.log2(max(steps, 1)),
                     c.p * c.p / (2 * c.p)], np.float32)


def schedule(prepared: Prepared, intrin: Intrinsic, config: GpuConfig | None = None,
             target: tvm.target.Target | None = None) -> s_tir.Schedule:
    """s_tir.Schedule of a Prepared graph on a CUDA GPU: `apply` with `config` (None: `default`,
    as the model path uses untuned)."""
    sch = s_tir.Schedule(te.create_prim_func(prepared.tensors))
    apply(sch, prepared, intrin, config if config is not None else default(prepared, target))
    return sch


def prepare_options(target: tvm.target.Target) -> dict[str, Any]:
    """How operands are prepared for this strategy: staged one loop per dimension (fragment
    loads), columns not padded for a register tile, M padded to an even count of fragments
    (`paired_tiles`)."""
    return {"separable": True, "tile_columns": None, "tile_rows": paired_tiles}


def tile_columns(prepared: Prepared, intrin: Intrinsic,
                 target: tvm.target.Target | None) -> int | None:
    """None: a fragment's columns are not padded for a register tile (base.Strategy)."""
    return None


def _within_shared_memory(config: GpuConfig, frag: Fragment,
                          sizes: tuple[int, int, int]) -> tuple[GpuConfig, bool]:
    """(config, pad rows?): the block epilogue's tile, the pipeline's second stages, then the
    rows' padding, only where they fit (a config given directly need not be in the space, which
    holds those whose unpadded size fits)."""
    if config.block_epilogue and config.shared_bytes(frag, *sizes) > SHARED_LIMIT:
        config = dataclasses.replace(config, block_epilogue=False)
    if config.pipeline and config.shared_bytes(frag, *sizes) > SHARED_LIMIT:
        config = dataclasses.replace(config, pipeline=False)
    padded = config.shared_bytes(frag, *sizes, padded=True)
    return config, config.vector_copy and padded <= SHARED_LIMIT


def apply(sch: s_tir.Schedule, prepared: Prepared, intrin: Intrinsic,
          config: GpuConfig) -> GpuConfig:
    """Schedule a Prepared graph for a CUDA target; returns the (fitted) config used."""
    mapping = prepared.mapping
    core_op = prepared.core.op
    n_spatial = len(core_op.axis)
    config = fit(config, *tiles(prepared))
    frag = _fragment(prepared)
    config, pad_rows = _within_shared_memory(config, frag, _operand_bytes(prepared))
    block = sch.get_sblock(core_op.name)
    epilogue = gpu_stages.bind_other_blocks(sch, block, config.block_epilogue)
    loops = sch.get_loops(block)
    m_match, n_match, k_match = mapping.loops
    orig = prepared.original_mapping.loops
    m_pos, n_pos = orig[0].op_index, orig[1].op_index  # M/N tile loops of the core
    outer_spatial = [i for i in range(n_spatial) if i not in (m_match.op_index, n_match.op_index)]
    p, wm, wn, ks, sk = config.p, config.warps_m, config.warps_n, config.k_step, config.split_k
    warps = wm * wn * sk
    a_op, b_op, d_op = intrin.operands
    k_pos = k_match.op_index
    block, loops, grid = gpu_stages.split_k_across_blocks(sch, block, loops, k_pos,
                                                          config.grid_split_k)
    k_first = k_pos + len(grid)  # the reduction each block keeps
    # the slices interleave per shared stage (k = ((ko * sk + slice) * ks + kk) * K + ki) so the
    # stage of all slices is one dense tile
    write_back = None
    if sk > 1:
        ko, kz, kk, ki = sch.split(loops[k_first], [None, sk, ks, frag.k])
        # each slice of warps accumulates its part of the reduction into a shared partial; the
        # rfactor block gets its own loop nest, with the same loops
        write_back, block = block, sch.rfactor(kz, 0)
        sch.set_scope(block, 0, "shared")
        loops = sch.get_loops(block)
        grid = loops[k_pos:k_first]
        ko, kz, kk, ki = loops[k_first:k_first + 4]
        k_loops = set(range(k_pos, k_first + 4))
    else:
        ko, kk, ki = sch.split(loops[k_first], [None, ks, frag.k])
        k_loops = set(range(k_pos, k_first + 1))
    bm, tym, pm = sch.split(loops[m_pos], [None, wm, p])
    bn, tyn, pn = sch.split(loops[n_pos], [None, wn, p])
    others = [loops[i] for i in outer_spatial if i not in (m_pos, n_pos)]
    red_others = [loops[i] for i in range(n_spatial, len(loops)) if i not in k_loops]
    im, jn = loops[m_match.op_index], loops[n_match.op_index]
    slices = [kz] if sk > 1 else []
    fused = config.fuse_spatial or not others
    # the slice loop joins the block index: beside M and N, or inside an unfused blockIdx.y
    lead = [*grid, *others] if fused else [*others, *grid]
    sch.reorder(*lead, bm, bn, *slices, tym, tyn, *red_others, ko, kk, pm, pn, im, jn, ki)
    if fused:
        bx = sch.fuse(*grid, *others, bm, bn)
    else:
        sch.bind(sch.fuse(*others) if len(others) > 1 else others[0], "blockIdx.y")
        bx = sch.fuse(*grid, bm, bn)
    sch.bind(bx, "blockIdx.x")
    ty = sch.fuse(*slices, tym, tyn)
    sch.bind(ty, "threadIdx.y")

    # accumulators: a p x p window of fragments per warp, stored back through the helper
    acc = sch.cache_write(block, 0, intrin.scopes[d_op])
    sch.reverse_compute_at(acc, ty)
    store = gpu_stages.result_tile(sch, acc, write_back, epilogue, bx, warps)
    op_tensor = {o.intrin_operand: o.op_tensor for o in mapping.operands}
    stage_loops = gpu_stages.StageLoops(ko, kk, warps)
    vectors = [gpu_stages.stage_operand(sch, block, op_tensor[operand], intrin.scopes[operand],
                                        intrin.helper(helper), shape, stage_loops, config,
                                        pad_rows)
               for operand, helper, shape in ((a_op, "load_a", (frag.m, frag.k)),
                                              (b_op, "load_b", (frag.k, frag.n)))]
    if config.pipeline and all(v > 1 for v in vectors):
        gpu_stages.pipeline_stages(sch, ko)
    elif config.pipeline:  # cp.async moves 4-16 bytes: element copies stay synchronous
        config = dataclasses.replace(config, pipeline=False)
    init = sch.decompose_reduction(block, red_others[0] if red_others else ko)
    i_loops = sch.get_loops(init)
    sch.tensorize(i_loops[-2], intrin.helper("fill"))
    sch.tensorize(im, intrin.tensor_intrin)
    gpu_stages.tensorize_tile_copy(sch, acc, intrin.helper(store), frag.m, frag.n)
    return config
