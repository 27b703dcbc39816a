"""Window taps that read only padding, skipped in a scheduled kernel.

A conv3d over a short clip spends much of its time on padding: with a 3-tap depth window and one
frame of padding on each side, a 2-frame layer computes 6 depth taps per output pair of which 2
read only padding (a third of the work), a 4-frame one 2 of 12. oneDNN skips such taps. Here the
tensorized update block gets a predicate: the depth index it reads in the padded input must lie
inside the real frames. The taps skipped must add nothing, so this applies only where the padding
value is the instruction's zero (`pads_with_zero`): uint8 activations whose zero point is 0
(inputs after a relu, most of a CNN) and bf16. With another zero point the padding adds
zp * w, which the op's compensation term (zp * sum of all weights) takes away again: skipping
would break that balance.

A conv2d's padding columns are skipped the same way (`skip_padding_columns`), with one more
step: the window's column loop is unrolled inside the register tile, so that with the tile's
columns unrolled as well each tap's condition is a constant and the taps reading padding simply
vanish from the code (a runtime condition per accumulator would keep them out of registers;
rows, whose loop runs outside the tile, are therefore left alone), and only where the register
tile spans the whole row, so that every condition is a constant. Measured on VNNI (Zen 4),
bit-exact: 3x3 convs at 7x7 with a 14-accumulator tile -8.5% (2 of 21 column taps read
padding). Where the tile covers part of a row the edge tiles' conditions depend on which tile
runs: some kernels gained (Inception's 1x7 at 17x17 with 12 accumulators -11%, 3x3 at 28x28
-2%), others lost (3x3 at 35x35 with 14 accumulators 1.5x slower, 24 accumulators 2.1x: LLVM
spills accumulators), so those keep their padding taps."""

import tvm_ffi
from tvm import s_tir, tirx

from .recipe import is_bf16


def pads_with_zero(recipe) -> bool:
    """Whether the padding the recipe's kernel reads is 0 in the instruction's arithmetic, so
    that a tap reading only padding adds nothing to the accumulator."""
    return is_bf16(recipe) or (recipe.x_zp == 0 and not recipe.x_signed)


def _padding_reads(block, buffer, axis):
    """The block's read of `buffer` when it reads one element along `axis` per iteration (the
    tensorized update of a conv over its padded input), else None."""
    reads = [r for r in block.reads if r.source.name == buffer]
    if not reads or getattr(reads[0].region[axis].extent, "value", None) != 1:
        return None
    return reads[0]


def skip_padding_taps(func: tirx.PrimFunc, buffer: str, axis: int, lo: int,
                      hi: int) -> tirx.PrimFunc:
    """func whose blocks reading `buffer` run only where their index along `axis` of it lies in
    [lo, hi): the blocks that read one element there per iteration (the tensorized update of a
    conv over its padded input) get that condition added to their predicate."""

    def on_realize(node, mutator):
        block = node.block
        read = _padding_reads(block, buffer, axis)
        if read is None:
            return mutator.default_mutate(node)
        # the index in terms of the loops around the block (its iter vars -> their bindings)
        bound = dict(zip((iv.var for iv in block.iter_vars), node.iter_values))
        index = tvm_ffi.structural_mutate(read.region[axis].min,
                                          [(tirx.Var, lambda v, _m: bound.get(v, v))])
        inside = tirx.all(index >= lo, index < hi)
        return s_tir.SBlockRealize(node.iter_values, tirx.all(node.predicate, inside), block)

    return func.with_body(tvm_ffi.structural_mutate(func.body,
                                                    [(s_tir.SBlockRealize, on_realize)]))


# the longest window-column loop unrolled (a 1x7 conv's 7 taps x a 14-accumulator tile: 98
# tensorized calls, still a small loop body)
MAX_UNROLLED_TAPS = 8


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
    return skip_padding_taps(func, buffer, axis, lo, hi)
