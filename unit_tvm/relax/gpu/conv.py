"""How the GPU path writes an NHWC conv2d for Tensor Cores: two forms of one te op, and the
policy that picks between them.

- "direct": the output row's pixels are the instruction's M, channels its K, the window a
  reduction loop around it (prepare gathers the window one loop per dimension). Each output row is
  padded to whole fragments, an odd count of them to an even one (schedules.gpu_config's
  paired_tiles): a 7-pixel row computes 16, a 112-pixel one 128.
- "gemm": every output pixel of every row and image is one row of M, and window x channels is one
  reduction of K (UNIT's fused width and height, and oneDNN's im2col): a 7x7 layer computes 64
  rows instead of 112, a 3-channel 7x7 stem reduces 160 values instead of 49 x 16. The window is
  gathered by a te stage inside the kernel (`cols`), which the GPU strategy's `implicit` option
  inlines into its shared-memory stage (implicit GEMM). Dilated windows take this form only.

`choose_form` is the one place that decides; the graph pass and bench-gpu both call it.
"""

import dataclasses
from dataclasses import dataclass

import numpy as np
from tvm import te, tirx

from ...schedules import gpu
from ...schedules.gpu import Fragment
from . import int8 as gpu_int8

FORMS = ("direct", "gemm")


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass(frozen=True)
class ConvGeometry:
    """An NHWC x OHWI conv2d (groups 1) over an input padded to h x w. `padding` (top, left,
    bottom, right) is the part of that padding the gemm form's gather supplies as zeros (its
    input is then h - top - bottom rows by w - left - right); the direct form reads an input
    already padded (padding all zero)."""

    n: int
    h: int
    w: int
    c: int
    k: int
    kh: int
    kw: int
    stride: tuple = (1, 1)
    dilation: tuple = (1, 1)
    padding: tuple = (0, 0, 0, 0)

    @property
    def in_h(self) -> int:
        """Rows of the input tensor the kernel reads."""
        return self.h - self.padding[0] - self.padding[2]

    @property
    def in_w(self) -> int:
        """Columns of the input tensor the kernel reads."""
        return self.w - self.padding[1] - self.padding[3]

    def without_padding(self) -> "ConvGeometry":
        """The same conv over an input padded beforehand (what the direct form reads)."""
        return dataclasses.replace(self, padding=(0, 0, 0, 0))

    @property
    def out_h(self) -> int:
        return (self.h - self.dilation[0] * (self.kh - 1) - 1) // self.stride[0] + 1

    @property
    def out_w(self) -> int:
        return (self.w - self.dilation[1] * (self.kw - 1) - 1) // self.stride[1] + 1

    @property
    def pixels(self) -> int:
        """Output pixels of the whole batch: the GEMM's M."""
        return self.n * self.out_h * self.out_w

    @property
    def window(self) -> int:
        """Window taps times input channels: the GEMM's K."""
        return self.kh * self.kw * self.c


