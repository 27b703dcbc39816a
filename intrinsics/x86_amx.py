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


def _chain_ir(steps, fname, cols=1):
    """LLVM IR of `steps` tdpbusd into each of `cols` accumulator tiles side by side (C is 16 x
    16*cols s32, B 16*cols columns wide). The C tiles are loaded once; per step the A tile (the
    next 64 bytes of each row) is loaded once and shared by the `cols` B tiles (the next 16 rows,
    one 64-byte column block each); the C tiles are stored once. The shape arguments of tdpbusd
    are rows, C's column bytes and A's column bytes."""
    lines = [
        "declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)",
        "declare x86_amx @llvm.x86.tdpbusd.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)",
        "declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)",
        f"define void @{fname}(ptr %c, i64 %cs, ptr %a, i64 %as, ptr %b, i64 %bs) {{",
    ]
    for j in range(cols):
        lines += [f"  %cp{j} = getelementptr i8, ptr %c, i64 {64 * j}",
                  f"  %c{j}_0 = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, "
                  f"ptr %cp{j}, i64 %cs)"]
    for i in range(steps):
        lines += [
            f"  %ap{i} = getelementptr i8, ptr %a, i64 {K * i}",
            f"  %at{i} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %ap{i}, "
            "i64 %as)",
            f"  %bo{i} = mul i64 %bs, {16 * i}",
        ]
        for j in range(cols):
            lines += [
                f"  %bq{i}_{j} = add i64 %bo{i}, {64 * j}",
                f"  %bp{i}_{j} = getelementptr i8, ptr %b, i64 %bq{i}_{j}",
                f"  %bt{i}_{j} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, "
                f"ptr %bp{i}_{j}, i64 %bs)",
                f"  %c{j}_{i + 1} = call x86_amx @llvm.x86.tdpbusd.internal(i16 16, i16 64, "
                f"i16 64, x86_amx %c{j}_{i}, x86_amx %at{i}, x86_amx %bt{i}_{j})",
            ]
    for j in range(cols):
        lines.append(f"  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %cp{j}, "
                     f"i64 %cs, x86_amx %c{j}_{steps})")
    lines += ["  ret void", "}"]
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=None)
def request_tile_permission():
    """Ask Linux for the AMX tile-data state for this process; True when granted."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def _semantics(steps, cols):
    def semantics():
        k_total, n_total = K * steps, N * cols
        a, b = placeholders(a=((M, k_total), "uint8"), b=((k_total // 4, n_total, 4), "int8"))
        k = te.reduce_axis((0, k_total), name="k")
        return te.compute(
            (M, n_total),
            lambda m, n: te.sum(a[m, k].astype("int32") * b[k // 4, n, k % 4].astype("int32"),
                                axis=k),
            name="d",
        )

    return semantics


def _ptr(buf, dtype, row_elems, mask):
    extent = buf.strides[0] * (buf.shape[0] - 1) + row_elems
    return tirx.tvm_access_ptr(tirx.type_annotation(dtype), buf.data, buf.elem_offset, extent, mask)


def _form_name(steps, cols):
    """x86.tdpbusd, x86.tdpbusd.x4, x86.tdpbusd.x4.n2, ..."""
    return "x86.tdpbusd" + (f".x{steps}" if steps > 1 else "") + (f".n{cols}" if cols > 1 else "")


def _emit(steps, cols):
    fname = "unit_tvm_" + _form_name(steps, cols)[len("x86."):].replace(".", "_")
    ir = _chain_ir(steps, fname, cols)

    def emit(bufs):
        a, b, d = bufs["a"], bufs["b"], bufs["d"]
        with T.attr(tirx.const(0, "int32"), "pragma_import_llvm", tvm.ir.expr.StringImm(ir)):
            T.evaluate(tirx.call_extern(
                "void", fname,
                _ptr(d, "int32", N * cols, 3), (d.strides[0] * 4).astype("int64"),
                _ptr(a, "uint8", K * steps, 1), a.strides[0].astype("int64"),
                _ptr(b, "int8", N * cols * 4, 1), b.strides[0].astype("int64")))

    return emit


def _tdpbusd(steps, cols=1):
    name = _form_name(steps, cols)
    chain = "" if steps == 1 else (
        f" {steps} tdpbusd chained on each accumulator tile (loaded and stored once, not per "
        f"instruction), so the reduction is {steps * K} wide.")
    if cols > 1:
        chain += (f" {cols} accumulator tiles side by side share each A tile (C is "
                  f"16x{N * cols}).")
    return Intrinsic(
        name,
        arch="x86_64",
        requires=[("amx-int8", "amx-tile")],
        semantics=_semantics(steps, cols),
        emit=_emit(steps, cols),
        strided=("a", "b", "d"),
        family="x86.amx-int8",
        host_check=lambda: None if request_tile_permission() else
        "OS permission for AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM refused)",
        doc=f"Intel AMX-INT8 tdpbusd: C[16x{N * cols} s32] += A[16x{K * steps} u8] . "
            f"B[{K * steps}x{N * cols} s8] (B packed as [{K * steps // 4}][{N * cols}][4]); rows "
            "of every tile may be strided." + chain,
    )


# Longer chains first: the one whose reduction fits the op with the least padding is used. The
# two-column forms (C 16x32) come after: ties go to the single column, which pads output channels
# less; they are for callers that measure (bench-op tunes every form).
TDPBUSD_X4, TDPBUSD_X2, TDPBUSD = _tdpbusd(4), _tdpbusd(2), _tdpbusd(1)
TDPBUSD_X4_N2, TDPBUSD_X2_N2 = _tdpbusd(4, 2), _tdpbusd(2, 2)
INTRINSICS = [TDPBUSD_X4, TDPBUSD_X2, TDPBUSD, TDPBUSD_X4_N2, TDPBUSD_X2_N2]

request_tile_permission()
