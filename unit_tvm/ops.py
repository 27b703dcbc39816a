"""Tensor operations written with te.compute: the workloads of make run, tests and benchmarks.

Nothing here is special to the Inspector: it accepts any te.compute; these are just the layouts
a quantized model uses (activations u8, weights s8, NCHW[x]c / KCRS[y]k[x]c packing).
"""

from tvm import te, tirx


def dense_packed(m, n, k, lanes=16, width=4, a_dtype="uint8", b_dtype="int8", acc="int32",
                 word=4):
    """C[i, j] = sum_k A[i, k] * B[j, k], B packed as [n/lanes, k/width, width/word, lanes,
    word].

    Each group of `word` reduction elements of one output column is adjacent: what vpdpbusd
    (width 4, word 4), vpmaddwd (2, 2) and AMX tdpbusd (width 64, 16 rows of 16 x 4) read.
    """
    a = te.placeholder((m, k), a_dtype, name="A")
    b = te.placeholder((n // lanes, k // width, width // word, lanes, word), b_dtype, name="B")
    r = te.reduce_axis((0, k), name="k")
    return te.compute(
        (m, n),
        lambda i, j: te.sum(
            a[i, r].astype(acc)
            * b[j // lanes, r // width, r % width // word, j % lanes, r % word].astype(acc),
            axis=r),
        name="dense",
    )


def dense(m, n, k, a_dtype="uint8", b_dtype="int8", acc="int32"):
    """C[i, j] = sum_k A[i, k] * B[j, k] (B row-major [n, k], as in nn.Linear)."""
    a = te.placeholder((m, k), a_dtype, name="A")
    b = te.placeholder((n, k), b_dtype, name="B")
    r = te.reduce_axis((0, k), name="k")
    return te.compute((m, n), lambda i, j: te.sum(a[i, r].astype(acc) * b[j, r].astype(acc),
                                                  axis=r), name="dense")


def conv2d_nchwc(n, c, h, w, k, r, s, stride=1, dilation=1, x=4, y=16,
                 a_dtype="uint8", b_dtype="int8", acc="int32", word=4):
    """conv2d, data NCHW[x]c, kernel KCRS[x/word]c[y]k[word]c, output NCHW[y]c, no padding.

    data: [n, c/x, h, w, x]; kernel: [k/y, c/x, r, s, x/word, y, word] (each group of `word`
    input channels of one output channel adjacent: what vpdpbusd (x=4, word 4), vpmaddwd (2, 2)
    and AMX tdpbusd (x=64, word 4) read); out: [n, k/y, oh, ow, y].
    """
    oh = (h - (r - 1) * dilation - 1) // stride + 1
    ow = (w - (s - 1) * dilation - 1) // stride + 1
    data = te.placeholder((n, c // x, h, w, x), a_dtype, name="data")
    kern = te.placeholder((k // y, c // x, r, s, x // word, y, word), b_dtype, name="kernel")
    rc = te.reduce_axis((0, c), name="rc")
    rr = te.reduce_axis((0, r), name="rr")
    rs = te.reduce_axis((0, s), name="rs")
    return te.compute(
        (n, k // y, oh, ow, y),
        lambda b, ko, i, j, ki: te.sum(
            data[b, rc // x, i * stride + rr * dilation, j * stride + rs * dilation, rc % x]
            .astype(acc)
            * kern[ko, rc // x, rr, rs, rc % x // word, ki, rc % word].astype(acc),
            axis=[rc, rr, rs]),
        name="conv2d_nchwc",
    )


def conv3d_ncdhwc(c, d, h, k, r, stride=1, x=4, y=16, a_dtype="uint8", b_dtype="int8",
                  acc="int32", word=4):
    """conv3d, batch 1, cubic window r and extents d x h x h, data NCDHW[x]c, kernel
    KCTRS[x/word]c[y]k[word]c, output NCDHW[y]c, no padding (pad the input to pad the conv).

    data: [1, c/x, d, h, h, x]; kernel: [k/y, c/x, r, r, r, x/word, y, word]; out: [1, k/y, od,
    oh, oh, y]: the blocked layouts of conv2d_nchwc with a depth axis.
    """
    od, oh = (d - r) // stride + 1, (h - r) // stride + 1
    data = te.placeholder((1, c // x, d, h, h, x), a_dtype, name="data")
    kern = te.placeholder((k // y, c // x, r, r, r, x // word, y, word), b_dtype, name="kernel")
    rc = te.reduce_axis((0, c), name="rc")
    rt, rr, rs = (te.reduce_axis((0, r), name=n) for n in ("rt", "rr", "rs"))
    return te.compute(
        (1, k // y, od, oh, oh, y),
        lambda b, ko, z, i, j, ki: te.sum(
            data[b, rc // x, z * stride + rt, i * stride + rr, j * stride + rs, rc % x]
            .astype(acc)
            * kern[ko, rc // x, rt, rr, rs, rc % x // word, ki, rc % word].astype(acc),
            axis=[rc, rt, rr, rs]),
        name="conv3d_ncdhwc",
    )


def _round_up(n, m):
    return -(-n // m) * m


def conv2d_window_folded(c, h, k, r, stride=1, fold="s", x=64, y=16, rows=16,
                         a_dtype="uint8", b_dtype="int8", acc="int32"):
    """conv2d (batch 1, square, no padding) whose window is folded into one reduction, as oneDNN
    does for narrow-channel convs: data NHWC, read through an im2col buffer made in the kernel.

    fold "s": cols[h, ow, (s, c)] (the window's columns and the channels, S*C bytes contiguous per
    output pixel); the window's rows stay a reduction loop. Wins where C is not a multiple of the
    instruction's reduction (80 channels: 240 of 256 used instead of 80 of 128).
    fold "rs": cols[(oh, ow), (r, s, c)] (full im2col; the conv is then a GEMM). Wins where an
    output row is short (OW=17: 289 pixels in 19 tiles of 16 instead of 17 rows of 32).
    The reduction is zero-padded to a multiple of x and the pixel rows to a multiple of `rows`
    inside cols, so the instruction reads cols in place. kernel: [k/y, r, KK/x, x/4, y, 4] ("s")
    or [k/y, KK/x, x/4, y, 4] ("rs"), KK the padded reduction (reference.pack_folded_kernel); output
    NCHW[y]c as [1, k/y, oh, ow, y] ("s") or [1, k/y, oh*ow, y] ("rs").
    """
    if fold not in ("s", "rs"):
        raise ValueError(f"fold must be 's' or 'rs', not {fold!r}")
    o = (h - r) // stride + 1
    data = te.placeholder((1, h, h, c), a_dtype, name="data")
    zero = tirx.const(0, a_dtype)
    if fold == "s":
        kk_n = _round_up(r * c, x)
        # indices are clamped as well as guarded: a vectorised guard may read both branches
        cols = te.compute(
            (h, _round_up(o, rows), kk_n),
            lambda hh, j, q: tirx.if_then_else(
                tirx.all(j < o, q < r * c),
                data[0, hh, tirx.min(j, o - 1) * stride + tirx.min(q, r * c - 1) // c, q % c],
                zero),
            name="cols")
        kern = te.placeholder((k // y, r, kk_n // x, x // 4, y, 4), b_dtype, name="kernel")
        rr = te.reduce_axis((0, r), name="rr")
        q = te.reduce_axis((0, kk_n), name="q")
        return te.compute(
            (1, k // y, o, o, y),
            lambda b, ko, i, j, ki: te.sum(
                cols[i * stride + rr, j, q].astype(acc)
                * kern[ko, rr, q // x, q % x // 4, ki, q % 4].astype(acc), axis=[rr, q]),
            name="conv2d_folded")
    kk_n = _round_up(r * r * c, x)
    p_n = o * o

    def col(p, q):
        pc, qc = tirx.min(p, p_n - 1), tirx.min(q, r * r * c - 1)
        return tirx.if_then_else(
            tirx.all(p < p_n, q < r * r * c),
            data[0, pc // o * stride + qc // (r * c), pc % o * stride + qc // c % r, qc % c], zero)

    cols = te.compute((_round_up(p_n, rows), kk_n), col, name="cols")
    kern = te.placeholder((k // y, kk_n // x, x // 4, y, 4), b_dtype, name="kernel")
    q = te.reduce_axis((0, kk_n), name="q")
    return te.compute(
        (1, k // y, p_n, y),
        lambda b, ko, p, ki: te.sum(
            cols[p, q].astype(acc) * kern[ko, q // x, q % x // 4, ki, q % 4].astype(acc), axis=q),
        name="conv2d_folded")


def matmul_bt(m, n, k, a="uint8", b="int8", acc="int32"):
    """C[i, j] = sum A[i, k] * B[j, k]  (B as nn.Linear weight)."""
    return dense(m, n, k, a, b, acc)


def matmul_bn(m, n, k, a="uint8", b="int8", acc="int32"):
    """C[i, j] = sum A[i, k] * B[k, j]  (B row-major K x N)."""
    A = te.placeholder((m, k), a, name="A")
    B = te.placeholder((k, n), b, name="B")
    r = te.reduce_axis((0, k), name="k")
    return te.compute((m, n), lambda i, j: te.sum(
        A[i, r].astype(acc) * B[r, j].astype(acc), axis=r), name="matmul")


def batch_matmul(bs, m, n, k, a="uint8", b="int8", acc="int32"):
    """C[z, i, j] = sum A[z, i, k] * B[z, j, k]."""
    A = te.placeholder((bs, m, k), a, name="A")
    B = te.placeholder((bs, n, k), b, name="B")
    r = te.reduce_axis((0, k), name="k")
    return te.compute((bs, m, n), lambda z, i, j: te.sum(
        A[z, i, r].astype(acc) * B[z, j, r].astype(acc), axis=r), name="batch_matmul")


def conv1d_ncw(c, w, k, s, a="uint8", b="int8"):
    """conv1d, NCW x KCS, batch 1, no padding."""
    data = te.placeholder((1, c, w), a, name="data")
    kern = te.placeholder((k, c, s), b, name="kernel")
    rc = te.reduce_axis((0, c), name="rc")
    rs = te.reduce_axis((0, s), name="rs")
    return te.compute((1, k, w - s + 1), lambda n, f, x: te.sum(
        data[n, rc, x + rs].astype("int32") * kern[f, rc, rs].astype("int32"), axis=[rc, rs]),
        name="conv1d")


def conv2d_nchw(c, h, k, r, stride=1, dilation=1, groups=1, a="uint8", b="int8", acc="int32"):
    """conv2d, NCHW x KCRS (grouped when groups > 1), batch 1, square, no padding."""
    oh = (h - (r - 1) * dilation - 1) // stride + 1
    cg = c // groups
    data = te.placeholder((1, c, h, h), a, name="data")
    kern = te.placeholder((k, cg, r, r), b, name="kernel")
    rc = te.reduce_axis((0, cg), name="rc")
    ry = te.reduce_axis((0, r), name="ry")
    rx = te.reduce_axis((0, r), name="rx")
    kg = k // groups

    def channel(f, rc):
        return f // kg * cg + rc if groups > 1 else rc

    return te.compute((1, k, oh, oh), lambda n, f, y, x: te.sum(
        data[n, channel(f, rc), y * stride + ry * dilation,
             x * stride + rx * dilation].astype(acc)
        * kern[f, rc, ry, rx].astype(acc), axis=[rc, ry, rx]), name="conv2d")


def conv2d_nhwc(c, h, k, r, a="uint8", b="int8", out="int32", stride=1):
    """conv2d, NHWC x RSCK (HWIO), batch 1, square, no padding, accumulated in `out`."""
    data = te.placeholder((1, h, h, c), a, name="data")
    kern = te.placeholder((r, r, c, k), b, name="kernel")
    rc = te.reduce_axis((0, c), name="rc")
    ry = te.reduce_axis((0, r), name="ry")
    rx = te.reduce_axis((0, r), name="rx")
    o = (h - r) // stride + 1
    return te.compute((1, o, o, k), lambda n, y, x, f: te.sum(
        data[n, y * stride + ry, x * stride + rx, rc].astype(out)
        * kern[ry, rx, rc, f].astype(out),
        axis=[rc, ry, rx]), name="conv2d_nhwc")


def conv3d_ncdhw(c, d, k, r, a="uint8", b="int8"):
    """conv3d, NCDHW x KCTRS, batch 1, cubic, no padding."""
    data = te.placeholder((1, c, d, d, d), a, name="data")
    kern = te.placeholder((k, c, r, r, r), b, name="kernel")
    rc = te.reduce_axis((0, c), name="rc")
    rz, ry, rx = (te.reduce_axis((0, r), name=n) for n in ("rz", "ry", "rx"))
    o = d - r + 1
    return te.compute((1, k, o, o, o), lambda n, f, z, y, x: te.sum(
        data[n, rc, z + rz, y + ry, x + rx].astype("int32")
        * kern[f, rc, rz, ry, rx].astype("int32"), axis=[rc, rz, ry, rx]), name="conv3d")
