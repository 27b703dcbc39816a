"""Benchmark workloads: UNIT's Table I convs, the GEMMs and ResNet-18-3D's convs, each in the
layout an instruction reads, with their operation counts. Shared by the op benchmarks, the
reproduction figures and the tests."""

from typing import NamedTuple

from .. import ops
from ..relax.cpu.tensorize import taps_inside

# UNIT Table I: C, input H=W, K, R=S, stride (batch 1, no padding)
TABLE_I = [(288, 35, 384, 3, 2), (160, 9, 224, 3, 1), (1056, 7, 192, 1, 1), (80, 73, 192, 3, 1),
           (128, 16, 128, 3, 1), (192, 16, 192, 3, 1), (256, 16, 256, 3, 1), (1024, 14, 512, 1, 1),
           (128, 16, 160, 3, 1), (576, 14, 192, 1, 1), (96, 16, 128, 3, 1), (1024, 14, 256, 1, 1),
           (576, 14, 128, 1, 1), (64, 29, 96, 3, 1), (64, 56, 128, 1, 2), (608, 14, 192, 1, 1)]
GEMMS = [(1024, 1024, 1024), (4096, 4096, 4096), (128, 2048, 4096), (320, 3072, 4096),
         (2048, 4096, 32)]
# ResNet-18 with every conv turned 3D (UNIT Fig. 13), a 16-frame clip (torchvision's r3d_18
# clip length) at the first stage; stride 2 halves depth, height and width; 3x3x3 convs padded by
# 1 (the input handed over pre-padded, as the graph pass pads in the producer), the 1x1x1
# projections not. The 7x7 stem (3 channels) is left out, as Table I leaves stems out.
# C, input D, input H=W, K, R, stride.
RESNET18_3D = [(64, 16, 56, 64, 3, 1), (64, 16, 56, 128, 3, 2), (64, 16, 56, 128, 1, 2),
               (128, 8, 28, 128, 3, 1), (128, 8, 28, 256, 3, 2), (128, 8, 28, 256, 1, 2),
               (256, 4, 14, 256, 3, 1), (256, 4, 14, 512, 3, 2), (256, 4, 14, 512, 1, 2),
               (512, 2, 7, 512, 3, 1)]
# ResNet-18's distinct convs at batch 1 as its layers pad them: C, input H=W, K, R, stride,
# padding, and how often the model runs each (the GPU config study's model layers)
RESNET18_CONVS = [(3, 224, 64, 7, 2, 3, 1), (64, 56, 64, 3, 1, 1, 4), (64, 56, 128, 3, 2, 1, 1),
                  (64, 56, 128, 1, 2, 0, 1), (128, 28, 128, 3, 1, 1, 3),
                  (128, 28, 256, 3, 2, 1, 1), (128, 28, 256, 1, 2, 0, 1),
                  (256, 14, 256, 3, 1, 1, 3), (256, 14, 512, 3, 2, 1, 1),
                  (256, 14, 512, 1, 2, 0, 1), (512, 7, 512, 3, 1, 1, 3)]


class MatmulShape(NamedTuple):
    """A model's matmul on the GPU path: A[batch..., m, k] x B[batch..., k, n] (batch () for a
    dense layer by its weight), and how often the model runs it."""

    batch: tuple
    m: int
    n: int
    k: int
    count: int = 1


# BERT-base's matmuls at 128 tokens (the GPU config study's transformer layers): the fused
# Q/K/V projection, the output projection, the FFN's two, then the attention's scores and
# weighted sum over 12 heads, each run once per layer
BERT_MATMULS = [MatmulShape((), 128, 2304, 768, 12), MatmulShape((), 128, 768, 768, 12),
                MatmulShape((), 128, 3072, 768, 12), MatmulShape((), 128, 768, 3072, 12),
                MatmulShape((12,), 128, 128, 64, 12), MatmulShape((12,), 128, 64, 128, 12)]
