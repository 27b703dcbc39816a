"""GPU strategy: every schedule compiles for sm_80 and sm_90 with nvcc, wmma in the PTX, and fits
the device limits. Numerics run only where a GPU is present (pytest -m gpu)."""

import os
import re

import numpy as np
import pytest
import tvm

import unit_tvm
from unit_tvm import intrinsics, lowering, nvcc, ops
from unit_tvm.relax.core.views import StridedView
from unit_tvm.relax.gpu import bmm as gpu_bmm
from unit_tvm.relax.gpu import conv as gpu_conv
from unit_tvm.relax.gpu import operands as gpu_operands
from unit_tvm.relax.gpu.pipeline import dense_te as gpu_dense_te
from unit_tvm.schedules import gpu
from unit_tvm.te_expr import placeholders_of

from .conftest import has_gpu

needs_nvcc = pytest.mark.skipif(nvcc.find_nvcc() is None, reason="nvcc not found")
# sm_80 runs in `make test-all`: every workload also compiles for sm_80 under every config below
ARCHS = [pytest.param("sm_80", marks=pytest.mark.slow), "sm_90"]
WMMA = gpu.Fragment(16, 16, 16)
# a conv nobody tuned for, in the GEMM form (pixels of 2 images fused into M): unequal strides,
# a dilated window, 5 channels (K 45 -> 48), 7 x 9 outputs per image (126 rows -> 128)
ODD_CONV = gpu_conv.ConvGeometry(2, 9, 13, 5, 24, 3, 3, (1, 1), (1, 2))
STRIDED_CONV = gpu_conv.ConvGeometry(1, 17, 17, 32, 48, 3, 3, (2, 2))
# a 14x14 output: 196 pixels, 13 fragments of M computed as 14
PAIRED_CONV = gpu_conv.ConvGeometry(1, 16, 16, 8, 24, 3, 3)
# zero padding (1 top, 2 left, 0 bottom, 1 right) supplied by the gather, strided: an 11 x 10
# input read as 12 x 13
PADDED_CONV = gpu_conv.ConvGeometry(1, 12, 13, 16, 24, 3, 3, (2, 2), padding=(1, 2, 0, 1))


def _gemm(g, dtype, acc):
    return lambda: gpu_conv.gemm_te(g, dtype, acc, WMMA)[-1]

WORKLOADS = [
    ("dense_f16", "cuda.wmma.f16f32", lambda: ops.matmul_bn(256, 256, 256, "float16", "float16",
                                                            "float32")),
    ("dense_s8", "cuda.wmma.s8s32", lambda: ops.matmul_bn(256, 256, 256, "int8", "int8", "int32")),
    ("dense_odd_packed", "cuda.wmma.f16f32", lambda: ops.dense(100, 64, 48, "float16", "float16",
                                                              "float32")),
    ("conv1x1_nhwc_s8", "cuda.wmma.s8s32", lambda: ops.conv2d_nhwc(64, 16, 64, 1, "int8", "int8")),
    ("conv3x3_nhwc_s8", "cuda.wmma.s8s32", lambda: ops.conv2d_nhwc(64, 18, 64, 3, "int8", "int8")),
    ("conv3x3_nhwc_f16", "cuda.wmma.f16f32", lambda: ops.conv2d_nhwc(32, 10, 48, 3, "float16",
                                                                     "float16", "float32")),
    ("conv_gemm_odd_f16", "cuda.wmma.f16f32", _gemm(ODD_CONV, "float16", "float32")),
    ("conv_gemm_s2_s8", "cuda.wmma.s8s32", _gemm(STRIDED_CONV, "int8", "int32")),
    # 13 fragments of M computed as 14: p = 2 fits (the default stays p = 1)
    ("conv_gemm_paired_f16", "cuda.wmma.f16f32", _gemm(PAIRED_CONV, "float16", "float32")),
    # an int8 gather with padding: TVM cannot write its 16-lane zero, so it copies 4 bytes
    ("conv_gemm_odd_s8", "cuda.wmma.s8s32", _gemm(ODD_CONV, "int8", "int32")),
    ("conv_gemm_padded_f16", "cuda.wmma.f16f32", _gemm(PADDED_CONV, "float16", "float32")),
    # int8 with the input quantized by the gather as it reads it (the model path's gemm form)
    ("conv_gemm_quantizing_s8", "cuda.wmma.s8s32", lambda: gpu_conv.gemm_te(
        STRIDED_CONV, "int8", "int32", WMMA, source="float32")[-1]),
    # attention's matmul of two activations, batched over heads, every extent padded but K
    ("bmm_odd_f16", "cuda.wmma.f16f32", lambda: gpu_bmm.batch_matmul_te(
        gpu_bmm.BatchedShape((3,), 40, 24, 64), "float16", "float32")[-1]),
    # a float32 input (a layer norm's result) rounded to fp16 as the kernel loads it
    ("dense_from_f32", "cuda.wmma.f16f32", lambda: gpu_dense_te(
        48, 40, 64, "float16", "float32", gpu_operands.Prologue(
            None, 48 * 64, "float32", StridedView.contiguous((48, 64)), "float16"))[-1]),
    # Q of attention read out of the fused Q/K/V projection [32 tokens, 3 x 2 heads x 32]:
    # Q[h, i, d] = qkv[i, h * 32 + d]
    ("bmm_q_from_qkv", "cuda.wmma.f16f32", lambda: gpu_bmm.batch_matmul_te(
        gpu_bmm.BatchedShape((2,), 32, 48, 32), "float16", "float32", (gpu_operands.Prologue(
            None, 32 * 192, "float16", StridedView((2, 32, 32), (32, 192, 1)), "float16"),
            None))[-1]),
]
# configs beyond the default: split-K through shared memory, unfused block index, wide windows,
# implicit preparation (the gather or pack done by the shared-memory stage; the default runs
# it as a kernel of its own), element copies, cp.async pipelines (with split-K too), the output
# written by the block (alone and after a split-K sum), K split across blocks (alone, and with
# split-K in the block, a pipeline and an unfused block index)
CONFIGS = [gpu.GpuConfig(split_k=2), gpu.GpuConfig(p=1, split_k=4, fuse_spatial=False),
           gpu.GpuConfig(p=4, warps_m=1, warps_n=1, k_step=4),
           gpu.GpuConfig(implicit=True, split_k=2), gpu.GpuConfig(vector_copy=False),
           gpu.GpuConfig(pipeline=True), gpu.GpuConfig(pipeline=True, implicit=True, split_k=2),
           gpu.GpuConfig(block_epilogue=True), gpu.GpuConfig(block_epilogue=True, split_k=2),
           gpu.GpuConfig(grid_split_k=4),
           gpu.GpuConfig(p=1, grid_split_k=2, split_k=2, pipeline=True, implicit=True,
                         fuse_spatial=False)]
