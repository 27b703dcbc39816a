"""Weights in numpy, laid out as the kernels of a recipe read them: the plain int8 loop nest's
layout, and the packed layouts of the tensorized kernels."""

import numpy as np

from ...shift import SHIFT
from ..core.recipe import CONV_KINDS, Blocks, folds_width, is_depthwise

def rebased_comp(comp, w):
    """The zero-point term of an op whose activation is re-based to int8 (x - 128): the
    kernel's sums are short of the u8 ones by 128 * sum(w) per output channel (exact in int32:
    |sum(w)| <= 127 * K), so the term it subtracts shrinks by as much."""
    wsum = w.reshape(w.shape[0], -1).astype(np.int64).sum(axis=1)
    return (comp.astype(np.int64) - SHIFT * wsum).astype(np.int32)


def plain_weight_shape(recipe):
    """Weight layout of plain_func: [K, C/groups, R, S] (KCTRS, or [N, K]); KCRS[b]k with
    b = out_block on a packed edge, so that its lanes are output channels like the
    accumulators'."""
    ob = recipe.out_block
    if not ob:
        return recipe.w_shape
    k, cg, *window = recipe.w_shape
    return [-(-k // ob), cg, *window, ob]


def plain_weight(recipe, w):
    """int8 (bf16) weights [K, C/groups, R, S] (KCTRS) -> plain_weight_shape(recipe),
    zero-padded."""
    ob = recipe.out_block
    if not ob:
        return w
    k, *rest = w.shape  # rest: C/groups and the window
    wp = np.zeros((_round_up(k, ob), *rest), w.dtype)
    wp[:k] = w
    order = (0, *range(2, 2 + len(rest)), 1)
    return np.ascontiguousarray(wp.reshape(-1, ob, *rest).transpose(order))


def _round_up(v, m):
    return -(-v // m) * m


def pack_weight(recipe, w, blocks: Blocks):
    """int8 (bf16) weights -> the packed layout of ops.conv2d_nchwc / ops.dense_packed,
    KCRS[x/word]c[y]k[word]c (word: the instruction's weight_word), zero-padded; a depthwise
    conv's (x: taps per instruction) as KR[S/x][y]k[x]s."""
    x, y = blocks.x, blocks.y
    if is_depthwise(recipe):
        # KR[S/x][y]k[x]s (x: the instruction's taps): per channel block and kernel row, x taps
        # of each channel together, padded with zero weights (the extra taps add nothing)
        k, _, r, s = w.shape
        taps = _round_up(s, x)
        wp = np.zeros((_round_up(k, y), r, taps), w.dtype)
        wp[:k, :, :s] = w[:, 0]
        wp = wp.reshape(-1, y, r, taps // x, x)
        return np.ascontiguousarray(wp.transpose(0, 2, 3, 1, 4))
    if folds_width(recipe, blocks):
        return pack_width_folded_weight(w, blocks)
    if recipe.kind in CONV_KINDS:
        return pack_conv_weight(w, blocks)
    return pack_dense_weight(w, blocks)


def pack_conv_weight(w, blocks: Blocks):
    """KCRS -> KCRS[x/word]c[y]k[word]c, zero-padded to whole blocks (ops.conv2d_nchwc); a
    conv3d's KCTRS the same way, with its window's three axes (ops.conv3d_ncdhwc)."""
    x, y, word = blocks.x, blocks.y, blocks.word
    k, c, *window = w.shape
    kp, cp = _round_up(k, y), _round_up(c, x)
    wp = np.zeros((kp, cp, *window), w.dtype)
    wp[:k, :c] = w
    wp = wp.reshape(kp // y, y, cp // x, x // word, word, *window)
    window_axes = tuple(range(5, 5 + len(window)))
    return np.ascontiguousarray(wp.transpose((0, 2) + window_axes + (3, 1, 4)))


def pack_width_folded_weight(w, blocks: Blocks):
    """KCRS -> KCR[S/word][y]k[word]s (KCTRS -> KCTR[S/word][y]k[word]s) for a conv whose
    reduction lanes are a word of window columns (recipe.folds_width): zero weights past the
    window's last column and the last output channel."""
    y, word = blocks.y, blocks.word
    k, c, *window = w.shape
    kp, sp = _round_up(k, y), _round_up(window[-1], word)
    wp = np.zeros((kp, c, *window[:-1], sp), w.dtype)
    wp[:k, ..., :window[-1]] = w
    wp = wp.reshape(kp // y, y, c, *window[:-1], sp // word, word)
    rows = tuple(range(3, 2 + len(window)))  # the window's axes before its columns
    last = 2 + len(window)  # the column words
    return np.ascontiguousarray(wp.transpose((0, 2) + rows + (last, 1, last + 1)))


def pack_dense_weight(w, blocks: Blocks):
    """[N, K] -> [N/y, K/x, x/word, y, word] (ops.dense_packed), or with blocks.panel = p > 1
    [N/(y p), K/x, p, x/word, y, word]: p blocks of columns interleaved per reduction step;
    zero-padded to whole blocks."""
    x, y, word, panel = blocks
    n, kk = w.shape
    np_, kp = _round_up(n, y), _round_up(kk, x)
    if np_ // y % panel:
        raise ValueError(f"a panel of {panel} blocks does not divide {np_ // y} blocks of {y}")
    wp = np.zeros((np_, kp), w.dtype)
    wp[:n, :kk] = w
    return np.ascontiguousarray(
        wp.reshape(np_ // (y * panel), panel, y, kp // x, x // word, word)
        .transpose(0, 3, 1, 4, 2, 5).reshape(dense_weight_shape(n, kk, blocks)))


def dense_weight_shape(n: int, k: int, blocks: Blocks) -> tuple[int, ...]:
    """The packed shape pack_dense_weight gives an [n, k] weight: the panel axis appears only
    where it is more than one block."""
    x, y, word, panel = blocks
    np_, kp = _round_up(n, y), _round_up(k, x)
    if panel == 1:
        return (np_ // y, kp // x, x // word, y, word)
    return (np_ // (y * panel), kp // x, panel, x // word, y, word)
