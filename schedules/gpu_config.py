"""The GPU strategy's search space: a Tensor Core instruction's fragment, the GpuConfig knobs
around it (schedules/gpu.py says what each does to the kernel), how a config is fitted to a
workload's tiles, and which configs fit a block's thread and shared-memory limits."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from unit_tvm.intrinsics import Intrinsic

MAX_THREADS = 1024
SHARED_LIMIT = 48 * 1024
# 16 bytes: one vector copy per thread, and the row padding of shared tiles (wmma needs row
# strides in multiples of 16 bytes; 16 more shift each row by four banks)
PAD_BYTES = 16


class Fragment(NamedTuple):
    """The instruction's M x N x K: the shape of its accumulator fragment and its reduction."""

    m: int
    n: int
    k: int


def fragment_of(intrin: Intrinsic) -> Fragment:
    """The Fragment an instruction computes, read off its semantics."""
    m, n = (int(s) for s in intrin.output.shape)
    return Fragment(m, n, intrin.reduction_width)


@dataclass(frozen=True)
class GpuConfig:
    """p: fragments per warp along M and N; warps_m x warps_n warps per block (times split_k);
    k_step: 16-wide reduction fragments per shared-memory stage; split_k: reduction slices, each
    accumulated by its own warps and summed through shared memory; implicit: operand preparation
    (gathers, packs) done by the shared-memory stages instead of separate passes; vector_copy:
    16-byte copies into bank-padded shared rows (off: one element per thread, dense rows);
    pipeline: two shared stages per operand, the next k step's filled by cp.async while the
    warps multiply the current one (only with vector copies, and only where both operands'
    stages copy whole vectors); block_epilogue: the block writes its output tile from shared
    memory (off: whole fragments to a global buffer, copied to the output by a second kernel);
    grid_split_k: reduction slices across thread blocks, each block accumulating one slice of K
    into a global buffer of partials that a kernel of its own sums (no block epilogue then)."""

    # the knobs' base values (what GpuConfig() and a record without a knob mean); the default
    # a layer gets is schedules/gpu.py `default`, fitted to its tiles
    p: int = 2
    warps_m: int = 2
    warps_n: int = 2
    k_step: int = 2
    fuse_spatial: bool = True
    split_k: int = 1
    implicit: bool = False
    vector_copy: bool = True
    pipeline: bool = False
    block_epilogue: bool = False
    grid_split_k: int = 1

    def key(self) -> dict[str, int | bool]:
        return {"p": self.p, "warps_m": self.warps_m, "warps_n": self.warps_n,
                "k_step": self.k_step, "fuse_spatial": self.fuse_spatial,
                "split_k": self.split_k, "implicit": self.implicit,
                "vector_copy": self.vector_copy, "pipeline": self.pipeline,
                "block_epilogue": self.block_epilogue, "grid_split_k": self.grid_split_k}

    @staticmethod
    def from_key(d: dict[str, Any]) -> GpuConfig:
        """The config a database record's key describes (records from before `implicit`,
        `vector_copy`, `pipeline`, `block_epilogue` or `grid_split_k` existed describe what the
        schedule did then)."""
        return GpuConfig(**{"implicit": False, "vector_copy": False, "pipeline": False,
                            "block_epilogue": False, **d})

    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n * self.split_k

    def shared_bytes(self, fragment: Fragment, a_bytes: int, b_bytes: int, acc_bytes: int = 4,
                     padded: bool = False) -> int:
        """Shared memory of one block: the A and B stages of every slice, and with split-K the
        slices' partial accumulators, and with the block epilogue the block's output tile
        (fragment: the instruction's Fragment); `padded`: at most what the stages take with
        their rows padded for vector copies; a pipelined config holds two stages of each
        operand."""
        k = self.k_step * fragment.k * self.split_k
        a_tile = self.warps_m * self.p * fragment.m * k * a_bytes
        b_tile = self.warps_n * self.p * fragment.n * k * b_bytes
        if padded:  # at most 16 bytes more per row, and rows may be as short as a fragment's
            a_tile += a_tile * PAD_BYTES // (fragment.k * a_bytes)
            b_tile += b_tile * PAD_BYTES // (fragment.n * b_bytes)
        stages = (a_tile + b_tile) * (2 if self.pipeline else 1)  # pipelined: two of each
        tile = self.warps_m * self.warps_n * self.p ** 2 * fragment.m * fragment.n * acc_bytes
        partial = self.split_k * tile if self.split_k > 1 else 0
        # the summed tile is a buffer of its own beside the slices' partials
        output = tile if self.block_epilogue else 0
        return stages + partial + output


