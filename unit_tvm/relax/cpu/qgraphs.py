"""The te graphs unit-tvm's tensorized kernels compute, per recipe: a conv2d over NCHW[x]c
input (read in the producer's blocks when it can), a dense layer, a depthwise conv for a
lanewise instruction; each handed to `prepare` with its epilogue fused into the write-back."""

import dataclasses
import functools
from typing import NamedTuple

from tvm import te, tirx

from ...prepare import ZeroPadding, prepare
from ...schedules.register_tiles import reuses_operands, tile_registers, tiled_extent
from ..core.recipe import (blocked_index, blocks_of, dtypes, fits_groups, folds_width,
    group_channels, in_shape, is_depthwise, out_dtype, out_shape, pads_with_zero, w_arg_shape)
from .qarith import (arguments, epilogue_fn, load_input, logical_index, operand_at, packed_output,
    pad_value, placeholders, quantized, round_up, second_operand)
from .weights import dense_weight_shape


class _Graph(NamedTuple):
    """The te graph of a quantized op: its arguments, the int32 accumulation, the epilogue."""

    x: te.Tensor
    w: te.Tensor
    comp: te.Tensor
    mult: te.Tensor
    bias: te.Tensor
    res: te.Tensor  # None without a residual
    acc: te.Tensor
    epilogue: object  # (value, idx) -> the output element
    zero_padding: tuple = ()  # prepare.ZeroPadding: taps of the input that may be skipped


# whose graphs read weights in panels (Blocks.panel). Not conv2d: measured on Zen 5 (fp32,
# eight chained 512 -> 512 3x3 convs at 7x7, weights from memory), a 2-block panel made each
# layer 620-741 us against 454-530 in the blocks' own streams (in cache: equal)
PANEL_KINDS = ("dense",)


def tensorized_graph(recipe, intrin, target=None, panel=1):
    """(prepared graph, Blocks) computing the recipe with `intrin`; weights arrive packed.
    target: where it runs, for the output columns a register tile needs (tiled_extent; None:
    32 vector registers' widths). panel: a dense layer's weight panel (Blocks.panel, PANEL_KINDS);
    other graphs take 1."""
    reuse = target is not None and reuses_operands(intrin, target)
    columns = functools.partial(tiled_extent, reuse=reuse,
                                registers=tile_registers(intrin, target) if reuse else 0)
    if not is_depthwise(recipe) and not fits_groups(recipe, intrin):
        raise ValueError(f"grouped conv ({recipe.groups} groups of {group_channels(recipe)} "
                         f"channels): {intrin.name}'s channel blocks do not tile its groups")
    if is_depthwise(recipe) != intrin.lanewise:
        raise ValueError(f"{intrin.name} {'runs only' if intrin.lanewise else 'cannot run'} "
                         "depthwise convs")
    blocks = blocks_of(intrin)
    if is_depthwise(recipe):
        x, w, comp, mult, bias, res, acc = _depthwise_graph(recipe, intrin)
        epi = _conv_epilogue(recipe, epilogue_fn(recipe, comp, mult, bias, res), blocks.y)
        graph = _Graph(x, w, comp, mult, bias, res, acc, epi)
        blocks = blocks._replace(x=intrin.reduction_width)  # pack_weight's tap group
    elif folds_width(recipe, blocks):
        graph = _width_folded_graph(recipe, blocks, columns)
    elif recipe.kind == "conv2d":
        graph = _conv_graph(recipe, blocks, columns)
    elif recipe.kind == "conv3d":
        graph = _conv3d_graph(recipe, blocks, columns)
    elif recipe.kind == "bmm":
        graph = _bmm_graph(recipe, blocks, columns)
    else:
        blocks = blocks._replace(panel=panel)
        graph = _dense_graph(recipe, blocks, columns)
    params = arguments(graph.x, graph.w, graph.comp, graph.mult, graph.bias, graph.res)
    prepared = prepare(graph.acc, intrin, params=params,
                       epilogue=(out_shape(recipe), out_dtype(recipe), graph.epilogue, "out"))
    return dataclasses.replace(prepared, zero_padding=graph.zero_padding), blocks


