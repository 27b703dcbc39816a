"""Intel AMX tile dot products: AMX-INT8 tdpbusd (a 16x64 u8 tile times a 64x16 s8 tile,
VNNI-packed, into 16x16 s32) and AMX-BF16 tdpbf16ps (a 16x32 bf16 tile times a 32x16 bf16 tile,
pair-packed, into 16x16 f32).

The largest tensorized instructions on x86 (32768 / 16384 operations each). TVM has no x86_amx
type, so the rule passes pointers and row strides to a few lines of LLVM IR (linked with
pragma_import_llvm, always inlined) that load the tiles, issue the dot product and store the
accumulator tile; LLVM's AMX passes insert the tile configuration (ldtilecfg). Because the
accumulator cannot stay in a tile register between two tensorized calls, the chained forms (x2,
x4) run several instructions on one accumulator per call, with a 2x / 4x longer reduction, on
one, two (n2) or 2 x 2 (m2n2) accumulator tiles. Linux
also requires each process to ask for the AMX tile-data state once (arch_prctl): the forms'
host check does, which `intrinsics.for_target` runs and `target.prepare_host` calls before
kernels run in a process that chose none (a loaded library, an RPC server).
"""

import collections
import ctypes
import functools
from collections.abc import Callable

import tvm
from tvm import te, tirx
from tvm.script.ir_builder import tirx as T

from .base import Intrinsic, placeholders

M, N, ROW_BYTES = 16, 16, 64  # one instruction: 16 rows of 64 bytes in every tile

# One AMX dot-product instruction: its LLVM name, dtypes (A, B, C; `storage`: the integer type
# pointers to A and B are typed with, see x86.py on bf16) and elements per 32-bit word of A/B.
_Kind = collections.namedtuple("_Kind", "op a_dtype b_dtype c_dtype storage word feature")
INT8 = _Kind("tdpbusd", "uint8", "int8", "int32", ("uint8", "int8"), 4, "amx-int8")
BF16 = _Kind("tdpbf16ps", "bfloat16", "bfloat16", "float32", ("uint16", "uint16"), 2, "amx-bf16")
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_SYS_ARCH_PRCTL = 158