CONFIG_IDS = ["split2", "split4_unfused", "p4", "implicit_split2", "element_copies", "pipeline",
              "pipeline_implicit_split2", "block_epilogue", "block_epilogue_split2", "grid4",
              "grid2_split2_pipeline_unfused"]
# the compile test runs these in `make test-all` only (their ideas are covered by the others:
# split-K by implicit_split2 and block_epilogue_split2, windows by the default p=2 and the
# ablation test, the block epilogue alone by its own test, K across blocks by its own test)
_COMPILE_SLOW = {"split4_unfused", "element_copies", "block_epilogue", "p4", "split2", "grid4",
                 "grid2_split2_pipeline_unfused"}
COMPILE_CONFIGS = [pytest.param(c, id=i, marks=[pytest.mark.slow] if i in _COMPILE_SLOW else [])
                   for c, i in zip(CONFIGS, CONFIG_IDS)]


def _cuda(arch):
    return tvm.target.Target({"kind": "cuda", "arch": arch})


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("label,intrin,build", WORKLOADS, ids=[w[0] for w in WORKLOADS])
def test_gpu_schedule_compiles_with_wmma_and_fits(arch, label, intrin, build):
    _compile_checked(unit_tvm.rewrite(build(), intrin, target=_cuda(arch)), arch)


def _compile_checked(sch, arch):
    """Build for `arch` with nvcc; assert mma in the PTX and the device limits; return the CUDA
    source."""
    lib = lowering.build(sch.mod, _cuda(arch))
    src = nvcc.cuda_source(lib)
    ptx = nvcc.ptx(src, arch)
    assert sum("wmma.mma.sync" in line for line in ptx.splitlines()) >= 1
    # wmma reads rows whose stride is a multiple of 16 bytes (else undefined)
    per_16_bytes = 16 if "wmma::matrix_a, 16, 16, 16, signed char" in src else 8
    strides = re.findall(r"load_matrix_sync\(.*, (\d+)\);", src)
    assert strides and all(int(s) % per_16_bytes == 0 for s in strides), strides
    for name, res in nvcc.resources(src, arch).items():
        assert res["registers"] <= 255, name
        assert res["shared"] <= gpu.SHARED_LIMIT, name
    for name, threads in nvcc.launch_shapes(lib).items():
        assert threads <= gpu.MAX_THREADS, name
    return src


@needs_nvcc
def test_gpu_config_space_fits_limits():
    wmma = gpu.fragment_of(intrinsics.get("cuda.wmma.f16f32"))
    space = gpu.config_space(16, 16, 16, wmma)
    assert len(space) > 5
    assert {c.split_k for c in space} == {1, 2, 4}
    assert {c.grid_split_k for c in space} >= {1, 2, 4}
    assert {c.fuse_spatial for c in space} == {True, False}
    for c in space:
        assert c.threads() <= gpu.MAX_THREADS
        assert c.shared_bytes(wmma, 2, 2) <= gpu.SHARED_LIMIT
    for c in space[:6]:
        op = ops.matmul_bn(256, 256, 256, "float16", "float16", "float32")
        sch = unit_tvm.rewrite(op, "cuda.wmma.f16f32", config=c, target=_cuda("sm_80"))
        assert "wmma" in nvcc.ptx(nvcc.cuda_source(tvm.tirx.build(sch.mod, target=_cuda("sm_80"))))