def paired_tiles(tiles: int) -> int:
    """Fragments of M to compute for `tiles` real ones: an odd count above one gets one more,
    whose rows are zero padding cropped from the result. `fit` makes p divide both tile
    counts, so an odd M (13 tiles for a 14x14 output, 49 for 28x28) held every config at one
    fragment per warp, loading an A and a B fragment for each mma; with the pair, p = 2 loads
    four fragments for four mma, for 2-8% more rows."""
    return tiles + 1 if tiles > 1 and tiles % 2 else tiles


def _largest_divisor(n: int, limit: int,
                     allowed: Callable[[int], bool] = lambda d: True) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0 and allowed(d))


def fit(config: GpuConfig, m_tiles: int, n_tiles: int, k_tiles: int) -> GpuConfig:
    """The config clipped to the workload: every factor divides its loop (no predicates); the
    slices across blocks are taken from K first, the block's own slices and k_step from what
    each block keeps."""
    p = _largest_divisor(math.gcd(m_tiles, n_tiles), config.p)  # divides both
    wm = _largest_divisor(m_tiles // p, config.warps_m)
    wn = _largest_divisor(n_tiles // p, config.warps_n)
    gs = _largest_divisor(k_tiles, config.grid_split_k)
    # the block epilogue writes a finished tile: a block holding one slice of K has none
    epilogue = config.block_epilogue and gs == 1
    # the block's threads sum its slices into the tile it writes, p * p * 256 elements per warp
    # of a slice: an even share per thread needs split-K to divide 8 p^2 (3 would put the sum
    # under a predicate, where CUDA cannot take the barrier before the epilogue reads it)
    sk = _largest_divisor(k_tiles // gs, config.split_k,
                          lambda d: not epilogue or 8 * p * p % d == 0)
    ks = _largest_divisor(k_tiles // (gs * sk), config.k_step)
    return GpuConfig(p, wm, wn, ks, config.fuse_spatial, sk, config.implicit, config.vector_copy,
                     config.pipeline and config.vector_copy, epilogue, gs)


def fits_device(config: GpuConfig, fragment: Fragment, a_bytes: int, b_bytes: int,
                acc_bytes: int = 4) -> bool:
    """Whether a block of this config stays within the thread and shared-memory limits."""
    return (config.threads() <= MAX_THREADS
            and config.shared_bytes(fragment, a_bytes, b_bytes, acc_bytes) <= SHARED_LIMIT)


GRID_SPLITS = (1, 2, 4, 8)


def config_space(m_tiles: int, n_tiles: int, k_tiles: int, fragment: Fragment, a_bytes: int = 2,
                 b_bytes: int = 2, acc_bytes: int = 4) -> list[GpuConfig]:
    """Distinct fitted configs within the thread and shared-memory limits: p in 1, 2, 4; warps
    1-4 per side; k_step 1, 2, 4; split-K 1, 2, 4 in the block and 1, 2, 4, 8 across blocks;
    spatial fusion on and off; explicit and implicit operand preparation; vector and element
    copies; vector copies pipelined or not; the output written by a second kernel or by the
    block."""
    seen: set[GpuConfig]
    seen, out = set(), []
    for p, wm, wn, ks, sk, gs, fuse, implicit, vector, pipe, block_out in itertools.product(
            *[(1, 2, 4)] * 5, GRID_SPLITS, (True, False), (False, True), (True, False),
            (False, True), (False, True)):
        # mypy types the product's items as int (the join of int and bool): the flags are bools
        c = fit(GpuConfig(p, wm, wn, ks,
                          fuse, sk, implicit, vector, pipe, block_out,  # type: ignore[arg-type]
                          gs),
                m_tiles, n_tiles, k_tiles)
        if c not in seen and fits_device(c, fragment, a_bytes, b_bytes, acc_bytes):
            seen.add(c)
            out.append(c)
    return out
