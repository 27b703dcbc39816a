"""The GPU model path (unit_tvm.compile for CUDA): a zoo model compiles for sm_80 and sm_90 with
its convs and dense layer on Tensor Cores (wmma in the PTX nvcc makes of TVM's CUDA source);
where a GPU is present, its output matches PyTorch fp32 (pytest -m gpu)."""

import re

import numpy as np
import pytest
import tvm

import unit_tvm
from unit_tvm import nvcc
from unit_tvm.relax.gpu import kernels as gpu_kernels
from unit_tvm.relax.gpu.pipeline import UnitTensorizeGPU, to_fp16_nhwc

from .conftest import gpu_output, has_gpu

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
    # every output row of these layers is a partial fragment (7, 14, 28, 56: 112 with a
    # 3-channel window): their pixels fuse into one GEMM
    assert [k.form for k in tensorize.report] == ["gemm"] * 20 + ["dense"]
    text = out["main"].script()
    assert "R.nn.conv2d" not in text and "R.matmul" not in text
    assert text.count("unit_gpu_conv2d") >= 20
    # the gather supplies the convs' zero padding: no pad pass before any kernel
    assert "R.nn.pad" not in text
    # every bias, residual add and ReLU is in a kernel's write-back (gpu_epilogue)
    assert "R.add(" not in text and "R.nn.relu(" not in text


@needs_nvcc
# sm_80 (17 s) runs in `make test-all`; every kernel form compiles for sm_80 in test_gpu.py
@pytest.mark.parametrize("arch", [pytest.param("sm_80", marks=pytest.mark.slow), "sm_90"])
def test_gpu_zoo_model_compiles_with_wmma(resnet18, arch):
    _, _, mod = resnet18
    ex = unit_tvm.compile(mod, _cuda(arch))
    src = nvcc.cuda_source(ex.mod)
    # 12 distinct conv / dense shapes (layers of one shape share a kernel)
    assert src.count("wmma::mma_sync") >= 12
    ptx = nvcc.ptx(src, arch)
    assert ptx.count("wmma.mma.sync") >= 12


@needs_nvcc
# 16 s: `make test-all`; the default suite keeps the int8 encoder below and every s8 conv
# form's compile (test_gpu.py)
@pytest.mark.slow
def test_gpu_int8_model_compiles_with_s8_wmma(resnet18):
    """quantize on CUDA: every conv and the classifier become s8 x s8 -> s32 wmma kernels."""
    _, x, mod = resnet18
    report = []
    ex = unit_tvm.compile(mod, _cuda("sm_90"), quantize={"calibration_data": [x.numpy()]},
                          report=report)
    assert len(report) == 21 and all(r[1] == "cuda.wmma.s8s32" for r in report)
    ptx = nvcc.ptx(nvcc.cuda_source(ex.mod), "sm_90")
    assert sum("wmma.mma.sync" in line and ".s8" in line for line in ptx.splitlines()) >= 12


@needs_nvcc
def test_gpu_int8_transformer_compiles_with_s8_wmma():
    """An int8 encoder layer on CUDA: its dense layers become s8 wmma kernels and the fp16
    conversion after quantization goes through (its input clip once stopped ToMixedPrecision
    on bert_base)."""
    from unit_tvm import frontends
    from unit_tvm.testing import zoo

    module = zoo.BertEncoder(layers=1, hidden=64, heads=2, ffn=128).eval()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 32, 64), np.float32))
    report = []
    ex = unit_tvm.compile(frontends.from_torch(module, [x]), _cuda("sm_90"),
                          quantize={"calibration_data": [x.numpy()]}, report=report)
    dense = [r for r in report if r[1] == "cuda.wmma.s8s32"]
    assert len(dense) >= 4  # q/k/v (or their fused form), the output projection, the FFN
    ptx = nvcc.ptx(nvcc.cuda_source(ex.mod), "sm_90")
    assert any("wmma.mma.sync" in line and ".s8" in line for line in ptx.splitlines())