@needs_nvcc
@pytest.mark.parametrize("config", COMPILE_CONFIGS)
@pytest.mark.parametrize("label,intrin,build", WORKLOADS, ids=[w[0] for w in WORKLOADS])
def test_gpu_split_k_and_window_configs_compile(config, label, intrin, build):
    """Every workload under every config compiles with nvcc (an inlined pack once made TVM
    write a vector gathered from scattered elements, which CUDA rejects; a window of 3
    fragments once did not divide 4 fragment rows)."""
    op = build()
    sch = unit_tvm.rewrite(op, intrin, config=config, target=_cuda("sm_80"))
    src = _compile_checked(sch, "sm_80")
    if gpu.fit(config, *gpu.tiles(_prepared(op, intrin))).split_k > 1:
        # partial accumulators go to shared memory between two barriers (the first: they may
        # overwrite operand tiles other warps still read), then the block sums them there
        stores = re.findall(r"store_matrix_sync\(\(&\((.*?)\[", src)
        assert stores and all("shared_ptr" in s for s in stores)
        body = src[src.index("wmma::mma_sync"):]
        before, after = body.split("nvcuda::wmma::store_matrix_sync", 1)
        assert before.rstrip().endswith("__syncthreads();")
        assert "__syncthreads()" in after


@needs_nvcc
def test_gpu_pipeline_fills_the_next_stage_with_cp_async():
    """A pipelined config doubles the shared stages and copies the next k step with cp.async
    (lowering.build turns the copies TVM's pipeline marks asynchronous into cp.async); where the
    doubled stages would not fit, or a stage copies single elements, the kernel is the plain
    one and the config used says so."""
    from unit_tvm import lowering
    from unit_tvm.rewriter import schedule

    label, intrin, build = WORKLOADS[0]
    prepared = _prepared(build(), intrin)
    wmma = unit_tvm.intrinsics.get(intrin)

    def compiled(config):
        sch = schedule(prepared, wmma, config, _cuda("sm_80"))
        src = nvcc.cuda_source(lowering.build(sch.mod, _cuda("sm_80")))
        return nvcc.ptx(src, "sm_80"), nvcc.resources(src, "sm_80")

    ptx, res = compiled(gpu.GpuConfig(pipeline=True))
    plain_ptx, plain_res = compiled(gpu.GpuConfig())
    assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group" in ptx
    assert "cp.async" not in plain_ptx
    shared = max(r["shared"] for r in res.values())
    assert shared == 2 * max(r["shared"] for r in plain_res.values())
    used = gpu.apply(tvm.s_tir.Schedule(tvm.te.create_prim_func(prepared.tensors)), prepared,
                     wmma, gpu.GpuConfig(pipeline=True, split_k=2))
    assert not used.pipeline  # 2 x 16 KB of stages and 32 KB of partials: over 48 KB
    used = gpu.apply(tvm.s_tir.Schedule(tvm.te.create_prim_func(prepared.tensors)), prepared,
                     wmma, gpu.GpuConfig(pipeline=True, vector_copy=False))
    assert not used.pipeline
    space = gpu.space(prepared)
    assert any(c.pipeline for c in space) and all(c.vector_copy for c in space if c.pipeline)


def _grid(sch, block):
    """The blockIdx.x extent of the kernel holding `block` in a scheduled module."""
    for loop in sch.get_loops(sch.get_sblock(block)):
        binding = sch.get(loop).thread_binding
        if binding is not None and binding.thread_tag == "blockIdx.x":
            return int(sch.get(loop).extent)
    raise AssertionError(f"{block} is not under blockIdx.x")


@needs_nvcc
def test_gpu_grid_split_k_sums_slices_in_a_kernel_of_its_own():
    """K split across blocks: the core's grid grows by the slice count, each block writes its
    slice's fragments to a global buffer of partials (no shared memory), and a kernel of its own
    sums the slices into the core's result; in the block's own split-K the partials go to
    shared memory as before. The fitted slice count divides K's fragments."""
    op = ops.matmul_bn(256, 256, 256, "float16", "float16", "float32")
    intrin = "cuda.wmma.f16f32"
    plain = unit_tvm.rewrite(op, intrin, config=gpu.GpuConfig(), target=_cuda("sm_90"))
    split = unit_tvm.rewrite(op, intrin, config=gpu.GpuConfig(grid_split_k=4),
                             target=_cuda("sm_90"))
    assert _grid(split, "matmul_core_rf_update_o") == 4 * _grid(plain, "matmul_core_update_o")
    assert _grid(split, "matmul_core") == 256 * 256 // 128  # the sum: an output per thread
    src = _compile_checked(split, "sm_90")
    stores = re.findall(r"store_matrix_sync\(\(&\((.*?)\[", src)
    assert stores and not any("shared" in s for s in stores)
    # the partials, summed by a kernel of their own into the core's result
    assert re.search(r"void __launch_bounds__\(128\) \w+\(float\* __restrict__ \w+_core_ptr, "
                     r"float\* __restrict__ \w+_core_rf_ptr\)", src)
    assert gpu.fit(gpu.GpuConfig(grid_split_k=8), 4, 12, 66).grid_split_k == 6
    assert gpu.fit(gpu.GpuConfig(grid_split_k=8, block_epilogue=True), 4, 12, 66) \
        .block_epilogue is False


@needs_nvcc
@pytest.mark.parametrize("dtype,intrin,kernels", [("float16", "cuda.wmma.f16f32", 1),
                                                  ("int8", "cuda.wmma.s8s32", 2)])
