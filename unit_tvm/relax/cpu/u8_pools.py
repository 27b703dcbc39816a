"""Average pools on uint8 values (planned in u8_values.py): the kernels, NCHW and NCHW[block]c.

The window sums the real values (q - zp; padding is real 0.0) in int32 and requantizes once. A
kernel is one parallel loop over (image, channel or channel block, output row). In each row the
interior columns, whose window lies inside the input row, read their taps unchecked: in NCHW as
vectors of neighbouring columns, in blocks as one vector of a pixel's channels. The few edge
columns check their taps; a window row outside the input adds nothing, decided once per row.
A stride-2 NCHW pool, or rows narrower than four columns, use a te graph and the default
schedule instead.
"""

import json
from typing import NamedTuple

import tvm
from tvm import te, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from ..core.u8_values import AvgPoolPlan, QParams

POOL_ATTR = "unit_tvm.pool"  # a uint8 average pool's geometry and quantization (JSON)
NCHW_LANES = (16, 8, 4)  # vector widths along an NCHW row's interior, widest that fits first
_I32 = "int32"


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


def avg_pool_func(shape, attrs, pool: AvgPoolPlan) -> tvm.tirx.PrimFunc:
    """PrimFunc(x uint8 NCHW, out uint8 NCHW): relax.nn.avg_pool2d(attrs) of the real values.
    The function carries its description (POOL_ATTR) so that UnitTensorize can rebuild it for a
    blocked layout (`blocked_pool_func`)."""
    geo = _Pool(tuple(int(s) for s in shape), tuple(int(v) for v in attrs.pool_size),
                tuple(int(v) for v in attrs.strides), tuple(int(v) for v in attrs.padding),
                bool(attrs.count_include_pad), pool)
    lanes = _row_lanes(geo)
    func = _row_pool(geo, 0, lanes, "qavg_pool") if lanes else _te_pool(geo)
    return func.with_attr(POOL_ATTR, _describe(geo))


def blocked_pool_func(func, block) -> tvm.tirx.PrimFunc:
    """The average pool of `func` (made by avg_pool_func) on NCHW[block]c uint8, same layout
    out: each output pixel is one vector of `block` channels, every tap a contiguous load."""
    return _row_pool(_geometry(str(func.attrs[POOL_ATTR])), block, block, "qavg_pool_blocked")


