"""Intel AMX-INT8 tdpbusd: a 16x64 u8 tile times a 64x16 s8 tile (VNNI-packed) into 16x16 s32.

The largest tensorized instruction on x86 (32768 operations each). TVM has no x86_amx type, so
the rule passes pointers and row strides to a few lines of LLVM IR (linked with
pragma_import_llvm, always inlined) that load the three tiles, issue tdpbusd and store the
accumulator tile; LLVM's AMX passes insert the tile configuration (ldtilecfg). Linux also
requires each process to ask for the AMX tile-data state once (arch_prctl), done here on import.
"""

import ctypes
import functools

import tvm
from tvm import te, tirx
from tvm.script.ir_builder import tirx as T

from .base import Intrinsic, placeholders

M, N, K = 16, 16, 64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_SYS_ARCH_PRCTL = 158

_TDPBUSD_IR = """
declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)
declare x86_amx @llvm.x86.tdpbusd.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)
declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)
define void @unit_tvm_tdpbusd(ptr %c, i64 %cs, ptr %a, i64 %as, ptr %b, i64 %bs) {
  %ct = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %c, i64 %cs)
  %at = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %a, i64 %as)
  %bt = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %b, i64 %bs)
  %r = call x86_amx @llvm.x86.tdpbusd.internal(i16 16, i16 16, i16 64, x86_amx %ct, x86_amx %at, x86_amx %bt)
  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %c, i64 %cs, x86_amx %r)
  ret void
}
"""


@functools.lru_cache(maxsize=None)
def request_tile_permission():
    """Ask Linux for the AMX tile-data state for this process; True when granted."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def _semantics():
    a, b = placeholders(a=((M, K), "uint8"), b=((K // 4, N, 4), "int8"))
    k = te.reduce_axis((0, K), name="k")
    return te.compute(
        (M, N),
        lambda m, n: te.sum(a[m, k].astype("int32") * b[k // 4, n, k % 4].astype("int32"), axis=k),
        name="d",
    )


def _ptr(buf, dtype, row_elems, mask):
    extent = buf.strides[0] * (buf.shape[0] - 1) + row_elems
    return tirx.tvm_access_ptr(tirx.type_annotation(dtype), buf.data, buf.elem_offset, extent, mask)


def _emit(bufs):
    a, b, d = bufs["a"], bufs["b"], bufs["d"]
    with T.attr(tirx.const(0, "int32"), "pragma_import_llvm", tvm.ir.expr.StringImm(_TDPBUSD_IR)):
        T.evaluate(tirx.call_extern(
            "void", "unit_tvm_tdpbusd",
            _ptr(d, "int32", N, 3), (d.strides[0] * 4).astype("int64"),
            _ptr(a, "uint8", K, 1), a.strides[0].astype("int64"),
            _ptr(b, "int8", N * 4, 1), b.strides[0].astype("int64")))


TDPBUSD = Intrinsic(
    "x86.tdpbusd",
    arch="x86_64",
    requires=[("amx-int8", "amx-tile")],
    semantics=_semantics,
    emit=_emit,
    strided=("a", "b", "d"),
    host_check=lambda: None if request_tile_permission() else
    "OS permission for AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM refused)",
    doc="Intel AMX-INT8 tdpbusd: C[16x16 s32] += A[16x64 u8] . B[64x16 s8] (B packed as "
        "[16][16][4]); rows of every tile may be strided.",
)

INTRINSICS = [TDPBUSD]

request_tile_permission()
