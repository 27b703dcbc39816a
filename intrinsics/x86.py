"""x86 dot-product instructions: AVX512-VNNI / AVX-VNNI vpdpbusd, AVX512-BF16 vdpbf16ps
(the int8 forms of CPUs without VNNI: x86_pre_vnni.py).

The first three have the shape of UNIT's Fig. 4a: one `a` operand of `width` elements broadcast
to every lane, a `b` operand of lanes x width elements, accumulated horizontally into `lanes`
outputs. The last, vpermb + vpdpbusd, is lanewise (a depthwise window): each lane reads its own
activations.
"""

from collections.abc import Callable

import tvm
from tvm import te, tirx
from tvm.script.ir_builder import tirx as T

from .base import Intrinsic, placeholders


def dot_semantics(
    lanes: int, width: int, a_dtype: str, b_dtype: str, acc_dtype: str
) -> Callable[[], te.Tensor]:
    """d[i] = sum_k acc(a[k]) * acc(b[i, k]): the broadcast dot product of UNIT Fig. 4a."""

    def semantics() -> te.Tensor:
        a, b = placeholders(a=((width,), a_dtype), b=((lanes, width), b_dtype))
        k = te.reduce_axis((0, width), name="k")
        return te.compute(
            (lanes,),
            lambda i: te.sum(a[k].astype(acc_dtype) * b[i, k].astype(acc_dtype), axis=k),
            name="d",
        )

    return semantics


def broadcast_word(a: tirx.Buffer, lanes: int, width: int, vec_dtype: str) -> tirx.Expr:
    """Load the `width` elements of a as one 32-bit word and broadcast it to every lane."""
    word = tirx.reinterpret("int32", a.vload([0], f"{a.dtype}x{width}"))
    return tirx.reinterpret(vec_dtype, tirx.Broadcast(word, lanes))


def _vpdpbusd_emit(lanes: int, llvm_name: str) -> Callable[[dict[str, tirx.Buffer]], None]:
    def emit(bufs: dict[str, tirx.Buffer]) -> None:
        a, b, d = bufs["a"], bufs["b"], bufs["d"]
        acc = d.vload([0], f"int32x{lanes}")
        a_vec = broadcast_word(a, lanes, 4, f"uint8x{lanes * 4}")
        b_vec = b.vload([0, 0], f"int8x{lanes * 4}")
        # LLVM >= 19 types the byte operands as <N x i8> (TVM's own VNNI intrin still passes
        # <16 x i32> and fails verification); the accumulator stays <lanes x i32>.
        T.buffer_store(
            d,
            tirx.call_llvm_pure_intrin(f"int32x{lanes}", llvm_name, acc, a_vec, b_vec),
            [tirx.Ramp(0, 1, lanes)],
        )

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


def _storage_ptr(buf: tirx.Buffer, extent: int) -> tirx.Expr:
    """Read pointer to a bf16 buffer, typed by its uint16 storage (Buffer.access_ptr would type it
    bfloat16, which TVM's BF16 legalization rewrites inconsistently: float32 vs uint16)."""
    return tirx.tvm_access_ptr(tirx.type_annotation("uint16"), buf.data, buf.elem_offset, extent, 1)


def _vdpbf16ps_emit(bufs: dict[str, tirx.Buffer]) -> None:
    a, b, d = bufs["a"], bufs["b"], bufs["d"]
    # the float32 accumulator by address_of: TVM's StorageRewrite may fold its tile into a dead
    # buffer of another dtype (a bf16 pack), after which a typed access_ptr fails to lower
    with T.attr(tirx.const(0, "int32"), "pragma_import_llvm", tvm.ir.expr.StringImm(_VDPBF16PS_IR)):
        T.evaluate(tirx.call_extern("void", "unit_tvm_vdpbf16ps", tirx.address_of(d),
                                    _storage_ptr(a, 2), _storage_ptr(b, 32)))


VPDPBUSD = Intrinsic(
    "x86.vpdpbusd",
    arch="x86_64",
    requires=(("avx512vnni",),),
    semantics=dot_semantics(16, 4, "uint8", "int8", "int32"),
    emit=_vpdpbusd_emit(16, "llvm.x86.avx512.vpdpbusd.512"),
    doc="AVX512-VNNI vpdpbusd zmm: 16 lanes, each the sum of 4 u8*s8 products added to s32. "
    "Exact (no saturation in this non-'s' form).",
    # the broadcast word is an embedded {1to16} memory operand: nothing besides the operands
    scratch_registers=0,
)

VPDPBUSD_256 = Intrinsic(
    "x86.vpdpbusd.256",
    arch="x86_64",
    requires=(("avxvnni",), ("avx512vnni", "avx512vl")),
    semantics=dot_semantics(8, 4, "uint8", "int8", "int32"),
    emit=_vpdpbusd_emit(8, "llvm.x86.avx512.vpdpbusd.256"),
    doc="AVX-VNNI (VEX) or AVX512VL-VNNI (EVEX) vpdpbusd ymm: 8 lanes x 4 u8*s8 -> s32. LLVM picks "
    "the encoding from the target's features; both compute the same.",
)

VDPBF16PS = Intrinsic(
    "x86.vdpbf16ps",
    arch="x86_64",
    requires=(("avx512bf16",),),
    semantics=dot_semantics(16, 2, "bfloat16", "bfloat16", "float32"),
    emit=_vdpbf16ps_emit,
    doc="AVX512-BF16 vdpbf16ps zmm: 16 lanes, each adds 2 bf16*bf16 products to an f32. Products "
    "of bf16 values are exact in f32; only the two f32 additions round (RNE, denormals flushed).",
)


def lanewise_semantics(
    lanes: int, width: int, a_dtype: str, b_dtype: str, acc_dtype: str
) -> Callable[[], te.Tensor]:
    """d[c] = sum_t acc(a[t, c]) * acc(b[c, t]): every lane sums `width` products of its own
    activations (a: width rows of `lanes` channels, e.g. 4 neighbouring pixels of a channel-blocked
    feature map) and its own weights (b: `width` per lane, contiguous)."""

    def semantics() -> te.Tensor:
        a, b = placeholders(a=((width, lanes), a_dtype), b=((lanes, width), b_dtype))
        t = te.reduce_axis((0, width), name="t")
        return te.compute(
            (lanes,),
            lambda c: te.sum(a[t, c].astype(acc_dtype) * b[c, t].astype(acc_dtype), axis=t),
            name="d",
        )

    return semantics


def _vpermb_vpdpbusd_emit(bufs: dict[str, tirx.Buffer]) -> None:
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
    requires=(("avx512vnni", "avx512vbmi"),),
    semantics=lanewise_semantics(16, 4, "uint8", "int8", "int32"),
    emit=_vpermb_vpdpbusd_emit,
    doc="AVX512-VBMI vpermb + AVX512-VNNI vpdpbusd zmm, lanewise: 64 u8 activations (4 rows of 16 "
    "channels, e.g. 4 neighbouring pixels of NCHW16c) are transposed by one byte permutation so "
    "that each 32-bit word holds 4 values of one channel, then each of the 16 lanes adds 4 "
    "u8*s8 products of its own channel to s32 (a depthwise conv's window taps). Exact.",
)

# registry order is preference order (unit_tvm.selection): the widest first
INTRINSICS = [VPDPBUSD, VPDPBUSD_256, VDPBF16PS, VPERMB_VPDPBUSD]