@needs_nvcc
def test_gpu_attention_matmuls_run_on_tensor_cores():
    """fp16 attention on CUDA: the scores (Q x K^T, K = 64) and the weighted sum (P x V, N =
    64), matmuls of two activations that dlight's rule leaves on CUDA cores at this head size,
    are wmma kernels batched over the heads, as the dense layers are."""
    from unit_tvm import frontends
    from unit_tvm.testing import zoo

    module = zoo.BertEncoder(layers=1, hidden=128, heads=2, ffn=256).eval()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 32, 128), np.float32))
    report = []
    ex = unit_tvm.compile(frontends.from_torch(module, [x]), _cuda("sm_90"), report=report)
    attention = [r for r in report if r[0].startswith("matmul 2 x 32x")]
    assert [r[1] for r in attention] == ["cuda.wmma.f16f32"] * 2, report
    src = nvcc.cuda_source(ex.mod)
    assert len(set(re.findall(r"unit_gpu_bmm_\d+_kernel", src))) == 2
    ptx = nvcc.ptx(src, "sm_90")
    assert sum("wmma.mma.sync" in line for line in ptx.splitlines()) >= 6


@pytest.mark.skipif(has_gpu(), reason="a GPU is present: the library would load")
def test_a_cuda_library_says_what_it_needs_where_it_cannot_run(tmp_path):
    from unit_tvm import deploy

    _, _, mod = _odd_model()
    path = deploy.export(unit_tvm.compile(mod, _cuda("sm_80")), str(tmp_path / "m.so"))
    with pytest.raises(RuntimeError, match="no CUDA GPU|holds CUDA kernels"):
        deploy.load(path, "cuda")
    with pytest.raises(RuntimeError, match="holds CUDA kernels|no CUDA GPU"):
        deploy.load(path)


def test_gpu_int8_options_have_clear_errors(resnet18):
    _, x, mod = resnet18
    for quantize, match in (({"calibration_data": []}, "calibration_data is empty"),
                            ({"calibration_data": [x.numpy()], "dtype": "bfloat16"}, "int8"),
                            ({"calibration_data": [x.numpy()], "attention": "int8"}, "CPU-only"),
                            ({"calibration_data": [x.numpy()], "method": "mse"}, "minmax")):
        with pytest.raises(ValueError, match=match):
            unit_tvm.compile(mod, _cuda("sm_80"), quantize=quantize)


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("name,int8", [("resnet18", False), ("mobilenet_v2", False),
                                       ("bert_base", False), ("resnet18", True),
                                       ("bert_base", True), ("whisper_encoder", False),
                                       ("wav2vec2_base", True)])
def test_gpu_model_matches_pytorch_fp32(name, int8):
    from unit_tvm import frontends
    from unit_tvm.testing import zoo

    module, shape = zoo.get(name)
    x = torch.from_numpy(zoo.inputs(shape, 1)[0])
    with torch.no_grad():
        ref = module(x).numpy()
    mod = frontends.from_torch(module, [x])
    quantize = {"calibration_data": zoo.inputs(shape, 4)} if int8 else None
    got = gpu_output(mod, x.numpy(), quantize)
    cos = got.ravel() @ ref.ravel() / (np.linalg.norm(got) * np.linalg.norm(ref))
    assert cos > (0.99 if int8 else 0.995), cos


