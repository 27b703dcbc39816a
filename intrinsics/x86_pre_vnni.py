"""x86 int8 without VNNI: the forms of AVX2 (AMD Zen 2/3, Intel Haswell/Broadwell) and AVX512BW
(Intel Skylake-SP), one table row per vector width.

- the *pair form* (x86.vpmaddubsw): vpmaddubsw sums each pair of u8 x s8 products in int16,
  *saturating*, vpmaddwd by ones adds the pairs into int32, vpaddd accumulates: 3 uops per 4
  products a lane. Exact for u7 activations, or for weights whose adjacent pairs obey
  |b0| + |b1| <= 128 (255 * 128 = 32640 <= 32767), which the quantizer gives them and checks
  (quantization/pair_weights.py). 450 GOPS on Zen 4 held to AVX2 (2 threads), 1.8x the int16 form.
- the *quad form* (x86.vpmaddubsw.quad): two pair-form vpmaddubsw results (two consecutive
  words of the reduction) added in int16 by vpaddw before one vpmaddwd: 5 uops per 8 products
  a lane instead of 6, and 3 multiplies instead of 4. Exact for weights whose int16 groups obey
  |w0| + |w1| + |w4| + |w5| <= 128 (PairSumBound(128, words=2)), or activations in [0, 63].
  The weights lose more precision than the pair form's: the quantizer weighs it per layer.
- the *int16 form* (x86.vpmaddwd): both operands widened to int16 (the weights by vpmovsxbw),
  one vpmaddwd per 2 products a lane. Exact on every u8 x s8 value: runs everything else.
- its lanewise form (x86.vpunpck.vpmaddwd): 2 rows of channels widened and interleaved so each
  32-bit word holds one channel's 2 taps: a depthwise conv's window, exact.

Registry order puts the pair forms first: wherever their precondition holds they are chosen.
Where VNNI runs (vpdpbusd; vpermb + vpdpbusd for the lanewise form) these forms are superseded:
selection leaves them out, a caller may still name them.
"""

from collections.abc import Callable
from typing import NamedTuple

from tvm import te, tirx
from tvm.script.ir_builder import tirx as T

from .base import Intrinsic, PairSumBound, placeholders
from .x86 import broadcast_word, dot_semantics, lanewise_semantics


class _Width(NamedTuple):
    """One vector width of the pre-VNNI forms: its name suffix and ISA, int32 lanes, the
    feature it needs and the LLVM intrinsics of its vpmaddwd and vpmaddubsw."""

    suffix: str
    isa: str
    register: str
    lanes: int
    requires: tuple[str, ...]
    pmaddwd: str
    pmaddubsw: str


WIDTHS = (
    _Width("", "AVX512BW", "zmm", 16, ("avx512bw",), "llvm.x86.avx512.pmaddw.d.512",
           "llvm.x86.avx512.pmaddubs.w.512"),
    _Width(".256", "AVX2", "ymm", 8, ("avx2",), "llvm.x86.avx2.pmadd.wd",
           "llvm.x86.avx2.pmadd.ub.sw"),
)


def _madd_words(d: tirx.Buffer, w: _Width, x: tirx.Expr, y: tirx.Expr) -> None:
    """d += vpmaddwd(x, y): each int32 lane adds the two int16 products of its word."""
    prods = tirx.call_llvm_pure_intrin(f"int32x{w.lanes}", w.pmaddwd, x, y)
    T.buffer_store(d, d.vload([0], f"int32x{w.lanes}") + prods, [tirx.Ramp(0, 1, w.lanes)])


def _pair_emit(w: _Width) -> Callable[[dict[str, tirx.Buffer]], None]:
    def emit(bufs: dict[str, tirx.Buffer]) -> None:
        a, b, d = bufs["a"], bufs["b"], bufs["d"]
        a_vec = broadcast_word(a, w.lanes, 4, f"uint8x{w.lanes * 4}")
        pairs = tirx.call_llvm_pure_intrin(f"int16x{w.lanes * 2}", w.pmaddubsw, a_vec,
                                           b.vload([0, 0], f"int8x{w.lanes * 4}"))
        _madd_words(d, w, pairs, tirx.Broadcast(tirx.const(1, "int16"), w.lanes * 2))

    return emit


