"""Which edges between quantized ops carry uint8 instead of float32: the producer requantizes
in the quantization its readers share (or, for a projection shortcut, its own observed one) and
the readers read it as is, or dequantize it as their residual. Each pass sets `out_q` on the
producer's recipe and `in_u8` / `residual_q` on its readers' (by_end: var -> QuantizedOp, whose
frozen recipe is replaced)."""

from ..core.graph import dataflow_bindings, is_nchw_max_pool, uses as count_uses
from ..core.recipe import CONV_KINDS

# a conv's result can be shared as uint8 between convs of the same kind (a block output read as
# input and as residual): conv2d edges are then laid out NCHW[y]c, conv3d ones stay NCDHW


def requantize_edges(func, chains, by_end):
    """Where a quantized op's only consumer is another quantized op's input, the producer writes
    uint8 already quantized with the consumer's parameters (requantization), and the consumer
    reads it as is: 4x less activation traffic on that edge and no quantize step."""
    uses = count_uses(dataflow_bindings(func), func)
    by_x = {}
    for c in chains:
        by_x.setdefault(c.x, []).append(c)
    for chain in chains:
        consumers = by_x.get(chain.end, [])
        if uses.get(chain.end, 0) != 1 or len(consumers) != 1:
            continue
        recipe, next_recipe = by_end[chain.end].recipe, by_end[consumers[0].end].recipe
        if any(r.nd_in_shape is not None or r.nd_out_shape is not None
               for r in (recipe, next_recipe)):
            continue
        by_end[chain.end].update(out_q=(next_recipe.x_scale, next_recipe.x_zp))
        by_end[consumers[0].end].update(in_u8=True)


def requantize_shared_edges(func, chains, by_end):
    """Where every user of a conv's result is a quantized conv that reads it as its input or
    adds it as its residual (a ResNet or MobileNetV2 block output), the producer writes uint8
    in the quantization its input readers share (they observed the same tensor), the input
    readers read it as is and the residual readers dequantize it in their epilogue: the block
    output travels as uint8 instead of fp32 there and back. UnitTensorize lays such an edge out
    NCHW[y]c, for input and residual readers alike."""
    uses = count_uses(dataflow_bindings(func), func)
    readers, adders = {}, {}
    for c in chains:
        readers.setdefault(c.x, []).append(c)
        if c.residual is not None:
            adders.setdefault(c.residual, []).append(c)
    for chain in chains:
        recipe = by_end[chain.end].recipe
        ins, res = readers.get(chain.end, []), adders.get(chain.end, [])
        if (recipe.out_q or not ins or len(ins) + len(res) != uses.get(chain.end, 0)
                or recipe.kind not in CONV_KINDS):
            continue
        users = [by_end[c.end].recipe for c in ins + res]
        if any(r.kind != recipe.kind or r.nd_in_shape is not None or r.nd_out_shape is not None
               for r in users):
            continue
        scale, zp = users[0].x_scale, users[0].x_zp
        by_end[chain.end].update(out_q=(scale, zp))
        for c in ins:
            by_end[c.end].update(x_scale=scale, x_zp=zp, in_u8=True)
        for c in res:
            by_end[c.end].update(residual_q=(scale, zp))


def residual_only_ends(func, chains):
    """The conv chains whose result every user adds as its residual in a quantized conv
    (ResNet's projection shortcut): nothing reads it as an input, so no reader has observed
    it; quantize() observes it itself."""
    uses = count_uses(dataflow_bindings(func), func)
    adders = {}
    for c in chains:
        if c.residual is not None:
            adders.setdefault(c.residual, []).append(c)
    return [c for c in chains if c.kind in CONV_KINDS and adders.get(c.end)
            and len(adders[c.end]) == uses.get(c.end, 0)
            and all(a.kind == c.kind for a in adders[c.end])]


def requantize_shortcuts(chains, by_end, shortcuts, quantizations):
    """A projection shortcut writes uint8 in its own quantization (scale, zero point: of its
    observed values, or the model's), and its adders dequantize it in their epilogue (the
    residual travels as uint8 NCHW[y]c, as a block output does, instead of float32 there and
    back)."""
    for chain, (scale, zp) in zip(shortcuts, quantizations):
        recipe = by_end[chain.end].recipe
        adders = [by_end[c.end] for c in chains if c.residual is not None
                  and c.residual.same_as(chain.end)]
        if (recipe.out_q or recipe.kind not in CONV_KINDS
                or any(a.recipe.nd_in_shape is not None or a.recipe.nd_out_shape is not None
                       for a in adders)):
            continue
        by_end[chain.end].update(out_q=(float(scale), int(zp)))
        for adder in adders:
            adder.update(residual_q=(float(scale), int(zp)))


def requantize_through_pools(func, chains, by_end):
    """{max-pool binding var: (scale, zp)} of the pools that run on uint8: the producer (a
    quantized op whose result only that NCHW max-pool reads) requantizes with the quantization
    of the quantized convs that read the pool (they observed the same tensor, so they share
    it), and those convs read the pool's uint8 result as is; a quantized op adding it as its
    residual dequantizes it in its epilogue. quantize(max(v)) == max(quantize(v)) for a
    non-decreasing quantize; uint8 padding (0) is the smallest value, like fp32's -inf."""
    bindings = dataflow_bindings(func)
    uses = count_uses(bindings, func)
    readers = {}
    for c in chains:
        readers.setdefault(c.x, []).append(c)
    pools = {}
    for b in bindings:
        v = b.value
        if not is_nchw_max_pool(v):
            continue
        src = v.args[0]
        if src not in by_end or uses.get(src, 0) != 1 or not readers.get(b.var):
            continue
        recipe = by_end[src].recipe
        consumers = [by_end[c.end] for c in readers[b.var]]
        if (recipe.out_q or recipe.nd_out_shape is not None
                or any(op.recipe.kind != "conv2d" for op in consumers)):
            continue
        scale, zp = consumers[0].recipe.x_scale, consumers[0].recipe.x_zp
        by_end[src].update(out_q=(scale, zp))
        for op in consumers:
            op.update(x_scale=scale, x_zp=zp, in_u8=True)
        for c in chains:
            if c.residual is not None and c.residual.same_as(b.var):
                by_end[c.end].update(residual_q=(scale, zp))
        pools[b.var] = (scale, zp)
    return pools
