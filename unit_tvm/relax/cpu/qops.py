"""Quantized operators as te graphs, from a recipe (what the graph pass records per op).

A recipe describes one int8 op of a quantized model: the conv2d or dense shape, the activation's
uint8 quantization (scale, zero point), and what is fused after it (per-channel dequantization
and bias, residual add, relu). A recipe with "dtype": "bfloat16" is the bf16 form of the op:
activations rounded to bf16 inside the kernel, bf16 weights, float32 accumulation, then bias,
residual and activation (no scales, no zero point). The same recipe builds
- the plain int8 (bf16) computation with TVM's default schedule (`plain_func`: "no tensorize"),
- the tensorized one (`tensorized_func`): activations quantized and packed into the instruction's
  layout inside the kernel, weights packed at compile time, epilogue fused into the write-back.
What a recipe says (dtypes, shapes, the instructions that may run it) is in recipe.py; its
weights in the kernels' layouts, in numpy, in weights.py.
"""


from tvm import te, tirx

from ... import schedules
from ...rewriter import schedule
from ..core.recipe import ATTR, dtypes, in_shape, out_shape, w_arg_shape
from .qarith import (arguments, epilogue_fn, load_input, logical_index, operand_at, packed_output,
    pad_value, placeholders, second_operand)
from .qgraphs import PANEL_KINDS, tensorized_graph
from .weights import plain_weight_shape


