"""Float32 fused multiply-add as instructions: the broadcast outer-product step of a register-
blocked fp32 microkernel (x86 vfmadd231ps on 8 or 16 lanes, aarch64 NEON fmla on 4), and its
lanewise form for depthwise windows.

Each is UNIT's Fig. 4a with a reduction of extent 1: `d[i] += a[0] * b[i, 0]`, one element of
the activation broadcast to every lane, a vector of `lanes` weights (output channels), added to
`lanes` float32 accumulators. The accumulator is the instruction's own operand: the CPU strategy
keeps a register block of them across the whole reduction, exactly as it does for vpdpbusd.

The lanewise forms (`.lanewise`) are the same instruction with no operand broadcast:
`d[c] += a[0, c] * b[c, 0]`, each lane its own channel's pixel and weight, one window tap per
instruction: a depthwise conv on NCHW[lanes]c blocks.

Numerics: one rounding per multiply-add (fused), so a kernel's sums differ from an unfused
reference only by the summation order's float32 rounding.
"""

from collections.abc import Callable

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .base import Intrinsic
from .x86 import dot_semantics, lanewise_semantics


def _fma_emit(lanes: int) -> Callable[[dict[str, tirx.Buffer]], None]:
    def emit(bufs: dict[str, tirx.Buffer]) -> None:
        a, b, d = bufs["a"], bufs["b"], bufs["d"]
        vec = f"float32x{lanes}"
        # llvm.fma: always fused (never a separate multiply and add), lowered to vfmadd231ps /
        # fmla with the broadcast folded into the instruction's memory operand where it can
        T.buffer_store(
            d,
            tirx.call_llvm_pure_intrin(vec, f"llvm.fma.v{lanes}f32",
                                       tirx.Broadcast(a[0], lanes), b.vload([0, 0], vec),
                                       d.vload([0], vec)),
            [tirx.Ramp(0, 1, lanes)],
        )

    return emit


def _lanewise_fma_emit(lanes: int) -> Callable[[dict[str, tirx.Buffer]], None]:
    def emit(bufs: dict[str, tirx.Buffer]) -> None:
        a, b, d = bufs["a"], bufs["b"], bufs["d"]
        vec = f"float32x{lanes}"
        T.buffer_store(
            d,
            tirx.call_llvm_pure_intrin(vec, f"llvm.fma.v{lanes}f32", a.vload([0, 0], vec),
                                       b.vload([0, 0], vec), d.vload([0], vec)),
            [tirx.Ramp(0, 1, lanes)],
        )

    return emit


VFMADD231PS_512 = Intrinsic(
    "x86.vfmadd231ps.512",
    arch="x86_64",
    requires=(("avx512f",),),
    semantics=dot_semantics(16, 1, "float32", "float32", "float32"),
    emit=_fma_emit(16),
    doc="AVX512F vfmadd231ps zmm: 16 float32 lanes += one broadcast float32 x 16 weights, fused "
    "(one rounding).",
)

VFMADD231PS = Intrinsic(
    "x86.vfmadd231ps",
    arch="x86_64",
    requires=(("fma", "avx2"),),
    semantics=dot_semantics(8, 1, "float32", "float32", "float32"),
    emit=_fma_emit(8),
    doc="AVX2 + FMA vfmadd231ps ymm: 8 float32 lanes += one broadcast float32 x 8 weights, fused "
    "(one rounding).",
)

FMLA = Intrinsic(
    "arm.fmla",
    arch="aarch64",
    requires=(("neon",),),
    semantics=dot_semantics(4, 1, "float32", "float32", "float32"),
    emit=_fma_emit(4),
    doc="NEON fmla v.4s (by-element form): 4 float32 lanes += one broadcast float32 x 4 weights, "
    "fused.",
)

VFMADD231PS_512_LANEWISE = Intrinsic(
    "x86.vfmadd231ps.512.lanewise",
    arch="x86_64",
    requires=(("avx512f",),),
    semantics=lanewise_semantics(16, 1, "float32", "float32", "float32"),
    emit=_lanewise_fma_emit(16),
    doc="AVX512F vfmadd231ps zmm, lanewise: 16 channels each += its own pixel x its own weight "
    "(one tap of a depthwise window on NCHW16c), fused.",
)

VFMADD231PS_LANEWISE = Intrinsic(
    "x86.vfmadd231ps.lanewise",
    arch="x86_64",
    requires=(("fma", "avx2"),),
    semantics=lanewise_semantics(8, 1, "float32", "float32", "float32"),
    emit=_lanewise_fma_emit(8),
    doc="AVX2 + FMA vfmadd231ps ymm, lanewise: 8 channels each += its own pixel x its own "
    "weight (one tap of a depthwise window on NCHW8c), fused.",
)

FMLA_LANEWISE = Intrinsic(
    "arm.fmla.lanewise",
    arch="aarch64",
    requires=(("neon",),),
    semantics=lanewise_semantics(4, 1, "float32", "float32", "float32"),
    emit=_lanewise_fma_emit(4),
    doc="NEON fmla v.4s (vector form), lanewise: 4 channels each += its own pixel x its own "
    "weight (a depthwise window's tap), fused.",
)

# registry order is preference order (unit_tvm.selection): the widest first
INTRINSICS = [VFMADD231PS_512, VFMADD231PS, FMLA, VFMADD231PS_512_LANEWISE,
              VFMADD231PS_LANEWISE, FMLA_LANEWISE]
