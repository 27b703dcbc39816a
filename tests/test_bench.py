"""Benchmark plumbing: instruction choice, accuracy metrics, outputs; one real run when slow."""

import json
import subprocess
import sys

import numpy as np
import pytest
import tvm
import tvm_ffi

import unit_tvm
from unit_tvm import intrinsics, measure, selection
from unit_tvm.bench import model, op_level, report
from unit_tvm.bench.engines import accuracy
from unit_tvm.timing import interleaved
from unit_tvm.build import prepare_op
from unit_tvm.rewriter import schedule
from unit_tvm.prepare import placeholders_of
from unit_tvm.target import host
from unit_tvm.testing import workloads


def test_bench_op_workloads_are_table1_and_gemms():
    w = workloads.workloads()
    assert len(w) == 21 and w[0] == ("L1", "conv", (288, 35, 384, 3, 2))
    assert ("GEMM 4096x4096x4096", "gemm", (4096, 4096, 4096)) in w


def test_bench_op_candidates_follow_the_host():
    got = [i.name for i, _, _ in op_level.candidates("conv", (96, 16, 128, 3, 1), host())]
    usable = {i.name for i in intrinsics.for_target(host())}
    assert set(got) <= usable
    if "x86.tdpbusd" in usable:
        # AMX reads a 3x3 conv folded (3 columns x 96 channels = 288 reduced together): chained
        # twice pads it to 384, alone to 320; chained 4x would pad it to 512 (1.8x), too much
        assert got[:2] == ["x86.tdpbusd.x2", "x86.tdpbusd"] and "x86.tdpbusd.x4" not in got
        assert {workloads.form("conv", (96, 16, 128, 3, 1), intrinsics.get(n))
                for n in got[:2]} == {"folded"}
    # 1x1 convs are not folded: 1056 channels would be padded to 1280 by the 4x chain (1.2x)
    for intrin, x, _ in op_level.candidates("conv", (1056, 7, 192, 1, 1), host()):
        assert -(-1056 // x) * x / 1056 <= selection.RACE_WASTE
        assert workloads.form("conv", (1056, 7, 192, 1, 1), intrin) == "flat"
    vector = [i for i, _, _ in op_level.candidates("conv", (80, 73, 192, 3, 1), host())
              if i.broadcast_operand]
    assert all(workloads.form("conv", (80, 73, 192, 3, 1), i) == "direct" for i in vector)


def test_bench_op_only_selects_a_kind():
    assert {k for _, k, _ in workloads.workloads(only="conv")} == {"conv"}
    assert len(workloads.workloads(only="gemm")) == 5
    assert [p for _, _, p in workloads.workloads(only="conv3d")] == workloads.RESNET18_3D
    with pytest.raises(ValueError):
        workloads.workloads(only="pool")


def _conv3d_reference(data, weight, stride):
    """NCDHW x KCTRS, no padding, int64: the conv3d written out in numpy."""
    k, r = weight.shape[0], weight.shape[2]
    o = [(n - r) // stride + 1 for n in data.shape[2:]]
    out = np.zeros((1, k, *o), np.int64)
    for t in range(r):
        for i in range(r):
            for j in range(r):
                win = data[0, :, t:t + stride * o[0]:stride, i:i + stride * o[1]:stride,
                           j:j + stride * o[2]:stride].astype(np.int64)
                out[0] += np.einsum("cdhw,kc->kdhw", win, weight[:, :, t, i, j].astype(np.int64))
    return out


@pytest.mark.parametrize("stride", [1, 2])
def test_resnet18_3d_layer_is_tensorized_and_exact(stride):
    """A ResNet-18-3D layer (smaller channels) in bench-op's layout builds with the host's dot
    instruction and equals the conv3d computed in numpy, padding included; so does the kernel
    bench-op times, which skips the depth taps reading only (zero) padding frames."""
    p = (32, 4, 9, 32, 3, stride)
    intrin = next((i for i, _, _ in op_level.candidates("conv3d", p, host())), None)
    if intrin is None:
        pytest.skip("this CPU has no int8 dot-product instruction")
    op = workloads.workload_op("conv3d", p, intrin)
    report = unit_tvm.build_report([*placeholders_of(op), op], intrinsic=intrin.name)
    assert report.intrinsic == intrin.name
    x, y = intrin.channel_blocks
    rng = np.random.default_rng(3)
    # (a pair form, first without VNNI, is exact on u7 activations: the range it states)
    lo, hi = intrin.operand_ranges.get("a", (0, 255))
    data = rng.integers(lo, hi + 1, (1, 32, 6, 11, 11), dtype=np.uint8)  # pre-padded 4 x 9 x 9
    data[:, :, [0, -1]] = 0  # the padding frames (rows and columns keep random values)
    weight = rng.integers(-128, 128, (32, 32, 3, 3, 3), dtype=np.int8)
    packed_data = data.reshape(1, 32 // x, x, 6, 11, 11).transpose(0, 1, 3, 4, 5, 2)
    word = intrin.weight_word  # 4 for vpdpbusd, 2 for the int16 vpmaddwd forms
    packed_w = weight.reshape(32 // y, y, 32 // x, x // word, word, 3, 3, 3).transpose(
        0, 2, 5, 6, 7, 3, 1, 4)
    out_shape = [int(s) for s in op.shape]
    want = _conv3d_reference(data, weight, stride)
    prepared = prepare_op(op, intrin)
    timed = op_level.build_kernel("conv3d", p, prepared, intrin, None, host())
    # the timed kernel is not the plain schedule: the taps' predicate is there
    assert not tvm_ffi.structural_equal(
        op_level.kernel_func("conv3d", p, prepared, intrin, None, host()),
        schedule(prepared, intrin, None, host()).mod["main"])
    for module in (report.module, timed):
        args = measure.to_device([np.ascontiguousarray(packed_data), np.ascontiguousarray(
            packed_w), np.zeros(out_shape, np.int32)], tvm.cpu())
        module(*args)
        got = args[-1].numpy().transpose(0, 1, 5, 2, 3, 4).reshape(1, 32, *out_shape[2:5])
        np.testing.assert_array_equal(got, want)


def test_pytorch_conv3d_baseline_is_the_same_op():
    torch = pytest.importorskip("torch")
    mod, x = op_level.torch_int8_op("conv3d", (16, 4, 8, 32, 3, 2))
    assert mod(x).shape == torch.Size([1, 32, 2, 4, 4])
    # depth 4 -> 2 and 8 -> 4 with stride 2: output 0 sees taps 1-2, the others all 3 taps
    assert workloads.ops_count("conv3d", (16, 4, 8, 32, 3, 2)) == 2 * 16 * 32 * 5 * 11 * 11
    assert workloads.ops_count("conv3d", (16, 4, 8, 32, 1, 2)) == 2 * 16 * 32 * 2 * 4 * 4


def test_accuracy_metrics():
    a = [np.array([[0.1, 0.9, 0.0]]), np.array([[1.0, 0.0, 0.0]])]
    b = [np.array([[0.1, 0.8, 0.1]]), np.array([[0.0, 1.0, 0.0]])]
    cos, top1 = accuracy(a, b)
    assert top1 == 0.5 and 0.4 < cos < 0.6


def _result(name, ours, others):
    engines = {"unit-tvm int8": {"min_ms": ours, "median_ms": ours, "calls": 3, "cosine": 0.999,
                                 "top1_agreement": 1.0, "precision": "int8"}}
    for engine, (ms, cos) in others.items():
        engines[engine] = {"min_ms": ms, "median_ms": ms, "calls": 3, "cosine": cos,
                           "top1_agreement": 1.0, "precision": "int8"}
    res = {"model": name, "accuracy_inputs": 32, "engines": engines}
    model._speedups(res, lambda *a: None)
    return res


def test_strongest_is_the_fastest_accurate_rival():
    res = _result("m", 2.0, {"OpenVINO int8": (1.0, 0.95), "ORT int8": (1.6, 0.995),
                             "PyTorch int8": (3.0, 0.999), "TVM int8": (0.5, 0.999)})
    # OpenVINO is faster but below cosine 0.99; TVM int8 is the untensorized baseline
    assert res["strongest"] == "ORT int8" and res["vs_strongest"] == pytest.approx(0.8)


def test_outputs_and_geomeans(tmp_path):
    res = [_result("a", 1.0, {"ORT int8": (2.0, 0.999)}),
           _result("b", 1.0, {"ORT int8": (0.5, 0.999)})]
    geo = model.geomean_speedups(res)
    assert geo["ORT int8"] == pytest.approx(1.0) and geo["strongest"] == pytest.approx(1.0)
    paths = report.write_outputs(res, str(tmp_path))
    assert any(p.endswith(".png") for p in paths)
    data = json.loads((tmp_path / "bench_model.json").read_text())
    assert data["geomean_speedup"]["ORT int8"] == pytest.approx(1.0)
    text = report.summary(res)
    assert "strongest other int8 engine ORT int8" in text
    assert "cosine 0.99900 vs 0.99900, top-1 1.000 vs 1.000 over 32 inputs" in text
    engines = _result("c", 1.0, {"ORT int8": (2.0, 0.999)})["engines"]
    del engines["unit-tvm int8"]
    rivals_only = {"model": "c", "accuracy_inputs": 32, "engines": engines}
    model._speedups(rivals_only, lambda *a: None)  # `--engines` without unit-tvm
    assert rivals_only["strongest"] == "ORT int8" and report.summary([rivals_only]) == ""


def test_interleaved_timing_gives_every_engine_the_same_calls():
    import time

    slow_calls = []
    times = interleaved({"fast": lambda: None,
                         "slow": lambda: slow_calls.append(time.sleep(0.002))},
                        rounds=4, per_slot=3, warmup=1, gap_s=0)
    assert times["fast"].calls == times["slow"].calls == 12
    assert times["slow"].min_ms >= 2.0 > times["fast"].median_ms
    assert len(slow_calls) == 1 + 4 * (1 + 3)  # warm-up, then an untimed call per slot


@pytest.mark.slow
def test_bench_model_resnet18_runs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "unit_tvm.cli", "bench-model", "resnet18",
                           "--trials", "4", "--inputs", "2", "--skip", "TVM fp32", "--skip",
                           "TVM int8", "--out", str(tmp_path), "--json"], capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    eng = out["results"][0]["engines"]["unit-tvm int8"]
    assert eng["min_ms"] > 0 and eng["cosine"] > 0.99


def test_bench_model_takes_an_onnx_file(tmp_path):
    """An ONNX file (symbolic batch dimension, input not named input0) is benchmarked by the
    engines that start from ONNX, against ONNX Runtime's fp32 outputs; the PyTorch engines are
    skipped with the reason."""
    pytest.importorskip("onnxruntime", reason="ONNX Runtime is a bench and test extra")
    import torch
    from torch import nn

    # seeded: unseeded, the weights depended on the tests run before, and on some of them ORT's
    # int8 cosine fell to 0.98
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3),
                        nn.Flatten(), nn.Linear(16 * 6 * 6, 10)).eval()
    path = str(tmp_path / "small.onnx")
    with torch.no_grad():
        torch.onnx.export(net, (torch.randn(1, 3, 8, 8),), path, input_names=["pixels"],
                          dynamic_axes={"pixels": {0: "batch"}}, opset_version=17, dynamo=False)
    logged = []
    res = model.run_model(path, engines=("unit-tvm int8", "ORT int8", "PyTorch int8"),
                          n_inputs=2, rounds=1, log=logged.append, tune=False)
    assert res["model"] == "small.onnx" and res["accuracy_inputs"] == 2
    assert set(res["engines"]) == {"unit-tvm int8", "ORT int8"}
    assert any("PyTorch int8" in line and "skipped" in line for line in logged)
    # ONNX Runtime's U8S8 kernels on a CPU without VNNI (vpmaddubsw) saturate their int16 pair
    # sums: 0.974 on an AVX2-only Zen 3; unit-tvm stays exact there (its vpmaddwd form)
    vnni = intrinsics.get("x86.vpdpbusd.256").supported(unit_tvm.target.restricted("native"))
    for name, engine in res["engines"].items():
        floor = 0.99 if vnni or name == "unit-tvm int8" else 0.95
        assert engine["cosine"] > floor and engine["min_ms"] > 0, res["engines"]