def test_gpu_default_runs_a_layer_in_one_kernel(dtype, intrin, kernels):
    """The default computes an fp16 conv in one kernel (the gather in the shared-memory stages,
    the output written by the block) and an int8 one in two (its padded gather a pass of its
    own); it pipelines the stages and splits K in the block by K's length; a 71x71 output
    keeps two fragments per warp, Table I's 7x7 layer one."""
    from unit_tvm.prepare import prepare

    def prepared_layer(c, h, k, r):
        g = gpu_conv.ConvGeometry(1, h, h, c, k, r, r)
        acc = "float32" if dtype == "float16" else "int32"
        tensors = gpu_conv.gemm_te(g, dtype, acc, WMMA)
        return prepare(tensors[-1], intrin, params=tensors[:-1], **gpu.prepare_options(None))

    small, large = prepared_layer(1056, 7, 192, 1), prepared_layer(80, 73, 192, 3)
    d, big = gpu.default(small), gpu.default(large)
    assert (d.p, d.split_k, big.p) == (1, 2, 2)  # K: 66 fragments, 4 slices do not divide it
    assert d.block_epilogue and d.pipeline and d.implicit == (dtype == "float16")
    lib = lowering.build(unit_tvm.rewriter.schedule(small, intrinsics.get(intrin), d,
                                                    _cuda("sm_90")).mod,
                         _cuda("sm_90"))
    assert len(nvcc.launch_shapes(lib)) == kernels


def test_gpu_split_k_divides_the_tile_the_block_epilogue_sums():
    """With the block epilogue, split-K must divide 8 p^2 (each thread an even share of the
    sum): 3 slices would put the sum under a predicate, where no barrier can follow it."""
    assert gpu.fit(gpu.GpuConfig(p=1, split_k=4, block_epilogue=True), 4, 12, 66).split_k == 2
    assert gpu.fit(gpu.GpuConfig(p=1, split_k=4), 4, 12, 66).split_k == 3


def test_gpu_config_window_divides_both_sides():
    for m, n in ((4, 3), (6, 4), (8, 8), (5, 7)):
        p = gpu.fit(gpu.GpuConfig(p=4), m, n, 16).p
        assert m % p == 0 and n % p == 0, (m, n, p)
    assert gpu.fit(gpu.GpuConfig(p=4), 8, 12, 16).p == 4


@needs_nvcc
def test_gpu_default_copies_16_bytes_into_padded_rows():
    """The default config stages both operands with 16-byte cp.async copies (its pipeline) into
    shared rows padded by 16 bytes, and wmma reads them with the padded stride; without the
    pipeline the 16 bytes are one store per thread, without vector copies one element."""
    label, intrin, build = WORKLOADS[0]  # 256 x 256 x 256 fp16
    src = _compile_checked(unit_tvm.rewrite(build(), intrin, target=_cuda("sm_80")), "sm_80")
    assert re.search(r'cp\.async\.cg\.shared\.global \[%0\], \[%1\], %2;"\s*'
                     r':: "r"\(dst_addr\), "l"\(src_p\), "n"\(16\)\)', src)
    strides = {int(s) for s in re.findall(r"load_matrix_sync\(.*, (\d+)\);", src)}
    assert strides and all(s % 32 == 8 for s in strides), strides
    stored = unit_tvm.rewrite(build(), intrin, target=_cuda("sm_80"), config=gpu.GpuConfig())
    stored_src = nvcc.cuda_source(tvm.tirx.build(stored.mod, target=_cuda("sm_80")))
    assert len(re.findall(r"\*\(uint4\*\)\(\w+_shared_ptr \+", stored_src)) >= 2
    plain = unit_tvm.rewrite(build(), intrin, target=_cuda("sm_80"),
                             config=gpu.GpuConfig(vector_copy=False))
    assert "uint4" not in nvcc.cuda_source(tvm.tirx.build(plain.mod, target=_cuda("sm_80")))


def _prepared(op, intrin):
    from unit_tvm.prepare import prepare

    return prepare(op, intrin, **gpu.prepare_options(None))


@pytest.mark.parametrize("h, m_tiles", [(9, 1), (35, 4)])
def test_gpu_prepared_conv_is_exact_on_cpu(rng, h, m_tiles):
    """The GPU's operand preparation (window loops gathered im2col-style so every fragment copy
    reads single loops; a row of 33 pixels computed as 4 fragments, 3 of them paired with one
    of padding) computes the conv exactly; checked by running the prepared graph on CPU."""
    op = ops.conv2d_nhwc(24, h, 40, 3, "int8", "int8")
    prepared = _prepared(op, "cuda.wmma.s8s32")
    assert "data_packed" in prepared.stages and gpu.tiles(prepared)[0] == m_tiles
    lib = tvm.tirx.build(tvm.te.create_prim_func(prepared.tensors), target="llvm")
    o = h - 2
    data = rng.integers(-128, 128, (1, h, h, 24)).astype("int8")
    kern = rng.integers(-128, 128, (3, 3, 24, 40)).astype("int8")
    out = tvm.runtime.tensor(np.zeros((1, o, o, 40), "int32"))
    lib(tvm.runtime.tensor(data), tvm.runtime.tensor(kern), out)
    ref = np.zeros((o, o, 40), np.int64)
    for ry in range(3):
        for rx in range(3):
            ref += data[0, ry:ry + o, rx:rx + o].astype(np.int64) @ kern[ry, rx].astype(np.int64)
    np.testing.assert_array_equal(out.numpy()[0], ref)


