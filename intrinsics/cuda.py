"""NVIDIA Tensor Core wmma instructions (16x16x16), accumulate-in-place form (UNIT Fig. 4c).

Besides the mma itself, a fragment must be loaded, zero-filled and stored; those three
operand-preparation steps are registered as helper TensorIntrins of each instruction
(`intrin.helper('load_a' | 'load_b' | 'fill' | 'store' | 'store_shared')`; the last stores
partial accumulators to shared memory for a split-K reduction).
"""

from collections.abc import Callable

from tvm import te, tirx
from tvm.script.ir_builder import tirx as T

from .base import Intrinsic, derive_desc, derive_impl, placeholders

M = N = K = 16
_FRAG_SCOPES = {"a": "wmma.matrix_a", "b": "wmma.matrix_b", "d": "wmma.accumulator"}


def _mma_semantics(in_dtype: str, acc_dtype: str) -> Callable[[], te.Tensor]:
    def semantics() -> te.Tensor:
        a, b = placeholders(a=((M, K), in_dtype), b=((K, N), in_dtype))
        k = te.reduce_axis((0, K), name="k")
        return te.compute(
            (M, N),
            lambda i, j: te.sum(a[i, k].astype(acc_dtype) * b[k, j].astype(acc_dtype), axis=k),
            name="d",
        )

    return semantics


def fragment_index(buf: tirx.Buffer, rows: int, cols: int) -> tirx.Expr:
    """Index of the rows x cols fragment that `buf` (a view into a fragment array) starts at."""
    stride = buf.strides[0]
    return (buf.elem_offset // stride // rows) * (stride // cols) + buf.elem_offset % stride // cols


def _mma_emit(bufs: dict[str, tirx.Buffer]) -> None:
    a, b, d = bufs["a"], bufs["b"], bufs["d"]
    T.evaluate(
        tirx.tvm_mma_sync(
            d.data, fragment_index(d, M, N), a.data, fragment_index(a, M, K),
            b.data, fragment_index(b, K, N), d.data, fragment_index(d, M, N),
        )
    )


def _copy(
    name: str, dtype: str, src_scope: str, dst_scope: str
) -> tuple[te.Tensor, dict[str, str]]:
    """A 16x16 copy compute between two scopes: the semantics of a fragment load/store."""
    src = te.placeholder((M, N), dtype, name="src")
    dst = te.compute((M, N), lambda i, j: src[i, j], name="dst")
    return dst, {"src": src_scope, "dst": dst_scope}


def _helpers(
    in_dtype: str, acc_dtype: str
) -> dict[str, tuple[Callable[[], tirx.PrimFunc], Callable[[], tirx.PrimFunc]]]:
    def load(operand: str) -> tuple[Callable[[], tirx.PrimFunc], Callable[[], tirx.PrimFunc]]:
        out, scopes = _copy("load", in_dtype, "shared", _FRAG_SCOPES[operand])

        def emit(bufs: dict[str, tirx.Buffer]) -> None:
            src, dst = bufs["src"], bufs["dst"]
            T.evaluate(tirx.tvm_load_matrix_sync(
                dst.data, M, N, K, fragment_index(dst, M, N),
                src.access_ptr("r", ptr_type=in_dtype), src.strides[0], "row_major"))

        return (lambda: derive_desc(out, scopes=scopes, offset_factor=16),
                lambda: derive_impl(out, emit, scopes=scopes, offset_factor=16,
                                    strided=("src", "dst")))

    def fill() -> tuple[Callable[[], tirx.PrimFunc], Callable[[], tirx.PrimFunc]]:
        out = te.compute((M, N), lambda i, j: tirx.const(0, acc_dtype), name="dst")
        scopes = {"dst": "wmma.accumulator"}

        def emit(bufs: dict[str, tirx.Buffer]) -> None:
            dst = bufs["dst"]
            T.evaluate(tirx.tvm_fill_fragment(dst.data, M, N, K, fragment_index(dst, M, N),
                                              tirx.const(0, acc_dtype)))

        return (lambda: derive_desc(out, scopes=scopes, offset_factor=16),
                lambda: derive_impl(out, emit, scopes=scopes, offset_factor=16, strided=("dst",)))

    def store(dst_scope: str) -> tuple[Callable[[], tirx.PrimFunc], Callable[[], tirx.PrimFunc]]:
        out, scopes = _copy("store", acc_dtype, "wmma.accumulator", dst_scope)

        def emit(bufs: dict[str, tirx.Buffer]) -> None:
            src, dst = bufs["src"], bufs["dst"]
            if dst_scope == "global":
                ptr = dst.access_ptr("w", ptr_type=acc_dtype)
            else:
                # TVM's StorageRewrite may fold this shared buffer into an earlier one of another
                # dtype, after which a typed access_ptr fails to lower; address_of survives it.
                # Folded into the operand stages, the partials overwrite tiles that slower
                # warps may still be loading fragments from: all warps finish those first (a
                # wrong answer on an H200 without this barrier)
                ptr = tirx.address_of(dst)
                T.evaluate(tirx.op.tvm_storage_sync("shared"))
            T.evaluate(tirx.tvm_store_matrix_sync(
                src.data, M, N, K, fragment_index(src, M, N), ptr, dst.strides[0], "row_major"))
            if dst_scope == "shared":
                # other threads read these partials next, and TVM's barrier insertion cannot see
                # a write through address_of; every thread runs the same stores, so this
                # barrier is reached uniformly
                T.evaluate(tirx.op.tvm_storage_sync("shared"))

        return (lambda: derive_desc(out, scopes=scopes, offset_factor=16),
                lambda: derive_impl(out, emit, scopes=scopes, offset_factor=16,
                                    strided=("src", "dst")))

    return {"load_a": load("a"), "load_b": load("b"), "fill": fill(), "store": store("global"),
            "store_shared": store("shared")}


def _wmma(
    name: str, in_dtype: str, acc_dtype: str, requires: tuple[tuple[str, ...], ...], doc: str
) -> Intrinsic:
    return Intrinsic(
        name, arch="cuda", requires=requires,
        semantics=_mma_semantics(in_dtype, acc_dtype), emit=_mma_emit,
        scopes=_FRAG_SCOPES, offset_factor=16, strided=("a", "b", "d"),
        helpers=_helpers(in_dtype, acc_dtype), doc=doc,
    )


WMMA_F16F32 = _wmma(
    "cuda.wmma.f16f32", "float16", "float32", (("tensorcore",),),
    "Tensor Core wmma.mma.sync m16n16k16: fp16 A (row major) x fp16 B (row major) accumulated "
    "in place into an fp32 fragment (sm_70+).",
)
WMMA_S8S32 = _wmma(
    "cuda.wmma.s8s32", "int8", "int32", (("tensorcore-int8",),),
    "Tensor Core wmma.mma.sync m16n16k16: s8 x s8 accumulated in place into s32 (sm_72+).",
)

INTRINSICS = [WMMA_F16F32, WMMA_S8S32]
