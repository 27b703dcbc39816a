"""x86 dot-product instructions: AVX512-VNNI / AVX-VNNI vpdpbusd, the pre-VNNI int8 forms of
AVX2 and AVX512BW (vpmaddwd on widened operands, vpmaddubsw pairs), AVX512-BF16.

All but the last have the shape of UNIT's Fig. 4a: one `a` operand of `width` elements broadcast
to every lane, a `b` operand of lanes x width elements, accumulated horizontally into `lanes`
outputs. The last, vpermb + vpdpbusd, is lanewise (a depthwise window): each lane reads its own
activations.
"""

import tvm
from tvm import te, tirx
from tvm.script.ir_builder import tirx as T

from .base import Intrinsic, PairSumBound, placeholders


def dot_semantics(lanes, width, a_dtype, b_dtype, acc_dtype):
    """d[i] = sum_k acc(a[k]) * acc(b[i, k]): the broadcast dot product of UNIT Fig. 4a."""

    def semantics():
        a, b = placeholders(a=((width,), a_dtype), b=((lanes, width), b_dtype))
        k = te.reduce_axis((0, width), name="k")
        return te.compute(
            (lanes,),
            lambda i: te.sum(a[k].astype(acc_dtype) * b[i, k].astype(acc_dtype), axis=k),
            name="d",
        )

    return semantics


def _broadcast_a(a, lanes, width, vec_dtype):
    """Load the `width` elements of a as one 32-bit word and broadcast it to every lane."""
    word = tirx.reinterpret("int32", a.vload([0], f"{a.dtype}x{width}"))
    return tirx.reinterpret(vec_dtype, tirx.Broadcast(word, lanes))


def _vpdpbusd_emit(lanes, llvm_name):
    def emit(bufs):
        a, b, d = bufs["a"], bufs["b"], bufs["d"]
        acc = d.vload([0], f"int32x{lanes}")
        a_vec = _broadcast_a(a, lanes, 4, f"uint8x{lanes * 4}")
        b_vec = b.vload([0, 0], f"int8x{lanes * 4}")
        # LLVM >= 19 types the byte operands as <N x i8> (TVM's own VNNI intrin still passes
        # <16 x i32> and fails verification); the accumulator stays <lanes x i32>.
        T.buffer_store(
            d,
            tirx.call_llvm_pure_intrin(f"int32x{lanes}", llvm_name, acc, a_vec, b_vec),
            [tirx.Ramp(0, 1, lanes)],
        )

    return emit


def _vpmaddubsw_emit(lanes, pairs_intrin, words_intrin):
    """vpmaddubsw (u8 x s8 pairs -> s16, saturating) then vpmaddwd by ones (s16 pairs -> s32)."""

    def emit(bufs):
        a, b, d = bufs["a"], bufs["b"], bufs["d"]
        a_vec = _broadcast_a(a, lanes, 4, f"uint8x{lanes * 4}")
        b_vec = b.vload([0, 0], f"int8x{lanes * 4}")
        pairs = tirx.call_llvm_pure_intrin(f"int16x{lanes * 2}", pairs_intrin, a_vec, b_vec)
        quads = tirx.call_llvm_pure_intrin(
            f"int32x{lanes}", words_intrin, pairs, tirx.Broadcast(tirx.const(1, "int16"), lanes * 2)
        )
        T.buffer_store(d, d.vload([0], f"int32x{lanes}") + quads, [tirx.Ramp(0, 1, lanes)])

    return emit


def _vpmaddwd_emit(lanes, llvm_name):
    """The exact int16 form: both operands widened to s16 (zero- and sign-extended), then one
    vpmaddwd sums each lane's pair of products into s32 (255 * -128 * 2 fits; no saturation)."""

    def emit(bufs):
        a, b, d = bufs["a"], bufs["b"], bufs["d"]
        # a's two bytes as two int16 (one 32-bit word), broadcast to every lane
        a_word = tirx.reinterpret("int32", tirx.Cast("int16x2", a.vload([0], "uint8x2")))
        a_vec = tirx.reinterpret(f"int16x{lanes * 2}", tirx.Broadcast(a_word, lanes))
        b_vec = tirx.Cast(f"int16x{lanes * 2}", b.vload([0, 0], f"int8x{lanes * 2}"))
        prods = tirx.call_llvm_pure_intrin(f"int32x{lanes}", llvm_name, a_vec, b_vec)
        T.buffer_store(d, d.vload([0], f"int32x{lanes}") + prods, [tirx.Ramp(0, 1, lanes)])

    return emit