class _OddConvs(torch.nn.Module):
    """Convs nobody tuned for: a dilated window with unequal strides over 5 channels and a
    batch norm (folded into its weights: TVM folds one only after a conv without bias), then
    a pointwise conv over 16-pixel rows (which stays direct), on a batch of 2."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(5, 24, 3, stride=(1, 2), padding=2, dilation=2, bias=False)
        self.norm = torch.nn.BatchNorm2d(24)
        self.b = torch.nn.Conv2d(24, 32, 1)
        with torch.no_grad():  # statistics far from the identity, so a wrong fold shows
            self.norm.running_mean.uniform_(-0.5, 0.5)
            self.norm.running_var.uniform_(0.2, 3.0)
            self.norm.weight.uniform_(0.5, 2.0)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.b(torch.relu(self.norm(self.a(x))))


def _odd_model():
    from unit_tvm import frontends

    torch.manual_seed(0)
    module = _OddConvs().eval()
    x = torch.randn(2, 5, 11, 31)
    return module, x, frontends.from_torch(module, [x])


@needs_nvcc
def test_gpu_pass_writes_dilated_and_odd_convs_as_one_gemm():
    _, _, mod = _odd_model()
    tensorize = UnitTensorizeGPU(_cuda("sm_90"))
    tensorize(to_fp16_nhwc(mod))
    assert [(k.intrinsic, k.form) for k in tensorize.report] == [
        ("cuda.wmma.f16f32", "gemm"), ("cuda.wmma.f16f32", "direct")]
    src = nvcc.cuda_source(unit_tvm.compile(mod, _cuda("sm_90")).mod)
    assert nvcc.ptx(src, "sm_90").count("wmma.mma.sync") >= 2


def test_gpu_database_record_decides_the_form(tmp_path):
    """A tuning record for the form the policy did not prefer (the direct form of a 7x7 layer,
    measured faster on some GPU) makes the pass write the conv that way."""
    from tvm import relax
    from tvm.script import relax as R

    from unit_tvm.prepare import prepare
    from unit_tvm.relax.gpu import conv as gpu_conv
    from unit_tvm.schedules import gpu
    from unit_tvm.tuner import Database
    from unit_tvm.tuner.database import workload_key

    weight = np.random.default_rng(0).standard_normal((64, 3, 3, 64)).astype("float16")

    @tvm.script.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((1, 9, 9, 64), "float16")):
            with R.dataflow():
                y = R.nn.conv2d(x, R.const(weight), data_layout="NHWC", kernel_layout="OHWI",
                                out_dtype="float16")
                R.output(y)
            return y

    target = _cuda("sm_90")
    g = gpu_conv.ConvGeometry(1, 9, 9, 64, 64, 3, 3)
    assert gpu_conv.choose_form(g, gpu.Fragment(16, 16, 16)) == "gemm"
    plain = UnitTensorizeGPU(target)
    plain(Mod)
    assert plain.report[0].form == "gemm"
    tensors = gpu_conv.direct_te(g, "float16", "float32")
    prepared = prepare(tensors[-1], "cuda.wmma.f16f32", params=tensors[:-1],
                       **gpu.prepare_options(None))
    db = Database(tmp_path / "db.jsonl")
    key = workload_key(tvm.te.create_prim_func(list(prepared.params) + [prepared.reference]))
    db.append(key, target, "cuda.wmma.f16f32", gpu.default(prepared).key(), 1000.0)
    recorded = UnitTensorizeGPU(target, database=db)
    out = recorded(Mod)
    assert recorded.report[0].form == "direct"
    assert isinstance(out["main"], relax.Function)


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="no CUDA GPU on this machine")
def test_gpu_odd_convs_match_pytorch_fp32():
    module, x, mod = _odd_model()
    with torch.no_grad():
        ref = module(x).numpy()
    got = gpu_output(mod, x.numpy())
    np.testing.assert_allclose(got, ref, rtol=2e-2, atol=2e-2)


@pytest.fixture
def te_kernels():
    """Each kernel of the GPU pass its te definition (gpu_kernels.te_reference): runs on CPU."""
    with gpu_kernels.te_reference():
        yield


@pytest.mark.parametrize("int8", [False, True], ids=["fp16", "int8"])
def test_gpu_graph_around_the_kernels_is_exact_on_cpu(te_kernels, int8):
    """Everything the GPU pass puts around its kernels (int8: input quantization, per-channel
    weights, dequantization; both: padding, the GEMM form's weight layout and reshapes) is right:
    with each kernel replaced by its te definition, the pass's module runs on this CPU and
    matches PyTorch fp32. The kernels themselves are checked against the same te definitions on
    a GPU (test_gpu.py, -m gpu)."""
    from tvm import relax

    from unit_tvm.compiler import build_relax
    from unit_tvm.relax.gpu import pipeline as gpu
    from unit_tvm.relax.gpu import int8 as gpu_int8
    from unit_tvm.target import host

    module, x, mod = _odd_model()
    samples = [x.numpy()] + [torch.randn(2, 5, 11, 31).numpy() for _ in range(3)]
    calibration = gpu_int8.Int8Calibration(samples) if int8 else None
    tensorize = UnitTensorizeGPU(_cuda("sm_90"), int8=calibration)
    out_mod = (gpu.to_fp16(tensorize(gpu.to_nhwc(mod))) if int8
               else tensorize(gpu.to_fp16_nhwc(mod)))
    assert [k.form for k in tensorize.report] == ["gemm", "direct"]
    # the batch norm folded into the first conv's weights: no elementwise (x - mean) / std left
    text = out_mod["main"].script()
    assert "R.subtract" not in text and "R.divide" not in text
    # each conv's bias and ReLU in its write-back (int8: after the dequantization there); the
    # gemm form's gather quantizes its input (one quantization left: the direct form's)
    assert "R.nn.relu(" not in text, text
    assert text.count("R.floor(") == (1 if int8 else 0), text
    vm = relax.VirtualMachine(build_relax(out_mod, host()), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x.numpy(), tvm.cpu()))
    got = (got if hasattr(got, "numpy") else got[0]).numpy().astype(np.float64)
    with torch.no_grad():
        ref = module(x).numpy().astype(np.float64)
    cos = got.ravel() @ ref.ravel() / (np.linalg.norm(got) * np.linalg.norm(ref))
    assert cos > (0.999 if int8 else 0.9999), cos
    # int8 measured 1.4% of the largest output (a 1% error in the dequantization scale: 2.8%)
    np.testing.assert_allclose(got, ref, atol=(0.02 if int8 else 0.005) * np.abs(ref).max())


class _Residual(torch.nn.Module):
    """A residual block with a ReLU6 (a clip: a maximum and a minimum on the GPU path), a
    folded batch norm, a residual add after it and a ReLU, and a 1x1 conv with a bias."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.b = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.norm = torch.nn.BatchNorm2d(16)
        self.c = torch.nn.Conv2d(16, 24, 1)
        with torch.no_grad():
            self.norm.running_mean.uniform_(-0.5, 0.5)
            self.norm.running_var.uniform_(0.2, 3.0)

    def forward(self, x):
        y = torch.clamp(self.a(x), 0.0, 0.5)
        return self.c(torch.relu(self.norm(self.b(y)) + y))


def test_gpu_epilogue_chains_fold_into_the_kernels_exactly_on_cpu(te_kernels):
    """Bias adds, the residual add and the activations after each conv go into its kernel
    (no elementwise op is left between the kernels), and the result is what the model
    computes: each kernel replaced by its te definition, run on this CPU, against PyTorch
    fp32 (fp16 rounding: cast, + bias, + residual, activation, in the model's order)."""
    from tvm import relax

    from unit_tvm import frontends
    from unit_tvm.compiler import build_relax
    from unit_tvm.relax.gpu import pipeline as gpu
    from unit_tvm.target import host

    torch.manual_seed(0)
    module = _Residual().eval()
    x = torch.randn(1, 16, 12, 12)
    tensorize = UnitTensorizeGPU(_cuda("sm_90"))
    out_mod = tensorize(gpu.to_fp16_nhwc(frontends.from_torch(module, [x])))
    text = out_mod["main"].script()
    assert len(tensorize.report) == 3
    for op in ("R.add(", "R.nn.relu(", "R.maximum(", "R.minimum("):
        assert op not in text, op
    vm = relax.VirtualMachine(build_relax(out_mod, host()), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x.numpy(), tvm.cpu()))
    got = (got if hasattr(got, "numpy") else got[0]).numpy().astype(np.float64)
    with torch.no_grad():
        ref = module(x).numpy().astype(np.float64)
    np.testing.assert_allclose(got, ref, atol=0.01 * np.abs(ref).max())