def _quad_emit(w: _Width) -> Callable[[dict[str, tirx.Buffer]], None]:
    def emit(bufs: dict[str, tirx.Buffer]) -> None:
        a, b, d = bufs["a"], bufs["b"], bufs["d"]
        vec = f"uint8x{w.lanes * 4}"
        halves = []
        for h in range(2):  # a's h-th word against the h-th word of every lane
            word = tirx.reinterpret("int32", a.vload([4 * h], "uint8x4"))
            a_vec = tirx.reinterpret(vec, tirx.Broadcast(word, w.lanes))
            halves.append(tirx.call_llvm_pure_intrin(
                f"int16x{w.lanes * 2}", w.pmaddubsw, a_vec,
                b.vload([h, 0, 0], f"int8x{w.lanes * 4}")))
        # int16 add (vpaddw, wrapping): exact where the bound keeps each sum within int16
        ones = tirx.Broadcast(tirx.const(1, "int16"), w.lanes * 2)
        _madd_words(d, w, halves[0] + halves[1], ones)

    return emit


def _quad_semantics(lanes: int) -> Callable[[], te.Tensor]:
    """d[i] = sum_k a[k] * b[k // 4, i, k % 4], k < 8: two 4-byte words of the reduction per
    lane, the weights packed word by word ([2][lanes][4], the layout of two vpdpbusd steps)."""

    def semantics() -> te.Tensor:
        a, b = placeholders(a=((8,), "uint8"), b=((2, lanes, 4), "int8"))
        k = te.reduce_axis((0, 8), name="k")
        return te.compute(
            (lanes,),
            lambda i: te.sum(a[k].astype("int32") * b[k // 4, i, k % 4].astype("int32"), axis=k),
            name="d")

    return semantics


def _int16_emit(w: _Width) -> Callable[[dict[str, tirx.Buffer]], None]:
    def emit(bufs: dict[str, tirx.Buffer]) -> None:
        a, b, d = bufs["a"], bufs["b"], bufs["d"]
        # a's two bytes as two int16 (one 32-bit word), broadcast to every lane
        a_word = tirx.reinterpret("int32", tirx.Cast("int16x2", a.vload([0], "uint8x2")))
        a_vec = tirx.reinterpret(f"int16x{w.lanes * 2}", tirx.Broadcast(a_word, w.lanes))
        b_vec = tirx.Cast(f"int16x{w.lanes * 2}", b.vload([0, 0], f"int8x{w.lanes * 2}"))
        _madd_words(d, w, a_vec, b_vec)

    return emit


def _lanewise_int16_emit(w: _Width) -> Callable[[dict[str, tirx.Buffer]], None]:
    def emit(bufs: dict[str, tirx.Buffer]) -> None:
        a, b, d = bufs["a"], bufs["b"], bufs["d"]
        rows = tirx.Cast(f"int16x{w.lanes * 2}", a.vload([0, 0], f"uint8x{w.lanes * 2}"))
        # element lanes * t + c -> 2 c + t: each word one channel's two taps
        words = tirx.Shuffle([rows], [tirx.const(w.lanes * (i % 2) + i // 2, "int32")
                                      for i in range(w.lanes * 2)])
        taps = tirx.Cast(f"int16x{w.lanes * 2}", b.vload([0, 0], f"int8x{w.lanes * 2}"))
        _madd_words(d, w, words, taps)

    return emit


def pair_form(w: _Width) -> Intrinsic:
    """x86.vpmaddubsw[.256]: the pair form, exact under its precondition only."""
    return Intrinsic(
        f"x86.vpmaddubsw{w.suffix}", arch="x86_64", requires=(w.requires,),
        semantics=dot_semantics(w.lanes, 4, "uint8", "int8", "int32"), emit=_pair_emit(w),
        operand_ranges={"a": (0, 127)}, weight_bound=PairSumBound(128), superseded_by=_VNNI,
        doc=f"{w.isa} pair form: vpmaddubsw {w.register} (u8*s8 pairs summed to s16, "
        f"*saturating*) + vpmaddwd by ones (s16 pairs -> s32) + vpaddd, {w.lanes} lanes x 4 "
        "products. Exact only where a pair sum cannot saturate: the u8 operand `a` in [0, 127] "
        "(2*127*128 = 32512 < 32767), or weights whose adjacent pairs obey |b0| + |b1| <= 128 "
        "(255 * 128 = 32640). Elsewhere a=255, b=-128 pairs give -32768, not -65280.")


def quad_form(w: _Width) -> Intrinsic:
    """x86.vpmaddubsw.quad[.256]: two pair-form results added in int16 before widening."""
    return Intrinsic(
        f"x86.vpmaddubsw.quad{w.suffix}", arch="x86_64", requires=(w.requires,),
        semantics=_quad_semantics(w.lanes), emit=_quad_emit(w),
        operand_ranges={"a": (0, 63)}, weight_bound=PairSumBound(128, words=2),
        superseded_by=_VNNI,
        doc=f"{w.isa} quad form: 2 vpmaddubsw {w.register} (each u8*s8 pairs summed to s16, "
        "*saturating*) added by vpaddw (s16, wrapping), vpmaddwd by ones (s16 pairs -> s32) + "
        f"vpaddd: {w.lanes} lanes x 8 products, weights packed [2][{w.lanes}][4]. Exact only "
        "where an int16 sum of 4 products cannot overflow: `a` in [0, 63] (4*63*128 = 32256), "
        "or weights with |b0| + |b1| + |b4| + |b5| <= 128 (and |b2| + |b3| + |b6| + |b7|).")


def int16_form(w: _Width) -> Intrinsic:
    """x86.vpmaddwd[.256]: the exact int16 form."""
    return Intrinsic(
        f"x86.vpmaddwd{w.suffix}", arch="x86_64", requires=(w.requires,),
        semantics=dot_semantics(w.lanes, 2, "uint8", "int8", "int32"), emit=_int16_emit(w),
        superseded_by=_VNNI,
        doc=f"{w.isa} int8 without VNNI, exact: a's 2 u8 zero-extended and b's s8 sign-extended "
        f"(vpmovsxbw) to s16, then vpmaddwd {w.register}: {w.lanes} lanes, each the sum of 2 "
        "products added to s32 (|2 * 255 * -128| < 2^31: no value saturates).")


def lanewise_int16_form(w: _Width) -> Intrinsic:
    """x86.vpunpck.vpmaddwd[.256]: the int16 form for depthwise windows."""
    return Intrinsic(
        f"x86.vpunpck.vpmaddwd{w.suffix}", arch="x86_64", requires=(w.requires,),
        semantics=lanewise_semantics(w.lanes, 2, "uint8", "int8", "int32"),
        emit=_lanewise_int16_emit(w), superseded_by=_VNNI_LANEWISE,
        doc=f"{w.isa} lanewise int8 without VNNI, exact: 2 rows of {w.lanes} u8 channels (2 "
        f"neighbouring pixels of NCHW{w.lanes}c) widened to s16 and interleaved so that each "
        f"word holds one channel's 2 taps, then vpmaddwd {w.register} with the taps' s8 weights "
        "widened: each lane adds 2 products of its own channel to s32 (a depthwise window).")


_VNNI = ("x86.vpdpbusd", "x86.vpdpbusd.256")
_VNNI_LANEWISE = ("x86.vpermb.vpdpbusd",)


# preference order (unit_tvm.selection): the quad forms, then the pair forms, where their
# precondition holds, then the int16 forms, widest first
INTRINSICS = ([quad_form(w) for w in WIDTHS] + [pair_form(w) for w in WIDTHS]
              + [int16_form(w) for w in WIDTHS] + [lanewise_int16_form(w) for w in WIDTHS])