# TVM's LLVM codegen has no bf16 vector type (its BF16 legalization turns bf16 values into f32),
# while LLVM's vdpbf16ps takes <32 x bfloat>. So this rule passes pointers only and does the
# loads, the broadcast and the call in a few lines of LLVM IR linked in by pragma_import_llvm
# (always-inlined, so it costs nothing over a direct intrinsic call).
_VDPBF16PS_IR = """
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
define void @unit_tvm_vdpbf16ps(ptr %d, ptr %a, ptr %b) {
  %acc = load <16 x float>, ptr %d, align 4
  %pair = load i32, ptr %a, align 2
  %ins = insertelement <16 x i32> poison, i32 %pair, i64 0
  %splat = shufflevector <16 x i32> %ins, <16 x i32> poison, <16 x i32> zeroinitializer
  %av = bitcast <16 x i32> %splat to <32 x bfloat>
  %bv = load <32 x bfloat>, ptr %b, align 2
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %acc, <32 x bfloat> %av, <32 x bfloat> %bv)
  store <16 x float> %r, ptr %d, align 4
  ret void
}
"""  # noqa: E501 - LLVM IR lines are as long as they are


def _storage_ptr(buf, extent):
    """Read pointer to a bf16 buffer, typed by its uint16 storage (Buffer.access_ptr would type it
    bfloat16, which TVM's BF16 legalization rewrites inconsistently: float32 vs uint16)."""
    return tirx.tvm_access_ptr(tirx.type_annotation("uint16"), buf.data, buf.elem_offset, extent, 1)


def _vdpbf16ps_emit(bufs):
    a, b, d = bufs["a"], bufs["b"], bufs["d"]
    # the float32 accumulator by address_of: TVM's StorageRewrite may fold its tile into a dead
    # buffer of another dtype (a bf16 pack), after which a typed access_ptr fails to lower
    with T.attr(tirx.const(0, "int32"), "pragma_import_llvm", tvm.ir.expr.StringImm(_VDPBF16PS_IR)):
        T.evaluate(tirx.call_extern("void", "unit_tvm_vdpbf16ps", tirx.address_of(d),
                                    _storage_ptr(a, 2), _storage_ptr(b, 32)))


VPDPBUSD = Intrinsic(
    "x86.vpdpbusd",
    arch="x86_64",
    requires=[("avx512vnni",)],
    semantics=dot_semantics(16, 4, "uint8", "int8", "int32"),
    emit=_vpdpbusd_emit(16, "llvm.x86.avx512.vpdpbusd.512"),
    doc="AVX512-VNNI vpdpbusd zmm: 16 lanes, each the sum of 4 u8*s8 products added to s32. "
    "Exact (no saturation in this non-'s' form).",
)

VPDPBUSD_256 = Intrinsic(
    "x86.vpdpbusd.256",
    arch="x86_64",
    requires=[("avxvnni",), ("avx512vnni", "avx512vl")],
    semantics=dot_semantics(8, 4, "uint8", "int8", "int32"),
    emit=_vpdpbusd_emit(8, "llvm.x86.avx512.vpdpbusd.256"),
    doc="AVX-VNNI (VEX) or AVX512VL-VNNI (EVEX) vpdpbusd ymm: 8 lanes x 4 u8*s8 -> s32. LLVM picks "
    "the encoding from the target's features; both compute the same.",
)

# The pre-VNNI int8 forms. The vpmaddubsw pair form is the fast one (3 uops per 4 products a lane;
# 450 against 244 GOPS for vpmaddwd.256 on Zen 4 held to AVX2) but saturates its int16 pair sums:
# exact for u7 activations, or for weights whose adjacent pairs obey |w0| + |w1| <= 128, which the
# quantizer can give them and checks. vpmaddwd on operands widened to int16 is exact on every
# u8 x s8 value: it runs everything else.
VPMADDWD = Intrinsic(
    "x86.vpmaddwd",
    arch="x86_64",
    requires=[("avx512bw",)],
    semantics=dot_semantics(16, 2, "uint8", "int8", "int32"),
    emit=_vpmaddwd_emit(16, "llvm.x86.avx512.pmaddw.d.512"),
    doc="AVX512BW int8 without VNNI, exact: a's 2 u8 zero-extended and b's 32 s8 sign-extended "
    "(vpmovsxbw) to s16, then vpmaddwd zmm: 16 lanes, each the sum of 2 products added to s32. "
    "Every u8 x s8 value is exact (|2 * 255 * -128| < 2^31).",
)