class _Smooth(torch.nn.Module):
    """Convs ending in smooth activations (SiLU, sigmoid) and a dense layer in a tanh GELU."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.b = torch.nn.Conv2d(16, 16, 1)
        self.fc = torch.nn.Linear(16, 32)

    def forward(self, x):
        y = torch.sigmoid(self.b(torch.nn.functional.silu(self.a(x))))
        return torch.nn.functional.gelu(self.fc(y.mean((2, 3))), approximate="tanh")


def _run_on_cpu(module, x, quantize=None):
    """(the GPU path's graph as text, its output run on this CPU with each kernel its te
    definition, PyTorch fp32's output); the frontend's output repaired as unit_tvm.compile
    repairs it."""
    from tvm import relax

    from unit_tvm import frontends
    from unit_tvm.compiler import build_relax, tensorized_for_cuda
    from unit_tvm.relax.frontend.fixes import frontend_fixes
    from unit_tvm.target import host

    report = []
    out_mod = tensorized_for_cuda(frontend_fixes(frontends.from_torch(module, [x])),
                                  _cuda("sm_90"), quantize=quantize, report=report)
    vm = relax.VirtualMachine(build_relax(out_mod, host()), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x.numpy(), tvm.cpu()))
    got = (got if hasattr(got, "numpy") else got[0]).numpy().astype(np.float64)
    with torch.no_grad():
        ref = module(x).numpy().astype(np.float64)
    return out_mod["main"].script(), got, ref, report


@pytest.mark.parametrize("name", ["smooth", "encoder", "encoder_int8"])
def test_gpu_transformer_and_smooth_chains_fold_exactly_on_cpu(te_kernels, name):
    """A transformer layer's chains (reshapes between the ops, the float32 cast before the
    residual add, erf's GELU, the scores' scale) and the smooth activations go into the
    kernels too: no bias or residual add, scale, GELU, SiLU or sigmoid is left as an op, and
    with each kernel its te definition the model computes what PyTorch fp32 does. An int8
    encoder keeps its attention matmuls (not quantized) on fp16 Tensor Cores the same way."""
    from unit_tvm.testing import zoo

    torch.manual_seed(0)
    if name == "smooth":
        module, x = _Smooth().eval(), torch.randn(1, 8, 6, 6)
        gone = ("R.add(", "R.sigmoid(", "R.multiply(", "R.nn.gelu_tanh(")
    else:
        module, x = zoo.BertEncoder(layers=1, hidden=64, heads=2, ffn=128).eval(), \
            torch.randn(1, 32, 64)
        # no cast either: the kernels read float32 values as they load their operands
        # (gpu_operands) and write float32 where a residual add or the softmax reads it
        gone = ("R.add(", "R.nn.gelu(", "R.divide(", "R.astype(", "R.matmul(")
    quantize = None
    if name == "encoder_int8":
        quantize = {"calibration_data": [x.numpy()] + [torch.randn(1, 32, 64).numpy()]}
        gone = ("R.matmul(",)
    text, got, ref, report = _run_on_cpu(module, x, quantize)
    for op in gone:
        assert op not in text, op
    if quantize is not None:
        ops = [r[0] for r in report]  # four int8 dense layers, then the two fp16 matmuls
        assert [op.split()[0] for op in ops] == ["dense"] * 4 + ["matmul"] * 2, ops
        assert all(op.endswith("int8") for op in ops[:4]), ops
    np.testing.assert_allclose(got, ref, atol=(0.03 if quantize else 0.01) * np.abs(ref).max())


class _Depthwise(torch.nn.Module):
    """A depthwise conv (TVM's schedule, fp16 after ToMixedPrecision) read by a 3x3 conv."""

    def __init__(self):
        super().__init__()
        self.dw = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.conv = torch.nn.Conv2d(16, 24, 3, padding=1)

    def forward(self, x):
        return self.conv(torch.relu(self.dw(x)))


def test_gpu_int8_gather_reads_a_depthwise_convs_result(te_kernels):
    """int8: the gather of a conv quantizes a depthwise conv's result as it reads it. TVM's
    ToMixedPrecision fails on a call_tir reading a value it makes fp16 (an explicit cast to
    float32 in between keeps it working); the model matches PyTorch fp32."""
    torch.manual_seed(0)
    module, x = _Depthwise().eval(), torch.randn(1, 16, 10, 10)
    quantize = {"calibration_data": [x.numpy()] + [torch.randn(1, 16, 10, 10).numpy()]}
    text, got, ref, report = _run_on_cpu(module, x, quantize)
    assert [r[0].split()[-1] for r in report] == ["int8"] and "R.floor(" not in text, text
    np.testing.assert_allclose(got, ref, atol=0.03 * np.abs(ref).max())


def test_gpu_bench_model_speedups_name_each_engine():
    from unit_tvm.bench.gpu_model import speedups

    ms = {"unit_tvm_fp16": 2.0, "unit_tvm_int8": 1.0, "tvm_fp16": 3.0, "pytorch_fp16": 4.0,
          "pytorch_fp16_cudagraph": 0.5}
    got = speedups({"engines": {k: {"min_ms": v} for k, v in ms.items()}})
    assert got["best_pytorch"] == 0.25 and got["int8_best_pytorch"] == 0.5
    assert got["tvm_fp16"] == 1.5 and got["unit_tvm_int8"] == 0.5


@pytest.mark.parametrize("int8", [False, True], ids=["fp16", "int8"])
def test_gpu_speech_block_on_cpu(te_kernels, int8):
    """Two conv1d (lifted to 2-D, on Tensor Cores) and torch's nn.TransformerEncoderLayer
    (its squeeze(axis=-2) had crashed TVM's ConvertLayout; its safe softmax is one reduction
    kernel): the GPU path's graph, each kernel its te definition, against PyTorch fp32."""
    from .test_conv1d_lift import _SpeechBlock

    torch.manual_seed(0)
    module, x = _SpeechBlock().eval(), torch.randn(1, 20, 64)
    quantize = ({"calibration_data": [x.numpy()] + [torch.randn(1, 20, 64).numpy()]}
                if int8 else None)
    _, got, ref, report = _run_on_cpu(module, x, quantize)
    assert sum("conv2d" in r[0] for r in report) == 2, report
    cos = float((got * ref).sum() / np.linalg.norm(got) / np.linalg.norm(ref))
    assert cos > (0.999 if int8 else 0.9999), cos
