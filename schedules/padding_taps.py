"""Window taps that read only padding, skipped in a scheduled kernel (CPU strategy).

A conv3d over a short clip spends much of its time on padding: with a 3-tap depth window and one
frame of padding on each side, a 2-frame layer computes 6 depth taps per output pair of which 2
read only padding (a third of the work), a 4-frame one 2 of 12. oneDNN skips such taps. Here the
tensorized update block gets a predicate: the depth index it reads in the padded input must lie
inside the real frames. The taps skipped must add nothing, so the graph builder names such a
range (prepare.ZeroPadding) only where the padding value is the instruction's zero: uint8
activations whose zero point is 0 (inputs after a relu, most of a CNN) and bf16. With another
zero point the padding adds zp * w, which the op's compensation term (zp * sum of all weights)
takes away again: skipping would break that balance.

A conv2d's padding columns are skipped the same way (`skip_padding_columns`), with one more
step: the window's column loop is unrolled inside the register tile, so that with the tile's
columns unrolled as well each tap's condition is a constant and the taps reading padding simply
vanish from the code (a runtime condition per accumulator would keep them out of registers),
and only where the register tile spans the whole row, so that every condition is a constant.
Measured on VNNI (Zen 4), bit-exact: 3x3 convs at 7x7 with a 14-accumulator tile -8.5% (2 of
21 column taps read padding). Where the tile covers part of a row the edge tiles' conditions
depend on which tile runs: some kernels gained (Inception's 1x7 at 17x17 with 12 accumulators
-11%, 3x3 at 28x28 -2%), others lost (3x3 at 35x35 with 14 accumulators 1.5x slower, 24
accumulators 2.1x: LLVM spills accumulators), so those keep their padding taps.

A conv2d's padding rows, whose loop runs outside the tile, are skipped by one run-time test per
window row around the tile's updates (`skip_padding_taps`), where the tile is on the stack
(unit_tvm.lowering): Inception's 7x1 at 17x17 -10%. That row loop is unrolled too (up to
MAX_UNROLLED_TAPS rows; each row keeps its own test): a loop whose every iteration branches
around one tile's updates left issue slots idle. Measured on VNNI (Zen 5, each kernel of the
models built both ways, alternated, bit-exact): Inception's 7x1 at 17x17 -7 to -8% (one -19%),
its 3x3 at 8x8 -6 to -11%, 3x3 and 5x5 at 35x35 and every ResNet-18/50 3x3 within +-1.4%.

Both run inside the strategy's `schedule`, so the tuner times every candidate as it will run
and can prefer a tile that spans the row where skipping pays."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ..lowering import STACK_TILE_BYTES

if TYPE_CHECKING:
    from unit_tvm.prepare import ZeroPadding

# the longest window loop unrolled (a 1x7 conv's 7 taps x a 14-accumulator tile: 98 tensorized
# calls, still a small loop body)
MAX_UNROLLED_TAPS = 8


def skip_padding(sch: s_tir.Schedule, ranges: Sequence[ZeroPadding]) -> s_tir.Schedule:
    """sch with the taps skipped that read only the padding `ranges` (prepare.ZeroPadding) name:
    along a width where that is static (`skip_padding_columns`), else with a run-time predicate
    (`skip_padding_taps`). sch itself when there are none."""
    if not ranges:
        return sch
    func = sch.mod["main"]
    for r in ranges:
        if r.static_only:
            func = skip_padding_columns(func, r.buffer, r.axis, r.lo, r.hi)
        else:
            func = skip_padding_taps(func, r.buffer, r.axis, r.lo, r.hi, r.per_update)
    return s_tir.Schedule(tvm.IRModule({"main": func}))


def _padding_reads(block: s_tir.SBlock, buffer: str, axis: int) -> tirx.BufferRegion | None:
    """The block's read of `buffer` when it reads one element along `axis` per iteration (the
    tensorized update of a conv over its padded input), else None."""
    reads = [r for r in block.reads if r.source.name == buffer]
    if not reads or getattr(reads[0].region[axis].extent, "value", None) != 1:
        return None
    return reads[0]


def _bound(node: s_tir.SBlockRealize, expr: tvm.ir.Expr) -> tvm.ir.Expr:
    """expr over a block's iter vars in the loop variables around it (their bindings)."""
    bound = dict(zip((iv.var for iv in node.block.iter_vars), node.iter_values))
    return tvm_ffi.structural_mutate(expr, [(tirx.Var, lambda v, _m: bound.get(v, v))])


