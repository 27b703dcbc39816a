"""Adding an instruction touches nothing outside its own module: a module written here, in a
temporary folder, declared as an installed package's `unit_tvm.intrinsics` entry point, is
listed, inspected, built into an exact kernel and benchmarked by unit-tvm unchanged."""

import os
import subprocess
import sys
import textwrap

import pytest

from unit_tvm import intrinsics
from unit_tvm.target import host

PLUGIN = '''
"""AVX512-VNNI vpdpwssd: 16 lanes, each the sum of 2 s16 * s16 products (wrapping)."""

from tvm import te, tirx
from tvm.script.ir_builder import tirx as T

from unit_tvm.intrinsics import Intrinsic, placeholders


def semantics():
    a, b = placeholders(a=((2,), "int16"), b=((16, 2), "int16"))
    k = te.reduce_axis((0, 2), name="k")
    return te.compute((16,), lambda i: te.sum(a[k].astype("int32") * b[i, k].astype("int32"),
                                              axis=k), name="d")


def emit(bufs):
    a, b, d = bufs["a"], bufs["b"], bufs["d"]
    word = tirx.reinterpret("int32", a.vload([0], "int16x2"))
    T.buffer_store(d, tirx.call_llvm_pure_intrin(
        "int32x16", "llvm.x86.avx512.vpdpwssd.512", d.vload([0], "int32x16"),
        tirx.reinterpret("int16x32", tirx.Broadcast(word, 16)), b.vload([0, 0], "int16x32")),
        [tirx.Ramp(0, 1, 16)])


INTRINSICS = [Intrinsic("plugin.vpdpwssd", arch="x86_64", requires=[("avx512vnni",)],
                        semantics=semantics, emit=emit, doc="16 x 2 s16*s16 -> s32")]
'''

# runs in a process that sees the plugin package: everything below is unit-tvm's public API
CHECK = '''
import numpy as np
import tvm
from tvm import te

import unit_tvm
from unit_tvm import intrinsics
from unit_tvm.peak import peak

intrin = intrinsics.get("plugin.vpdpwssd")
assert intrin.input_dtypes == ("int16", "int16") and intrin.lanes == 16
a_t = te.placeholder((8, 64), "int16", name="A")
b_t = te.placeholder((48, 64), "int16", name="B")
k = te.reduce_axis((0, 64), name="k")
c_t = te.compute((8, 48), lambda i, j: te.sum(a_t[i, k].astype("int32")
                                              * b_t[j, k].astype("int32"), axis=k), name="C")
assert unit_tvm.inspect(c_t, intrin), unit_tvm.explain(c_t, intrin)
report = unit_tvm.build_report([a_t, b_t, c_t])
assert report.intrinsic == "plugin.vpdpwssd", report
assert "vpdpwssd" in report.module.inspect_source("asm")
rng = np.random.default_rng(0)
a = rng.integers(-32768, 32768, (8, 64)).astype("int16")
b = rng.integers(-32768, 32768, (48, 64)).astype("int16")
c = tvm.runtime.tensor(np.zeros((8, 48), "int32"))
report.module(tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
expected = (a.astype(np.int64) @ b.astype(np.int64).T).astype(np.int32)  # int32 wraps, as te's
np.testing.assert_array_equal(c.numpy(), expected)
print("peak GOPS", peak("plugin.vpdpwssd", 1)["gops"])
'''


def _plugin_package(root):
    """The plugin module and an installed distribution declaring it (what pip would write)."""
    (root / "my_isa.py").write_text(textwrap.dedent(PLUGIN))
    dist = root / "my_isa-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-isa\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[unit_tvm.intrinsics]\nmy_isa = my_isa\n")


def test_instruction_from_another_package_is_listed_inspected_built_and_benchmarked(tmp_path):
    missing = intrinsics.get("x86.vpdpbusd").missing_features(host())  # the same extension
    if missing:
        pytest.skip(f"vpdpwssd needs {', '.join(missing)}, which this CPU lacks")
    _plugin_package(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), UNIT_TVM_QUIET="1")
    proc = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert float(proc.stdout.split("peak GOPS")[1]) > 0
    listing = subprocess.run([sys.executable, "-m", "unit_tvm.cli", "intrinsics"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr[-2000:]
    row = next(line for line in listing.stdout.splitlines() if "plugin.vpdpwssd" in line)
    assert "int16,int16->int32" in row and "yes" in row
    without = subprocess.run([sys.executable, "-m", "unit_tvm.cli", "intrinsics"],
                             capture_output=True, text=True, timeout=120)
    assert "plugin.vpdpwssd" not in without.stdout  # only the installed package adds it