# names of a conv's spatial axes (the loop variables of its stages), by the number of them
_SPATIAL = {2: ("i", "j"), 3: ("z", "i", "j")}
_WINDOW = {2: ("rr",), 3: ("rt", "rr")}  # its window's axes before the folded columns


def _unpadded(padded, before, sizes):
    """(conditions, indices) of padded spatial indices over the unpadded input: each index lies
    inside its real extent, and the input index, clamped as well as guarded (a vectorised
    select may load both sides)."""
    inside, at = [], []
    for v, p, n in zip(padded, before, sizes):
        inside += [v >= p, v < n + p]
        at.append(tirx.max(tirx.min(v - p, n - 1), 0))
    return inside, tuple(at)


def _producer_blocks(recipe, x, x_blk, padded_width):
    """(uint8 NC..[ib]c input the instruction reads, ib) where the op reads its producer's
    channel blocks (a conv2d's or conv3d's; uint8, or float32 through elementwise ops: see
    f32_blocks.py): read in place, or copied (quantized) padded as whole channel vectors (the
    instruction reads x_blk of a block's ib channels in place); None where it does not (the
    caller quantizes, pads and packs its input)."""
    n, c, *extents = recipe.in_shape
    ib = recipe.in_block
    # channels need not fill the last block: the reduction stops at c rounded up to x_blk,
    # and the producer's padding lanes hold real 0 (packed_output) against zero weights
    if not (ib and ib % x_blk == 0):
        return None
    as_taken = (recipe.in_u8 and not recipe.x_signed) or (
        recipe.dtype == "float32" and not recipe.x_gate)
    if as_taken and not any(recipe.padding) and padded_width == extents[-1]:
        # the producer's NC..[ib]c (uint8, or float32 for the float32 form) already holds
        # every x_blk channels of a pixel as the instruction takes them: it reads them in
        # place, no pass over the input
        return x, ib
    rank = len(extents)
    before, after = recipe.padding[:rank], recipe.padding[rank:]
    padded = [e + b + a for e, b, a in zip(extents[:-1], before, after)] + [padded_width]

    def copy_body(b, co, *rest):
        *at, ci = rest
        inside, at = _unpadded(at, before, extents)
        return tirx.if_then_else(tirx.all(*inside), quantized(x[(b, co, *at, ci)], recipe),
                                 pad_value(recipe))

    return te.compute((n, -(-c // ib), *padded, ib), copy_body, name="xq",
                      varargs_names=[*_SPATIAL[rank], "ci"]), ib


def _conv_input(recipe, x, x_blk, padded_width):
    """(uint8 NCHW[block]c input the instruction reads, its channel block): the producer's
    blocks read in place or padded, else the input quantized, padded and packed in one pass."""
    blocks = _producer_blocks(recipe, x, x_blk, padded_width)
    if blocks is not None:
        return blocks
    n, c, h, w_ = recipe.in_shape
    pt, pl, pb, _ = recipe.padding
    # quantize, pad (with the zero point: real 0.0) and pack NCHW -> NCHW[x]c in one pass
    cp = round_up(c, x_blk)
    return te.compute((n, cp // x_blk, h + pt + pb, padded_width, x_blk), lambda b, co, i, j, ci:
                      tirx.if_then_else(
                          tirx.all(i >= pt, i < h + pt, j >= pl, j < w_ + pl,
                                   co * x_blk + ci < c),
                          load_input(x, recipe, (b, co * x_blk + ci, i - pt, j - pl)),
                          pad_value(recipe)), name="xq"), x_blk


def _conv_graph(recipe, blocks, columns):
    """A conv2d over NCHW[x]c input and KCRS[x/word]c[y]k[word]c weights."""
    x_blk, y_blk, word = blocks.x, blocks.y, blocks.word
    acc_t = dtypes(recipe)[2]
    n, c, h, w_ = recipe.in_shape
    k, _, r, s = recipe.w_shape
    (sh, sw), (dh, dw) = recipe.stride, recipe.dilation
    _, pl, _, pr = recipe.padding
    cg, kg = group_channels(recipe)  # a grouped conv's blocks tile its groups (fits_groups)
    cp, kp = round_up(cg, x_blk), round_up(k, y_blk)
    _, oc, oh, ow = recipe.out_shape
    x, w, comp, mult, bias, res = placeholders(
        recipe, in_shape(recipe), (kp // y_blk, cp // x_blk, r, s, x_blk // word, y_blk, word))
    # output columns computed: padded when their count has no divisor a register tile can
    # use and is too wide for one tile (71, 73), the extra columns cropped by the epilogue
    owp = columns(ow, blocks=kp // y_blk, window=r * s > 1)
    xb, ib, col = _conv_columns(recipe, x, x_blk, ow, owp)
    rr, rs = te.reduce_axis((0, r), name="rr"), te.reduce_axis((0, s), name="rs")
    # a 1x1 conv of a one-channel instruction reading channel blocks: the channels as blocks
    # x lanes, so that each input read is affine (rc // ib and rc % ib recomputed per channel
    # spilled a 12-accumulator tile's registers; with a window, the taps innermost under the
    # lanes ran 3x3 convs at 60% against 95%)
    by_block = x_blk == 1 and ib > 1 and r * s == 1 and recipe.groups == 1 and cp % ib == 0
    rcs = ([te.reduce_axis((0, cp // ib), name="rco"), te.reduce_axis((0, ib), name="rci")]
           if by_block else [te.reduce_axis((0, cp), name="rc")])

    def acc_body(b, ko, i, j, ki):
        group = ko // (kg // y_blk) if recipe.groups > 1 else 0  # output block ko's group
        if by_block:
            rc, (blk, lane) = rcs[0] * ib + rcs[1], rcs
        else:
            rc = rcs[0]
            blk, lane = _input_channel(group, rc, cg, ib, recipe.groups)
        return te.sum(
            xb[b, blk, i * sh + rr * dh, col(j) * sw + rs * dw, lane].astype(acc_t)
            * w[ko, rc // x_blk, rr, rs, rc % x_blk // word, ki, rc % word].astype(acc_t),
            axis=[*rcs, rr, rs])

    acc = te.compute((n, kp // y_blk, oh, owp, y_blk), acc_body, name="acc")
    epi = _conv_epilogue(recipe, epilogue_fn(recipe, comp, mult, bias, res), y_blk)
    return _Graph(x, w, comp, mult, bias, res, acc, epi, _window_padding(recipe, xb, x))


def _conv_columns(recipe, x, x_blk, ow, owp):
    """(input, its channel block, column -> input column base) of a conv2d computing `owp`
    output columns where it has `ow`. Where the producer's blocks are read in place at `ow`
    columns, the extra ones re-read the last real column (their results are cropped): a
    wider input would be a copy of it on every call. Elsewhere the input is padded (it is
    copied anyway, with the conv's own padding) and they read zeros."""
    _, _, _, w_ = recipe.in_shape
    _, pl, _, pr = recipe.padding
    (_, sw), (_, dw) = recipe.stride, recipe.dilation
    s = recipe.w_shape[-1]

    def width(columns):
        return max(w_ + pl + pr, (columns - 1) * sw + (s - 1) * dw + 1)

    if owp > ow:
        in_place = _producer_blocks(recipe, x, x_blk, width(ow))
        if in_place is not None and in_place[0] is x:
            return (*in_place, lambda j: tirx.min(j, ow - 1))
    return (*_conv_input(recipe, x, x_blk, width(owp)), lambda j: j)


def _window_padding(recipe, xb, x):
    """The ZeroPadding of a conv2d's input (none unless padding adds nothing, see
    schedules/padding_taps.py): its rows, skipped per window row at run time, and its columns,
    skipped where that is static."""
    if xb is x or not pads_with_zero(recipe):
        return ()
    _, _, h, w_ = recipe.in_shape
    pt, pl, pb, _ = recipe.padding
    rows = (ZeroPadding(xb.op.name, 2, pt, pt + h),) if pt or pb else ()
    return rows + (ZeroPadding(xb.op.name, 3, pl, pl + w_, static_only=True),)


def _width_folded_graph(recipe, blocks, columns):
    """A conv2d (conv3d) over its NCHW (NCDHW) input (quantized and padded, channels not
    padded) whose reduction lanes are `word` neighbouring columns of one channel
    (recipe.folds_width), with KCR[S/word][y]k[word]s (KCTR[S/word][y]k[word]s) weights: an RGB
    stem's 7-column window is two words of four columns (8/7 of its work) instead of 3 channels
    padded to 4 (4/3)."""
    y_blk, word = blocks.y, blocks.word
    acc_t = dtypes(recipe)[2]
    n, c, *extents = recipe.in_shape
    k, _, *window = recipe.w_shape
    rank = len(extents)
    before, after = recipe.padding[:rank], recipe.padding[rank:]
    stride, dilation = recipe.stride, recipe.dilation
    kp, words = round_up(k, y_blk), -(-window[-1] // word)
    owp = columns(recipe.out_shape[-1])
    x, w, comp, mult, bias, res = placeholders(
        recipe, in_shape(recipe), (kp // y_blk, c, *window[:-1], words, y_blk, word))
    # the last word of the last computed column reaches past the window: more padding columns
    padded = [e + b + a for e, b, a in zip(extents, before, after)]
    padded[-1] = max(padded[-1], (owp - 1) * stride[-1] + words * word)

    def xq_body(b, ch, *at):
        inside, at = _unpadded(at, before, extents)
        return tirx.if_then_else(tirx.all(*inside), load_input(x, recipe, (b, ch, *at)),
                                 pad_value(recipe))

    xq = te.compute((n, c, *padded), xq_body, name="xq", varargs_names=list(_SPATIAL[rank]))
    rc = te.reduce_axis((0, c), name="rc")
    taps = [te.reduce_axis((0, e), name=nm) for e, nm in zip(window[:-1], _WINDOW[rank])]
    rg, rl = te.reduce_axis((0, words), name="rg"), te.reduce_axis((0, word), name="rl")

    def acc_body(b, ko, *rest):
        *at, ki = rest
        rows = [o * st + t * dl for o, t, st, dl in zip(at, taps, stride, dilation)]
        col = at[-1] * stride[-1] + rg * word + rl
        return te.sum(xq[(b, rc, *rows, col)].astype(acc_t)
                      * w[(ko, rc, *taps, rg, ki, rl)].astype(acc_t), axis=[rc, *taps, rg, rl])

    acc = te.compute((n, kp // y_blk, *recipe.out_shape[2:-1], owp, y_blk), acc_body,
                     name="acc", varargs_names=[*_SPATIAL[rank], "ki"])
    epi = _conv_epilogue(recipe, epilogue_fn(recipe, comp, mult, bias, res), y_blk)
    return _Graph(x, w, comp, mult, bias, res, acc, epi)


def _conv3d_graph(recipe, blocks, columns):
    """An (ungrouped) conv3d over NCDHW[x]c input (the producer's NCDHW[y]c blocks read in
    place or padded as they are, else the NCDHW input quantized, padded and packed in one
    pass), KCTRS[x/word]c[y]k[word]c weights, NCDHW[y]c accumulators, an NCDHW result (or
    NCDHW[y]c for conv readers)."""
    x_blk, y_blk, word = blocks.x, blocks.y, blocks.word
    acc_t = dtypes(recipe)[2]
    k, _, t, r, s = recipe.w_shape
    (st, sh, sw), (dt, dh, dw) = recipe.stride, recipe.dilation
    cp, kp = round_up(recipe.in_shape[1], x_blk), round_up(k, y_blk)
    n, _, od, oh, ow = recipe.out_shape
    x, w, comp, mult, bias, res = placeholders(
        recipe, in_shape(recipe), (kp // y_blk, cp // x_blk, t, r, s, x_blk // word, y_blk, word))
    owp = columns(ow)  # padded output columns, as for a conv2d
    xq, ib = _conv3d_input(recipe, x, x_blk, (owp - 1) * sw + (s - 1) * dw + 1)
    rc, rt, rr, rs = (te.reduce_axis((0, e), name=nm)
                      for e, nm in ((cp, "rc"), (t, "rt"), (r, "rr"), (s, "rs")))
    acc = te.compute((n, kp // y_blk, od, oh, owp, y_blk), lambda b, ko, z, i, j, ki: te.sum(
        xq[b, rc // ib, z * st + rt * dt, i * sh + rr * dh, j * sw + rs * dw, rc % ib]
        .astype(acc_t)
        * w[ko, rc // x_blk, rt, rr, rs, rc % x_blk // word, ki, rc % word].astype(acc_t),
        axis=[rc, rt, rr, rs]), name="acc")
    epi = _conv_epilogue(recipe, epilogue_fn(recipe, comp, mult, bias, res), y_blk)
    return _Graph(x, w, comp, mult, bias, res, acc, epi, _conv3d_padding(recipe, xq, x))


def _conv3d_padding(recipe, xq, x):
    """The ZeroPadding of a conv3d's input (none unless padding adds nothing, see
    schedules/padding_taps.py): its frames, skipped per tap or per update at run time, and its
    rows, per window row where the tile's rows run outside it. Not its columns: with the frames
    tested per update (a tile over two frames) the unrolled column taps made a 7x7 layer 1.7x
    slower, and where they stayed constant they gained nothing (measured on Zen 4)."""
    if xq is x or not pads_with_zero(recipe):
        return ()
    _, _, d, h, _ = recipe.in_shape
    pf, pt = recipe.padding[:2]
    return (ZeroPadding("xq", 2, pf, pf + d, per_update=True), ZeroPadding("xq", 3, pt, pt + h))


def _conv3d_input(recipe, x, x_blk, min_width):
    """(uint8 NCDHW[block]c input a conv3d's instruction reads, its channel block): the
    producer's blocks (`_producer_blocks`), else the NCDHW input quantized, padded and packed
    to NCDHW[x_blk]c in one pass."""
    n, c, d, h, w_ = recipe.in_shape
    pf, pt, pl, pk, pb, pr = recipe.padding
    wp = max(w_ + pl + pr, min_width)
    blocks = _producer_blocks(recipe, x, x_blk, wp)
    if blocks is not None:
        return blocks

    def pack_body(b, co, z, i, j, ci):
        ch = co * x_blk + ci
        inside, at = _unpadded((z, i, j), (pf, pt, pl), (d, h, w_))
        return tirx.if_then_else(tirx.all(*inside, ch < c),
                                 load_input(x, recipe, (b, tirx.min(ch, c - 1), *at)),
                                 pad_value(recipe))

    return te.compute((n, round_up(c, x_blk) // x_blk, d + pf + pk, h + pt + pb, wp, x_blk),
                      pack_body, name="xq"), x_blk


def _input_channel(group, rc, cg, ib, groups):
    """(block, lane) in NCHW[ib]c of input channel group * cg + rc, written so that TVM's
    tensorize sees a dense run of lanes: a group inside one block (ib a multiple of cg) or
    whole blocks per group (cg a multiple of ib) have indices without a division of a sum."""
    if groups == 1:
        return rc // ib, rc % ib
    if ib % cg == 0:
        per_block = ib // cg
        return group // per_block, group % per_block * cg + rc
    if cg % ib == 0:
        return group * (cg // ib) + rc // ib, rc % ib
    ch = group * cg + rc
    return ch // ib, ch % ib


def _dense_graph(recipe, blocks, columns):
    """A dense layer over [rows, K] input and N[x/word]k[y]n[word]k weights."""
    x_blk, y_blk, word = blocks.x, blocks.y, blocks.word
    acc_t, pad = dtypes(recipe)[2], pad_value(recipe)
    m, kk = recipe.in_shape
    nn_ = recipe.out_channels
    kp, np_ = round_up(kk, x_blk), round_up(nn_, y_blk)
    # rows computed: padded like a conv's output columns when their count has no divisor a
    # register tile can use (197 tokens -> 198: a one-row tile ran at 35% of peak), or, where
    # the tile reuses operands, for 12 accumulators (128 rows -> 132 for 6 rows x 2 blocks of
    # 256); the rows' loop runs outside the column blocks'
    mp = columns(m, blocks=np_ // y_blk, columns_inner=False)
    x, w, comp, mult, bias, res = placeholders(
        recipe, recipe.in_shape, dense_weight_shape(nn_, kk, blocks))
    xq = te.compute((mp, kp), lambda i, j: tirx.if_then_else(
        tirx.all(j < kk, i < m),
        load_input(x, recipe, (tirx.min(i, m - 1), tirx.min(j, kk - 1))), pad), name="xq")
    r = te.reduce_axis((0, kp), name="k")
    panel = blocks.panel

    def weight(j, r):
        inner = (r % x_blk // word, j % y_blk, r % word)
        if panel == 1:
            return w[(j // y_blk, r // x_blk, *inner)]
        return w[(j // (y_blk * panel), r // x_blk, j // y_blk % panel, *inner)]

    acc = te.compute((mp, np_), lambda i, j: te.sum(
        xq[i, r].astype(acc_t) * weight(j, r).astype(acc_t), axis=r), name="acc")
    fn = epilogue_fn(recipe, comp, mult, bias, res)
    return _Graph(x, w, comp, mult, bias, res, acc, lambda value, idx: fn(value(idx), idx[-1], idx))


def _bmm_graph(recipe, blocks, columns):
    """A matmul of two activations per batch row: x [B, M, K] quantized to uint8 and the int8
    y [B, K, N] (qbmm.quantized_y) packed to [B, N/y, K/x, x/word, y, word] inside the kernel
    (both change every call), rows padded like a dense layer's; bf16: both float32, rounded to
    bf16 as they are packed."""
    x_blk, y_blk, word = blocks.x, blocks.y, blocks.word
    acc_t, pad = dtypes(recipe)[2], pad_value(recipe)
    nb, m, kk = recipe.in_shape
    nn_ = recipe.out_channels
    kp, np_, mp = round_up(kk, x_blk), round_up(nn_, y_blk), columns(m)
    x, y, comp, mult, bias, res = placeholders(recipe, in_shape(recipe), w_arg_shape(recipe))
    x_at = operand_at(x, recipe.x_view, recipe.in_shape)
    y_at = operand_at(y, recipe.w_view, recipe.w_shape)
    zero = tirx.const(0.0, "float32").astype(dtypes(recipe)[1])
    xq = te.compute((nb, mp, kp), lambda b, i, j: tirx.if_then_else(
        tirx.all(j < kk, i < m),
        load_input(x_at, recipe, (b, tirx.min(i, m - 1), tirx.min(j, kk - 1))), pad), name="xq")

    def yq_body(b, jo, ro, rw, ji, rr):
        r, j = ro * x_blk + rw * word + rr, jo * y_blk + ji
        value = second_operand(y_at(b, tirx.min(r, kk - 1), tirx.min(j, nn_ - 1)), recipe)
        return tirx.if_then_else(tirx.all(r < kk, j < nn_), value, zero)

    yq = te.compute((nb, np_ // y_blk, kp // x_blk, x_blk // word, y_blk, word), yq_body,
                    name="yq")
    r = te.reduce_axis((0, kp), name="k")
    acc = te.compute((nb, mp, np_), lambda b, i, j: te.sum(
        xq[b, i, r].astype(acc_t)
        * yq[b, j // y_blk, r // x_blk, r % x_blk // word, j % y_blk, r % word].astype(acc_t),
        axis=r), name="acc")
    fn = epilogue_fn(recipe, comp, mult, bias, res)

    def epilogue(value, idx):  # idx: of the output, whose axes may be permuted (out_axes)
        at = logical_index(recipe, idx)
        return fn(value(at), at[-1], at)

    return _Graph(x, y, comp, mult, bias, res, acc, epilogue)


def _conv_epilogue(recipe, fn, y_blk):
    """epilogue fn of prepare for a conv whose accumulators are NCHW[y_blk]c (NCDHW[y_blk]c):
    the output is NCHW, or NCHW[out_block]c read in place (out_block must then be y_blk)."""
    ob = recipe.out_block
    if ob and ob != y_blk:
        # one output block would mix accumulator blocks; TVM's reverse_compute_at then
        # derives a wrong per-tile loop nest (a wrong result, seen with 8-lane accumulators
        # under a 16-channel output block), so the output block follows the instruction
        raise ValueError(f"output block {ob} differs from the instruction's {y_blk} channels")

    def epi(value, idx):
        if ob:
            # the same blocking as the accumulators: read in place
            return packed_output(recipe, fn, lambda *at: value(at[:-1]))(*idx)
        return fn(value(blocked_index(idx, y_blk)), idx[1], idx)

    return epi


def _depthwise_graph(recipe, intrin):
    """(x, w, comp, mult, bias, residual, acc) of a depthwise conv for a lanewise instruction:
    the input quantized, padded and packed to NCHW[lanes]c with room for the padded taps, the
    window's taps along the width as the instruction's reduction (zero weights past the last tap),
    accumulators NCHW[lanes]c."""
    _, y_blk = intrin.channel_blocks
    width = intrin.reduction_width
    n, c, h, w_ = recipe.in_shape
    k, _, r, s = recipe.w_shape
    (sh, sw), (dh, dw) = recipe.stride, recipe.dilation
    if dw != 1:
        raise ValueError(f"dilated depthwise window (dilation {dw} along the width): the "
                         f"instruction reads {width} neighbouring pixels")
    pt, pl, pb, pr = recipe.padding
    _, _, oh, ow = recipe.out_shape
    taps = round_up(s, width)
    kp = round_up(k, y_blk)
    x, w, comp, mult, bias, res = placeholders(
        recipe, in_shape(recipe), (kp // y_blk, r, taps // width, y_blk, width))
    # the padded taps of the last output column read up to taps - s pixels past the window
    wpd = max(w_ + pl + pr, (ow - 1) * sw + taps)

    def xq_body(b, co, i, j, ci):
        inside = [i >= pt, i < h + pt, j >= pl, j < w_ + pl] + ([co * y_blk + ci < c] if c % y_blk
                                                               else [])
        if recipe.in_block == y_blk:  # the producer's blocks: read in place, vectorises
            value = quantized(x(b, co, i - pt, j - pl, ci), recipe)
        else:
            value = load_input(x, recipe, (b, co * y_blk + ci, i - pt, j - pl))
        return tirx.if_then_else(tirx.all(*inside), value, pad_value(recipe))

    xq = te.compute((n, kp // y_blk, h + pt + pb, wpd, y_blk), xq_body, name="xq")
    rr, rs = te.reduce_axis((0, r), name="rr"), te.reduce_axis((0, taps), name="rs")
    acc_t = dtypes(recipe)[2]
    acc = te.compute((n, kp // y_blk, oh, ow, y_blk), lambda b, ko, i, j, ki: te.sum(
        xq[b, ko, i * sh + rr * dh, j * sw + rs, ki].astype(acc_t)
        * w[ko, rr, rs // width, ki, rs % width].astype(acc_t), axis=[rr, rs]), name="acc")
    return x, w, comp, mult, bias, res, acc