def _index_along(node: s_tir.SBlockRealize, read: tirx.BufferRegion, axis: int) -> tvm.ir.Expr:
    """The index a tensorized block reads along `axis`, in the loop variables around it."""
    return _bound(node, read.region[axis].min)


def _taps_of(node: s_tir.SBlockRealize, used: set[tirx.Var]) -> set[tirx.Var]:
    """The loop variables bound to the block's reduction iter vars among `used`."""
    return {value for iv, value in zip(node.block.iter_vars, node.iter_values)
            if iv.iter_type == tirx.IterVar.CommReduce and isinstance(value, tirx.Var)
            and iv.var in used}


def _predicated(func: tirx.PrimFunc, buffer: str, axis: int, lo: int,
                hi: int) -> tirx.PrimFunc:
    """func whose blocks reading one element of `buffer` along `axis` per iteration get the
    condition that the index lies in [lo, hi) added to their predicate."""

    def on_realize(node, mutator):
        read = _padding_reads(node.block, buffer, axis)
        if read is None:
            return mutator.default_mutate(node)
        index = _index_along(node, read, axis)
        inside = tirx.all(index >= lo, index < hi)
        return s_tir.SBlockRealize(node.iter_values, tirx.all(node.predicate, inside),
                                   node.block)

    return func.with_body(tvm_ffi.structural_mutate(func.body,
                                                    [(s_tir.SBlockRealize, on_realize)]))


def skip_padding_taps(func: tirx.PrimFunc, buffer: str, axis: int, lo: int, hi: int,
                      per_update: bool = False) -> tirx.PrimFunc:
    """func in which the window taps reading only padding along `axis` of `buffer` (indices
    outside [lo, hi)) are skipped by one run-time test per tap: the body of the innermost window
    loop the index moves with runs only where it lies inside, and that loop is unrolled (up to
    MAX_UNROLLED_TAPS iterations). Where that cannot be (the index moves with an unrolled loop,
    a register tile's; or that innermost loop is not a window loop, whose body would hold more
    than the taps), each update gets the test as its predicate if `per_update`, else nothing is
    skipped. Nothing is either where the accumulator tile is not on the stack (`_tile_bytes`)."""
    stack, found = [], []

    def on_loop(loop, mutator):
        stack.append(loop)
        out = mutator.default_mutate(loop)
        stack.pop()
        return out

    def on_realize(node, mutator):
        read = _padding_reads(node.block, buffer, axis)
        if read is not None:
            index = _index_along(node, read, axis)
            used = _vars_of(read.region[axis].min)
            found.append((index, [lp for lp in stack if lp.loop_var in _vars_of(index)],
                          _taps_of(node, used), _tile_bytes(node, stack)))
        return mutator.default_mutate(node)

    tvm_ffi.structural_mutate(func.body, [(tirx.For, on_loop), (s_tir.SBlockRealize, on_realize)])
    if len(found) != 1 or not found[0][1]:
        return func
    index, moving, taps, tile_bytes = found[0]
    innermost = moving[-1]
    if tile_bytes > STACK_TILE_BYTES:
        return func
    if any(lp.kind == tirx.ForKind.UNROLLED for lp in moving) or innermost.loop_var not in taps:
        return _predicated(func, buffer, axis, lo, hi) if per_update else func
    inside = tirx.all(index >= lo, index < hi)

    def guard(loop, mutator):
        body, kind = mutator.mutate(loop.body), loop.kind
        if loop.loop_var.same_as(innermost.loop_var):
            body = tirx.IfThenElse(inside, body, None)
            extent = getattr(loop.extent, "value", None)
            if kind == tirx.ForKind.SERIAL and extent is not None and extent <= MAX_UNROLLED_TAPS:
                kind = tirx.ForKind.UNROLLED
        return tirx.For(loop.loop_var, loop.min, loop.extent, kind, body,
                        loop.thread_binding, loop.annotations, loop.step)

    return func.with_body(tvm_ffi.structural_mutate(func.body, [(tirx.For, guard)]))