ONLY = ("conv", "gemm", "conv3d")


def workloads(quick=False, only=None):
    """[(label, kind, params)]: Table I convs and the GEMMs (only: "conv" or "gemm"), or the
    ResNet-18-3D convs (only="conv3d"); quick keeps 4 convs, 1 GEMM or 3 conv3d layers."""
    if only not in (None, *ONLY):
        raise ValueError(f"only must be one of {', '.join(ONLY)}, not {only!r}")
    if only == "conv3d":
        layers = [(f"R3D-{i + 1}", "conv3d", p) for i, p in enumerate(RESNET18_3D)]
        return layers[:3] if quick else layers
    convs = [(f"L{i + 1}", "conv", p) for i, p in enumerate(TABLE_I)]
    gemms = [(f"GEMM {m}x{n}x{k}", "gemm", (m, n, k)) for m, n, k in GEMMS]
    if quick:
        convs, gemms = convs[4:8], gemms[:1]
    return (convs if only != "gemm" else []) + (gemms if only != "conv" else [])


def form(kind, p, intrin):
    """How a workload is laid out for an instruction: "gemm"; for a conv "folded" (a tile
    instruction on a window wider than 1: the window's columns and the channels are one
    reduction read through an in-kernel im2col buffer, ops.conv2d_window_folded), "flat" (a 1x1
    stride-1 conv: its pixels are one row of NCHW[x]c, the same bytes) or "direct"."""
    if kind == "conv3d":
        return "direct"
    if kind != "conv":
        return "gemm"
    _, _, _, r, s = p
    if r > 1 and intrin.tile:
        return "folded"
    return "flat" if r == 1 and s == 1 else "direct"


def workload_op(kind, p, intrin):
    """The workload in the layout the instruction reads (see `form`), channels zero-padded to a
    multiple of its reduction block x, output channels blocked by its columns y."""
    x, y = intrin.channel_blocks
    word = intrin.weight_word
    layout = form(kind, p, intrin)
    if kind == "conv3d":
        c, d, h, k, r, stride = p
        pad = 2 * (r // 2)
        return ops.conv3d_ncdhwc(-(-c // x) * x, d + pad, h + pad, k, r, stride, x=x, y=y,
                                 word=word)
    if layout == "folded":
        c, h, k, r, s = p
        return ops.conv2d_window_folded(c, h, k, r, s, "s", x=x, y=y)
    if layout == "flat":
        c, h, k, _, _ = p
        return ops.conv2d_nchwc(1, -(-c // x) * x, 1, h * h, k, 1, 1, x=x, y=y, word=word)
    if kind == "conv":
        c, h, k, r, s = p
        return ops.conv2d_nchwc(1, -(-c // x) * x, h, h, k, r, r, s, x=x, y=y, word=word)
    m, n, k = p
    return ops.dense_packed(m, n, -(-k // x) * x, y, x, word=word)


def ops_count(kind, p):
    """Operations (2 x multiply-adds) of a workload's real, unpadded channels; for a padded conv3d
    only the products whose input is inside the volume (oneDNN skips window taps that fall
    wholly in the padding, so counting them would overstate what either engine must do)."""
    if kind == "conv3d":
        c, d, h, k, r, stride = p
        return 2 * c * k * _taps_inside(d, r, stride) * _taps_inside(h, r, stride) ** 2
    if kind == "conv":
        c, h, k, r, s = p
        oh = (h - r) // s + 1
        return 2 * c * k * r * r * oh * oh
    m, n, k = p
    return 2 * m * n * k


def _taps_inside(n, r, stride):
    """(output position, window tap) pairs along one axis of extent n, window r, padding r // 2,
    whose input index lies inside the axis (the compiler's count, relax.tensorize.taps_inside)."""
    pad = r // 2
    return taps_inside(n, (n + 2 * pad - r) // stride + 1, r, stride, pad=pad)
