"""The GPU model path (unit_tvm.compile for CUDA): a zoo model compiles for sm_80 and sm_90 with
its convs and dense layer on Tensor Cores (wmma in the PTX nvcc makes of TVM's CUDA source);
where a GPU is present, its output matches PyTorch fp32 (pytest -m gpu)."""

import numpy as np
import pytest
import tvm

import unit_tvm
from unit_tvm import nvcc
from unit_tvm.relax.gpu import UnitTensorizeGPU, to_fp16_nhwc

from .conftest import has_gpu

torch = pytest.importorskip("torch")
needs_nvcc = pytest.mark.skipif(nvcc.find_nvcc() is None, reason="nvcc not found")


def _cuda(arch):
    return tvm.target.Target({"kind": "cuda", "arch": arch})


def _resnet18():
    from unit_tvm import frontends
    from unit_tvm.testing import zoo

    module, shape = zoo.get("resnet18")
    x = torch.from_numpy(zoo.inputs(shape, 1)[0])
    return module, x, frontends.from_torch(module, [x])


@pytest.fixture(scope="module")
def resnet18():
    return _resnet18()


def test_gpu_pass_tensorizes_every_conv_and_dense(resnet18):
    _, _, mod = resnet18
    tensorize = UnitTensorizeGPU(_cuda("sm_80"))
    out = tensorize(to_fp16_nhwc(mod))
    assert len(tensorize.report) == 21  # 20 convs and the classifier
    assert all(k.intrinsic == "cuda.wmma.f16f32" for k in tensorize.report)
    text = out["main"].script()
    assert "R.nn.conv2d" not in text and "R.matmul" not in text
    assert text.count("unit_gpu_conv2d") >= 20


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_gpu_zoo_model_compiles_with_wmma(resnet18, arch):
    _, _, mod = resnet18
    ex = unit_tvm.compile(mod, _cuda(arch))
    src = nvcc.cuda_source(ex.mod)
    # 12 distinct conv / dense shapes (layers of one shape share a kernel)
    assert src.count("wmma::mma_sync") >= 12
    ptx = nvcc.ptx(src, arch)
    assert ptx.count("wmma.mma.sync") >= 12


def test_gpu_compile_refuses_int8_with_a_clear_error(resnet18):
    _, x, mod = resnet18
    with pytest.raises(NotImplementedError, match="CPU targets only"):
        unit_tvm.compile(mod, _cuda("sm_80"), quantize={"calibration_data": [x.numpy()]})


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "bert_base"])
def test_gpu_model_matches_pytorch_fp32(name):
    from tvm import relax

    from unit_tvm import frontends
    from unit_tvm.testing import zoo

    module, shape = zoo.get(name)
    x = torch.from_numpy(zoo.inputs(shape, 1)[0])
    with torch.no_grad():
        ref = module(x).numpy()
    mod = frontends.from_torch(module, [x])
    arch = "sm_" + tvm.cuda(0).compute_version.replace(".", "")
    vm = relax.VirtualMachine(unit_tvm.compile(mod, _cuda(arch)), tvm.cuda(0))
    out = vm["main"](tvm.runtime.tensor(x.numpy(), tvm.cuda(0)))
    got = (out if hasattr(out, "numpy") else out[0]).numpy().astype(np.float64)
    cos = got.ravel() @ ref.ravel() / (np.linalg.norm(got) * np.linalg.norm(ref))
    assert cos > 0.995, cos
