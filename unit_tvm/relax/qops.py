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

import json

from tvm import te, tirx

from .. import fastmath
from ..prepare import prepare
from ..rewriter import schedule
from ..shift import SHIFT
from ..schedules.cpu import tiled_extent
from .recipe import (ATTR, Blocks, blocks_of, dtypes, in_shape, is_bf16, is_depthwise,
                     out_dtype, out_shape, packed_shape)
from .weights import plain_weight_shape

def _quantize(x, scale, zp):
    """fp32 -> uint8, round half away from zero, clipped. Multiplies by 1/scale: a vector divide
    costs ~10x a multiply, once per activation; results can differ from x / scale by one step
    only where x / scale lies within an ulp of a rounding tie."""
    q = tirx.round(x * tirx.const(1.0 / scale, "float32")) + tirx.const(float(zp), "float32")
    return tirx.max(tirx.min(q, tirx.const(255.0, "float32")), tirx.const(0.0, "float32")).astype(
        "uint8")


def _round_to_bf16(v):
    """float32 v rounded to the nearest bfloat16 (ties to even), still float32. Spelled out
    because TVM's BF16 legalization keeps an internal bf16 stage in float32 unless an
    instruction reads its storage: with this, the plain loop nest (the tuner's reference) and
    the tensorized kernel see the same bf16 activations."""
    bits = tirx.reinterpret("uint32", v)
    bits = bits + tirx.const(0x7FFF, "uint32") + ((bits >> tirx.const(16, "uint32"))
                                                   & tirx.const(1, "uint32"))
    return tirx.reinterpret("float32", bits & tirx.const(0xFFFF0000, "uint32"))


def _pad_value(recipe):
    """What padding holds in the instruction's activation dtype: real 0.0 (the zero point)."""
    if is_bf16(recipe):
        return tirx.const(0.0, "float32").astype("bfloat16")
    if recipe.get("x_signed"):
        return tirx.const(recipe["x_zp"] - SHIFT, "int8")
    return tirx.const(recipe["x_zp"], "uint8")