def _m_rows(n: int, frag: Fragment) -> int:
    """Rows of M the core computes for n real ones: whole fragments, as many as the GPU
    strategy's preparation pads them to (its tile_rows: paired_tiles)."""
    return gpu.prepare_options(None)["tile_rows"](-(-n // frag.m)) * frag.m


def padded_work(g: ConvGeometry, form: str, frag: Fragment) -> int:
    """Multiply-adds a form computes, padding to whole fragments included (N is the same in
    both forms and left out). The fragment that pairs an odd count (`_m_rows`) is not counted
    as waste: it buys two fragments per warp."""
    if form == "direct":
        rows = g.n * g.out_h * _round_up(g.out_w, frag.m)
        return rows * g.kh * g.kw * _round_up(g.c, frag.k)
    if form == "gemm":
        return _round_up(g.pixels, frag.m) * _round_up(g.window, frag.k)
    raise ValueError(f"form must be one of {FORMS}, not {form!r}")


def choose_form(g: ConvGeometry, frag: Fragment) -> str:
    """The form that computes less padding ("direct" on a tie: it reads a 1x1 conv's input in
    place); "gemm" for dilated windows, which the direct form does not gather."""
    if any(d != 1 for d in g.dilation):
        return "gemm"
    return "gemm" if padded_work(g, "gemm", frag) < padded_work(g, "direct", frag) else "direct"


def forms_in_order(g: ConvGeometry, frag: Fragment) -> tuple:
    """Every form that computes `g`, the chosen one first (what the tuner races)."""
    first = choose_form(g, frag)
    if any(d != 1 for d in g.dilation):
        return (first,)
    return (first,) + tuple(f for f in FORMS if f != first)


def direct_te(g: ConvGeometry, dtype: str, acc: str) -> list:
    """[data NHWC, kernel HWIO, out NHWC]: the conv as written, accumulated in `acc`."""
    if any(d != 1 for d in g.dilation):
        raise ValueError("the direct form has no dilation; use the gemm form")
    if any(g.padding):
        raise ValueError("the direct form reads an input padded beforehand: pass "
                         "g.without_padding() and pad the input")
    data = te.placeholder((g.n, g.h, g.w, g.c), dtype, name="data")
    kern = te.placeholder((g.kh, g.kw, g.c, g.k), dtype, name="kernel")
    rc = te.reduce_axis((0, g.c), name="rc")
    ry = te.reduce_axis((0, g.kh), name="ry")
    rx = te.reduce_axis((0, g.kw), name="rx")
    sy, sx = g.stride
    out = te.compute((g.n, g.out_h, g.out_w, g.k), lambda b, y, x, f: te.sum(
        data[b, y * sy + ry, x * sx + rx, rc].astype(acc)
        * kern[ry, rx, rc, f].astype(acc), axis=[rc, ry, rx]), name="conv2d_nhwc")
    return [data, kern, out]


def gemm_te(g: ConvGeometry, dtype: str, acc: str, frag: Fragment,
            source: str | None = None) -> list:
    """[data NHWC, kernel (K', k), out (pixels, k)]: the conv as one GEMM over a window gathered
    in the kernel. K' is window x channels rounded up to the fragment's K (`gemm_weight` lays a
    HWIO weight out so); the gather pads pixels to the rows the core computes (`_m_rows`) and
    writes zeros past the window and in `g.padding`, so the core reads it in place and no pad
    pass runs before the kernel. Indices are clamped as well as guarded. With `source` (int8:
    the unquantized input's dtype) the data arrives in that dtype with a 1-element
    `inv_scale` after the kernel, and the gather quantizes what it reads (gpu_int8), so no
    quantization pass runs before the kernel either: [data, kernel, inv_scale, out]."""
    data = te.placeholder((g.n, g.in_h, g.in_w, g.c), source or dtype, name="data")
    inv_scale = None if source is None else te.placeholder((1,), source, name="inv_scale")
    pixels, window = g.pixels, g.window
    plane, width = g.out_h * g.out_w, _round_up(window, frag.k)
    (sy, sx), (dy, dx) = g.stride, g.dilation
    top, left = g.padding[:2]
    zero = tirx.const(0, dtype)

    def gathered(p, q):
        pc, qc = tirx.min(p, pixels - 1), tirx.min(q, window - 1)
        # the tap's row and column in the padded input, then in the tensor
        y = pc // g.out_w % g.out_h * sy + qc // (g.kw * g.c) * dy - top
        x = pc % g.out_w * sx + qc // g.c % g.kw * dx - left
        inside = [p < pixels, q < window]
        if any(g.padding):
            inside += [y >= 0, y < g.in_h, x >= 0, x < g.in_w]
            y = tirx.max(tirx.min(y, g.in_h - 1), 0)
            x = tirx.max(tirx.min(x, g.in_w - 1), 0)
        value = data[pc // plane, y, x, qc % g.c]
        if inv_scale is not None:
            value = gpu_int8.quantized_value(value, inv_scale[0])
        return tirx.if_then_else(tirx.all(*inside), value, zero)

    cols = te.compute((_m_rows(pixels, frag), width), gathered, name="cols")
    kern = te.placeholder((width, g.k), dtype, name="kernel")
    q = te.reduce_axis((0, width), name="q")
    out = te.compute((pixels, g.k), lambda p, f: te.sum(
        cols[p, q].astype(acc) * kern[q, f].astype(acc), axis=q), name="conv2d_gemm")
    return [data, kern, out] if inv_scale is None else [data, kern, inv_scale, out]


def gemm_weight(hwio: np.ndarray, frag: Fragment) -> np.ndarray:
    """A HWIO weight as the gemm form's (K', k) operand: rows in (kh, kw, c) order, zero rows up
    to a whole fragment of K."""
    kh, kw, c, k = hwio.shape
    out = np.zeros((_round_up(kh * kw * c, frag.k), k), hwio.dtype)
    out[:kh * kw * c] = hwio.reshape(kh * kw * c, k)
    return out


def te_for_form(g: ConvGeometry, form: str, dtype: str, acc: str, frag: Fragment,
                source: str | None = None) -> list:
    """The te tensors ([inputs..., out]) of `g` in `form` (`source`: gemm_te's)."""
    if form == "direct":
        return direct_te(g, dtype, acc)
    if form == "gemm":
        return gemm_te(g, dtype, acc, frag, source)
    raise ValueError(f"form must be one of {FORMS}, not {form!r}")