def blocked_shape(shape, block):
    """NCHW -> NCHW[block]c (channels a multiple of block)."""
    n, c, h, w = shape
    return (n, c // block, h, w, block)


def pool_out_shape(func, block):
    """The result shape of a pool function rebuilt with blocked_pool_func(func, block)."""
    geo = _geometry(str(func.attrs[POOL_ATTR]))
    return blocked_shape((*geo.shape[:2], *geo.out_hw), block)


def _describe(geo):
    return json.dumps({"shape": geo.shape, "window": geo.window, "strides": geo.strides,
                       "padding": geo.padding, "include_pad": geo.include_pad,
                       "source": list(geo.plan.source), "result": list(geo.plan.result)})


def _geometry(text):
    d = json.loads(text)
    return _Pool(tuple(d["shape"]), tuple(d["window"]), tuple(d["strides"]),
                 tuple(d["padding"]), d["include_pad"],
                 AvgPoolPlan(QParams(*d["source"]), QParams(*d["result"])))


def _interior(geo):
    """[first, last) output columns whose whole window lies inside the input row."""
    (_, _, _, w), (_, kw), (_, sw), (_, pl, _, _) = geo.shape, geo.window, geo.strides, geo.padding
    first = -(-pl // sw)
    return first, max(min((w - kw + pl) // sw + 1, geo.out_hw[1]), first)


def _row_lanes(geo):
    """Vector width along an NCHW row's stride-1 interior, or 0 (te graph) when it is strided
    or narrower than the narrowest width."""
    lo, hi = _interior(geo)
    if geo.strides[1] != 1:
        return 0
    return next((v for v in NCHW_LANES if hi - lo >= v), 0)


def _requantized(total, divisor, geo):
    """uint8 of an int32 window sum: round(sum * s_in / (divisor * s_out)) + zp_out, clipped.
    Counting the padding, the divisor is the window's size and one multiplier replaces the
    division (every kernel of a pool rounds the same way, whatever its layout)."""
    ratio = geo.plan.source.scale / geo.plan.result.scale
    if geo.include_pad:
        v = tirx.round(total.astype("float32") * tirx.const(ratio / divisor, "float32"))
    else:
        v = tirx.round(total.astype("float32") * tirx.const(ratio, "float32") / divisor)
    v = v + tirx.const(float(geo.plan.result.zp), "float32")
    return tirx.max(tirx.min(v, tirx.const(255.0, "float32")),
                    tirx.const(0.0, "float32")).astype("uint8")


def _divisor(geo, i, j):
    """Taps the divisor counts: the window's size (a Python number) counting the padding, else
    only the taps inside the input (float32 expression)."""
    (_, _, h, w), (kh, kw), (sh, sw) = geo.shape, geo.window, geo.strides
    pt, pl = geo.padding[:2]
    if geo.include_pad:
        return float(kh * kw)
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
    zp_in = tirx.const(geo.plan.source.zp, _I32)

    def tap(b, ch, i, j):
        inside = tirx.all(i >= 0, i < h, j >= 0, j < w)
        return tirx.if_then_else(inside, x[b, ch, tirx.max(tirx.min(i, h - 1), 0),
                                           tirx.max(tirx.min(j, w - 1), 0)].astype(_I32)
                                 - zp_in, tirx.const(0, _I32))

    total = te.compute((n, c, oh, ow), lambda b, ch, i, j: te.sum(
        tap(b, ch, i * sh + rh - pt, j * sw + rw - pl), axis=[rh, rw]), name="total")
    out = te.compute((n, c, oh, ow), lambda b, ch, i, j: _requantized(
        total[b, ch, i, j], _divisor(geo, i, j), geo), name="out")
    return te.create_prim_func([x, out])


def _row_pool(geo, block, lanes, name):
    """The pool as one parallel loop over (image, channel [block], output row). block = 0:
    NCHW, the interior columns as vectors of `lanes` columns, the last overlapping the one
    before it instead of leaving a scalar tail (TVM would not vectorise one); block > 0:
    NCHW[block]c, every column one vector of its `lanes` = block channels."""
    n, c, h, w = geo.shape
    kh, kw = geo.window
    sh, sw = geo.strides
    pt, pl = geo.padding[:2]
    oh, ow = geo.out_hw
    lo, hi = _interior(geo)
    groups = c // block if block else c
    zp_in = geo.plan.source.zp
    zero = tirx.const(0, _I32)

    def window_sum(x, at, i, j, checked):
        """Sum over the window of output (i, j) of q - zp (int32); `at(r, col)` indexes x. A
        window row outside the input adds 0: one select per row, on a scalar condition."""
        total = zero
        for dh in range(kh):
            r = i * sh - pt + dh
            r_safe = tirx.max(tirx.min(r, h - 1), 0)  # read in bounds even where unused
            row = zero
            for dw in range(kw):
                col = j * sw - pl + dw
                if checked:
                    v = x[at(r_safe, tirx.max(tirx.min(col, w - 1), 0))].astype(_I32)
                    row = row + tirx.if_then_else(tirx.all(col >= 0, col < w),
                                                  v - tirx.const(zp_in, _I32), zero)
                else:
                    row = row + x[at(r_safe, col)].astype(_I32)
            if not checked:
                row = row - tirx.const(kw * zp_in, _I32)
            total = total + tirx.if_then_else(tirx.all(r >= 0, r < h), row, zero)
        return total

    in_shape = blocked_shape(geo.shape, block) if block else geo.shape
    out_shape = blocked_shape((n, c, oh, ow), block) if block else (n, c, oh, ow)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name(name)
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
            x = T.arg("x", T.buffer(in_shape, "uint8"))
            out = T.arg("out", T.buffer(out_shape, "uint8"))
            with T.sblock("root"):  # Relax's pattern analysis expects a root block
                with T.parallel(0, n * groups * oh) as row:
                    b, g, i = row // (groups * oh), row // oh % groups, row % oh
                    if block:
                        def store(j, checked):
                            with T.vectorized(0, lanes) as lane:
                                def at(r, col):
                                    return [b, g, r, col, lane]
                                T.buffer_store(out, _requantized(
                                    window_sum(x, at, i, j, checked), _divisor(geo, i, j), geo),
                                    at(i, j))
                        with T.serial(lo, hi) as j:
                            store(j, False)
                    else:
                        def store(j, checked):
                            def at(r, col):
                                return [b, g, r, col]
                            T.buffer_store(out, _requantized(
                                window_sum(x, at, i, j, checked), _divisor(geo, i, j), geo),
                                at(i, j))
                        with T.serial(0, -(-(hi - lo) // lanes)) as chunk:
                            with T.vectorized(0, lanes) as lane:
                                store(tirx.min(lo + chunk * lanes, hi - lanes) + lane, False)
                    for e in list(range(lo)) + list(range(hi, ow)):
                        store(e, True)
    return ib.get()