def plain_func(recipe):
    """PrimFunc(x, w[K, C, R, S] or [N, K], comp, mult, bias[, residual], out), default schedule."""
    if recipe.kind == "conv3d":
        return _plain_conv3d(recipe)
    if recipe.kind == "bmm":
        return _plain_bmm(recipe)
    if recipe.kind == "conv2d":
        n, c, h, w_ = recipe.in_shape
        k, _, r, s = recipe.w_shape
        (sh, sw), (dh, dw) = recipe.stride, recipe.dilation
        pt, pl, pb, pr = recipe.padding
        ob = recipe.out_block
        x, w, comp, mult, bias, res = placeholders(recipe, in_shape(recipe),
                                                    plain_weight_shape(recipe))
        groups = recipe.groups
        cg, kg = c // groups, k // groups  # input / output channels per group
        # a depthwise conv has no channel reduction: an extent-1 one would put a reduction
        # variable in the channel index and keep the default schedule from vectorising channels
        rc = te.reduce_axis((0, cg), name="rc") if cg > 1 else tirx.const(0, "int32")
        rr, rs = (te.reduce_axis((0, e), name=nm) for e, nm in ((r, "rr"), (s, "rs")))
        red = [rc, rr, rs] if cg > 1 else [rr, rs]
        # padded (with the zero point: real 0.0) and quantized, in the input's own layout; on a
        # packed edge the channel block stays innermost, so a depthwise conv vectorises over it
        ib = recipe.in_block
        xq_shape = (in_shape(recipe)[:2] + [h + pt + pb, w_ + pl + pr] + ([ib] if ib else []))

        def xq_body(b, co, i, j, *ci):
            ch = co * ib + ci[0] if ib else co
            inside = tirx.all(i >= pt, i < h + pt, j >= pl, j < w_ + pl, *([ch < c] if ib else []))
            return tirx.if_then_else(inside, load_input(x, recipe, (b, ch, i - pt, j - pl)),
                                     pad_value(recipe))

        xq = te.compute(xq_shape, xq_body, name="xq")

        def xq_at(b, ch, i, j, lanes):
            if lanes is not None and cg == kg == 1 and ib == ob:
                return xq[b, lanes[0], i, j, lanes[1]]  # a depthwise conv reads its own lanes
            return xq[b, ch // ib, i, j, ch % ib] if ib else xq[b, ch, i, j]

        acc_t = dtypes(recipe)[2]

        def conv_at(b, f, i, j, w_at, lanes=None):
            return te.sum(xq_at(b, f // kg * cg + rc, i * sh + rr * dh, j * sw + rs * dw, lanes)
                          .astype(acc_t) * w_at(rc, rr, rs).astype(acc_t), axis=red)

        fn = epilogue_fn(recipe, comp, mult, bias, res)
        if ob:  # accumulators and weights in the output's blocked layout too: lanes = channels
            def acc_body(b, ko, i, j, ki):
                f = ko * ob + ki if k % ob == 0 else tirx.min(ko * ob + ki, k - 1)
                return conv_at(b, f, i, j, lambda *a: w[(ko,) + a + (ki,)], lanes=(ko, ki))

            acc = te.compute(out_shape(recipe), acc_body, name="acc")
            out = te.compute(out_shape(recipe), packed_output(
                recipe, fn, lambda b, ko, i, j, ki, _f: acc[b, ko, i, j, ki]), name="out")
        else:
            acc = te.compute(recipe.out_shape, lambda b, f, i, j: conv_at(
                b, f, i, j, lambda *a: w[(f,) + a]), name="acc")
            out = te.compute(recipe.out_shape, lambda b, f, i, j: fn(
                acc[b, f, i, j], f, (b, f, i, j)), name="out")  # float32, or uint8 requantized
    else:
        m, kk = recipe.in_shape
        x, w, comp, mult, bias, res = placeholders(recipe, recipe.in_shape, recipe.w_shape)
        xq = te.compute((m, kk), lambda i, j: load_input(x, recipe, (i, j)), name="xq")
        r = te.reduce_axis((0, kk), name="k")
        acc_t = dtypes(recipe)[2]
        acc = te.compute(recipe.out_shape, lambda i, j: te.sum(
            xq[i, r].astype(acc_t) * w[j, r].astype(acc_t), axis=r), name="acc")
        fn = epilogue_fn(recipe, comp, mult, bias, res)
        out = te.compute(recipe.out_shape, lambda i, j: fn(acc[i, j], j, (i, j)), name="out")
    args = arguments(x, w, comp, mult, bias, res, out)
    return te.create_prim_func(args).with_attr(ATTR, recipe.to_json())


def _plain_conv3d(recipe):
    """plain_func of an (ungrouped) conv3d: NCDHW input and output, KCTRS weights; on a packed
    edge the input (residual, result) in NCDHW[block]c and the weights KCTRS[block]k."""
    n, c, d, h, w_ = recipe.in_shape
    k, _, t, r, s = recipe.w_shape
    (st, sh, sw), (dt, dh, dw) = recipe.stride, recipe.dilation
    pf, pt, pl, pk, pb, pr = recipe.padding
    ob = recipe.out_block
    x, w, comp, mult, bias, res = placeholders(recipe, in_shape(recipe),
                                                plain_weight_shape(recipe))

    def xq_body(b, ch, z, i, j):
        inside = tirx.all(z >= pf, z < d + pf, i >= pt, i < h + pt, j >= pl, j < w_ + pl)
        return tirx.if_then_else(inside, load_input(x, recipe, (b, ch, z - pf, i - pt, j - pl)),
                                 pad_value(recipe))

    xq = te.compute((n, c, d + pf + pk, h + pt + pb, w_ + pl + pr), xq_body, name="xq")
    rc, rt, rr, rs = (te.reduce_axis((0, e), name=nm)
                      for e, nm in ((c, "rc"), (t, "rt"), (r, "rr"), (s, "rs")))
    acc_t = dtypes(recipe)[2]

    def weight(f):
        return (w[f // ob, rc, rt, rr, rs, f % ob] if ob else w[f, rc, rt, rr, rs]).astype(acc_t)

    acc = te.compute(recipe.out_shape, lambda b, f, z, i, j: te.sum(
        xq[b, rc, z * st + rt * dt, i * sh + rr * dh, j * sw + rs * dw].astype(acc_t)
        * weight(f), axis=[rc, rt, rr, rs]), name="acc")
    fn = epilogue_fn(recipe, comp, mult, bias, res)
    if ob:  # channel f of block ko reads the NCDHW accumulator (f clamped on padding lanes)
        out = te.compute(out_shape(recipe), packed_output(
            recipe, fn, lambda b, ko, z, i, j, ki, f: acc[b, f, z, i, j]), name="out")
    else:
        out = te.compute(recipe.out_shape, lambda b, f, z, i, j: fn(
            acc[b, f, z, i, j], f, (b, f, z, i, j)), name="out")
    args = arguments(x, w, comp, mult, bias, res, out)
    return te.create_prim_func(args).with_attr(ATTR, recipe.to_json())


def _plain_bmm(recipe):
    """plain_func of a bmm: x [B, M, K] to uint8 times the int8 y [B, K, N] (bf16: both
    rounded to bf16), epilogue."""
    kk = recipe.in_shape[-1]
    x, y, comp, mult, bias, res = placeholders(recipe, in_shape(recipe), w_arg_shape(recipe))
    x_at = operand_at(x, recipe.x_view, recipe.in_shape)
    y_at = operand_at(y, recipe.w_view, recipe.w_shape)
    xq = te.compute(recipe.in_shape, lambda b, i, j: load_input(x_at, recipe, (b, i, j)),
                    name="xq")
    r = te.reduce_axis((0, kk), name="k")
    acc_t = dtypes(recipe)[2]
    acc = te.compute(recipe.out_shape, lambda b, i, j: te.sum(
        xq[b, i, r].astype(acc_t) * second_operand(y_at(b, r, j), recipe).astype(acc_t),
        axis=r), name="acc")
    fn = epilogue_fn(recipe, comp, mult, bias, res)

    def out_body(*idx):  # of the output, whose axes may be permuted (out_axes)
        b, i, j = logical_index(recipe, idx)
        return fn(acc[b, i, j], j, (b, i, j))

    out = te.compute(out_shape(recipe), out_body, name="out")
    return te.create_prim_func(arguments(x, y, comp, mult, bias, res, out)).with_attr(
        ATTR, recipe.to_json())


def tensorized_func(recipe, intrin, target, config=None):
    """(PrimFunc, Blocks, prepared) of the recipe tensorized with intrin, scheduled with config
    (None: the strategy's default); a dense layer's weights packed in the panel the config's
    register tile reads (the strategy's weight_panel; qgraphs.PANEL_KINDS)."""
    prepared, blocks = tensorized_graph(recipe, intrin, target)
    strategy = schedules.for_target(target)
    config = config if config is not None else strategy.default(prepared, target)
    panel = strategy.weight_panel(config, prepared)
    if recipe.kind in PANEL_KINDS and panel > 1:
        prepared, blocks = tensorized_graph(recipe, intrin, target, panel)
    func = schedule(prepared, intrin, config, target).mod["main"]
    func = func.with_attr(ATTR, recipe.to_json()).with_attr("tirx.is_scheduled", True)
    return func, blocks, prepared
