"""Regressions for the wrong answers and crashes the fuzzer found, on ops written by hand and
with topi, each against TVM's default build of the same op."""

import warnings

import numpy as np
import pytest
import tvm
from tvm import te, topi

import unit_tvm
from unit_tvm import FallbackWarning
from unit_tvm.build import build_report
from unit_tvm.fuzz.check import compare, operand
from unit_tvm.indexing import tile_offsets
from unit_tvm.target import host

from .conftest import require_host


def _check(tensors, intrinsic=None, expect_tensorized=None, seed=0):
    """Build with unit-tvm and with TVM; equal (ints) or within rounding (floats). Returns the
    BuildReport."""
    rng = np.random.default_rng(seed)
    arrays = [operand(t.shape, str(t.dtype), rng) for t in tensors[:-1]]
    out = tensors[-1]
    dev = tvm.cpu()

    def run(mod, arrs):
        args = [tvm.runtime.tensor(a, dev) for a in arrs]
        args.append(tvm.runtime.tensor(np.zeros([int(s) for s in out.shape],
                                                str(out.dtype).replace("bfloat16", "float32")),
                                       dev))
        mod(*args)
        return args[-1].numpy()

    ref = tvm.tirx.build(te.create_prim_func(list(tensors)), target=host())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        report = build_report(list(tensors), intrinsic=intrinsic)
    want = run(ref, arrays)
    magnitude = None if np.issubdtype(want.dtype, np.integer) else run(
        ref, [np.abs(a) for a in arrays])
    assert compare(run(report.module, arrays), want, magnitude) == ""
    if expect_tensorized is not None:
        assert report.tensorized == expect_tensorized, report.reason
    return report


def _products(m, n, k, a_dtype, b_dtype, reducer):
    a = te.placeholder((m, k), a_dtype, name="A")
    b = te.placeholder((n, k), b_dtype, name="B")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((m, n), lambda i, j: reducer(a[i, r].astype("int32") * b[j, r].astype("int32"),
                                                 axis=r), name="C")
    return [a, b, c]


# -- 1. s8 x s8 max/min reductions were computed as sums (the +128 shift rebuilt them) ---------
@pytest.mark.parametrize("reducer", [te.max, te.min], ids=["max", "min"])
@pytest.mark.parametrize("dtypes", [("int8", "int8"), ("uint8", "int8"), ("uint8", "uint8")])
def test_max_and_min_of_products_are_never_computed_as_sums(reducer, dtypes):
    require_host("x86.vpdpbusd")
    tensors = _products(24, 32, 24, *dtypes, reducer)
    report = _check(tensors, expect_tensorized=False)
    assert "combiner" in report.reason


def test_naming_the_instruction_for_a_max_still_falls_back():
    require_host("x86.vpdpbusd")
    with pytest.warns(FallbackWarning, match="sum is not max"):
        unit_tvm.build(_products(8, 32, 8, "int8", "int8", te.max), intrinsic="x86.vpdpbusd")


# -- 2. grouped convs whose groups straddle an instruction tile ---------------------------------
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtypes", [("uint8", "int8"), ("int8", "int8"), ("bfloat16", "bfloat16")])
@pytest.mark.parametrize("k,groups", [(105, 3), (54, 2), (48, 3)])
def test_grouped_convs_are_exact_whatever_the_channels_per_group(layout, dtypes, k, groups):
    c = groups * 8
    acc = "float32" if dtypes[0] == "bfloat16" else "int32"
    if layout == "NCHW":
        data = te.placeholder((1, c, 6, 6), dtypes[0], name="data")
        kern = te.placeholder((k, c // groups, 3, 3), dtypes[1], name="kernel")
        out = topi.nn.group_conv2d_nchw(data, kern, 1, 1, 1, groups, out_dtype=acc)
    else:
        data = te.placeholder((1, 6, 6, c), dtypes[0], name="data")
        kern = te.placeholder((3, 3, c // groups, k), dtypes[1], name="kernel")
        out = topi.nn.group_conv2d_nhwc(data, kern, 1, 1, 1, groups, out_dtype=acc)
    _check([data, kern, out])


def test_a_hand_written_grouped_conv_with_27_channels_per_group_is_exact():
    data = te.placeholder((1, 24, 5, 5), "uint8", name="data")
    kern = te.placeholder((81, 8, 1, 1), "int8", name="kernel")
    rc = te.reduce_axis((0, 8), name="rc")
    out = te.compute((1, 81, 5, 5), lambda n, f, y, x: te.sum(
        data[n, f // 27 * 8 + rc, y, x].astype("int32") * kern[f, rc, 0, 0].astype("int32"),
        axis=rc), name="gconv")
    _check([data, kern, out])


def test_lane_constancy_is_decided_on_every_tile_not_samples():
    f, rc = te.var("f"), te.var("rc")
    index = [f // 35 * 8 + rc]
    moved = tile_offsets(index, [24], "f", 16, {"f": 105, "rc": 8})
    # tiles 0 and 1 stay in group 0 (f < 35 ... 31), tile 2 (f = 32..47) crosses into group 1
    assert not moved.offsets[0].any() and not moved.offsets[1].any()
    assert moved.offsets[2].any()


# -- 3. bf16 convs whose operand goes through a padding stage failed to build ------------------
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_bf16_conv_read_through_a_padding_stage_builds_and_is_close(layout):
    require_host("x86.vdpbf16ps")
    if layout == "NCHW":
        data = te.placeholder((1, 5, 2, 11), "bfloat16", name="data")
        kern = te.placeholder((3, 5, 1, 3), "bfloat16", name="kernel")
        out = topi.nn.conv2d_nchw(data, kern, 2, 1, 1, out_dtype="float32")
    else:
        data = te.placeholder((1, 3, 5, 11), "bfloat16", name="data")
        kern = te.placeholder((3, 1, 11, 3), "bfloat16", name="kernel")
        out = topi.nn.conv2d_nhwc(data, kern, 1, 2, 1, out_dtype="float32")
    report = _check([data, kern, out])
    assert report.intrinsic == "x86.vdpbf16ps"


def test_bf16_dense_after_an_explicit_pad_builds():
    require_host("x86.vdpbf16ps")
    a = te.placeholder((5, 30), "bfloat16", name="A")
    b = te.placeholder((32, 32), "bfloat16", name="B")
    padded = topi.nn.pad(a, (0, 0), (0, 2), name="A_pad")
    k = te.reduce_axis((0, 32), name="k")
    c = te.compute((5, 32), lambda i, j: te.sum(
        padded[i, k].astype("float32") * b[j, k].astype("float32"), axis=k), name="C")
    _check([a, b, c], expect_tensorized=True)


# -- operand orders and names users write ------------------------------------------------------
def test_an_operand_order_other_than_the_instructions_still_tensorizes():
    require_host("x86.vpdpbusd")
    a = te.placeholder((16, 32), "uint8", name="A")
    b = te.placeholder((32, 32), "int8", name="B")
    k = te.reduce_axis((0, 32), name="k")
    c = te.compute((16, 32), lambda i, j: te.sum(b[j, k].astype("int32") * a[i, k].astype("int32"),
                                                 axis=k), name="C")
    _check([a, b, c], expect_tensorized=True)


def test_two_placeholders_with_the_default_name_build_correctly():
    a = te.placeholder((16, 32), "uint8")
    b = te.placeholder((32, 32), "int8")
    assert a.op.name == b.op.name
    k = te.reduce_axis((0, 32))
    c = te.compute((16, 32), lambda i, j: te.sum(a[i, k].astype("int32") * b[j, k].astype("int32"),
                                                 axis=k))
    _check([a, b, c])

