"""ARM kernels made by the same Inspector/Rewriter, cross-compiled and executed under qemu."""

import numpy as np
import pytest

import unit_tvm
from unit_tvm import ops
from unit_tvm.testing import reference
from unit_tvm.cross import aarch64

pytestmark = pytest.mark.skipif(
    bool(aarch64.missing_tools()),
    reason=f"cannot run aarch64 code: missing {aarch64.missing_tools()}")

CASES = [("arm.sdot", "sdot", "int8", "int8", "int32"),
         ("arm.udot", "udot", "uint8", "uint8", "uint32"),
         ("arm.smmla", "smmla", "int8", "int8", "int32")]


def _range(dtype):
    return (-128, 127) if dtype == "int8" else (0, 255)


@pytest.mark.parametrize("name,mnemonic,a_dt,b_dt,acc", CASES, ids=[c[0] for c in CASES])
def test_dense_runs_under_qemu(name, mnemonic, a_dt, b_dt, acc, rng):
    op = ops.dense(24, 40, 36, a_dt, b_dt, acc)  # odd sizes: packing and padding on ARM too
    mod = unit_tvm.build([*op.op.input_tensors, op], aarch64.target(), intrinsic=name)
    a = rng.integers(*_range(a_dt), (24, 36), endpoint=True).astype(a_dt)
    b = rng.integers(*_range(b_dt), (40, 36), endpoint=True).astype(b_dt)
    a[0, :], b[0, :] = _range(a_dt)[0], _range(b_dt)[0]
    got = aarch64.run(mod, [a, b, np.zeros((24, 40), acc)])
    expected = a.astype(np.int64) @ b.astype(np.int64).T
    if acc == "uint32":
        expected %= 1 << 32
    np.testing.assert_array_equal(got.astype(np.int64), expected)
    # the instruction is what runs: count it in the generated code rather than timing qemu
    assert aarch64.instruction_count(mod, mnemonic) >= 4


@pytest.mark.parametrize("name", ["arm.sdot", "arm.smmla"])
def test_conv2d_runs_under_qemu(name, rng):
    op = ops.conv2d_nchw(8, 9, 16, 3, a="int8")
    mod = unit_tvm.build([*op.op.input_tensors, op], aarch64.target(), intrinsic=name)
    d = rng.integers(-128, 128, (1, 8, 9, 9)).astype("int8")
    w = rng.integers(-128, 128, (16, 8, 3, 3)).astype("int8")
    got = aarch64.run(mod, [d, w, np.zeros((1, 16, 7, 7), "int32")])
    np.testing.assert_array_equal(got.astype(np.int64), reference.conv2d_nchw(d, w))
    assert aarch64.instruction_count(mod, name.split(".")[1]) >= 1


def test_harness_reports_kernel_errors(rng):
    """A shape the kernel was not built for is refused by the kernel's own checks, not run."""
    op = ops.dense(8, 16, 16, "int8", "int8")
    mod = unit_tvm.build([*op.op.input_tensors, op], aarch64.target(), intrinsic="arm.sdot")
    with pytest.raises(RuntimeError, match="kernel"):
        aarch64.run(mod, [np.zeros((8, 8), "int8"), np.zeros((16, 16), "int8"),
                          np.zeros((8, 16), "int32")])
