"""Intel AMX-INT8 tdpbusd: a 16x64 u8 tile times a 64x16 s8 tile (VNNI-packed) into 16x16 s32.

The largest tensorized instruction on x86 (32768 operations each). TVM has no x86_amx type, so
the rule passes pointers and row strides to a few lines of LLVM IR (linked with
pragma_import_llvm, always inlined) that load the tiles, issue tdpbusd and store the accumulator
tile; LLVM's AMX passes insert the tile configuration (ldtilecfg). Because the accumulator cannot
stay in a tile register between two tensorized calls, the chained forms (x2, x4) run several
tdpbusd on one accumulator per call, with a 2x / 4x longer reduction. Linux also
requires each process to ask for the AMX tile-data state once (arch_prctl), done here on import.
"""

import ctypes
import functools

import tvm
from tvm import te, tirx
from tvm.script.ir_builder import tirx as T

from .base import Intrinsic, placeholders

M, N, K = 16, 16, 64  # one tdpbusd: K u8 per A row = 64 bytes, N s32 per C row = 64 bytes
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_SYS_ARCH_PRCTL = 158


def _chain_ir(steps, fname):
    """LLVM IR of `steps` tdpbusd into one accumulator tile: C is loaded once, the A and B tiles
    of every step (A: the next 64 bytes of each row, B: the next 16 rows) are loaded and
    multiplied in, and C is stored once. The shape arguments of tdpbusd are rows, C's column
    bytes and A's column bytes."""
    lines = [
        "declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)",
        "declare x86_amx @llvm.x86.tdpbusd.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)",
        "declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)",
        f"define void @{fname}(ptr %c, i64 %cs, ptr %a, i64 %as, ptr %b, i64 %bs) {{",
        "  %c0 = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %c, i64 %cs)",
    ]
    for i in range(steps):
        lines += [
            f"  %ap{i} = getelementptr i8, ptr %a, i64 {K * i}",
            f"  %bo{i} = mul i64 %bs, {16 * i}",
            f"  %bp{i} = getelementptr i8, ptr %b, i64 %bo{i}",
            f"  %at{i} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %ap{i}, "
            "i64 %as)",
            f"  %bt{i} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %bp{i}, "
            "i64 %bs)",
            f"  %c{i + 1} = call x86_amx @llvm.x86.tdpbusd.internal(i16 16, i16 64, i16 64, "
            f"x86_amx %c{i}, x86_amx %at{i}, x86_amx %bt{i})",
        ]
    lines += [f"  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %c, i64 %cs, "
              f"x86_amx %c{steps})", "  ret void", "}"]
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=None)
def request_tile_permission():
    """Ask Linux for the AMX tile-data state for this process; True when granted."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def _semantics(steps):
    def semantics():
        k_total = K * steps
        a, b = placeholders(a=((M, k_total), "uint8"), b=((k_total // 4, N, 4), "int8"))
        k = te.reduce_axis((0, k_total), name="k")
        return te.compute(
            (M, N),
            lambda m, n: te.sum(a[m, k].astype("int32") * b[k // 4, n, k % 4].astype("int32"),
                                axis=k),
            name="d",
        )

    return semantics


def _ptr(buf, dtype, row_elems, mask):
    extent = buf.strides[0] * (buf.shape[0] - 1) + row_elems
    return tirx.tvm_access_ptr(tirx.type_annotation(dtype), buf.data, buf.elem_offset, extent, mask)


def _emit(steps):
    fname = "unit_tvm_tdpbusd" if steps == 1 else f"unit_tvm_tdpbusd_x{steps}"
    ir = _chain_ir(steps, fname)

    def emit(bufs):
        a, b, d = bufs["a"], bufs["b"], bufs["d"]
        with T.attr(tirx.const(0, "int32"), "pragma_import_llvm", tvm.ir.expr.StringImm(ir)):
            T.evaluate(tirx.call_extern(
                "void", fname,
                _ptr(d, "int32", N, 3), (d.strides[0] * 4).astype("int64"),
                _ptr(a, "uint8", K * steps, 1), a.strides[0].astype("int64"),
                _ptr(b, "int8", N * 4, 1), b.strides[0].astype("int64")))

    return emit


def _tdpbusd(steps):
    name = "x86.tdpbusd" if steps == 1 else f"x86.tdpbusd.x{steps}"
    chain = "" if steps == 1 else (
        f" {steps} tdpbusd chained on one accumulator tile (loaded and stored once, not per "
        f"instruction), so the reduction is {steps * K} wide.")
    return Intrinsic(
        name,
        arch="x86_64",
        requires=[("amx-int8", "amx-tile")],
        semantics=_semantics(steps),
        emit=_emit(steps),
        strided=("a", "b", "d"),
        family="x86.amx-int8",
        host_check=lambda: None if request_tile_permission() else
        "OS permission for AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM refused)",
        doc=f"Intel AMX-INT8 tdpbusd: C[16x16 s32] += A[16x{K * steps} u8] . B[{K * steps}x16 s8] "
            f"(B packed as [{K * steps // 4}][16][4]); rows of every tile may be strided." + chain,
    )


# Longer chains first: the one whose reduction fits the op with the least padding is used.
TDPBUSD_X4, TDPBUSD_X2, TDPBUSD = _tdpbusd(4), _tdpbusd(2), _tdpbusd(1)
INTRINSICS = [TDPBUSD_X4, TDPBUSD_X2, TDPBUSD]

request_tile_permission()