def test_gpu_tuning_space_and_database_without_a_gpu(tmp_path):
    from unit_tvm.tuner import Database, tune

    op = ops.matmul_bn(128, 128, 512, "float16", "float16", "float32")
    prepared = _prepared(op, "cuda.wmma.f16f32")
    intrin = unit_tvm.intrinsics.get("cuda.wmma.f16f32")
    space = gpu.space(prepared)
    assert space[0] == gpu.default(prepared)
    assert {c.split_k for c in space} >= {1, 2, 4} and len({len(gpu.features(c, prepared))
                                                            for c in space}) == 1
    target = _cuda("sm_80")
    if not has_gpu():
        with pytest.raises(RuntimeError, match="has none"):
            tune(prepared, intrin, target, progress=False)
    db = Database(tmp_path / "db.jsonl")
    assert tune(prepared, intrin, target, database=db, measure=False).config == space[0]
    # a record tuned on a GPU elsewhere is used as is: its config comes back, nothing measured
    from unit_tvm.tuner.search import reference_output  # noqa: F401 - the reference runs on CPU
    from unit_tvm.tuner.database import workload_key

    key = workload_key(tvm.te.create_prim_func(list(prepared.params) + [prepared.reference]))
    db.append(key, target, intrin.name, space[3].key(), 1.0)
    hit = tune(prepared, intrin, target, database=db)
    assert hit.from_database and hit.config == space[3]


def test_gpu_tuner_measures_the_default_and_its_neighbours_first(monkeypatch):
    """The tuner's first candidates on a GPU are the default and its one-knob neighbours
    (gpu.seeds: split-K, k_step, warps, p, pipeline, implicit, epilogue, K across blocks), so
    a few trials already cover the class the config study found fastest. Candidates are timed
    here by a runner that ranks them in measuring order (no GPU on this machine)."""
    from unit_tvm.runner import Measurement
    from unit_tvm.tuner import search, tune

    prepared = _prepared(ops.matmul_bn(256, 256, 256, "float16", "float16", "float32"),
                         "cuda.wmma.f16f32")
    order = []
    monkeypatch.setattr(search, "candidate_module",
                        lambda p, i, config, t: order.append(config) or config)

    class InOrder:
        name = "in order"

        def target(self):
            return _cuda("sm_90")

        def measure(self, libs, arrays, expected=None, **_):
            return [Measurement(1e-3 * (1 + order.index(lib))) for lib in libs]

    seeds = gpu.seeds(prepared)
    assert len(seeds) >= 8 and gpu.default(prepared) not in seeds
    assert all(s in gpu.space(prepared) for s in seeds)
    result = tune(prepared, "cuda.wmma.f16f32", trials=1 + len(seeds), runner=InOrder(),
                  progress=False)
    assert order[:1 + len(seeds)] == [gpu.default(prepared)] + seeds
    assert result.config == gpu.default(prepared)  # timed fastest: measured first