VPMADDWD_256 = Intrinsic(
    "x86.vpmaddwd.256",
    arch="x86_64",
    requires=[("avx2",)],
    semantics=dot_semantics(8, 2, "uint8", "int8", "int32"),
    emit=_vpmaddwd_emit(8, "llvm.x86.avx2.pmadd.wd"),
    doc="AVX2 int8 (AMD Zen 2/3, Intel Haswell/Broadwell), exact: operands widened to s16, "
    "then vpmaddwd ymm: 8 lanes, each the sum of 2 u8*s8 products added to s32.",
)

_PAIR_RANGE_DOC = (
    "Its semantics here is the exact dot product, so its applicability is restricted to where "
    "that is exact: the u8 operand `a` in [0, 127] (u7), which bounds each pair sum by "
    "2*127*128 = 32512 < 32767, or weights whose adjacent pairs obey |b0| + |b1| <= 128 (255 * "
    "128 = 32640). Outside both the s16 step saturates (e.g. a=255, b=-128 pairs give -32768, "
    "not -65280)."
)

VPMADDUBSW = Intrinsic(
    "x86.vpmaddubsw",
    arch="x86_64",
    requires=[("avx512bw",)],
    semantics=dot_semantics(16, 4, "uint8", "int8", "int32"),
    emit=_vpmaddubsw_emit(16, "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"),
    operand_ranges={"a": (0, 127)},
    weight_bound=PairSumBound(128),
    doc="AVX512BW pair form: vpmaddubsw zmm (u8*s8 pairs summed to s16, *saturating*) + vpmaddwd "
    "by ones (s16 pairs -> s32) + vpaddd. " + _PAIR_RANGE_DOC,
)

VPMADDUBSW_256 = Intrinsic(
    "x86.vpmaddubsw.256",
    arch="x86_64",
    requires=[("avx2",)],
    semantics=dot_semantics(8, 4, "uint8", "int8", "int32"),
    emit=_vpmaddubsw_emit(8, "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"),
    operand_ranges={"a": (0, 127)},
    weight_bound=PairSumBound(128),
    doc="AVX2 pair form: vpmaddubsw ymm + vpmaddwd by ones + vpaddd, 8 lanes x 4 products. "
    + _PAIR_RANGE_DOC,
)

VDPBF16PS = Intrinsic(
    "x86.vdpbf16ps",
    arch="x86_64",
    requires=[("avx512bf16",)],
    semantics=dot_semantics(16, 2, "bfloat16", "bfloat16", "float32"),
    emit=_vdpbf16ps_emit,
    doc="AVX512-BF16 vdpbf16ps zmm: 16 lanes, each adds 2 bf16*bf16 products to an f32. Products "
    "of bf16 values are exact in f32; only the two f32 additions round (RNE, denormals flushed).",
)


def lanewise_semantics(lanes, width, a_dtype, b_dtype, acc_dtype):
    """d[c] = sum_t acc(a[t, c]) * acc(b[c, t]): every lane sums `width` products of its own
    activations (a: width rows of `lanes` channels, e.g. 4 neighbouring pixels of a channel-blocked
    feature map) and its own weights (b: `width` per lane, contiguous)."""

    def semantics():
        a, b = placeholders(a=((width, lanes), a_dtype), b=((lanes, width), b_dtype))
        t = te.reduce_axis((0, width), name="t")
        return te.compute(
            (lanes,),
            lambda c: te.sum(a[t, c].astype(acc_dtype) * b[c, t].astype(acc_dtype), axis=t),
            name="d",
        )

    return semantics


