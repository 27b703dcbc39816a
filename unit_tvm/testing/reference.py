"""numpy references for the workloads in unit_tvm.ops (exact for integer data via float64)."""

import numpy as np

from ..relax.core.recipe import Blocks
from ..relax.cpu import weights


def pack_dense_weight(b, lanes=16, width=4):
    """[n, k] -> [n/lanes, k/width, width/4, lanes, 4] (the layout ops.dense_packed reads; the
    graph pass's own packing, relax.weights)."""
    return weights.pack_dense_weight(b, Blocks(width, lanes, 4))


def pack_nchwc(data, x=4):
    """[n, c, h, w] -> [n, c/x, h, w, x]; any number of spatial axes ([n, c, d, h, w] too)."""
    n, c, *spatial = data.shape
    order = (0, 1, *range(3, 3 + len(spatial)), 2)
    return np.ascontiguousarray(data.reshape(n, c // x, x, *spatial).transpose(order))


def unpack_nchwc(out):
    """[n, c/y, h, w, y] -> [n, c, h, w]; any number of spatial axes."""
    n, co, *spatial, y = out.shape
    order = (0, 1, 2 + len(spatial), *range(2, 2 + len(spatial)))
    return np.ascontiguousarray(out.transpose(order).reshape(n, co * y, *spatial))


def pack_kcrs(weight, y=16, x=4):
    """[k, c, r, s] -> [k/y, c/x, r, s, x/4, y, 4] (the layout ops.conv2d_nchwc reads; the
    graph pass's own packing, relax.weights)."""
    return weights.pack_conv_weight(weight, Blocks(x, y, 4))


def pack_folded_kernel(weight, fold="s", x=64, y=16):
    """[k, c, r, s] -> the kernel of ops.conv2d_window_folded: the reduction in (r,) s, c order
    (as its im2col buffer holds it), zero-padded to a multiple of x, blocked [k/y, (r,) KK/x,
    x/4, y, 4]."""
    k, c, r, s = weight.shape
    taps = weight.transpose(0, 2, 3, 1)  # k r s c
    flat = taps.reshape(k, r, s * c) if fold == "s" else taps.reshape(k, r * s * c)
    kk = -(-flat.shape[-1] // x) * x
    flat = np.concatenate([flat, np.zeros(flat.shape[:-1] + (kk - flat.shape[-1],), weight.dtype)],
                          axis=-1)
    lead = flat.shape[1:-1]  # (r,) for "s", () for "rs"
    blocked = flat.reshape((k // y, y) + lead + (kk // x, x // 4, 4))
    n = len(lead)
    order = (0, *range(2, 2 + n), 2 + n, 3 + n, 1, 4 + n)
    return np.ascontiguousarray(blocked.transpose(order))


def dense(a, b):
    """a [m, k] @ b[n, k]^T, exact int64 for int8 data."""
    return (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.int64)


def conv2d_nchw(data, weight, stride=1, dilation=1):
    """Direct conv2d without padding, NCHW x KCRS -> NKHW, exact int64 for int8 data."""
    n, c, h, w = data.shape
    k, _, r, s = weight.shape
    oh = (h - (r - 1) * dilation - 1) // stride + 1
    ow = (w - (s - 1) * dilation - 1) // stride + 1
    out = np.zeros((n, k, oh, ow), np.float64)
    d64 = data.astype(np.float64)
    w64 = weight.astype(np.float64)
    for i in range(r):
        for j in range(s):
            patch = d64[:, :, i * dilation: i * dilation + (oh - 1) * stride + 1: stride,
                        j * dilation: j * dilation + (ow - 1) * stride + 1: stride]
            out += np.einsum("nchw,kc->nkhw", patch, w64[:, :, i, j], optimize=True)
    return out.astype(np.int64)
