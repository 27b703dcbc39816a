"""The GPU path's rule for small-window reductions (relax/gpu/window.py): a depthwise conv gets one
thread per output with its window unrolled and its bias and clip in the same thread; long
reductions and small outputs are left to TVM's rules. Numerics where a GPU is present."""

import numpy as np
import pytest
import tvm
from tvm import te

from unit_tvm import nvcc
from unit_tvm.relax.gpu.window import MAX_WINDOW, THREADS, WindowReduction

from .conftest import gpu_output, has_gpu

torch = pytest.importorskip("torch")
needs_nvcc = pytest.mark.skipif(nvcc.find_nvcc() is None, reason="nvcc not found")
SM90 = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})


class _Depthwise(torch.nn.Module):
    """A depthwise 3x3 conv with bias and ReLU6 between two pointwise convs, then pooling (the
    ReLU6 a clip that must follow the convs into NHWC, or it runs between two transposes)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.expand = torch.nn.Conv2d(16, 64, 1)
        self.depthwise = torch.nn.Conv2d(64, 64, 3, padding=1, groups=64)
        self.project = torch.nn.Conv2d(64, 32, 1)
        self.pool = torch.nn.MaxPool2d(3, stride=2, padding=1)

    def forward(self, x):
        y = torch.nn.functional.relu6(self.depthwise(self.expand(x)))
        return self.pool(self.project(y))


def _model():
    from unit_tvm import frontends

    x = torch.randn(1, 16, 28, 28, generator=torch.Generator().manual_seed(1))
    module = _Depthwise().eval()
    return module, x, frontends.from_torch(module, [x])


def _reduction(outputs, window):
    data = te.placeholder((outputs, window), "float32", name="data")
    r = te.reduce_axis((0, window), name="r")
    out = te.compute((outputs,), lambda i: te.sum(data[i, r], axis=r), name="out")
    return te.create_prim_func([data, out])


@needs_nvcc
def test_depthwise_conv_gets_a_thread_per_output():
    from unit_tvm.compiler import scheduled_for_cuda

    _, _, mod = _model()
    mod = scheduled_for_cuda(mod, SM90)
    depthwise = [(gv.name_hint, f) for gv, f in mod.functions.items()
                 if isinstance(f, tvm.tirx.PrimFunc) and "group_conv2d" in f.script()]
    assert len(depthwise) == 1, [n for n, _ in depthwise]
    script = depthwise[0][1].script()
    outputs = 28 * 28 * 64
    assert f'T.thread_binding(T.int64({-(-outputs // THREADS)}), thread="blockIdx.x")' in script
    assert script.count("T.unroll(T.int64(3))") == 2  # the window, in registers
    assert 'scope="local"' in script
    lib = tvm.tirx.build(depthwise[0][1].with_attr("global_symbol", "main"), target=SM90)
    src = nvcc.cuda_source(lib)
    assert len(nvcc.launch_shapes(lib)) == 1  # the bias and the ReLU6 in the conv's kernel
    assert "max(" in src and "min(" in src
    nvcc.ptx(src, "sm_90")


def test_window_rule_leaves_long_reductions_and_small_outputs_to_tvm():
    rule = WindowReduction()
    assert rule.apply(_reduction(8192, 9), SM90, False) is not None
    assert rule.apply(_reduction(8192, MAX_WINDOW + 1), SM90, False) is None  # softmax-like
    assert rule.apply(_reduction(1280, 49), SM90, False) is None  # a global average pool
    assert rule.apply(_reduction(8192, 9), tvm.target.Target("llvm"), False) is None


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="no CUDA GPU on this machine")
def test_depthwise_model_matches_pytorch_fp32():
    module, x, mod = _model()
    with torch.no_grad():
        ref = module(x).numpy()
    got = gpu_output(mod, x.numpy())
    np.testing.assert_allclose(got, ref, rtol=2e-2, atol=2e-2)
