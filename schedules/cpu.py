"""CPU strategy around a tensorized core (UNIT §III-C, Fig. 7).

After the Rewriter has split the mapped loops so that the innermost ones are the instruction,
the remaining data-parallel loops are organised by two breakpoints:
- loops above the first breakpoint are fused and parallelised;
- loops below the second breakpoint are moved under the innermost reduction loop and unrolled,
  so their instructions use independent accumulators held in registers;
- the rest run serially.
A breakpoint is a loop level plus a tiling factor: `CpuConfig.unroll` gives, per outer data-parallel
loop, the factor kept below the second breakpoint; `CpuConfig.parallel` how many leading loops are
fused into the parallel loop.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
from tvm import s_tir, te

from .. import intrinsics
from ..prefetch import PREFETCH_ATTR
from ..target import l1_bytes, l2_bytes, vector_registers
from . import loop_order
from .cpu_columns import tile_columns  # noqa: F401  (the strategy's, see base.Strategy)
from .cache_blocks import tile_chunk
from .cpu_loops import (lanes_loop, outer_axes, outer_extents, reduce_extents,  # noqa: F401
                        row_loop)
from .cpu_stages import (inline_copy_stages, parallel_stage, producer_stages,
                         vectorize_lanes)
from .padding_taps import skip_padding
from .register_tiles import (ACCUMULATORS, ACCUMULATORS_16, OPERAND_REGISTERS,
                             REUSE_ACCUMULATORS, VECTOR_REGISTERS, WIDE_TILE, default_tile,
                             operand_reuse_tile, reuses_operands, tile_factors, tile_registers,
                             tiled_extent)

if TYPE_CHECKING:
    from tvm.s_tir.schedule import LoopRV, SBlockRV

    from unit_tvm.intrinsics import Intrinsic
    from unit_tvm.prepare import Prepared

MAX_PARALLEL_EXTENT = 3000  # the paper's first-breakpoint bound


@dataclass(frozen=True)
class CpuConfig:
    """Knobs of the CPU strategy.

    unroll: tuple of (outer data-parallel loop position, factor) placed below the reduction and
        unrolled; their product is the number of accumulators.
    parallel: number of leading outer data-parallel loops fused into the parallel loop.
    reduce_split: reserved for cache blocking of long reductions (not searched yet).
    front: an outer loop moved in front of the others (e.g. GEMM columns before rows, so a panel
        of weights stays in cache while every row block streams past it).
    """

    unroll: tuple = field(default=())
    parallel: int = 1
    reduce_split: tuple = ()
    front: int = -1  # outer loop position moved to the front (-1: keep the op's order)

    def accumulators(self) -> int:
        n = 1
        for _, f in self.unroll:
            n *= f
        return n

    def key(self) -> dict[str, Any]:
        return {"unroll": [list(u) for u in self.unroll], "parallel": self.parallel,
                "reduce_split": list(self.reduce_split), "front": self.front}

    @staticmethod
    def from_key(d: dict[str, Any]) -> CpuConfig:
        return CpuConfig(unroll=tuple(tuple(u) for u in d.get("unroll", ())),
                         parallel=int(d.get("parallel", 1)),
                         reduce_split=tuple(d.get("reduce_split", ())),
                         front=int(d.get("front", -1)))


def default_config(outer_extents: Sequence[int], threads: int, acc_budget: int = ACCUMULATORS,
                   row: int | None = None, front: int = -1,
                   wide_budget: int | None = WIDE_TILE, tile: tuple | None = None) -> CpuConfig:
    """The default breakpoint pair for outer data-parallel loop extents (outermost first).

    Second breakpoint: unroll the two innermost outer loops of extent > 1 (rows and columns)
    by divisors f1, f2 of their extents (<= register_tiles.MAX_UNROLL each, f1*f2 accumulators <=
    acc_budget), preferring the most accumulators, then the most instructions issued per
    operand load of a register block (f1*f2 / (f1+f2)); when those two loops give at most
    half the budget (a 7x7 layer: 7), the next loop out (channel blocks) may take one factor;
    a row no such tile divides well (17 columns; `row`: that loop's position) is one tile as
    wide as the row (register_tiles); when the two loops' divisors give at most half of
    `wide_budget` (powers of two: 8), a tile of `wide_budget` where they have one (None: never).
    tile: a register tile chosen already (operand_reuse_tile, or `default`'s stream_tile)
    instead of the above.
    First breakpoint: fuse leading loops, in the order `front` gives them, while the fused
    extent stays <= MAX_PARALLEL_EXTENT, at least one chunk per thread.
    """
    unroll = tile or default_tile(outer_extents, acc_budget, row, wide_budget)
    remaining = list(outer_extents)
    for p, f in unroll:
        remaining[p] //= f
    parallel, fused = 0, 1
    for p in _order(len(remaining), front):  # the order `apply` fuses them in
        if parallel and fused * remaining[p] > MAX_PARALLEL_EXTENT and fused >= threads:
            break
        fused *= remaining[p]
        parallel += 1
    return CpuConfig(unroll=unroll, parallel=max(parallel, 1), front=front)


def config_space(outer_extents: Sequence[int], threads: int,
                 acc_budget: int = VECTOR_REGISTERS - OPERAND_REGISTERS) -> list[CpuConfig]:
    """Every sensible breakpoint pair: unroll choices (`tile_factors`) on up to two loops x parallel
    depth x which loop goes first."""
    n = len(outer_extents)
    positions = list(range(n))
    out = set()
    for p1 in positions:
        for f1 in tile_factors(outer_extents[p1]):
            for p2 in [None] + [p for p in positions if p > p1]:
                f2s = [1] if p2 is None else tile_factors(outer_extents[p2])
                for f2 in f2s:
                    if f1 * f2 > acc_budget:
                        continue
                    unroll = tuple(u for u in ((p1, f1), (p2, f2)) if u[0] is not None and u[1] > 1)
                    rem = list(outer_extents)
                    for p, f in unroll:
                        rem[p] //= f  # type: ignore[index]
                    for front in [-1] + [p for p in range(1, n) if rem[p] > 1]:
                        order = _order(n, front)
                        fused = 1
                        for par in range(1, n + 1):
                            fused *= rem[order[par - 1]]
                            if fused >= threads or par == n:
                                out.add(CpuConfig(unroll=unroll, parallel=par, front=front))
                            if fused > MAX_PARALLEL_EXTENT * 4:
                                break
    return sorted(out, key=lambda c: (c.parallel, c.unroll, c.front))


def _order(n: int, front: int) -> list[int]:
    """Outer loop positions, with `front` (if >= 0) moved first."""
    return list(range(n)) if front < 0 else [front] + [p for p in range(n) if p != front]


def apply(sch: s_tir.Schedule, block: SBlockRV, outer_spatial: list[LoopRV],
          reduce_loops: list[LoopRV], intrin_loops: list[LoopRV], config: CpuConfig,
          write_back: SBlockRV | None = None) -> LoopRV | None:
    """Organise loops around the instruction loops per `config`.

    outer_spatial: loop RVs of the data-parallel loops left after splitting off the instruction
    (outermost first); reduce_loops: the reduction loops left; intrin_loops: the instruction's
    loops in its own order. write_back: the block that consumes the accumulators (the epilogue);
    it is computed per tile, so the accumulator tile compacts to a small buffer kept in
    registers. Without one, a cache_write stage plays that role.
    """
    unroll_of = dict(config.unroll)
    reduce_loops = list(reduce_loops)
    chunks = []  # cache blocks of the reduction: each runs over the outer loops below them
    for pos, f in config.reduce_split:
        chunk, reduce_loops[pos] = sch.split(reduce_loops[pos], [None, f])
        chunks.append(chunk)
    outer, inner = [], []
    for pos, loop in enumerate(outer_spatial):
        f = unroll_of.get(pos, 1)
        if f > 1:
            o, i = sch.split(loop, [None, f])
            outer.append(o)
            inner.append(i)
        else:
            outer.append(loop)
    outer = [outer[p] for p in _order(len(outer), config.front)]
    # loops of extent 1 are not fused (fusing them trips tensorize's region analysis); they sit
    # innermost among the outer loops, where they cost nothing
    units = [lp for lp in outer if int(sch.get(lp).extent) == 1]
    outer = [lp for lp in outer if int(sch.get(lp).extent) != 1] + units
    n_par = min(config.parallel, len(outer) - len(units)) if len(outer) > len(units) else 1
    sch.reorder(*outer[:n_par], *chunks, *outer[n_par:], *reduce_loops, *inner, *intrin_loops)
    # prefetch the next tile's weights while this one runs (unit_tvm.prefetch); not in cache
    # blocks, where the panel is in L1 already and the prefetch calls, which LLVM must assume
    # write memory, kept it from holding the accumulators in registers (33% of the peak)
    if reduce_loops and not chunks:
        sch.annotate(reduce_loops[0], PREFETCH_ATTR, 1)
    if n_par > 1:
        outer = [sch.fuse(*outer[:n_par])] + outer[n_par:]
    if outer:
        if write_back is None:
            write_back = sch.cache_write(block, 0, "global")
        # with chunks, the accumulators outlive a tile: written back once all chunks ran
        sch.reverse_compute_at(write_back, outer[0] if chunks else outer[-1])
        vectorize_lanes(sch, write_back)
        sch.parallel(outer[0])
    for loop in inner:
        sch.unroll(loop)
    first = (chunks or reduce_loops or inner or intrin_loops)[0]
    sch.decompose_reduction(block, first)
    return outer[-1] if outer else None


def schedule(prepared: Prepared, intrin: Intrinsic, config: CpuConfig | None = None,
             target: tvm.target.Target | None = None) -> s_tir.Schedule:
    """s_tir.Schedule of a Prepared graph on a CPU: producer stages inlined or run once in
    parallel, the core's mapped loops split by the instruction's extents, the breakpoints of
    `config` (default: `default`) around them, the instruction tensorized, then the taps that
    read only zero padding skipped (`prepared.zero_padding`, padding_taps.py)."""
    sch = s_tir.Schedule(te.create_prim_func(prepared.tensors))
    inline_copy_stages(sch, prepared, intrin)
    for name in producer_stages(sch, prepared):
        parallel_stage(sch, sch.get_sblock(name))
    core_op = prepared.core.op
    block = sch.get_sblock(core_op.name)
    loops = sch.get_loops(block)
    outer = dict(enumerate(loops))
    intrin_loops = []
    for m in prepared.mapping.loops:
        if m.op_extent == m.intrin_extent:
            intrin_loops.append(loops[m.op_index])
            del outer[m.op_index]
        else:
            o, i = sch.split(loops[m.op_index], [None, m.intrin_extent])
            outer[m.op_index] = o
            intrin_loops.append(i)
    n_spatial = len(core_op.axis)
    spatial = [outer[i] for i in sorted(outer) if i < n_spatial]
    reduce = [outer[i] for i in sorted(outer) if i >= n_spatial]
    if config is None:
        config = default(prepared, target)
    _check(config, outer_extents(prepared), reduce_extents(prepared))
    epilogue = sch.get_sblock(prepared.output.op.name)
    if prepared.shifted:
        # the epilogue also reads the compensation, produced once at root; TVM can only compute a
        # block per tile when all its producers are in that tile, so it runs as its own pass
        parallel_stage(sch, epilogue)
        epilogue = None
    apply(sch, block, spatial, reduce, intrin_loops, config, write_back=epilogue)
    sch.tensorize(intrin_loops[0], intrin.tensor_intrin)
    return skip_padding(sch, prepared.zero_padding)


def _check(config: CpuConfig, extents: Sequence[int], reductions: Sequence[int]) -> None:
    """ValueError unless each unroll factor of `config` divides its outer loop and each cache
    block its reduction loop (one that does not would fail inside TVM's tensorize); the
    tuner's space only holds such configs, a user's or an old database record's may not."""
    for p, f in config.unroll:
        if not 0 <= p < len(extents) or f < 1 or extents[p] % f:
            raise ValueError(f"CpuConfig unroll ({p}, {f}): no register tile of the op's outer "
                             f"loops {'x'.join(map(str, extents))} (factors must divide them)")
    for p, f in config.reduce_split:
        if not 0 <= p < len(reductions) or f < 1 or reductions[p] % f:
            raise ValueError(f"CpuConfig reduce_split ({p}, {f}): no cache block of the op's "
                             f"reduction loops {'x'.join(map(str, reductions)) or '(none)'} "
                             "(blocks must divide them)")


def prepare_options(target: tvm.target.Target) -> dict[str, Any]:
    """How operands are prepared for this strategy: a register tile's columns padded to a width
    it can hold (17 -> 18); operands packed whole (not one loop per dimension)."""
    return {"separable": False, "tile_columns": tiled_extent}


# -- the tuning interface every strategy offers (the tuner calls only these) --------------------
def describe(config: CpuConfig, prepared: Prepared) -> str:
    """e.g. 'loops 1x4x14x14: tile L2/2 x L3/7 (14 acc), parallel L1.L2.L3': the outer
    data-parallel loops (outer_extents, numbered from the outermost), the register tile's loops
    and factors, then the loops `apply` fuses into the parallel one (extent-1 ones left out)."""
    extents = outer_extents(prepared)
    unroll = dict(config.unroll)
    tile = " x ".join(f"L{p}/{f}" for p, f in config.unroll) or "none"
    order = [p for p in _order(len(extents), config.front) if extents[p] // unroll.get(p, 1) > 1]
    fused = ".".join(f"L{p}" for p in order[:max(config.parallel, 1)]) or "-"
    front = f", L{config.front} first" if config.front >= 0 else ""
    chunks = "".join(f", reduction R{p} in blocks of {f}" for p, f in config.reduce_split)
    return (f"loops {'x'.join(map(str, extents))}: tile {tile} ({config.accumulators()} acc), "
            f"parallel {fused}{front}{chunks}")


def _threads(target: tvm.target.Target) -> int:
    return int(target.attrs.get("num-cores", 1))


def _register_bound(target: tvm.target.Target) -> int:
    """The most accumulators a register tile may hold on `target`: its vector registers less
    the operands'."""
    return vector_registers(target) - OPERAND_REGISTERS


def default(prepared: Prepared, target: tvm.target.Target) -> CpuConfig:
    """The default breakpoint pair for a Prepared op on `target`."""
    # a tile instruction's accumulators are tiles in memory, not vector registers: the
    # register-tile measurements (register_tiles.py) do not apply, the register file bounds it
    intrin = intrinsics.get(prepared.mapping.intrinsic)
    tile = intrin.tile
    wide = vector_registers(target) >= VECTOR_REGISTERS
    budget = (VECTOR_REGISTERS - OPERAND_REGISTERS if tile
              else ACCUMULATORS if wide else ACCUMULATORS_16)
    extents = outer_extents(prepared)
    operands = loop_order.tile_operands(prepared)
    axes = outer_axes(prepared)
    lanes = loop_order.lanes_loop(operands, axes)
    reuse = None
    registers = tile_registers(intrin, target)
    if registers is not None and reuses_operands(intrin, target):
        reuse = operand_reuse_tile(extents, lanes, registers, REUSE_ACCUMULATORS)
    row = None if tile or not wide else row_loop(prepared)
    wide_budget = WIDE_TILE if wide and not tile else None
    unroll = reuse or default_tile(extents, budget, row, wide_budget,
                                   None if lanes is None else (lanes, intrin.lanes), registers)
    factors = dict(unroll)
    steps = [n // factors.get(p, 1) for p, n in enumerate(extents)]
    # the channel blocks (the lanes loop) first on the 16-register reuse tile, where the
    # loop order's tiers measured worse (Zen 5 held to AVX2, in the model, us): the L1 tier
    # ran ResNet's stem 2107 rows first against 1008 with its blocks (32 registers' 2 x 7:
    # 480 against 571), the L2 tier ResNet-50's 128 -> 128 3x3 stride 2 at 56x56 1237-1291
    # against 960-974, Inception's 32 -> 64 3x3 at 147 columns 3329-3347 against 2980-2987
    # (its 80 -> 192 at 71: 5196-5237 against 5275; the rest within 1-2%)
    if reuse:
        live = [p for p, n in enumerate(steps) if n > 1]
        front = -1 if lanes is None or not live or live[0] == lanes else lanes
    else:
        front = loop_order.front(operands, axes, steps, l2_bytes(target), l1_bytes(target))
    config = default_config(extents, _threads(target), budget, row=row, front=front,
                            wide_budget=wide_budget, tile=unroll)
    return _in_cache_blocks(config, prepared, target, steps)


def _in_cache_blocks(config: CpuConfig, prepared: Prepared, target: tvm.target.Target,
                     steps: Sequence[int], anywhere: bool = False) -> CpuConfig:
    """`config` with its reduction in the cache blocks cache_blocks.tile_chunk finds for it
    (the channel blocks then alone in the parallel loop), else `config`."""
    order = [p for p in _order(len(steps), config.front) if steps[p] > 1]
    chunk = tile_chunk(prepared, target, dict(config.unroll), steps, order, _threads(target),
                       anywhere)
    if chunk is None:
        return config
    return dataclasses.replace(config, reduce_split=((0, chunk),), parallel=1)


# Columns of weights per memory stream of a register tile: each stream then moves one cache
# line per reduction index. Measured on Zen 5 (cold 16 MB GEMVs, a tile of 8 column blocks,
# speed against the 8 blocks' own streams, in slow / fast memory phases): vpdpbusd (16
# columns a block) 2 blocks a stream 0.99-1.00 / 1.10, 4 blocks 0.99 / 1.10, 8 blocks
# 0.93-0.94 / 1.06; AVX2's quad form (8 columns) 4 blocks 1.09-1.10 / 1.18, 8 blocks
# 1.11-1.14 / 1.30 on 2048 -> 8192 (on 8192 -> 2048: 4 blocks 1.02, 8 blocks 1.01).
PANEL_COLUMNS = 64


def weight_panel(config: CpuConfig, prepared: Prepared) -> int:
    """Blocks of the streamed operand's lanes (a dense layer's column blocks) that `config`'s
    register tile reads per reduction step and that sit side by side in its packed weights
    (Blocks.panel): as many as make PANEL_COLUMNS columns, within the tile's blocks."""
    lanes = lanes_loop(prepared)
    if lanes is None:
        return 1
    per_block = intrinsics.get(prepared.mapping.intrinsic).channel_blocks[1]
    return math.gcd(dict(config.unroll).get(lanes, 1), max(1, PANEL_COLUMNS // per_block))


def space(prepared: Prepared, target: tvm.target.Target) -> list[CpuConfig]:
    """Every config the tuner may try for a Prepared op, the default first, then the
    default's reduction in cache blocks where the default keeps it whole (`seeds`)."""
    first = default(prepared, target)
    head = [first] + _blocked_seeds(first, prepared, target)
    return head + [c for c in config_space(outer_extents(prepared), _threads(target),
                                           _register_bound(target))
                   if c not in head]


def seeds(prepared: Prepared, target: tvm.target.Target) -> list[CpuConfig]:
    """Configs to measure right after the default: the default's reduction in cache blocks
    where its panel outgrows L1 but the default keeps it whole (weights beyond L2, an input
    that stays in a line: cache_blocks.reduction_chunk), else none (the rest of the CPU space
    is sampled at random)."""
    return _blocked_seeds(default(prepared, target), prepared, target)


def _blocked_seeds(first: CpuConfig, prepared: Prepared,
                   target: tvm.target.Target) -> list[CpuConfig]:
    """[the default `first` in cache blocks wherever they fit], or [] where `first` has them
    already or none fit."""
    if first.reduce_split:
        return []
    factors = dict(first.unroll)
    steps = [n // factors.get(p, 1) for p, n in enumerate(outer_extents(prepared))]
    blocked = _in_cache_blocks(first, prepared, target, steps, anywhere=True)
    return [blocked] if blocked != first else []


def from_key(d: dict[str, Any]) -> CpuConfig:
    """The config a database record's key describes."""
    return CpuConfig.from_key(d)


MAX_LOOPS = 8  # unroll factors of at most this many outer loops are features


def features(config: CpuConfig, prepared: Prepared, target: tvm.target.Target) -> np.ndarray:
    """Numeric features of a CpuConfig for a Prepared op (input of the tuner's cost model)."""
    extents, threads = outer_extents(prepared), _threads(target)
    unroll = dict(config.unroll)
    factors = [unroll.get(i, 1) for i in range(len(extents))]
    rem = [e // f for e, f in zip(extents, factors)]
    par = min(config.parallel, len(rem))
    fused = math.prod(rem[:par]) if par else 1
    acc = math.prod(factors)
    fs = sorted((f for f in factors if f > 1), reverse=True) + [1, 1]
    reuse = fs[0] * fs[1] / (fs[0] + fs[1])
    chunks = fused / threads
    balance = fused / (math.ceil(fused / threads) * threads)
    serial = math.prod(rem[par:]) if par < len(rem) else 1
    pos = [math.log2(f) for f in factors][-MAX_LOOPS:]
    pos = [0.0] * (MAX_LOOPS - len(pos)) + pos
    return np.array(pos + [acc, math.log2(acc), reuse, par, math.log2(max(fused, 1)),
                           math.log2(max(chunks, 1e-3)), balance, math.log2(serial)], np.float32)
