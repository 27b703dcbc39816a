"""Window taps that read only padding, skipped in a scheduled kernel.

A conv3d over a short clip spends much of its time on padding: with a 3-tap depth window and one
frame of padding on each side, a 2-frame layer computes 6 depth taps per output pair of which 2
read only padding (a third of the work), a 4-frame one 2 of 12. oneDNN skips such taps. Here the
tensorized update block gets a predicate: the depth index it reads in the padded input must lie
inside the real frames. The taps skipped must add nothing, so this applies only where the padding
value is the instruction's zero (`pads_with_zero`): uint8 activations whose zero point is 0
(inputs after a relu, most of a CNN) and bf16. With another zero point the padding adds
zp * w, which the op's compensation term (zp * sum of all weights) takes away again: skipping
would break that balance."""

import tvm_ffi
from tvm import s_tir, tirx

from .recipe import is_bf16


def pads_with_zero(recipe) -> bool:
    """Whether the padding the recipe's kernel reads is 0 in the instruction's arithmetic, so
    that a tap reading only padding adds nothing to the accumulator."""
    return is_bf16(recipe) or (recipe.x_zp == 0 and not recipe.x_signed)


def skip_padding_taps(func: tirx.PrimFunc, buffer: str, axis: int, lo: int,
                      hi: int) -> tirx.PrimFunc:
    """func whose blocks reading `buffer` run only where their index along `axis` of it lies in
    [lo, hi): the blocks that read one element there per iteration (the tensorized update of a
    conv over its padded input) get that condition added to their predicate."""

    def on_realize(node, mutator):
        block = node.block
        reads = [r for r in block.reads if r.source.name == buffer]
        if not reads or getattr(reads[0].region[axis].extent, "value", None) != 1:
            return mutator.default_mutate(node)
        # the index in terms of the loops around the block (its iter vars -> their bindings)
        bound = dict(zip((iv.var for iv in block.iter_vars), node.iter_values))
        index = tvm_ffi.structural_mutate(reads[0].region[axis].min,
                                          [(tirx.Var, lambda v, _m: bound.get(v, v))])
        inside = tirx.all(index >= lo, index < hi)
        return s_tir.SBlockRealize(node.iter_values, tirx.all(node.predicate, inside), block)

    return func.with_body(tvm_ffi.structural_mutate(func.body,
                                                    [(s_tir.SBlockRealize, on_realize)]))