def test_an_onnx_file_tvm_cannot_import_still_gets_the_other_engines(tmp_path):
    """An operator TVM 0.27's ONNX frontend lacks (Celu, which no folding removes) used to
    stop bench-model before any engine ran: now unit-tvm is reported failed with TVM's reason,
    and ONNX Runtime is still built, checked and timed."""
    pytest.importorskip("onnxruntime", reason="ONNX Runtime is a bench and test extra")
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Celu", ["r"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6])])
    path = str(tmp_path / "celu.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), path)
    logged = []
    res = model.run_model(path, engines=("unit-tvm int8", "ORT int8"), n_inputs=2, rounds=1,
                          log=logged.append, tune=False)
    assert set(res["engines"]) == {"ORT int8"}
    assert any("unit-tvm int8" in line and "failed" in line and "Celu" in line
               for line in logged), logged


def test_bench_model_runs_a_zoo_model_at_a_batch_size():
    """--batch: every engine gets the batched inputs (a wrong batch would not match the
    references' shapes), and the case is named after it."""
    res = model.run_model("bert_layer", engines=("unit-tvm int8", "PyTorch int8"), n_inputs=2,
                          rounds=1, log=lambda *a: None, batch=2, tune=False)
    assert res["model"] == "bert_layer_b2"
    assert set(res["engines"]) == {"unit-tvm int8", "PyTorch int8"}
    # ONNX Runtime's U8S8 kernels on a CPU without VNNI (vpmaddubsw) saturate their int16 pair
    # sums: 0.974 on an AVX2-only Zen 3; unit-tvm stays exact there (its vpmaddwd form)
    vnni = intrinsics.get("x86.vpdpbusd.256").supported(unit_tvm.target.restricted("native"))
    for name, engine in res["engines"].items():
        floor = 0.99 if vnni or name == "unit-tvm int8" else 0.95
        assert engine["cosine"] > floor and engine["min_ms"] > 0, res["engines"]
    case = model.make_case("bert_layer", 1, batch=3)
    assert case.shape[0] == 3 and case.inputs[0].shape == tuple(case.shape)


def test_batch_is_for_zoo_models_only(tmp_path):
    with pytest.raises(ValueError, match="exported with"):
        model.make_case(str(tmp_path / "m.onnx"), batch=2)
    with pytest.raises(ValueError, match="at least 1"):
        model.make_case("resnet18", batch=0)


def test_bench_model_rejects_an_onnx_file_it_cannot_feed(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["ids"], ["out"])], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
                              [helper.make_tensor_value_info("out", TensorProto.INT64, [1, 4])])
    path = str(tmp_path / "ids.onnx")
    onnx.save(helper.make_model(graph), path)
    with pytest.raises(ValueError, match="one float32 input"):
        model.make_case(path)


