"""AArch64 dot-product instructions: DotProd sdot/udot and I8MM smmla."""

from collections.abc import Callable

from tvm import te, tirx
from tvm.script.ir_builder import tirx as T

from .base import Intrinsic, placeholders
from .x86 import dot_semantics


def _dot_emit(
    dtype: str, acc_dtype: str, llvm_name: str
) -> Callable[[dict[str, tirx.Buffer]], None]:
    def emit(bufs: dict[str, tirx.Buffer]) -> None:
        a, b, d = bufs["a"], bufs["b"], bufs["d"]
        # sdot/udot (vector form): lane i adds the 4 products of bytes 4i..4i+3 of both sources;
        # broadcasting the 4 bytes of `a` to all lanes makes it the indexed (by-element) form.
        word = tirx.reinterpret("int32", a.vload([0], f"{dtype}x4"))
        a_vec = tirx.reinterpret(f"{dtype}x16", tirx.Broadcast(word, 4))
        b_vec = b.vload([0, 0], f"{dtype}x16")
        acc = d.vload([0], f"{acc_dtype}x4")
        T.buffer_store(
            d, tirx.call_llvm_pure_intrin(f"{acc_dtype}x4", llvm_name, acc, b_vec, a_vec),
            [tirx.Ramp(0, 1, 4)],
        )

    return emit


def _smmla_semantics() -> te.Tensor:
    a, b = placeholders(a=((2, 8), "int8"), b=((2, 8), "int8"))
    k = te.reduce_axis((0, 8), name="k")
    return te.compute(
        (2, 2),
        lambda i, j: te.sum(a[i, k].astype("int32") * b[j, k].astype("int32"), axis=k),
        name="d",
    )


def _smmla_emit(bufs: dict[str, tirx.Buffer]) -> None:
    a, b, d = bufs["a"], bufs["b"], bufs["d"]
    T.buffer_store(
        d,
        tirx.call_llvm_pure_intrin(
            "int32x4", "llvm.aarch64.neon.smmla.v4i32.v16i8",
            d.vload([0, 0], "int32x4"), a.vload([0, 0], "int8x16"), b.vload([0, 0], "int8x16"),
        ),
        [0, tirx.Ramp(0, 1, 4)],
    )


SDOT = Intrinsic(
    "arm.sdot", arch="aarch64", requires=(("dotprod",),),
    semantics=dot_semantics(4, 4, "int8", "int8", "int32"),
    emit=_dot_emit("int8", "int32", "llvm.aarch64.neon.sdot.v4i32.v16i8"),
    doc="Armv8.2 DotProd sdot v.4s: 4 lanes x 4 s8*s8 -> s32, `a` broadcast (by-element form).",
)
UDOT = Intrinsic(
    "arm.udot", arch="aarch64", requires=(("dotprod",),),
    semantics=dot_semantics(4, 4, "uint8", "uint8", "uint32"),
    emit=_dot_emit("uint8", "uint32", "llvm.aarch64.neon.udot.v4i32.v16i8"),
    doc="Armv8.2 DotProd udot v.4s: 4 lanes x 4 u8*u8 -> u32, `a` broadcast (by-element form).",
)
SMMLA = Intrinsic(
    "arm.smmla", arch="aarch64", requires=(("i8mm",),),
    semantics=_smmla_semantics, emit=_smmla_emit,
    doc="Armv8.6 I8MM smmla: (2x8 s8) x (2x8 s8)^T accumulated into a 2x2 s32 tile (row major).",
)

# fastest first (the registry order unit_tvm.selection prefers): smmla performs 32 multiply-adds
# per instruction, sdot 16, at the same issue rate on the Neoverse cores that have both
INTRINSICS = [SMMLA, SDOT, UDOT]
