"""GPU strategy: every schedule compiles for sm_80 and sm_90 with nvcc, wmma in the PTX, and fits
the device limits. Numerics run only where a GPU is present (pytest -m gpu)."""

import numpy as np
import pytest
import tvm

import unit_tvm
from unit_tvm import nvcc, ops
from unit_tvm.schedules import gpu

needs_nvcc = pytest.mark.skipif(nvcc.find_nvcc() is None, reason="nvcc not found")
ARCHS = ["sm_80", "sm_90"]
WORKLOADS = [
    ("dense_f16", "cuda.wmma.f16f32", lambda: ops.matmul_bn(256, 256, 256, "float16", "float16",
                                                            "float32")),
    ("dense_s8", "cuda.wmma.s8s32", lambda: ops.matmul_bn(256, 256, 256, "int8", "int8", "int32")),
    ("dense_odd_packed", "cuda.wmma.f16f32", lambda: ops.dense(100, 64, 48, "float16", "float16",
                                                              "float32")),
    ("conv1x1_nhwc_s8", "cuda.wmma.s8s32", lambda: ops.conv2d_nhwc(64, 16, 64, 1, "int8", "int8")),
]


def _cuda(arch):
    return tvm.target.Target({"kind": "cuda", "arch": arch})


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("label,intrin,build", WORKLOADS, ids=[w[0] for w in WORKLOADS])
def test_gpu_schedule_compiles_with_wmma_and_fits(arch, label, intrin, build):
    op = build()
    sch = unit_tvm.rewrite(op, intrin, target=_cuda(arch))
    lib = tvm.tirx.build(sch.mod, target=_cuda(arch))
    src = nvcc.cuda_source(lib)
    ptx = nvcc.ptx(src, arch)
    assert sum("wmma.mma.sync" in line for line in ptx.splitlines()) >= 1
    for name, res in nvcc.resources(src, arch).items():
        assert res["registers"] <= 255, name
        assert res["shared"] <= gpu.SHARED_LIMIT, name
    for name, threads in nvcc.launch_shapes(lib).items():
        assert threads <= gpu.MAX_THREADS, name


@needs_nvcc
def test_gpu_config_space_fits_limits():
    space = gpu.config_space(16, 16, 16)
    assert len(space) > 5
    for c in space:
        assert c.threads() <= gpu.MAX_THREADS
        assert c.shared_bytes(2, 2) <= gpu.SHARED_LIMIT
    for c in space[:6]:
        op = ops.matmul_bn(256, 256, 256, "float16", "float16", "float32")
        sch = unit_tvm.rewrite(op, "cuda.wmma.f16f32", config=c, target=_cuda("sm_80"))
        assert "wmma" in nvcc.ptx(nvcc.cuda_source(tvm.tirx.build(sch.mod, target=_cuda("sm_80"))))


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


def _has_gpu():
    try:
        return tvm.cuda(0).exist
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("label,intrin,build", WORKLOADS, ids=[w[0] for w in WORKLOADS])
def test_gpu_numerics(label, intrin, build, rng):
    op = build()
    tensors = [*op.op.input_tensors, op]
    arch = "sm_" + tvm.cuda(0).compute_version.replace(".", "")
    mod = unit_tvm.build(tensors, _cuda(arch), intrinsic=intrin)
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
