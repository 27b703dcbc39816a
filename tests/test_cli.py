"""The unit-tvm console script."""

import json
import subprocess
import sys

from unit_tvm import intrinsics
from unit_tvm.target import host

from .conftest import require_host


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


def test_bench_gpu_says_it_needs_a_gpu():
    import tvm

    try:
        has_gpu = tvm.cuda(0).exist
    except Exception:  # noqa: BLE001
        has_gpu = False
    if has_gpu:
        import pytest

        pytest.skip("a GPU is present: bench-gpu would run the whole benchmark")
    proc = _cli("bench-gpu", "--quick")
    assert proc.returncode == 2
    assert "GPU" in proc.stderr and "Traceback" not in proc.stderr
    bad = _cli("bench-gpu", "--dtype", "bfloat16")
    assert bad.returncode == 2