def _tile_bytes(node: s_tir.SBlockRealize, loops: list[tirx.For]) -> int:
    """Bytes of the accumulator tile the block updates: its write region times the unrolled
    loops (a register tile's) the write moves with. unit_tvm.lowering keeps a tile of up to
    STACK_TILE_BYTES on the stack; from a workspace (TVM's place for anything larger), LLVM keeps
    the accumulators in registers only when every update runs: behind a run-time test a
    17-accumulator tile stored each one back after every instruction, 2x slower, while on the
    stack the test saved 9% (14 accumulators) to 10% (17, Inception's 7x1)."""
    write = node.block.writes[0]
    n = 1
    for r in write.region:
        n *= int(r.extent)
    used: set[tirx.Var] = set()
    for r in write.region:
        used |= _vars_of(_bound(node, r.min))
    for lp in loops:
        if lp.kind == tirx.ForKind.UNROLLED and lp.loop_var in used:
            n *= int(lp.extent)
    return n * write.source.dtype.bits // 8


def _vars_of(expr):
    """The variables an expression reads."""
    found = set()
    tvm_ffi.structural_mutate(expr, [(tirx.Var, lambda v, _m: found.add(v) or v)])
    return found


def skip_padding_columns(func: tirx.PrimFunc, buffer: str, axis: int, lo: int,
                         hi: int) -> tirx.PrimFunc:
    """skip_padding_taps along a conv2d's width, with the window's column loop unrolled, where
    that makes every condition a constant: each loop the column index moves with is then
    unrolled or runs once (a register tile spanning the whole row). Elsewhere func as it is."""
    moving, taps, loops = set(), set(), {}

    def find(node, mutator):
        block = node.block
        read = _padding_reads(block, buffer, axis)
        if read is not None:
            used = _vars_of(read.region[axis].min)
            for iv, value in zip(block.iter_vars, node.iter_values):
                if iv.var in used:
                    moving.update(_vars_of(value))
                    if iv.iter_type == tirx.IterVar.CommReduce and isinstance(value, tirx.Var):
                        taps.add(value)
        return mutator.default_mutate(node)

    def record(loop, mutator):
        loops[loop.loop_var] = (getattr(loop.extent, "value", None), loop.kind)
        return mutator.default_mutate(loop)

    tvm_ffi.structural_mutate(func.body, [(s_tir.SBlockRealize, find), (tirx.For, record)])

    def constant(v):
        extent, kind = loops.get(v, (None, None))
        if v in taps:
            return extent is not None and extent <= MAX_UNROLLED_TAPS
        return extent == 1 or kind == tirx.ForKind.UNROLLED

    if not moving or not all(constant(v) for v in moving):
        return func

    def unroll(loop, mutator):
        body = mutator.mutate(loop.body)
        return tirx.For(loop.loop_var, loop.min, loop.extent,
                        tirx.ForKind.UNROLLED if loop.loop_var in taps else loop.kind, body,
                        loop.thread_binding, loop.annotations, loop.step)

    func = func.with_body(tvm_ffi.structural_mutate(func.body, [(tirx.For, unroll)]))
    return _predicated(func, buffer, axis, lo, hi)