@needs_nvcc
def test_gpu_build_falls_back_to_a_valid_kernel():
    from tvm import te

    data = te.placeholder((1, 8, 9, 9), "float32", name="data")
    ry = te.reduce_axis((0, 3), name="ry")
    rx = te.reduce_axis((0, 3), name="rx")
    pool = te.compute((1, 8, 7, 7), lambda n, c, y, x: te.max(data[n, c, y + ry, x + rx],
                                                                 axis=[ry, rx]), name="pool")
    with pytest.warns(unit_tvm.FallbackWarning):
        lib = unit_tvm.build([data, pool], _cuda("sm_80"))
    assert "__global__" in nvcc.cuda_source(lib)


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("config", [None] + CONFIGS, ids=["default"] + CONFIG_IDS)
@pytest.mark.parametrize("label,intrin,build", WORKLOADS, ids=[w[0] for w in WORKLOADS])
def test_gpu_numerics(label, intrin, build, config, rng):
    op = build()
    tensors = [*placeholders_of(op), op]
    arch = "sm_" + tvm.cuda(0).compute_version.replace(".", "")
    sch = unit_tvm.rewrite(op, intrin, config=config, target=_cuda(arch))
    mod = tvm.tirx.build(sch.mod, target=_cuda(arch))
    dev = tvm.cuda(0)
    arrays = []
    for t in tensors[:-1]:
        if "int" in str(t.dtype):
            arrays.append(rng.integers(-128, 128, [int(s) for s in t.shape]).astype(str(t.dtype)))
        else:
            arrays.append((rng.standard_normal([int(s) for s in t.shape]) / 4).astype(str(t.dtype)))
    out = np.zeros([int(s) for s in op.shape], str(op.dtype))
    args = [tvm.runtime.tensor(a, dev) for a in arrays + [out]]
    mod(*args)
    ref_lib = tvm.tirx.build(tvm.te.create_prim_func(tensors), target=unit_tvm.target.host())
    cpu_args = [tvm.runtime.tensor(a, tvm.cpu()) for a in arrays + [out]]
    ref_lib(*cpu_args)
    np.testing.assert_allclose(args[-1].numpy(), cpu_args[-1].numpy(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="no CUDA GPU on this machine")
def test_gpu_tuning_keeps_a_checked_config(tmp_path):
    from unit_tvm.tuner import tune

    op = ops.conv2d_nhwc(64, 18, 64, 3, "int8", "int8")
    prepared = _prepared(op, "cuda.wmma.s8s32")
    arch = "sm_" + tvm.cuda(0).compute_version.replace(".", "")
    result = tune(prepared, unit_tvm.intrinsics.get("cuda.wmma.s8s32"), _cuda(arch), trials=12,
                  database=tmp_path / "db.jsonl", progress=False)
    assert result.gops > 0 and result.measured >= 1


@needs_nvcc
def test_gpu_ablation_steps_are_distinct_and_compile():
    """`unit-tvm reproduce fig11-gpu` (run where a GPU is lent): on a Table I layer each step
    adds its idea (window, fused spatial index, split-K) to the one before, fitted to the layer,
    and every step's kernel compiles to PTX with wmma."""
    from unit_tvm.bench import gpu_ops
    from unit_tvm.testing.workloads import TABLE_I
    from unit_tvm.rewriter import schedule

    # L1 (288 -> 384, 3x3 stride 2, 17 output columns): two fragments along M, so the window
    # applies; on one-fragment rows (most Table I layers) that step equals the one before
    c, h, k, r, s = TABLE_I[0]
    op = ops.conv2d_nhwc(c, h, k, r, "float16", "float16", "float32", stride=s)
    prepared = _prepared(op, "cuda.wmma.f16f32")
    steps = gpu_ops.ablation_configs(prepared, gpu.default(prepared))
    assert len(steps) == len(gpu_ops.ABLATION)
    base, window, fused, split = steps[:4]
    assert (base.p, window.p) == (1, 2) and not window.fuse_spatial and fused.fuse_spatial
    assert split.split_k > 1 and split.p == fused.p
    assert steps[-2].block_epilogue and not steps[-3].block_epilogue
    for config in steps[:4]:
        sch = schedule(prepared, unit_tvm.intrinsics.get("cuda.wmma.f16f32"), config,
                       _cuda("sm_80"))
        assert "wmma" in nvcc.ptx(nvcc.cuda_source(tvm.tirx.build(sch.mod,
                                                                   target=_cuda("sm_80"))))


@needs_nvcc
def test_bench_gpu_layer_case_and_tvm_baseline():
    """bench-gpu's layers: one whose rows are 8 pixels (as L1's are 17) is written as one GEMM,
    its arguments fit the prepared kernel, and TVM's own dlight build of the conv as written (the
    TVM column) builds for sm_90 with the same input and weight values in HWIO."""
    from unit_tvm.bench.gpu_ops import layer_case, tvm_default_build

    intrin = intrinsics.get("cuda.wmma.f16f32")
    layer = (32, 17, 48, 3, 2)  # C, H, K, R, stride as in Table I
    case = layer_case(*layer, "float16", intrin, tvm.cpu(), np.random.default_rng(0))
    assert case.form == "gemm"

    def shapes(ts):
        return [[int(x) for x in t.shape] for t in ts]

    assert shapes(case.prepared.tensors) == [list(a.shape) for a in case.args]
    assert shapes(case.direct) == [list(a.shape) for a in case.direct_args]
    np.testing.assert_array_equal(case.args[0].numpy(), case.direct_args[0].numpy())
    c, _, k, r, _ = layer
    np.testing.assert_array_equal(case.args[1].numpy()[:r * r * c],
                                  case.direct_args[1].numpy().reshape(r * r * c, k))
    lib = tvm_default_build(case.direct[-1], _cuda("sm_90"))
    assert lib is not None and "__global__" in nvcc.cuda_source(lib)


def _numpy_conv(data, hwio, g):
    """NHWC x HWIO conv2d with strides and dilation, in int64 (the reference)."""
    (sy, sx), (dy, dx) = g.stride, g.dilation
    out = np.zeros((g.n, g.out_h, g.out_w, g.k), np.int64)
    for ry in range(g.kh):
        for rx in range(g.kw):
            win = data[:, ry * dy:ry * dy + (g.out_h - 1) * sy + 1:sy,
                       rx * dx:rx * dx + (g.out_w - 1) * sx + 1:sx]
            out += win.astype(np.int64) @ hwio[ry, rx].astype(np.int64)
    return out


def test_paired_fragments_open_two_per_warp_to_the_tuner_and_keep_the_default():
    """13 fragments of M (a 14x14 output) admit only p = 1 (p divides both tile counts); the
    GPU strategy computes them as 14, so the tuner may try p = 2, while the untuned default
    stays the config the 13 gave."""
    from unit_tvm.prepare import prepare

    tensors = gpu_conv.gemm_te(PAIRED_CONV, "float16", "float32", WMMA)
    alone = prepare(tensors[-1], "cuda.wmma.f16f32", params=tensors[:-1], separable=True)
    paired = prepare(tensors[-1], "cuda.wmma.f16f32", params=tensors[:-1],
                     **gpu.prepare_options(None))
    assert gpu.tiles(alone)[0] == 13 and gpu.tiles(paired)[0] == 14
    assert {c.p for c in gpu.space(alone)} == {1} and 2 in {c.p for c in gpu.space(paired)}
    assert gpu.default(paired) == gpu.default(alone)


@pytest.mark.parametrize("g", [ODD_CONV, STRIDED_CONV, PAIRED_CONV, PADDED_CONV],
                         ids=["odd_dilated", "strided", "paired_14x14", "padded_in_gather"])
def test_gpu_gemm_form_is_exact_on_cpu(g, rng):
    """The GEMM form (every image's output rows fused into M, window x channels into K, gathered
    in the kernel and padded to whole fragments) prepared for wmma computes the conv exactly:
    the prepared graph run on CPU against numpy."""
    from unit_tvm.prepare import prepare

    tensors = gpu_conv.gemm_te(g, "int8", "int32", WMMA)
    prepared = prepare(tensors[-1], "cuda.wmma.s8s32", params=tensors[:-1],
                       **gpu.prepare_options(None))
    m_tiles, _, k_tiles = gpu.tiles(prepared)
    # an odd count of M fragments is computed paired, the extra rows cropped
    assert m_tiles == gpu.paired_tiles(-(-g.pixels // 16)) and k_tiles == -(-g.window // 16)
    lib = tvm.tirx.build(tvm.te.create_prim_func(prepared.tensors), target="llvm")
    data = rng.integers(-128, 128, (g.n, g.in_h, g.in_w, g.c)).astype("int8")
    hwio = rng.integers(-128, 128, (g.kh, g.kw, g.c, g.k)).astype("int8")
    out = tvm.runtime.tensor(np.zeros((g.pixels, g.k), "int32"))
    lib(tvm.runtime.tensor(data), tvm.runtime.tensor(gpu_conv.gemm_weight(hwio, WMMA)), out)
    top, left, bottom, right = g.padding
    padded = np.pad(data, ((0, 0), (top, bottom), (left, right), (0, 0)))
    np.testing.assert_array_equal(out.numpy().reshape(g.n, g.out_h, g.out_w, g.k),
                                  _numpy_conv(padded, hwio, g))


def test_gpu_conv_form_policy():
    """The form that computes less padding: 7-pixel rows fuse (64 rows, not 7 x 16), 56-pixel
    rows too (3136, not 56 x 64); a 3-channel stem folds its window into K (160, not 49 x 16);
    a 1x1 conv over 16-pixel rows stays direct (a tie: its input is read in place); a dilated
    window has the GEMM form only."""
    small = gpu_conv.ConvGeometry(1, 9, 9, 512, 512, 3, 3)
    assert gpu_conv.padded_work(small, "direct", WMMA) == 7 * 16 * 9 * 512
    assert gpu_conv.padded_work(small, "gemm", WMMA) == 64 * 9 * 512
    assert gpu_conv.choose_form(small, WMMA) == "gemm"
    assert gpu_conv.choose_form(gpu_conv.ConvGeometry(1, 58, 58, 64, 64, 3, 3), WMMA) == "gemm"
    stem = gpu_conv.ConvGeometry(1, 230, 230, 3, 64, 7, 7, (2, 2))
    assert gpu_conv.padded_work(stem, "gemm", WMMA) == 112 * 112 * 160
    assert gpu_conv.choose_form(stem, WMMA) == "gemm"
    pointwise = gpu_conv.ConvGeometry(1, 16, 16, 64, 64, 1, 1)
    assert gpu_conv.forms_in_order(pointwise, WMMA) == ("direct", "gemm")
    assert gpu_conv.forms_in_order(ODD_CONV, WMMA) == ("gemm",)
    with pytest.raises(ValueError, match="dilation"):
        gpu_conv.direct_te(ODD_CONV, "float16", "float32")
    with pytest.raises(ValueError, match="form must be"):
        gpu_conv.padded_work(small, "winograd", WMMA)


def _kernel_params(src):
    """kernel name -> the buffers it takes (TVM passes each as NAME_ptr)."""
    return {name: set(re.findall(r"(\w+)_ptr\b", params)) for name, params in
            re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(([^)]*)\)", src)}


@needs_nvcc
@pytest.mark.parametrize("label,build,gathered", [
    ("gemm", _gemm(STRIDED_CONV, "float16", "float32"), "cols"),
    ("direct", lambda: ops.conv2d_nhwc(32, 10, 48, 3, "float16", "float16", "float32"),
     "data_packed")])
def test_gpu_implicit_preparation_gathers_in_shared_memory(label, build, gathered):
    """implicit: the gather (or pack) of the data operand is done by the shared-memory stage, so
    the kernel reads the function's input and no gathered copy is written to global memory: one
    kernel fewer, and the gathered buffer exists only in shared memory."""
    op = build()
    srcs = {}
    for implicit in (False, True):
        sch = unit_tvm.rewrite(op, "cuda.wmma.f16f32", config=gpu.GpuConfig(implicit=implicit),
                               target=_cuda("sm_90"))
        srcs[implicit] = _compile_checked(sch, "sm_90")
    explicit, implicit = _kernel_params(srcs[False]), _kernel_params(srcs[True])
    assert any(gathered in params for params in explicit.values())
    assert not any(gathered in params for params in implicit.values())
    assert len(implicit) == len(explicit) - 1
    # the kernel with the Tensor Core loop reads the input and the weight themselves
    assert any({"data", "kernel"} <= params for params in implicit.values())


@needs_nvcc
@pytest.mark.parametrize("label,intrin,build,split_k", [
    ("gemm", "cuda.wmma.f16f32", _gemm(STRIDED_CONV, "float16", "float32"), 1),
    ("direct", "cuda.wmma.f16f32", lambda: ops.conv2d_nhwc(32, 10, 48, 3, "float16", "float16",
                                                           "float32"), 2),
    ("dense_s8", "cuda.wmma.s8s32", lambda: ops.dense(100, 64, 48, "int8", "int8", "int32"), 1)])
def test_gpu_block_epilogue_writes_the_output_in_one_kernel(label, intrin, build, split_k):
    """block_epilogue: the accumulators (or the summed slices) stay in shared memory and the
    block writes the output itself: no kernel takes the fragment buffer, one kernel fewer, and
    the fragments are stored to shared memory only."""
    op = build()
    srcs = {}
    for block_epilogue in (False, True):
        config = gpu.GpuConfig(split_k=split_k, block_epilogue=block_epilogue)
        srcs[block_epilogue] = _compile_checked(
            unit_tvm.rewrite(op, intrin, config=config, target=_cuda("sm_90")), "sm_90")
    core = _prepared(op, intrin).core.op.name
    second, block = _kernel_params(srcs[False]), _kernel_params(srcs[True])
    assert any(core in params for params in second.values())
    assert not any(core in params for params in block.values())
    assert len(block) == len(second) - 1
    stores = re.findall(r"store_matrix_sync\(\(&\((.*?)\[", srcs[True])
    assert stores and all("shared_ptr" in s for s in stores)


def test_cuda_target_names_the_device_architecture():
    from types import SimpleNamespace

    from unit_tvm.target import cuda_target

    target = cuda_target(SimpleNamespace(compute_version="9.0"))
    assert target.kind.name == "cuda" and str(target.attrs["arch"]) == "sm_90"


@needs_nvcc
def test_gpu_config_study_takes_bert_matmuls(tmp_path):
    """`--layers bert`: dense layers and attention's batched matmuls are studied as the GPU
    pass writes them (the batch is thread blocks), their kernels built like the convs'."""
    from unit_tvm.bench import gpu_configs
    from unit_tvm.testing.workloads import BERT_MATMULS, MatmulShape

    assert [gpu.tiles(gpu_configs.prepared_layer(m)) for m in BERT_MATMULS[::4]] == [
        (8, 144, 48), (8, 8, 4)]
    layer = MatmulShape((2,), 32, 48, 64, 3)
    jobs, where, built = gpu_configs.build_all([layer], ["default"], "sm_90", str(tmp_path),
                                               workers=1, log=lambda _: None)
    assert len(jobs) == 1 and built[0][1] is None, built
    assert gpu_configs._shape(layer) == [2, 32, 48, 64] and gpu_configs._count(layer) == 3


def test_gpu_config_study_builds_in_parallel_and_summarizes(tmp_path):
    """`python -m unit_tvm.bench.gpu_configs` (run where a GPU is lent): the named configs and
    a sample of the tuning space for a layer are built by worker processes into loadable
    libraries; the summary compares each named config with the legacy default and cuDNN."""
    from unit_tvm.bench import gpu_configs

    layer = (64, 14, 64, 3, 1, 1, 2)  # a model's conv: padded by the gather, run twice
    assert gpu_configs.prepared_layer(layer).params[0].shape[1] == 14  # the unpadded input
    jobs, where, built = gpu_configs.build_all([layer], ["legacy", "default"], "sm_90",
                                               str(tmp_path), workers=1, sample=2,
                                               log=lambda _: None)
    assert {name for _, name in where} == {"legacy", "default", "s0", "s1"}
    assert all(path and error is None for path, error in built), built
    assert gpu.GpuConfig.from_key(jobs[where[(0, "default")]][1]).block_epilogue
    assert not gpu.GpuConfig.from_key(jobs[where[(0, "legacy")]][1]).block_epilogue
    assert all(os.path.getsize(path) > 0 for path, _ in built)  # loading needs a GPU's runtime
    rows = [{"layer": "L1", "config": "legacy", "ms": 2.0, "cudnn_ms": 1.0, "count": 3},
            {"layer": "L1", "config": "default", "ms": 1.0, "cudnn_ms": 1.0, "count": 3},
            {"layer": "L2", "config": "legacy", "ms": 1.0, "cudnn_ms": 1.0, "count": 1},
            {"layer": "L2", "config": "default", "ms": 1.0, "cudnn_ms": 1.0, "count": 1},
            {"layer": "L1", "config": "s0", "ms": 0.5, "cudnn_ms": 1.0, "count": 3}]
    out = gpu_configs.summary(rows, log=lambda _: None)
    assert out["default"]["vs_legacy"] == pytest.approx(2.0 ** 0.5)
    assert out["legacy"]["vs_cudnn"] == pytest.approx(0.5 ** 0.5) and "s0" not in out
    assert out["legacy"]["total_ms"] == pytest.approx(7.0)  # 3 x 2 + 1
    assert out["legacy"]["total_vs_cudnn"] == pytest.approx(4.0 / 7.0)
