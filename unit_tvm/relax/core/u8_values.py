"""uint8 values between quantized ops beyond conv -> conv edges: channel concatenations and the
average / max pools that read them (Inception's blocks).

An Inception block's branches end in quantized convs whose results are concatenated; the
concatenation is read by the next block's convs (as their input), by an average pool feeding a
conv, and by a max-pool feeding the next concatenation. In fp32 every branch writes fp32, the
concat copies fp32 and every reader quantizes it again. Here the concat carries uint8 in the
quantization its conv readers share (they observed the same tensor): the branch convs
requantize into it, the concat copies a quarter of the bytes, its conv readers read it as is,
an average pool runs on it in integers and requantizes for its own readers, and a max-pool runs
on it unchanged (max commutes with a non-decreasing quantization). Whatever else reads such a
value gets a dequantized fp32 copy (dead code elimination drops it when nothing does).

The plan is made on the fp32 graph after calibration (`plan`); `_rewrite` in quantize.py emits
it with the helpers below and the pool kernels of u8_pools.py.
"""

from typing import NamedTuple

import numpy as np
import tvm
from tvm import relax

from .graph import is_nchw_max_pool
from .graph import readers as binding_readers
from .graph import uses as count_uses


class QParams(NamedTuple):
    """A per-tensor uint8 quantization: real = (q - zp) * scale."""
    scale: float
    zp: int


# The least step of an activation's uint8 grid: a calibrated range of denormal values (a
# randomly initialised MobileViT's last stages, ~1e-40) would give a step whose inverse
# exceeds float32 (TVM then refuses the literal); values below 255 steps of this carry no
# information a float32 product can keep, and round to the zero point.
MIN_STEP = 1e-30


def uint8_range(lo: float, hi: float) -> QParams:
    """The uint8 quantization of the range [lo, hi] widened to hold 0.0 exactly (zero padding,
    ReLU), its step at least MIN_STEP."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    step = max((hi - lo) / 255.0, MIN_STEP) if hi > lo else 1.0
    return QParams(step, int(np.clip(round(-lo / step), 0, 255)))


class AvgPoolPlan(NamedTuple):
    """An NCHW average pool run on uint8: its input's quantization and the one it writes (its
    conv readers')."""

    source: QParams
    result: QParams


class U8Plan(NamedTuple):
    """Which bindings of main become uint8 values, and in which quantization."""
    concats: dict  # concat var -> QParams
    avg_pools: dict  # avg pool var -> AvgPoolPlan
    max_pools: dict  # max-pool var (reading a uint8 concat) -> QParams


def is_channel_concat(value, dtype="float32") -> bool:
    """Whether a binding's value concatenates NCHW tensors of `dtype` along their channels
    (float32: one the quantizer may move to uint8; uint8: one it did)."""
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "relax.concat"):
        return False
    ty = value.ty
    return (getattr(ty, "ndim", -1) == 4 and str(ty.dtype) == dtype
            and value.attrs.axis is not None and int(value.attrs.axis) in (1, -3)
            and isinstance(value.args[0], relax.Tuple))


def is_nchw_avg_pool(value) -> bool:
    """Whether a binding's value is a plain NCHW relax.nn.avg_pool2d (no dilation, floor mode)."""
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "relax.nn.avg_pool2d"):
        return False
    a = value.attrs
    return (str(a.layout) == "NCHW" and str(a.out_layout) == "NCHW" and not bool(a.ceil_mode)
            and all(int(d) == 1 for d in a.dilation) and str(value.ty.dtype) == "float32")


def plan(bindings, func, chains, by_end, u8_pools) -> U8Plan:
    """Decide the uint8 concats and pools; updates the recipes in by_end: producers that only
    feed a uint8 concat requantize into it (out_q), readers read uint8 (in_u8). u8_pools:
    {max-pool var: (scale, zp)} of the pools already running on uint8 (an average pool may
    read them too)."""
    uses = count_uses(bindings, func)
    readers = {}
    for c in chains:
        readers.setdefault(c.x, []).append(c)
    users = binding_readers(bindings)
    concats = {}
    for b in reversed(bindings):  # a concat read only by a uint8 concat follows it
        if not is_channel_concat(b.value):
            continue
        conv_readers = [c for c in readers.get(b.var, []) if by_end[c.end].recipe.kind == "conv2d"]
        outer = users.get(b.var, [])
        if conv_readers:
            first = by_end[conv_readers[0].end].recipe
            q = QParams(float(first.x_scale), int(first.x_zp))
        elif len(outer) == 1 and uses.get(b.var) == 1 and outer[0].var in concats:
            q = concats[outer[0].var]
        else:
            continue
        concats[b.var] = q
        for c in conv_readers:
            by_end[c.end].update(x_scale=q.scale, x_zp=q.zp, in_u8=True)
        for field in b.value.args[0].fields:
            entry = by_end.get(field)
            if (entry is not None and uses.get(field) == 1 and not entry.recipe.out_q
                    and entry.recipe.kind == "conv2d" and entry.recipe.nd_out_shape is None):
                entry.update(out_q=(q.scale, q.zp))
    sources = {**concats, **{v: QParams(*q) for v, q in u8_pools.items()}}
    avg_pools, max_pools = {}, {}
    for b in bindings:
        src = b.value.args[0] if isinstance(b.value, relax.Call) and b.value.args else None
        if src is None or src not in sources:
            continue
        if is_nchw_max_pool(b.value):
            if src in concats:
                max_pools[b.var] = concats[src]
            continue
        pool_readers = readers.get(b.var, [])
        if (not is_nchw_avg_pool(b.value) or not pool_readers
                or len(pool_readers) != uses.get(b.var, 0)):
            continue
        first = by_end[pool_readers[0].end].recipe
        result = QParams(float(first.x_scale), int(first.x_zp))
        for c in pool_readers:
            by_end[c.end].update(x_scale=result.scale, x_zp=result.zp, in_u8=True)
        avg_pools[b.var] = AvgPoolPlan(sources[src], result)
    return U8Plan(concats, avg_pools, max_pools)


# -- emission (relax expressions) ----------------------------------------------------------------
def _f32(v):
    return relax.const(float(v), "float32")


def dequantize(u8, q: QParams):
    """fp32 real values of a uint8 tensor."""
    return relax.op.multiply(relax.op.subtract(relax.op.astype(u8, "float32"), _f32(q.zp)),
                             _f32(q.scale))


def quantize(x, q: QParams):
    """uint8 of a fp32 tensor (rounded, clipped to [0, 255])."""
    v = relax.op.add(relax.op.round(relax.op.multiply(x, _f32(1.0 / q.scale))), _f32(q.zp))
    return relax.op.astype(relax.op.clip(v, 0.0, 255.0), "uint8")


def requantize(u8, source: QParams, target: QParams):
    """u8 in `source`'s quantization re-expressed in `target`'s (u8 itself when they agree)."""
    return u8 if source == target else quantize(dequantize(u8, source), target)
