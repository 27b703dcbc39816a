"""Register tiles of the CPU strategy: how many accumulators a tile holds and over which loops
(rows x columns with 32 vector registers; rows x column blocks where the weight panel streams
from L2: stream_tile; a conv's channel blocks x columns on 32 registers: block_tile, and where
each broadcast costs a register: operand_reuse_tile), and how many output columns a graph
computes so that a tile divides them (tiled_extent). schedules/cpu.py builds its configs
from these."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..target import vector_registers

if TYPE_CHECKING:
    import tvm

    from unit_tvm.intrinsics import Intrinsic

# x86-64 AVX-512 (and aarch64) has 32 vector registers, AVX2 16 (`target.vector_registers`);
# the instruction needs one for the shared operand and one or two for broadcasts, so at most
# ~28 (12) accumulators stay in registers.
VECTOR_REGISTERS = 32
OPERAND_REGISTERS = 4
# Accumulators of a default register tile. Measured (Zen 5, 2 x 512-bit vpdpbusd per cycle,
# conv layers of ResNet at 7x7 to 56x56): 14 independent accumulators (2 rows x 7 columns,
# or 2 channel blocks x 7 columns at 7x7) reach 92-97% of the peak, 16 (4 x 4) 88-95%, 7-8
# leave issue slots idle (78-82%), 28 spill (47-68%), and 8 channel blocks x 2 columns ran at
# 70%; on Zen 4 the tuned dense tiles were 12 (4 rows x 3 blocks) against a 24-accumulator
# default (dense layers now take stream_tile's). The tuning space keeps the register file's
# bound.
ACCUMULATORS = 14
# A tile of this many accumulators or fewer still leaves issue slots idle: where the rows and
# columns give no more (and no wide tile), a factor of the channel blocks is taken as well.
# Zen 5, fp32, Inception's 80 -> 192 3x3 at 73x73 (71 rows x 72 columns): 1 x 8 3316-3400 us,
# 3 blocks x 4 columns 2947-3082, 2 x 6 3030-3166, 2 x 8 3048-3248, 4 x 3 3177-3346.
IDLE_TILE = 8
# A conv's register tile on 32 registers where its columns allow: this many output-channel
# blocks (the instruction's vector operand) x BLOCK_TILE_COLUMNS columns. Each reduction step
# then loads 2 vectors and 7 broadcasts for 14 instructions, where a rows x columns tile of one
# block loads 1 vector and 14 broadcasts (each a line of its own at stride 2): with two
# 512-bit multiply-adds a cycle (Zen 5) the loads, not the instruction, set the pace. Measured
# on Zen 5 (2 threads; kernels alone, min of 5 interleaved rounds, rows x columns 2 x 7
# against 2 blocks x 7): float32 ResNet stem 74.5% -> 92% of the peak, stride-2 3x3 convs
# 76-78% -> 89-92%, stride-1 3x3 at 56 / 28 columns 90-94% -> 92-96%, Inception's 32 -> 64
# 3x3 at 147 columns 86% (3 x 3) -> 91%; int8 (vpdpbusd) stem 65% -> 95%, stride 2 84-85% ->
# 89-94%, stride 1 92-95% -> 95-96%; the pre-VNNI quad form within 2% either way. Other
# factors were not as steady: 4 blocks x 3 columns 69-77%, 2 x 6 on 72 columns 62% (3 x 4:
# 81%), 2 x 8 on 72 columns 70% — but on a row of exactly 8 columns (Inception's 8x8
# layers, in the model) 2 x 8 beat the 4 rows x 4 columns wide tile by 7-25%.
# An odd number of blocks takes 3 where 3 divides it and the register file holds the tile
# (21 accumulators + 7 broadcasts + 1 in flight + the instruction's scratch registers, where
# they are known): Zen 5, Inception's 48- and 96-channel convs at 35 columns, float32, 73-79%
# of the peak with the 7-accumulator rows x columns tile, 90-96% as 3 x 7; vpdpbusd 31.0 ->
# 25.2 us on a 48-channel 3x3; the pre-VNNI quad form (scratch not known) 38.1 -> 42-50 us.
BLOCK_TILE_BLOCKS = (2, 3)
BLOCK_TILE_COLUMNS = 7
# The tile taken instead where the loops' divisors give no more than 8 under that budget
# (powers of two). Zen 5, BERT-base's bf16 attention matmuls alone: 42.5 -> 35.8 and 46.6 ->
# 39.4 us; tuning chose 16 for Inception's 8x8 layers too.
WIDE_TILE = 16
# The default tile with 16 registers (AVX2): 8 accumulators leave 8 for the widened or
# broadcast operands of the pre-VNNI forms (a 4 x 2 or 8 x 1 block, as MLAS's and oneDNN's
# AVX2 int8 kernels hold).
ACCUMULATORS_16 = 8
# A tile over the loop the instruction's vector operand varies along (a dense layer's or batched
# matmul's blocks of columns) and one it does not (rows) re-reads that operand's panel from L2
# for every block of rows: below this many accumulators the instruction's latency shows, above
# it the tile with the fewest bytes per instruction wins (stream_tile).
STREAM_FLOOR = 12
MAX_UNROLL = 8  # the paper's second-breakpoint bound per loop
TILE_WIDTHS = range(4, MAX_UNROLL + 1)  # output columns a register tile holds
REUSE_COLUMNS = 2  # the fewest steps of each loop in an operand_reuse_tile
# The accumulators of an operand_reuse_tile where the register file allows them (16 registers:
# 12 accumulators, the inner loop's 3 operands held, 1 in flight). Measured on Zen 5 held to
# AVX2 (2 threads, fp32 convs, min of 7 interleaved rounds): 4 channel blocks x 3 columns
# ran a 1x1 192 -> 192 at 24x24 at 170 us against 198-201 for 2 x 4 and 4 x 2 (8
# accumulators); 6 x 2 173 us; 3 x 4 and 2 x 6 (4 and 6 operands held: 17 and 19 registers)
# spilled (240, 252 us). oneDNN's AVX2 float32 convs hold the same 4 x 3.
REUSE_ACCUMULATORS = 12
# How many more columns a conv may compute so that an operand_reuse_tile reaches
# REUSE_ACCUMULATORS (56 -> 57, 28 -> 30, 14 -> 15; not 7 -> 9). Measured as above, the extra
# columns included: 1x1 256 -> 64 at 56 columns 458 us (2 x 4), at 57 406 (4 x 3); 1x1 128 ->
# 512 at 28 / 30 448 / 413; 3x3 64 -> 64 at 56 / 57 995 / 886; 3x3 256 -> 256 at 14 / 15
# 1001 / 893.
REUSE_WIDENING = 8  # fewer than extent / this many columns more (8 stays 8)
# The widest register tile: one accumulator per column of a whole row, the register file's
# bound. Measured on VNNI (Zen 4), Inception's 17x17 layers as one 17-accumulator tile per row
# against 18 columns in 4 x 3 tiles: 1x1 768 -> 192 111.7 vs 118.1 us, 7x1 181.4 vs 187.9.
ROW_TILE = VECTOR_REGISTERS - OPERAND_REGISTERS


def tiled_extent(extent: int, reuse: bool = False, blocks: int | None = None,
                 registers: int = 16, window: bool = False, columns_inner: bool = True) -> int:
    """The number of output columns to compute so that a register tile fits: `extent` when a
    width in TILE_WIDTHS divides it or one tile holds the whole row (<= ROW_TILE: 17, 23), else
    the next multiple of the width that pads least (71 -> 72, 73 -> 75). A prime count would
    otherwise leave a one-column tile. reuse: the tile is operand_reuse_tile's (see
    reuses_operands) over `blocks` channel blocks (None: unknown) and the columns, from
    `registers` vector registers: the fewest columns (fewer than an eighth more:
    REUSE_WIDENING) on which it holds REUSE_ACCUMULATORS; else columns REUSE_COLUMNS at a
    time: an odd count one more where that adds at most a fifth (ResNet's 7 -> 8: 8 products
    per 7, against 26-46% of the peak for the tiles 16 registers allow on 7 columns, 64-68%
    with 8; 3 stays), unless they feed a window (`window`: a conv kernel of more than one
    pixel), which keeps them. columns_inner: the columns' loop runs inside the blocks' (a
    conv's), else outside (a dense layer's rows), which decides the operands the tile holds.
    Padding 14 to 16 for 4-column tiles measured slower (58-74% against 79-86%)."""
    if reuse:
        for wider in range(extent, extent + (extent - 1) // REUSE_WIDENING + 1):
            if not blocks:
                break
            loops, lanes = ([blocks, wider], 0) if columns_inner else ([wider, blocks], 1)
            tile = operand_reuse_tile(loops, lanes, registers, REUSE_ACCUMULATORS)
            if tile and math.prod(f for _, f in tile) >= REUSE_ACCUMULATORS:
                return wider
        padded = -(-extent // REUSE_COLUMNS) * REUSE_COLUMNS
        # Where no 12-accumulator tile fits (ResNet's 7 columns), a conv with a window keeps
        # its odd count in one row tile (1 block x 7 columns) rather than computing a column
        # more in 2 x 4 tiles. Measured on Zen 5 held to AVX2 in the model (`profile --fp32`,
        # alternated, 2 rounds each): resnet18's 512 -> 512 3x3 at 7x7 911-980 us against
        # 1021-1088, its stride-2 256 -> 512 3x3 523-553 against 549-579, resnet50's 512 ->
        # 512 3x3 933-975 against 1052-1117; its 1x1 convs at 7x7 ran 3-6% faster widened
        # (2048 -> 512: 500-512 us against 514-538), so they keep the extra column. (2 rows x
        # 7 columns, 14 accumulators and one weight vector, ran the 14-56 column layers 5% to
        # 3x slower than 4 x 3 on widened rows.)
        return padded if (padded - extent) * 5 <= extent and not window else extent
    if (extent < TILE_WIDTHS[0] or extent <= ROW_TILE
            or any(extent % t == 0 for t in TILE_WIDTHS)):
        return extent
    return min((-(-extent // t) * t - extent, -t, -(-extent // t) * t) for t in TILE_WIDTHS)[2]


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def tile_factors(n: int) -> list[int]:
    """Register-tile factors of a loop of extent n: its divisors up to MAX_UNROLL, and the whole
    loop when one tile can hold it (a row of 14 or 17 columns)."""
    return _divisors(n, MAX_UNROLL) + ([n] if MAX_UNROLL < n <= ROW_TILE else [])


def _row_tile(outer_extents, row, accumulators):
    """((row, extent),): loop `row` (the columns tiled_extent sizes) held whole by one register
    tile when its extent has no divisor a smaller tile can use (17) and the tile found otherwise
    has fewer accumulators; else None."""
    ext = outer_extents[row] if row is not None else 0
    if (MAX_UNROLL < ext <= ROW_TILE and ext > accumulators
            and not any(ext % t == 0 for t in range(2, MAX_UNROLL + 1))):
        return ((row, ext),)
    return None


def default_tile(outer_extents: Sequence[int], acc_budget: int, row: int | None,
                 wide_budget: int | None, stream: tuple[int, int] | None = None,
                 registers: int | None = None) -> tuple:
    """cpu.default_config's register tile: rows x columns, widened as its docstring says;
    stream_tile's where `stream` (lanes loop, lanes) names one of the two innermost loops and
    that tile reaches STREAM_FLOOR (17 rows have none: they keep the whole-row tile);
    block_tile's where it names a loop above them (a conv's channel blocks) and the columns
    allow it (`registers`: what block_tile may fill). Neither without `wide_budget` (16
    registers, tile instructions)."""
    live = [p for p, ext in enumerate(outer_extents) if ext > 1]
    if stream and wide_budget and len(live) >= 2 and stream[0] in live[-2:]:
        streamed = stream_tile(outer_extents, live[-2:], stream, wide_budget)
        if math.prod(f for _, f in streamed) >= STREAM_FLOOR:
            return streamed
    if stream and wide_budget:
        blocked = block_tile(outer_extents, live, stream[0], registers)
        if blocked:
            return blocked
    unroll = _register_tile(outer_extents, live[-2:], acc_budget)
    if wide_budget and math.prod(f for _, f in unroll) * 2 <= wide_budget:
        # power-of-two extents (a batched matmul's 128 rows x 8 column blocks, an 8x8 layer)
        # reach only 8 under the budget: take 4 x 4 (or 8 x 2) where they have it
        wider = _register_tile(outer_extents, live[-2:], wide_budget)
        unroll = wider if math.prod(f for _, f in wider) == wide_budget else unroll
    acc = math.prod(f for _, f in unroll)
    half = acc * 2 <= acc_budget  # a 7x7 layer's 7: the channel blocks always join
    if len(live) > 2 and (half or acc <= IDLE_TILE < acc_budget):
        # idle issue slots (Inception's 71 rows x 72 columns give 1 x 8): the channel blocks
        # take a factor where that holds more accumulators (3 blocks x 4 columns)
        third = _register_tile(outer_extents, live[-3:], acc_budget)
        if wide_budget and registers is not None and math.prod(f for _, f in third) <= IDLE_TILE:
            # still idle (5 blocks x 73 rows x 75 columns: 5): up to the wide budget, 5 x 3,
            # where the instruction's registers are known. Zen 5, Inception's 64 -> 80 1x1 at
            # 73x75 in float32: 394 -> 114 us (tuned); the pre-VNNI quad form (not known)
            # ran a 3 x 5 tile 9% slower than 7 accumulators
            wider = _register_tile(outer_extents, live[-3:], wide_budget)
            third = max(third, wider, key=lambda t: math.prod(f for _, f in t))
        if half or math.prod(f for _, f in third) > acc:
            unroll = third
    return _row_tile(outer_extents, row, math.prod(f for _, f in unroll)) or unroll


def block_tile(outer_extents: Sequence[int], live: Sequence[int], lanes_loop: int,
               registers: int | None = None) -> tuple | None:
    """A conv's register tile on 32 registers: the first of BLOCK_TILE_BLOCKS that divides the
    blocks of `lanes_loop` (the loop the instruction's vector operand varies along, above the
    rows and columns) x BLOCK_TILE_COLUMNS columns where that many divide the innermost loop
    (the columns), or 2 blocks x a whole row of 8 (see BLOCK_TILE_COLUMNS); None where the
    loops allow neither, or where the vector operand's loop is one of the two innermost (a
    dense layer's blocks: stream_tile). `live`: positions of the loops of extent > 1;
    `registers`: the vector registers a tile may fill (None: unknown, 2 blocks only)."""
    if len(live) < 3 or lanes_loop not in live[:-2]:
        return None
    columns = live[-1]
    extent, blocks = outer_extents[columns], outer_extents[lanes_loop]
    if extent % BLOCK_TILE_COLUMNS == 0:
        fm = next((f for f in BLOCK_TILE_BLOCKS if blocks % f == 0 and (
            f == BLOCK_TILE_BLOCKS[0] or registers is not None
            and (f + 1) * BLOCK_TILE_COLUMNS + 1 <= registers)), None)
        return None if fm is None else ((lanes_loop, fm), (columns, BLOCK_TILE_COLUMNS))
    fm = BLOCK_TILE_BLOCKS[0]
    if extent == MAX_UNROLL and blocks % fm == 0:
        return ((lanes_loop, fm), (columns, extent))
    return None


def stream_tile(outer_extents: Sequence[int], positions: Sequence[int],
                stream: tuple[int, int], budget: int) -> tuple:
    """The register tile over two loops, one of them the loop the instruction's vector
    operand varies along (`stream`: its position, the instruction's lanes), with the fewest
    bytes read past L1 per instruction among those of at least STREAM_FLOOR accumulators (up
    to `budget`). Each vector load brings `lanes` words and serves f_other instructions; each
    broadcast a word of a line the next reduction steps share, serving f_lanes: bytes per
    instruction ~ lanes / f_other + 1 / f_lanes, so the rows take the larger factor (8 x 2,
    not 4 x 4, whose loads per instruction are fewer but from L2). Kelefouras-style: the panel
    a block of rows re-reads outgrows L1 (2 blocks x 768 deep x 64 B = 96 KB); the rows' slice
    stays there. Measured (Zen 5, 2 threads, % of the peak, 128 rows): fp32 768 / 3072 deep,
    8 x 2 99 / 87 against 4 x 4 91 / 60 and 4 x 3 87 / 66; int8 (vpdpbusd) 2048 / 8192 deep,
    95 / 93 against 4 x 4's 87 / 79; 8 x 1 (8 accumulators) 75-81."""
    lanes_loop, lanes = stream
    best: tuple | None = None
    tile: tuple = ()
    other = next(p for p in positions if p != lanes_loop)
    for fv in _divisors(outer_extents[lanes_loop], MAX_UNROLL):
        for fo in _divisors(outer_extents[other], MAX_UNROLL):
            acc = fv * fo
            if acc > budget:
                continue
            score = (acc >= STREAM_FLOOR, -(lanes / fo + 1 / fv), acc)
            if best is None or score > best:
                best = score
                tile = tuple(sorted((p, f) for p, f in ((lanes_loop, fv), (other, fo)) if f > 1))
    return tile


def operand_reuse_tile(outer_extents: Sequence[int], lanes_loop: int | None,
                       registers: int, accumulators: int) -> tuple | None:
    """The register tile of at most `accumulators` that loads the fewest operands per
    instruction from a file of `registers` vectors, or None: f_m blocks of the loop split from
    the instruction's lanes (`lanes_loop`: a vector of the shared operand each) by f_u steps
    of one other loop (a broadcast each); f_m * f_u accumulators, the operands of the inner of
    the two loops (the tile is unrolled in loop order) held in registers while the outer
    loop's come one at a time: f_m * f_u + f_inner + 1 <= registers (LLVM's allocation: 4
    blocks x 3 columns fills 16 registers and runs at the peak, 3 blocks x 4 columns needs 17
    and spills; REUSE_ACCUMULATORS). Most instructions per operand
    loaded (f_m * f_u / (f_m + f_u)) first, then most accumulators, then the innermost loop (a
    conv's columns). Each operand is used at least REUSE_COLUMNS times: a tile of one column
    streams its weights (a whole reduction of each block) from L2 for every pixel (8 blocks x
    1 column on ResNet's 7x7 layers: 26% of the peak, against 40% for the rows x columns
    tile's 7 columns); where no such tile exists (one block), None.
    Kelefouras-style: the register file and the loads decide, not a search. Measured on Zen 4
    held to AVX2 (2 threads, noisy: ranges over runs, GFLOPS of the 212 peak): 1x1 convs of
    64 -> 192 / 256 channels at 48x48 / 56x56, 2 channel blocks x 4 columns 117-202, the rows
    x columns tile of 8 (one weight vector, 8 broadcasts) 81-137; 3x3 convs of 64 and 128
    channels at 56x56 / 28x28, 182-194 against 172-184; 12 accumulators (2 x 6, 4 x 3,
    3 x 4) ranged from 104 to 208 with LLVM's register allocation (the inner loop's operand
    count decides: REUSE_ACCUMULATORS)."""
    if lanes_loop is None or outer_extents[lanes_loop] <= 1:
        return None
    best, tile = None, None
    for other, extent in enumerate(outer_extents):
        if other == lanes_loop or extent <= 1:
            continue
        for fm in _divisors(outer_extents[lanes_loop], MAX_UNROLL):
            for fu in _divisors(extent, MAX_UNROLL):
                inner = fu if other > lanes_loop else fm
                if (fm * fu > accumulators or fm * fu + inner + 1 > registers
                        or min(fm, fu) < REUSE_COLUMNS):
                    continue
                score = (fm * fu / (fm + fu), fm * fu, other)
                if best is None or score > best:
                    best = score
                    tile = tuple(sorted((p, f) for p, f in ((lanes_loop, fm), (other, fu))
                                        if f > 1))
    return tile or None


def _register_tile(outer_extents, positions, acc_budget):
    """((position, factor), ...) of the best unroll of at most two of `positions`."""
    best, unroll = None, ()
    for i, p1 in enumerate(positions):
        for p2 in positions[i + 1:] or [None]:
            f2s = _divisors(outer_extents[p2], MAX_UNROLL) if p2 is not None else [1]
            for f1 in _divisors(outer_extents[p1], MAX_UNROLL):
                for f2 in f2s:
                    if f1 * f2 > acc_budget:
                        continue
                    score = (f1 * f2, f1 * f2 / (f1 + f2), p1 + (p2 or 0))
                    if best is None or score > best:
                        best = score
                        unroll = tuple((p, f) for p, f in ((p1, f1), (p2, f2)) if f > 1)
    return unroll


def tile_registers(intrin: Intrinsic, target: tvm.target.Target) -> int | None:
    """Vector registers a register tile of `intrin` may fill on `target`: the register file
    less the instruction's scratch registers, or None where those are not known."""
    if intrin.scratch_registers is None:
        return None
    return vector_registers(target) - intrin.scratch_registers


def reuses_operands(intrin: Intrinsic, target: tvm.target.Target) -> bool:
    """Whether `intrin`'s default register tile on `target` is operand_reuse_tile's: a
    broadcast instruction whose scratch registers are known, on 16 vector registers. There
    each broadcast takes a register and a load (no embedded broadcast as with AVX-512, whose
    rows x columns tile measured 95-99% of the peak), so which operand the tile reuses
    decides; the measured tile stays for instructions whose scratch is unknown (the pre-VNNI
    forms)."""
    return (vector_registers(target) < VECTOR_REGISTERS and bool(intrin.broadcast_operand)
            and intrin.scratch_registers is not None)
