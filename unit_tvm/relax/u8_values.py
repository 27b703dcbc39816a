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
it with the helpers below.
"""

import json
from typing import NamedTuple

import tvm
from tvm import relax, te, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from .graph import is_nchw_max_pool
from .graph import readers as binding_readers
from .graph import uses as count_uses


class QParams(NamedTuple):
    """A per-tensor uint8 quantization: real = (q - zp) * scale."""
    scale: float
    zp: int


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
    return relax.op.astype(relax.op.clip(v, relax.PrimValue(0.0), relax.PrimValue(255.0)),
                           "uint8")


def requantize(u8, source: QParams, target: QParams):
    """u8 in `source`'s quantization re-expressed in `target`'s (u8 itself when they agree)."""
    return u8 if source == target else quantize(dequantize(u8, source), target)


class _Pool(NamedTuple):
    """An average pool's geometry on an NCHW uint8 tensor and its requantization."""
    shape: tuple  # n, c, h, w
    window: tuple  # kh, kw
    strides: tuple
    padding: tuple  # top, left, bottom, right
    include_pad: bool
    plan: AvgPoolPlan

    @property
    def out_hw(self):
        (_, _, h, w), (kh, kw), (sh, sw) = self.shape, self.window, self.strides
        pt, pl, pb, pr = self.padding
        return (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1


POOL_ATTR = "unit_tvm.pool"  # a uint8 average pool's geometry and quantization (JSON)


def avg_pool_func(shape, attrs, pool: AvgPoolPlan) -> tvm.tirx.PrimFunc:
    """PrimFunc(x uint8 NCHW, out uint8 NCHW): relax.nn.avg_pool2d(attrs) of the real values
    (padding is real 0.0, the source's zero point), summed in int32 and requantized once.
    Stride-1 rows get a vectorised kernel (below); anything else a te graph for the default
    schedule. The function carries its description (POOL_ATTR) so that UnitTensorize can
    rebuild it for a blocked layout (`blocked_pool_func`)."""
    geo = _Pool(tuple(int(s) for s in shape), tuple(int(v) for v in attrs.pool_size),
                tuple(int(v) for v in attrs.strides), tuple(int(v) for v in attrs.padding),
                bool(attrs.count_include_pad), pool)
    lanes = _row_lanes(geo)
    func = _vector_pool(geo, lanes) if lanes else _te_pool(geo)
    return func.with_attr(POOL_ATTR, _describe(geo))


def _describe(geo):
    return json.dumps({"shape": geo.shape, "window": geo.window, "strides": geo.strides,
                       "padding": geo.padding, "include_pad": geo.include_pad,
                       "source": list(geo.plan.source), "result": list(geo.plan.result)})


def _geometry(text):
    d = json.loads(text)
    return _Pool(tuple(d["shape"]), tuple(d["window"]), tuple(d["strides"]),
                 tuple(d["padding"]), d["include_pad"],
                 AvgPoolPlan(QParams(*d["source"]), QParams(*d["result"])))


def blocked_shape(shape, block):
    """NCHW -> NCHW[block]c (channels a multiple of block)."""
    n, c, h, w = shape
    return (n, c // block, h, w, block)


def pool_out_shape(func, block):
    """The result shape of a pool function rebuilt with blocked_pool_func(func, block)."""
    geo = _geometry(str(func.attrs[POOL_ATTR]))
    return blocked_shape((*geo.shape[:2], *geo.out_hw), block)


def blocked_pool_func(func, block) -> tvm.tirx.PrimFunc:
    """The average pool of `func` (made by avg_pool_func) on NCHW[block]c uint8, same layout
    out: each output pixel is one vector of `block` channels, every tap a contiguous load,
    the window's bounds checks scalar."""

    geo = _geometry(str(func.attrs[POOL_ATTR]))
    n, c, h, w = geo.shape
    (kh, kw), (sh, sw) = geo.window, geo.strides
    pt, pl = geo.padding[:2]
    oh, ow = geo.out_hw
    zp_in = tirx.const(geo.plan.source.zp, "int32")
    zero = tirx.const(0, "int32")
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("qavg_pool_blocked")
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
            x = T.arg("x", T.buffer(blocked_shape(geo.shape, block), "uint8"))
            out = T.arg("out", T.buffer(blocked_shape((n, c, oh, ow), block), "uint8"))
            with T.sblock("root"):  # Relax's pattern analysis expects a root block
                with T.parallel(0, n * (c // block) * oh) as row:
                    b, cb, i = row // (c // block * oh), row // oh % (c // block), row % oh
                    with T.serial(0, ow) as j:
                        with T.vectorized(0, block) as lane:
                            total = zero
                            for dh in range(kh):
                                for dw in range(kw):
                                    r, col = i * sh - pt + dh, j * sw - pl + dw
                                    v = x[b, cb, tirx.max(tirx.min(r, h - 1), 0),
                                          tirx.max(tirx.min(col, w - 1), 0), lane]
                                    total = total + tirx.if_then_else(
                                        tirx.all(r >= 0, r < h, col >= 0, col < w),
                                        v.astype("int32") - zp_in, zero)
                            T.buffer_store(out, _requantized(total, _window_count(geo, i, j),
                                                             geo), [b, cb, i, j, lane])
    return ib.get()


def _interior(geo):
    """[first, last) output columns whose whole window lies inside the input row."""
    (_, _, _, w), (_, kw), (_, pl, _, _) = geo.shape, geo.window, geo.padding
    return max(pl, 0), min(w - kw + pl + 1, geo.out_hw[1])


def _row_lanes(geo):
    """Vector width for the interior of each output row (stride-1 columns), or 0 when the
    interior is narrower than 8 columns."""
    lo, hi = _interior(geo)
    if geo.strides[1] != 1:
        return 0
    return next((v for v in (16, 8) if hi - lo >= v), 0)


def _requantized(total, divisor, geo):
    """uint8 of an int32 window sum: round(sum * s_in / (divisor * s_out)) + zp_out, clipped."""
    ratio = tirx.const(geo.plan.source.scale / geo.plan.result.scale, "float32")
    v = tirx.round(total.astype("float32") * ratio / divisor)
    v = v + tirx.const(float(geo.plan.result.zp), "float32")
    return tirx.max(tirx.min(v, tirx.const(255.0, "float32")),
                    tirx.const(0.0, "float32")).astype("uint8")


def _window_count(geo, i, j):
    """Taps the divisor counts (float32): the whole window, or only those inside the input."""
    (_, _, h, w), (kh, kw), (sh, sw) = geo.shape, geo.window, geo.strides
    pt, pl = geo.padding[:2]
    if geo.include_pad:
        return tirx.const(float(kh * kw), "float32")
    hi = tirx.min(i * sh - pt + kh, h) - tirx.max(i * sh - pt, 0)
    wi = tirx.min(j * sw - pl + kw, w) - tirx.max(j * sw - pl, 0)
    return (hi * wi).astype("float32")


def _te_pool(geo):
    n, c, h, w = geo.shape
    (kh, kw), (sh, sw) = geo.window, geo.strides
    pt, pl = geo.padding[:2]
    oh, ow = geo.out_hw
    x = te.placeholder((n, c, h, w), "uint8", name="x")
    rh, rw = te.reduce_axis((0, kh), name="rh"), te.reduce_axis((0, kw), name="rw")
    zp_in = tirx.const(geo.plan.source.zp, "int32")

    def tap(b, ch, i, j):
        inside = tirx.all(i >= 0, i < h, j >= 0, j < w)
        return tirx.if_then_else(inside, x[b, ch, tirx.max(tirx.min(i, h - 1), 0),
                                           tirx.max(tirx.min(j, w - 1), 0)].astype("int32")
                                 - zp_in, tirx.const(0, "int32"))

    total = te.compute((n, c, oh, ow), lambda b, ch, i, j: te.sum(
        tap(b, ch, i * sh + rh - pt, j * sw + rw - pl), axis=[rh, rw]), name="total")
    out = te.compute((n, c, oh, ow), lambda b, ch, i, j: _requantized(
        total[b, ch, i, j], _window_count(geo, i, j), geo), name="out")
    return te.create_prim_func([x, out])


def _vector_pool(geo, lanes):
    """The pool as one parallel loop over (image, channel, output row); each row's interior
    columns (whole window inside the row) as vectors of `lanes` columns — the last vector
    overlaps the one before it instead of leaving a scalar tail, which TVM would not vectorise
    — and its few edge columns as scalars with bounds checks. A window row outside the input
    adds nothing (its real value is 0.0)."""

    n, c, h, w = geo.shape
    (kh, kw), (sh, _) = geo.window, geo.strides
    pt, pl = geo.padding[:2]
    oh, ow = geo.out_hw
    lo, hi = _interior(geo)
    zp_in = tirx.const(geo.plan.source.zp, "int32")
    zero = tirx.const(0, "int32")

    def window_sum(x, b, ch, i, j, check_columns):
        total = zero
        for dh in range(kh):
            r = i * sh - pt + dh
            r_safe = tirx.max(tirx.min(r, h - 1), 0)  # read in bounds even where unused
            row = zero
            for dw in range(kw):
                col = j - pl + dw
                if check_columns:
                    v = x[b, ch, r_safe, tirx.max(tirx.min(col, w - 1), 0)].astype("int32")
                    row = row + tirx.if_then_else(tirx.all(col >= 0, col < w), v - zp_in, zero)
                else:
                    row = row + (x[b, ch, r_safe, col].astype("int32") - zp_in)
            total = total + tirx.if_then_else(tirx.all(r >= 0, r < h), row, zero)
        return total

    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("qavg_pool")
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
            x = T.arg("x", T.buffer((n, c, h, w), "uint8"))
            out = T.arg("out", T.buffer((n, c, oh, ow), "uint8"))
            with T.sblock("root"):  # Relax's pattern analysis expects a root block
                with T.parallel(0, n * c * oh) as row:
                    b, ch, i = row // (c * oh), row // oh % c, row % oh
                    with T.serial(0, -(-(hi - lo) // lanes)) as chunk:
                        with T.vectorized(0, lanes) as lane:
                            j = tirx.min(lo + chunk * lanes, hi - lanes) + lane
                            T.buffer_store(out, _requantized(window_sum(x, b, ch, i, j, False),
                                                             _window_count(geo, i, j), geo),
                                           [b, ch, i, j])
                    for e in list(range(lo)) + list(range(hi, ow)):
                        T.buffer_store(out, _requantized(window_sum(x, b, ch, i, e, True),
                                                         _window_count(geo, i, e), geo),
                                       [b, ch, i, e])
    return ib.get()
