"""The unit-tvm console script."""

import json
import subprocess
import sys

from unit_tvm import intrinsics
from unit_tvm.target import host

from .conftest import has_gpu, require_host


def _cli(*args):
    proc = subprocess.run([sys.executable, "-m", "unit_tvm.cli", *args], capture_output=True,
                          text=True, timeout=600)
    return proc


def test_intrinsics_table_json():
    proc = _cli("intrinsics", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["intrinsics"]
    assert [r["name"] for r in rows] == intrinsics.names()
    for r in rows:
        assert r["usable"] == intrinsics.get(r["name"]).supported(host())
        assert r["usable"] or r["missing"]


def test_isa_option_restricts_unit_tvm_not_only_the_other_engines():
    """`--isa` is applied after the CLI's imports; the host target they may have made before
    must not keep the instructions it turns off (it did: a module-level runner cached it, and
    an AMX host emulating a VNNI-only one would have run AMX kernels against engines held to
    VNNI)."""
    proc = _cli("--isa", "avx512_core", "intrinsics", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "-avx512vnni" in out["target"]
    usable = {r["name"] for r in out["intrinsics"] if r["usable"]}
    assert not any(n.startswith(("x86.vpdpbusd", "x86.vpermb", "x86.tdp", "x86.vdpbf16ps"))
                   for n in usable), usable


def test_intrinsics_table_text_says_what_is_missing():
    proc = _cli("intrinsics")
    assert proc.returncode == 0
    assert "arm.sdot" in proc.stdout and "no (missing arch aarch64" in proc.stdout


def test_peak_json_one_thread():
    require_host("x86.vpdpbusd.256")
    proc = _cli("peak", "--intrinsic", "x86.vpdpbusd.256", "--threads", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["intrinsic"] == "x86.vpdpbusd.256" and row["threads"] == 1 and row["gops"] > 1


def test_peak_refuses_foreign_instruction():
    proc = _cli("peak", "--intrinsic", "arm.sdot")
    assert proc.returncode == 2 and "missing arch aarch64" in proc.stderr


def test_inspect_prints_mapping_or_reason_for_every_instruction():
    proc = _cli("inspect", "conv2d", "64", "16", "64", "3", "--layout", "nchwc", "--json")
    assert proc.returncode == 0, proc.stderr
    report = {r["intrinsic"]: r for r in json.loads(proc.stdout)["report"]}
    assert set(report) == set(intrinsics.names())
    assert "ki[16] equal" in report["x86.vpdpbusd"]["mappings"][0]
    assert report["arm.sdot"]["reason"] and "must be int8" in report["arm.sdot"]["reason"]


def test_inspect_rejects_wrong_shape_arity():
    proc = _cli("inspect", "dense", "64", "64")
    assert proc.returncode == 2 and "M N K" in proc.stderr


def test_bench_gpu_and_gpu_models_say_they_need_a_gpu():
    if has_gpu():
        import pytest

        pytest.skip("a GPU is present: bench-gpu would run the whole benchmark")
    proc = _cli("bench-gpu", "--quick")
    assert proc.returncode == 2
    assert "GPU" in proc.stderr and "Traceback" not in proc.stderr
    bad = _cli("bench-gpu", "--dtype", "bfloat16")
    assert bad.returncode == 2
    # the models on the GPU too (it once ended in PyTorch's "not compiled with CUDA")
    models = _cli("bench-model", "resnet18", "--target", "cuda", "--no-tune")
    assert models.returncode == 2
    assert "CUDA GPU" in models.stderr and "Traceback" not in models.stderr


def test_compile_export_and_run_equal_the_in_process_model(tmp_path):
    """`unit-tvm compile model.onnx --int8` -> `unit-tvm run` gives exactly what the same model
    compiled in this process gives; the library also runs on TVM's runtime alone (no compiler
    library loaded), as on a deployment machine."""
    require_host("x86.vpdpbusd")
    import numpy as np
    import torch
    from torch import nn

    import unit_tvm
    from unit_tvm import deploy, sources

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2),
                          nn.ReLU(), nn.Flatten(), nn.Linear(32 * 7 * 7, 10)).eval()
    x = torch.randn(1, 3, 16, 16)
    onnx_path, lib = str(tmp_path / "m.onnx"), str(tmp_path / "m.so")
    torch.onnx.export(model, (x,), onnx_path, opset_version=17, input_names=["x"], dynamo=False)
    cal = [np.random.default_rng(i).standard_normal((1, 3, 16, 16)).astype("float32")
           for i in range(3)]
    np.savez(tmp_path / "cal.npz", *cal)
    np.save(tmp_path / "x.npy", x.numpy())
    proc = _cli("compile", onnx_path, "-o", lib, "--int8", "--calibration",
                str(tmp_path / "cal.npz"))
    assert proc.returncode == 0, proc.stderr
    assert "3 of 3 compute ops tensorized" in proc.stdout
    proc = _cli("run", lib, "--input", str(tmp_path / "x.npy"), "--output",
                str(tmp_path / "y.npy"))
    assert proc.returncode == 0, proc.stderr
    got = np.load(tmp_path / "y.npy")
    source = sources.model_source(onnx_path)
    ex = unit_tvm.compile(source.mod, quantize={"calibration_data": cal})
    again = deploy.export(ex, str(tmp_path / "again.so"))
    np.testing.assert_array_equal(got, unit_tvm.load(again)(x.numpy()))
    ref = model(x).detach().numpy()
    assert float(got.ravel() @ ref.ravel() / np.linalg.norm(got) / np.linalg.norm(ref)) > 0.99
    runtime_only = subprocess.run(
        [sys.executable, "-c", "import sys, numpy as np, tvm, tvm.base\n"
         "from tvm.runtime.vm import VirtualMachine\n"
         "assert tvm.base._RUNTIME_ONLY\n"
         "vm = VirtualMachine(tvm.runtime.load_module(sys.argv[1]), tvm.cpu())\n"
         "out = vm['main'](tvm.runtime.tensor(np.load(sys.argv[2])))\n"
         "np.save(sys.argv[3], (out if hasattr(out, 'numpy') else out[0]).numpy())",
         lib, str(tmp_path / "x.npy"), str(tmp_path / "z.npy")],
        capture_output=True, text=True, timeout=300, env={**__import__("os").environ,
                                                         "TVM_USE_RUNTIME_LIB": "1"})
    assert runtime_only.returncode == 0, runtime_only.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "z.npy"), got)


def test_compile_attention_needs_int8_and_a_known_precision():
    proc = _cli("compile", "bert_layer", "-o", "/tmp/never.so", "--attention", "bf16")
    assert proc.returncode == 2 and "--attention applies to --int8" in proc.stderr
    proc = _cli("compile", "bert_layer", "-o", "/tmp/never.so", "--int8", "--attention", "fp16")
    assert proc.returncode == 2 and "invalid choice: 'fp16'" in proc.stderr


def test_compile_names_an_unknown_model():
    proc = _cli("compile", "no_such_model", "-o", "/tmp/never.so")
    assert proc.returncode != 0 and "no_such_model" in proc.stderr