def _vpermb_vpdpbusd_emit(bufs):
    a, b, d = bufs["a"], bufs["b"], bufs["d"]
    rows = a.vload([0, 0], "uint8x64")  # byte 16 t + c
    # a constant byte shuffle to byte 4 c + t, the word layout vpdpbusd sums; with AVX512-VBMI
    # LLVM emits it as one vpermb
    words = tirx.Shuffle([rows], [tirx.const(16 * (i % 4) + i // 4, "int32") for i in range(64)])
    acc = d.vload([0], "int32x16")
    T.buffer_store(
        d,
        tirx.call_llvm_pure_intrin("int32x16", "llvm.x86.avx512.vpdpbusd.512", acc, words,
                                   b.vload([0, 0], "int8x64")),
        [tirx.Ramp(0, 1, 16)],
    )


VPERMB_VPDPBUSD = Intrinsic(
    "x86.vpermb.vpdpbusd",
    arch="x86_64",
    requires=[("avx512vnni", "avx512vbmi")],
    semantics=lanewise_semantics(16, 4, "uint8", "int8", "int32"),
    emit=_vpermb_vpdpbusd_emit,
    doc="AVX512-VBMI vpermb + AVX512-VNNI vpdpbusd zmm, lanewise: 64 u8 activations (4 rows of 16 "
    "channels, e.g. 4 neighbouring pixels of NCHW16c) are transposed by one byte permutation so "
    "that each 32-bit word holds 4 values of one channel, then each of the 16 lanes adds 4 "
    "u8*s8 products of its own channel to s32 (a depthwise conv's window taps). Exact.",
)

# registry order is preference order (unit_tvm.selection): VNNI first, then the exact pre-VNNI
# forms, widest first; the range-restricted pair forms only when named
def _lanewise_vpmaddwd_emit(lanes, llvm_name):
    """The lanewise int16 form: 2 rows of `lanes` u8 activations widened to s16 and interleaved
    (vpunpcklwd/hwd, or one vpermw) so that each 32-bit word holds a channel's 2 taps, b's
    taps sign-extended, then one vpmaddwd. Exact."""

    def emit(bufs):
        a, b, d = bufs["a"], bufs["b"], bufs["d"]
        rows = tirx.Cast(f"int16x{lanes * 2}", a.vload([0, 0], f"uint8x{lanes * 2}"))
        # element lanes * t + c -> 2 c + t
        words = tirx.Shuffle([rows], [tirx.const(lanes * (i % 2) + i // 2, "int32")
                                      for i in range(lanes * 2)])
        taps = tirx.Cast(f"int16x{lanes * 2}", b.vload([0, 0], f"int8x{lanes * 2}"))
        prods = tirx.call_llvm_pure_intrin(f"int32x{lanes}", llvm_name, words, taps)
        T.buffer_store(d, d.vload([0], f"int32x{lanes}") + prods, [tirx.Ramp(0, 1, lanes)])

    return emit


VPUNPCK_VPMADDWD = Intrinsic(
    "x86.vpunpck.vpmaddwd",
    arch="x86_64",
    requires=[("avx512bw",)],
    semantics=lanewise_semantics(16, 2, "uint8", "int8", "int32"),
    emit=_lanewise_vpmaddwd_emit(16, "llvm.x86.avx512.pmaddw.d.512"),
    doc="AVX512BW lanewise int8 without VNNI, exact: 2 rows of 16 u8 channels (2 neighbouring "
    "pixels of NCHW16c) widened to s16 and interleaved so that each word holds one channel's 2 "
    "taps, then vpmaddwd zmm with the taps' s8 weights widened: 16 lanes, each adds 2 products "
    "of its own channel to s32 (a depthwise conv's window).",
)

VPUNPCK_VPMADDWD_256 = Intrinsic(
    "x86.vpunpck.vpmaddwd.256",
    arch="x86_64",
    requires=[("avx2",)],
    semantics=lanewise_semantics(8, 2, "uint8", "int8", "int32"),
    emit=_lanewise_vpmaddwd_emit(8, "llvm.x86.avx2.pmadd.wd"),
    doc="AVX2 lanewise int8, exact: the 8-lane ymm form of x86.vpunpck.vpmaddwd (depthwise "
    "windows on AMD Zen 2/3 and Intel Haswell/Broadwell).",
)

# registry order is preference order (unit_tvm.selection): VNNI first, then the pair forms
# (only where their precondition is known to hold), then the int16 forms, widest first
INTRINSICS = [VPDPBUSD, VPDPBUSD_256, VPMADDUBSW, VPMADDUBSW_256, VPMADDWD, VPMADDWD_256,
              VDPBF16PS, VPERMB_VPDPBUSD, VPUNPCK_VPMADDWD, VPUNPCK_VPMADDWD_256]