def _epilogue(recipe, comp, mult, bias, residual):
    """acc (int32) -> fp32: (acc - zp*wsum[k]) * (s_x*s_w[k]) + bias[k] (+ residual), relu.
    A bf16 op's acc is float32 already: acc + bias[k] (+ residual), relu."""

    def fn(acc, k, out_idx):
        if is_bf16(recipe):
            v = acc + bias[k]
        else:
            v = (acc - comp[k]).astype("float32") * mult[k] + bias[k]
        if residual is not None:
            rb = recipe.get("residual_block")
            if rb:  # a residual in NCHW[rb]c blocks (a shared uint8 edge)
                b, f, i, j = out_idx
                r = residual(b, f // rb, i, j, f % rb)
            else:
                r = residual(*out_idx)
            if recipe.get("residual_q"):  # a uint8 residual (a pool's or conv's): dequantized here
                scale, zp = recipe["residual_q"]
                r = (r.astype("float32") - tirx.const(float(zp), "float32")) * tirx.const(
                    float(scale), "float32")
            v = v + r
        if recipe.get("gelu"):  # exact (erf) GELU, as torch.nn.functional.gelu
            v = v * tirx.const(0.5, "float32") * (tirx.const(1.0, "float32") + fastmath.erf(
                v * tirx.const(0.7071067811865476, "float32")))
        if recipe["relu"]:
            v = tirx.max(v, tirx.const(0.0, "float32"))
        if recipe.get("clip_max") is not None:
            v = tirx.min(v, tirx.const(float(recipe["clip_max"]), "float32"))
        if recipe.get("out_q"):  # requantize for the next quantized op
            return _quantize(v, *recipe["out_q"])
        return v

    return fn


def _load_input(x, recipe, idx):
    """The uint8 activation at the logical (NCHW or [rows, k]) index idx, whatever x's layout:
    x itself when the producer already requantized it, else quantized here."""
    blk = recipe.get("in_block")
    if blk:
        b, c, i, j = idx
        idx = (b, c // blk, i, j, c % blk)
    return _quantized(x(*idx), recipe)


def _quantized(value, recipe):
    """An activation read from the op's input as the instruction takes it: as is when the
    producer already requantized it, else quantized (or rounded to bf16) here; re-based to
    int8 (x - 128, an xor of the sign bit) for an s8 x s8 instruction."""
    if is_bf16(recipe):
        return value if recipe.get("in_u8") else _round_to_bf16(value).astype("bfloat16")
    q = value if recipe.get("in_u8") else _quantize(value, recipe["x_scale"], recipe["x_zp"])
    if recipe.get("x_signed"):
        return (q ^ tirx.const(SHIFT, "uint8")).astype("int8")  # u8 - 128 as s8
    return q


def _packed_output(recipe, fn, acc_at):
    """te body of a NCHW[out_block]c uint8 result: channel f = ko * block + ki from
    fn(acc_at(f), f, nchw index); the padding channels hold the output's zero point (real 0)."""
    blk, k = recipe["out_block"], recipe["out_channels"]
    zp = tirx.const(int(recipe["out_q"][1]), "uint8")

    def body(b, ko, i, j, ki):
        f = ko * blk + ki
        if k % blk == 0:  # no padding channel: straight-line code that vectorises
            return fn(acc_at(b, ko, i, j, ki, f), f, (b, f, i, j))
        fc = tirx.min(f, k - 1)  # parameters of a padding channel are never used, but read
        return tirx.if_then_else(f < k, fn(acc_at(b, ko, i, j, ki, fc), fc, (b, fc, i, j)), zp)

    return body


def _placeholders(recipe, x_shape, w_shape):
    """x, w, comp, mult, bias, residual: the op's arguments (comp and mult None for bf16, which
    has no quantization to undo; residual None without one)."""
    x = te.placeholder(x_shape, "uint8" if recipe.get("in_u8") else "float32", name="x")
    w = te.placeholder(w_shape, dtypes(recipe)[1], name="w")
    k = recipe["out_channels"]
    comp = None if is_bf16(recipe) else te.placeholder((k,), "int32", name="comp")
    mult = None if is_bf16(recipe) else te.placeholder((k,), "float32", name="mult")
    bias = te.placeholder((k,), "float32", name="bias")
    rb = recipe.get("residual_block")
    residual = te.placeholder(packed_shape(recipe["out_shape"], rb) if rb else recipe["out_shape"],
                              "uint8" if recipe.get("residual_q") else "float32",
                              name="residual") if recipe["residual"] else None
    return x, w, comp, mult, bias, residual


def _arguments(*tensors):
    """The PrimFunc's argument list: the given tensors, less the absent (None) ones."""
    return [t for t in tensors if t is not None]


def plain_func(recipe):
    """PrimFunc(x, w[K, C, R, S] or [N, K], comp, mult, bias[, residual], out), default schedule."""
    if recipe["kind"] == "conv2d":
        n, c, h, w_ = recipe["in_shape"]
        k, _, r, s = recipe["w_shape"]
        (sh, sw), (dh, dw) = recipe["stride"], recipe["dilation"]
        pt, pl, pb, pr = recipe["padding"]
        ob = recipe.get("out_block")
        x, w, comp, mult, bias, res = _placeholders(recipe, in_shape(recipe),
                                                    plain_weight_shape(recipe))
        groups = recipe.get("groups", 1)
        cg, kg = c // groups, k // groups  # input / output channels per group
        # a depthwise conv has no channel reduction: an extent-1 one would put a reduction
        # variable in the channel index and keep the default schedule from vectorising channels
        rc = te.reduce_axis((0, cg), name="rc") if cg > 1 else tirx.const(0, "int32")
        rr, rs = (te.reduce_axis((0, e), name=nm) for e, nm in ((r, "rr"), (s, "rs")))
        red = [rc, rr, rs] if cg > 1 else [rr, rs]
        # padded (with the zero point: real 0.0) and quantized, in the input's own layout; on a
        # packed edge the channel block stays innermost, so a depthwise conv vectorises over it
        ib = recipe.get("in_block")
        xq_shape = (in_shape(recipe)[:2] + [h + pt + pb, w_ + pl + pr] + ([ib] if ib else []))

        def xq_body(b, co, i, j, *ci):
            ch = co * ib + ci[0] if ib else co
            inside = tirx.all(i >= pt, i < h + pt, j >= pl, j < w_ + pl, *([ch < c] if ib else []))
            return tirx.if_then_else(inside, _load_input(x, recipe, (b, ch, i - pt, j - pl)),
                                     _pad_value(recipe))

        xq = te.compute(xq_shape, xq_body, name="xq")

        def xq_at(b, ch, i, j, lanes):
            if lanes is not None and cg == kg == 1 and ib == ob:
                return xq[b, lanes[0], i, j, lanes[1]]  # a depthwise conv reads its own lanes
            return xq[b, ch // ib, i, j, ch % ib] if ib else xq[b, ch, i, j]

        acc_t = dtypes(recipe)[2]

        def conv_at(b, f, i, j, w_at, lanes=None):
            return te.sum(xq_at(b, f // kg * cg + rc, i * sh + rr * dh, j * sw + rs * dw, lanes)
                          .astype(acc_t) * w_at(rc, rr, rs).astype(acc_t), axis=red)

        fn = _epilogue(recipe, comp, mult, bias, res)
        if ob:  # accumulators and weights in the output's blocked layout too: lanes = channels
            def acc_body(b, ko, i, j, ki):
                f = ko * ob + ki if k % ob == 0 else tirx.min(ko * ob + ki, k - 1)
                return conv_at(b, f, i, j, lambda *a: w[(ko,) + a + (ki,)], lanes=(ko, ki))

            acc = te.compute(out_shape(recipe), acc_body, name="acc")
            out = te.compute(out_shape(recipe), _packed_output(
                recipe, fn, lambda b, ko, i, j, ki, _f: acc[b, ko, i, j, ki]), name="out")
        else:
            acc = te.compute(recipe["out_shape"], lambda b, f, i, j: conv_at(
                b, f, i, j, lambda *a: w[(f,) + a]), name="acc")
            out = te.compute(recipe["out_shape"], lambda b, f, i, j: fn(
                acc[b, f, i, j], f, (b, f, i, j)), name="out")  # float32, or uint8 requantized
    else:
        m, kk = recipe["in_shape"]
        x, w, comp, mult, bias, res = _placeholders(recipe, recipe["in_shape"], recipe["w_shape"])
        xq = te.compute((m, kk), lambda i, j: _load_input(x, recipe, (i, j)), name="xq")
        r = te.reduce_axis((0, kk), name="k")
        acc_t = dtypes(recipe)[2]
        acc = te.compute(recipe["out_shape"], lambda i, j: te.sum(
            xq[i, r].astype(acc_t) * w[j, r].astype(acc_t), axis=r), name="acc")
        fn = _epilogue(recipe, comp, mult, bias, res)
        out = te.compute(recipe["out_shape"], lambda i, j: fn(acc[i, j], j, (i, j)), name="out")
    args = _arguments(x, w, comp, mult, bias, res, out)
    return te.create_prim_func(args).with_attr(ATTR, json.dumps(recipe))


def _round_up(v, m):
    return -(-v // m) * m


def tensorized_graph(recipe, intrin):
    """(prepared graph, Blocks) computing the recipe with `intrin`; weights arrive packed."""
    if recipe.get("groups", 1) != 1 and not is_depthwise(recipe):
        raise ValueError(f"grouped conv ({recipe['groups']} groups): no packed layout for "
                         "dot-product instructions here; it keeps TVM's int8 loop nest")
    if is_depthwise(recipe) != intrin.lanewise:
        raise ValueError(f"{intrin.name} {'runs only' if intrin.lanewise else 'cannot run'} "
                         "depthwise convs")
    x_blk, y_blk, word = blocks_of(intrin)
    pad = _pad_value(recipe)
    acc_t = dtypes(recipe)[2]
    if is_depthwise(recipe):
        x, w, comp, mult, bias, res, acc = _depthwise_graph(recipe, intrin)
        epi = _conv_epilogue(recipe, _epilogue(recipe, comp, mult, bias, res), y_blk)
        x_blk = intrin.reduction_width  # pack_weight's tap group
    elif recipe["kind"] == "conv2d":
        n, c, h, w_ = recipe["in_shape"]
        k, _, r, s = recipe["w_shape"]
        (sh, sw), (dh, dw) = recipe["stride"], recipe["dilation"]
        pt, pl, pb, pr = recipe["padding"]
        cp, kp = _round_up(c, x_blk), _round_up(k, y_blk)
        _, oc, oh, ow = recipe["out_shape"]
        x, w, comp, mult, bias, res = _placeholders(
            recipe, in_shape(recipe), (kp // y_blk, cp // x_blk, r, s, x_blk // word, y_blk, word))
        # output columns computed: padded when their count has no divisor a register tile can
        # use (17, 71, 73), the extra columns reading padding and cropped by the epilogue
        owp = tiled_extent(ow)
        hp, wpd = h + pt + pb, max(w_ + pl + pr, (owp - 1) * sw + (s - 1) * dw + 1)
        ib = recipe.get("in_block")
        blocked = recipe.get("in_u8") and ib and ib % x_blk == 0 and c % ib == 0
        in_place = not any(recipe["padding"]) and owp == ow and not recipe.get("x_signed")
        if blocked and in_place:
            # the producer's NCHW[ib]c uint8 already holds every x_blk channels of a pixel
            # together: the instruction reads it in place, no pass over the input
            xb = x
        elif blocked:
            # padded, still in the producer's blocks: a copy of whole channel vectors (the
            # instruction reads x_blk of a block's ib channels in place); indices are clamped
            # as well as guarded, since a vectorised select may load both sides
            def xb_body(b, co, i, j, ci):
                inside = tirx.all(i >= pt, i < h + pt, j >= pl, j < w_ + pl)
                ic = tirx.max(tirx.min(i - pt, h - 1), 0)
                jc = tirx.max(tirx.min(j - pl, w_ - 1), 0)
                return tirx.if_then_else(inside, _quantized(x[b, co, ic, jc, ci], recipe), pad)

            xb = te.compute((n, c // ib, hp, wpd, ib), xb_body, name="xq")
        else:
            # quantize, pad (with the zero point: real 0.0) and pack NCHW -> NCHW[x]c in one pass
            ib = x_blk
            xb = te.compute((n, cp // x_blk, hp, wpd, x_blk), lambda b, co, i, j, ci:
                            tirx.if_then_else(
                                tirx.all(i >= pt, i < h + pt, j >= pl, j < w_ + pl,
                                         co * x_blk + ci < c),
                                _load_input(x, recipe, (b, co * x_blk + ci, i - pt, j - pl)),
                                pad), name="xq")
        rc, rr, rs = (te.reduce_axis((0, e), name=nm)
                      for e, nm in ((cp, "rc"), (r, "rr"), (s, "rs")))
        acc = te.compute((n, kp // y_blk, oh, owp, y_blk), lambda b, ko, i, j, ki: te.sum(
            xb[b, rc // ib, i * sh + rr * dh, j * sw + rs * dw, rc % ib].astype(acc_t)
            * w[ko, rc // x_blk, rr, rs, rc % x_blk // word, ki, rc % word].astype(acc_t),
            axis=[rc, rr, rs]), name="acc")
        epi = _conv_epilogue(recipe, _epilogue(recipe, comp, mult, bias, res), y_blk)
    else:
        m, kk = recipe["in_shape"]
        nn_ = recipe["out_channels"]
        kp, np_ = _round_up(kk, x_blk), _round_up(nn_, y_blk)
        # rows computed: padded like a conv's output columns when their count has no divisor a
        # register tile can use (197 tokens -> 198: a one-row tile ran at 35% of peak)
        mp = tiled_extent(m)
        x, w, comp, mult, bias, res = _placeholders(
            recipe, recipe["in_shape"], (np_ // y_blk, kp // x_blk, x_blk // word, y_blk, word))
        xq = te.compute((mp, kp), lambda i, j: tirx.if_then_else(
            tirx.all(j < kk, i < m),
            _load_input(x, recipe, (tirx.min(i, m - 1), tirx.min(j, kk - 1))), pad), name="xq")
        r = te.reduce_axis((0, kp), name="k")
        acc = te.compute((mp, np_), lambda i, j: te.sum(
            xq[i, r].astype(acc_t)
            * w[j // y_blk, r // x_blk, r % x_blk // word, j % y_blk, r % word].astype(acc_t),
            axis=r), name="acc")
        fn = _epilogue(recipe, comp, mult, bias, res)

        def epi(value, idx):
            return fn(value(idx), idx[-1], idx)

    params = _arguments(x, w, comp, mult, bias, res)
    prepared = prepare(acc, intrin, params=params,
                       epilogue=(out_shape(recipe), out_dtype(recipe), epi, "out"))
    return prepared, Blocks(x_blk, y_blk, word)


def _conv_epilogue(recipe, fn, y_blk):
    """epilogue fn of prepare for a conv whose accumulators are NCHW[y_blk]c: the output is
    NCHW, or NCHW[out_block]c read in place (out_block must then be y_blk)."""
    ob = recipe.get("out_block")
    if ob and ob != y_blk:
        # one output block would mix accumulator blocks; TVM's reverse_compute_at then
        # derives a wrong per-tile loop nest (a wrong result, seen with 8-lane accumulators
        # under a 16-channel output block), so the output block follows the instruction
        raise ValueError(f"output block {ob} differs from the instruction's {y_blk} channels")

    def epi(value, idx):
        if ob:
            # the same blocking as the accumulators: read in place
            return _packed_output(recipe, fn, lambda b, ko, i, j, ki, f: value(
                (b, ko, i, j, ki)))(*idx)
        b, f, i, j = idx
        return fn(value((b, f // y_blk, i, j, f % y_blk)), f, idx)

    return epi


def _depthwise_graph(recipe, intrin):
    """(x, w, comp, mult, bias, residual, acc) of a depthwise conv for a lanewise instruction:
    the input quantized, padded and packed to NCHW[lanes]c with room for the padded taps, the
    window's taps along the width as the instruction's reduction (zero weights past the last tap),
    accumulators NCHW[lanes]c."""
    _, y_blk = intrin.channel_blocks
    width = intrin.reduction_width
    n, c, h, w_ = recipe["in_shape"]
    k, _, r, s = recipe["w_shape"]
    (sh, sw), (dh, dw) = recipe["stride"], recipe["dilation"]
    if dw != 1:
        raise ValueError(f"dilated depthwise window (dilation {dw} along the width): the "
                         f"instruction reads {width} neighbouring pixels")
    pt, pl, pb, pr = recipe["padding"]
    _, _, oh, ow = recipe["out_shape"]
    taps = _round_up(s, width)
    kp = _round_up(k, y_blk)
    x, w, comp, mult, bias, res = _placeholders(
        recipe, in_shape(recipe), (kp // y_blk, r, taps // width, y_blk, width))
    # the padded taps of the last output column read up to taps - s pixels past the window
    wpd = max(w_ + pl + pr, (ow - 1) * sw + taps)

    def xq_body(b, co, i, j, ci):
        inside = [i >= pt, i < h + pt, j >= pl, j < w_ + pl] + ([co * y_blk + ci < c] if c % y_blk
                                                               else [])
        if recipe.get("in_block") == y_blk:  # the producer's blocks: read in place, vectorises
            value = _quantized(x(b, co, i - pt, j - pl, ci), recipe)
        else:
            value = _load_input(x, recipe, (b, co * y_blk + ci, i - pt, j - pl))
        return tirx.if_then_else(tirx.all(*inside), value, _pad_value(recipe))

    xq = te.compute((n, kp // y_blk, h + pt + pb, wpd, y_blk), xq_body, name="xq")
    rr, rs = te.reduce_axis((0, r), name="rr"), te.reduce_axis((0, taps), name="rs")
    acc_t = dtypes(recipe)[2]
    acc = te.compute((n, kp // y_blk, oh, ow, y_blk), lambda b, ko, i, j, ki: te.sum(
        xq[b, ko, i * sh + rr * dh, j * sw + rs, ki].astype(acc_t)
        * w[ko, rr, rs // width, ki, rs % width].astype(acc_t), axis=[rr, rs]), name="acc")
    return x, w, comp, mult, bias, res, acc


def tensorized_func(recipe, intrin, target, config=None):
    """(PrimFunc, Blocks, prepared) of the recipe tensorized with intrin, scheduled with config."""
    prepared, blocks = tensorized_graph(recipe, intrin)
    func = schedule(prepared, intrin, config, target).mod["main"]
    func = func.with_attr(ATTR, json.dumps(recipe)).with_attr("tirx.is_scheduled", True)
    return func, blocks, prepared
