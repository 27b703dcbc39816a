"""Multi-head attention spelled the ways users' models spell it, for tests and the fuzzer
(fuzz kind "attention"): heads split, sliced, transposed and merged by view ops that
relax/core/views.py and relax/cpu/fused_attention.py read back into the kernels' operands."""

from typing import NamedTuple

import numpy as np


class Spelling(NamedTuple):
    """How a DrawnHeads layer writes its attention.

    fused: one QKV projection (else three); order: Q/K/V interleaved as (3, heads) "3hd" or
    (heads, 3) "h3d"; kt: K^T by "transpose" or straight from the 5-D "permute"; scale:
    "after" the matmul, on "q", or "none"; merge: heads merged by "transpose", "flatten",
    "interleave" (head index fastest: no view of the result) or "sum"; stride: every
    stride-th key; sharpness: a factor on Q (scores sharper than a trained model's: the int8
    attention's accuracy guard has something to refuse); cut: how a fused projection becomes
    Q, K and V: "unpack" (iterating the permuted tensor: slices), "chunk" (torch.chunk before
    the permute) or "split" (torch.split after it; both Relax's split, as ONNX's Split);
    mask: what is applied to the scaled scores: "none", "causal" (a constant added, -inf
    above the diagonal), "padding" (Hugging Face's [batch, 1, 1, keys] of float32's lowest
    added where a key is padding, computed from the input at run time: a key whose first
    feature is below -0.5, the first key never) or "fill" (nanoGPT's masked_fill of -inf
    where a buffer of ones below the diagonal is 0)."""

    fused: bool
    order: str
    kt: str
    scale: str
    merge: str
    stride: int
    sharpness: float = 1.0
    cut: str = "unpack"
    mask: str = "none"


def drawn_spelling(seed: int) -> Spelling:
    """The spelling test_views' seeds draw (numpy's generator, in this order)."""
    rng = np.random.default_rng(seed)
    fused = bool(rng.integers(0, 2))
    order, kt, scale, merge = (
        str(rng.choice(opts)) for opts in (["3hd", "h3d"], ["transpose", "permute"],
                                           ["after", "q", "none"],
                                           ["transpose", "flatten", "interleave", "sum"]))
    stride = int(rng.choice([1, 1, 2]))
    cut = str(rng.choice(["unpack", "chunk", "split"]))
    return Spelling(fused, order, kt, scale, merge, stride, cut=cut,
                    mask=str(rng.choice(["none", "causal", "padding"])))


def drawn_heads(spelling: Spelling, hidden: int = 48, heads: int = 3):
    """A torch module: `heads` heads of hidden / heads over [batch, tokens, hidden] inputs,
    attention written as `spelling` says, then an output projection."""
    import torch
    from torch import nn

    class DrawnHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads, self.d = heads, hidden // heads
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
            self.out = nn.Linear(self.d if spelling.merge == "sum" else hidden, hidden)

        def _split(self, x):
            b, s, _ = x.shape
            h, d = self.heads, self.d
            if not spelling.fused:
                q, k, v = (m(x).view(b, s, h, d).transpose(1, 2)
                           for m in (self.q, self.k, self.v))
                return q, (k.transpose(-1, -2) if spelling.kt == "transpose"
                           else k.permute(0, 1, 3, 2)), v
            shape, axes = (((b, s, 3, h, d), (2, 0, 3, 1, 4)) if spelling.order == "3hd"
                           else ((b, s, h, 3, d), (3, 0, 2, 1, 4)))
            t = self.qkv(x).reshape(shape)
            if spelling.cut == "chunk":  # along the axis of 3, each part [b, s, h, d]
                three = 2 if spelling.order == "3hd" else 3
                q, k, v = (u.squeeze(three).transpose(1, 2) for u in t.chunk(3, dim=three))
            elif spelling.cut == "split":
                q, k, v = (u.squeeze(0) for u in t.permute(axes).split(1, dim=0))
            else:
                q, k, v = t.permute(axes)
            if spelling.kt == "permute":  # K^T in one 5-D permute of the projection
                return q, t.permute(axes[:3] + (axes[4], axes[3]))[1], v
            return q, k.transpose(-1, -2), v

        def forward(self, x):
            b, s, _ = x.shape
            q, kt, v = self._split(x)
            kt, v = kt[..., ::spelling.stride], v[:, :, ::spelling.stride]
            if spelling.sharpness != 1.0:
                q = q * spelling.sharpness
            if spelling.scale == "q":
                q = q * self.d ** -0.5
            att = torch.matmul(q, kt)
            if spelling.scale == "after":
                att = att / self.d ** 0.5
            if spelling.mask == "fill":
                keep = torch.ones(att.shape[-2:]).tril().view(1, 1, *att.shape[-2:])
                att = att.masked_fill(keep == 0, float("-inf"))
            elif spelling.mask != "none":
                att = att + _mask(spelling.mask, x[:, ::spelling.stride, 0], att.shape)
            ctx = torch.matmul(torch.softmax(att, dim=-1), v)  # [b, heads, s, d]
            if spelling.merge == "transpose":
                ctx = ctx.transpose(1, 2).reshape(b, s, -1)
            elif spelling.merge == "flatten":
                ctx = ctx.permute(0, 2, 1, 3).flatten(2)
            elif spelling.merge == "interleave":  # head index fastest: no view of ctx
                ctx = ctx.permute(0, 2, 3, 1).reshape(b, s, -1)
            else:
                ctx = ctx.sum(1)
            return self.out(ctx)

    return DrawnHeads()


def _mask(kind: str, first_feature, scores_shape):
    """The mask a Spelling adds to scores of `scores_shape` ([batch, heads, rows, keys]);
    first_feature: each key's first input feature, [batch, keys]."""
    import torch

    rows, keys = scores_shape[-2:]
    if kind == "causal":
        return torch.triu(torch.full((rows, keys), float("-inf")), 1)
    if kind != "padding":
        raise ValueError(f"no mask of kind {kind!r}")
    padding = (first_feature < -0.5) & (torch.arange(keys) > 0)
    low = torch.finfo(torch.float32).min
    return torch.where(padding, low, 0.0)[:, None, None, :]
