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


def _fma_emit(lanes: int, lanewise: bool) -> Callable[[dict[str, tirx.Buffer]], None]:
    def emit(bufs: dict[str, tirx.Buffer]) -> None:
        a, b, d = bufs["a"], bufs["b"], bufs["d"]
        vec = f"float32x{lanes}"
        # lanewise: each lane's own activation; else one activation broadcast to every lane
        a_vec = a.vload([0, 0], vec) if lanewise else tirx.Broadcast(a[0], lanes)
        # llvm.fma: always fused (never a separate multiply and add), lowered to vfmadd231ps /
        # fmla with a broadcast or a load folded into the instruction's memory operand
        T.buffer_store(
            d,
            tirx.call_llvm_pure_intrin(vec, f"llvm.fma.v{lanes}f32", a_vec,
                                       b.vload([0, 0], vec), d.vload([0], vec)),
            [tirx.Ramp(0, 1, lanes)],
        )

    return emit


def _forms(name: str, arch: str, requires: tuple[tuple[str, ...], ...], lanes: int,
           what: str) -> tuple[Intrinsic, Intrinsic]:
    """(broadcast form, lanewise form) of a float32 multiply-add of `lanes` lanes."""
    f32 = ("float32", "float32", "float32")
    broadcast = Intrinsic(
        name, arch=arch, requires=requires, semantics=dot_semantics(lanes, 1, *f32),
        emit=_fma_emit(lanes, lanewise=False), scratch_registers=0,
        doc=f"{what}: {lanes} float32 lanes += one broadcast float32 x {lanes} weights, fused "
        "(one rounding).")
    lanewise = Intrinsic(
        name + ".lanewise", arch=arch, requires=requires,
        semantics=lanewise_semantics(lanes, 1, *f32), emit=_fma_emit(lanes, lanewise=True),
        doc=f"{what}, lanewise: {lanes} channels each += its own pixel x its own weight (one "
        f"tap of a depthwise window on NCHW{lanes}c), fused.")
    return broadcast, lanewise


VFMADD231PS_512, VFMADD231PS_512_LANEWISE = _forms(
    "x86.vfmadd231ps.512", "x86_64", (("avx512f",),), 16, "AVX512F vfmadd231ps zmm")
VFMADD231PS, VFMADD231PS_LANEWISE = _forms(
    "x86.vfmadd231ps", "x86_64", (("fma", "avx2"),), 8, "AVX2 + FMA vfmadd231ps ymm")
FMLA, FMLA_LANEWISE = _forms("arm.fmla", "aarch64", (("neon",),), 4, "NEON fmla v.4s")

# registry order is preference order (unit_tvm.selection): the widest first
INTRINSICS = [VFMADD231PS_512, VFMADD231PS, FMLA, VFMADD231PS_512_LANEWISE,
              VFMADD231PS_LANEWISE, FMLA_LANEWISE]