def _chain_ir(kind: _Kind, steps: int, fname: str, cols: int = 1, rows: int = 1) -> str:
    """LLVM IR of `steps` instructions (kind.op) into each of rows x cols accumulator tiles (C
    is 16*rows x 16*cols, A 16*rows rows, B 16*cols columns wide). The C tiles are loaded once;
    per step each of the `rows` A tiles (the next 64 bytes of its 16 rows) and each of the `cols`
    B tiles (the next 16 rows, one 64-byte column block each) is loaded once and shared by the
    tiles of its row / column of C; the C tiles are stored once. With 2 x 2 (4 C, 2 A, 2 B) the
    eight tile registers are all live. The shape arguments of the instruction are rows, C's
    column bytes and A's column bytes; strides are in bytes."""
    op = kind.op
    lines = [
        "declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)",
        f"declare x86_amx @llvm.x86.{op}.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)",
        "declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)",
        f"define void @{fname}(ptr %c, i64 %cs, ptr %a, i64 %as, ptr %b, i64 %bs) {{",
        "  %cr = mul i64 %cs, 16",
        "  %ar = mul i64 %as, 16",
    ]
    tiles = [(r, j) for r in range(rows) for j in range(cols)]
    for r, j in tiles:
        lines += [f"  %co{r}{j} = add i64 {64 * j}, {'%cr' if r else 0}",
                  f"  %cp{r}{j} = getelementptr i8, ptr %c, i64 %co{r}{j}",
                  f"  %c{r}{j}_0 = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, "
                  f"ptr %cp{r}{j}, i64 %cs)"]
    for i in range(steps):
        for r in range(rows):
            lines += [
                f"  %ao{i}_{r} = add i64 {ROW_BYTES * i}, {'%ar' if r else 0}",
                f"  %ap{i}_{r} = getelementptr i8, ptr %a, i64 %ao{i}_{r}",
                f"  %at{i}_{r} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, "
                f"ptr %ap{i}_{r}, i64 %as)"]
        lines.append(f"  %bo{i} = mul i64 %bs, {16 * i}")
        for j in range(cols):
            lines += [
                f"  %bq{i}_{j} = add i64 %bo{i}, {64 * j}",
                f"  %bp{i}_{j} = getelementptr i8, ptr %b, i64 %bq{i}_{j}",
                f"  %bt{i}_{j} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, "
                f"ptr %bp{i}_{j}, i64 %bs)"]
        for r, j in tiles:
            lines.append(
                f"  %c{r}{j}_{i + 1} = call x86_amx @llvm.x86.{op}.internal(i16 16, i16 64, "
                f"i16 64, x86_amx %c{r}{j}_{i}, x86_amx %at{i}_{r}, x86_amx %bt{i}_{j})")
    for r, j in tiles:
        lines.append(f"  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, "
                     f"ptr %cp{r}{j}, i64 %cs, x86_amx %c{r}{j}_{steps})")
    lines += ["  ret void", "}"]
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=None)
def request_tile_permission() -> bool:
    """Ask Linux for the AMX tile-data state for this process; True when granted."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def _semantics(kind: _Kind, steps: int, cols: int, rows: int = 1) -> Callable[[], te.Tensor]:
    def semantics() -> te.Tensor:
        w = kind.word
        k_total, n_total = ROW_BYTES // 4 * w * steps, N * cols
        a, b = placeholders(a=((M * rows, k_total), kind.a_dtype),
                            b=((k_total // w, n_total, w), kind.b_dtype))
        k = te.reduce_axis((0, k_total), name="k")
        acc = kind.c_dtype
        return te.compute(
            (M * rows, n_total),
            lambda m, n: te.sum(a[m, k].astype(acc) * b[k // w, n, k % w].astype(acc), axis=k),
            name="d",
        )

    return semantics


def _ptr(buf: tirx.Buffer, dtype: str, row_elems: int, mask: int) -> tirx.Expr:
    extent = buf.strides[0] * (buf.shape[0] - 1) + row_elems
    return tirx.tvm_access_ptr(tirx.type_annotation(dtype), buf.data, buf.elem_offset, extent, mask)


def _form_name(kind: _Kind, steps: int, cols: int, rows: int = 1) -> str:
    """x86.tdpbusd, x86.tdpbusd.x4, x86.tdpbf16ps.x4.n2, x86.tdpbusd.x4.m2n2, ..."""
    shape = f".m{rows}n{cols}" if rows > 1 else f".n{cols}" if cols > 1 else ""
    return f"x86.{kind.op}" + (f".x{steps}" if steps > 1 else "") + shape


def _emit(kind: _Kind, steps: int, cols: int,
          rows: int = 1) -> Callable[[dict[str, tirx.Buffer]], None]:
    fname = "unit_tvm_" + _form_name(kind, steps, cols, rows)[len("x86."):].replace(".", "_")
    ir = _chain_ir(kind, steps, fname, cols, rows)
    a_t, b_t = kind.storage
    elem = {"uint8": 1, "int8": 1, "uint16": 2}
    k_total = ROW_BYTES // elem[a_t] * steps

    def emit(bufs: dict[str, tirx.Buffer]) -> None:
        a, b, d = bufs["a"], bufs["b"], bufs["d"]
        with T.attr(tirx.const(0, "int32"), "pragma_import_llvm", tvm.ir.expr.StringImm(ir)):
            T.evaluate(tirx.call_extern(
                "void", fname,
                _ptr(d, kind.c_dtype, N * cols, 3), (d.strides[0] * 4).astype("int64"),
                _ptr(a, a_t, k_total, 1), (a.strides[0] * elem[a_t]).astype("int64"),
                _ptr(b, b_t, N * cols * kind.word, 1),
                (b.strides[0] * elem[b_t]).astype("int64")))

    return emit


def _form(kind: _Kind, steps: int, cols: int = 1, rows: int = 1) -> Intrinsic:
    name = _form_name(kind, steps, cols, rows)
    k = ROW_BYTES // 4 * kind.word * steps
    chain = "" if steps == 1 else (
        f" {steps} {kind.op} chained on each accumulator tile (loaded and stored once, not per "
        f"instruction), so the reduction is {k} wide.")
    if rows > 1:
        chain += (f" {rows} x {cols} accumulator tiles (C is {M * rows}x{N * cols}): each A tile "
                  f"is shared by a row of them, each B tile by a column.")
    elif cols > 1:
        chain += (f" {cols} accumulator tiles side by side share each A tile (C is "
                  f"16x{N * cols}).")
    return Intrinsic(
        name,
        arch="x86_64",
        requires=((kind.feature, "amx-tile"),),
        semantics=_semantics(kind, steps, cols, rows),
        emit=_emit(kind, steps, cols, rows),
        strided=("a", "b", "d"),
        family="x86." + kind.feature,
        host_check=lambda: None if request_tile_permission() else
        "OS permission for AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM refused)",
        doc=f"Intel {kind.feature.upper()} {kind.op}: C[{M * rows}x{N * cols} {kind.c_dtype}] += "
            f"A[{M * rows}x{k} {kind.a_dtype}] . B[{k}x{N * cols} {kind.b_dtype}] (B packed as "
            f"[{k // kind.word}][{N * cols}][{kind.word}]); rows of every tile may be strided."
            + chain,
    )


# Longer chains first: the one whose reduction fits the op with the least padding is used. The
# two-column forms (C 16x32) and the 2 x 2 form (C 32x32) come after: ties go to the single
# tile, which pads output channels and rows less; they are for callers that measure (bench-op,
# the tuner's race). The 2 x 2 form loads one tile per instruction instead of 1.5 (two-column)
# or 2, its A tiles from L2 where a GEMM's rows outgrow L1. Measured on a 2-vCPU AMX Xeon VM
# (2026-12-08, uint8 x int8 dense 512 x 2048 -> 8192, min of 7 x 5 calls): default configs
# x4 5.61-5.92 ms, x4.n2 5.38, x4.m2n2 5.01; tuned (24 trials) x4 4.90, x4.m2n2 4.28 ms.
# Chaining 8 instead of 4 gained nothing there (5.57 ms).
TDPBUSD_X4, TDPBUSD_X2, TDPBUSD = _form(INT8, 4), _form(INT8, 2), _form(INT8, 1)
TDPBUSD_X4_N2, TDPBUSD_X2_N2 = _form(INT8, 4, 2), _form(INT8, 2, 2)
TDPBUSD_X4_M2N2 = _form(INT8, 4, 2, 2)
TDPBF16PS_X4, TDPBF16PS_X2, TDPBF16PS = _form(BF16, 4), _form(BF16, 2), _form(BF16, 1)
TDPBF16PS_X4_N2, TDPBF16PS_X2_N2 = _form(BF16, 4, 2), _form(BF16, 2, 2)
INTRINSICS = [TDPBUSD_X4, TDPBUSD_X2, TDPBUSD, TDPBUSD_X4_N2, TDPBUSD_X2_N2, TDPBUSD_X4_M2N2,
              TDPBF16PS_X4, TDPBF16PS_X2, TDPBF16PS, TDPBF16PS_X4_N2, TDPBF16PS_X2_N2]