def test_bench_model_runs_a_quantized_file_as_it_is(tmp_path):
    """A QDQ file (ONNX Runtime's quantize_static): every engine runs the file's own
    quantization instead of quantizing it again, against ONNX Runtime running the file."""
    pytest.importorskip("onnxruntime", reason="ONNX Runtime is a bench and test extra")
    from .conftest import require_host
    from .test_qdq import _qdq_file

    require_host("x86.vpdpbusd")
    _, path, _ = _qdq_file(tmp_path)
    logged = []
    res = model.run_model(path, engines=("unit-tvm int8", "ORT int8"), n_inputs=2, rounds=1,
                          log=logged.append, tune=False)
    assert any("arrives quantized" in line for line in logged), logged
    assert set(res["engines"]) == {"unit-tvm int8", "ORT int8"}, logged
    assert res["engines"]["ORT int8"]["variant"] == "the file's quantization"
    assert res["engines"]["ORT int8"]["cosine"] > 0.99999  # its own reference
    assert res["engines"]["unit-tvm int8"]["cosine"] > 0.9999


def test_each_engine_says_whether_it_keeps_to_the_isa_level():
    """Held to a level (--isa), every engine's report says whether it obeyed; ONNX Runtime
    cannot be held, and says so; at the native level there is nothing to say."""
    from unit_tvm.bench.engines import isa_obedience

    assert isa_obedience("ORT int8", "native") == ""
    assert isa_obedience("ORT int8", "avx2").startswith("NOT held")
    assert isa_obedience("unit-tvm int8", "avx2").startswith("held")
    assert isa_obedience("OpenVINO int8", "avx512_core").startswith("held")
    assert isa_obedience("OpenVINO fp32", "avx2").startswith("partly")
    assert isa_obedience("PyTorch int8", "avx2").startswith("partly")
    assert isa_obedience("PyTorch PT2E int8", "avx2").startswith("held")
