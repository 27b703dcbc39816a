"""Op level: elementwise stages after a reduction go into the kernel's write-back, and 8-bit
operand pairs other than u8 x s8 are re-based with an exact correction."""

import numpy as np
import pytest
from tvm import te, topi

from unit_tvm import epilogue
from unit_tvm.build import build_report
from unit_tvm.shift import shift_plans
from unit_tvm import intrinsics

from .conftest import require_host
from .test_wrong_answers import _check


def _layer(a_dtype="uint8", b_dtype="int8", tail="requant"):
    """conv -> + bias -> relu -> requantize, as four te.computes (a layer written at op level)."""
    data = te.placeholder((1, 16, 8, 8), a_dtype, name="data")
    kern = te.placeholder((32, 16, 3, 3), b_dtype, name="kernel")
    bias = te.placeholder((32,), "int32", name="bias")
    conv = topi.nn.conv2d_nchw(data, kern, 1, 1, 1, out_dtype="int32")
    added = te.compute(conv.shape, lambda n, c, y, x: conv[n, c, y, x] + bias[c], name="bias_add")
    relu = te.compute(conv.shape, lambda *i: te.max(added(*i), 0), name="relu")
    if tail == "relu":
        return [data, kern, bias, relu]
    out = te.compute(conv.shape, lambda *i: te.min((relu(*i) * 181 + 8192) >> 14, 127)
                     .astype("int8"), name="requantize")
    return [data, kern, bias, out]


def test_a_conv_with_bias_relu_and_requantization_is_tensorized_whole():
    require_host("x86.vpdpbusd")
    report = _check(_layer(), expect_tensorized=True)
    assert report.intrinsic.startswith("x86.")


def test_the_epilogue_finder_sees_one_reduction_under_elementwise_stages():
    tensors = _layer()
    found = epilogue.find(tensors[-1])
    assert found is not None and found.core.op.name == "conv2d_nchw"
    assert found.stages == ("bias_add", "relu", "requantize")
    assert epilogue.find(found.core) is None  # a reduction is its own core


def test_two_reductions_under_one_output_are_not_an_epilogue():
    a = te.placeholder((8, 8), "uint8", name="A")
    b = te.placeholder((8, 8), "int8", name="B")
    k1, k2 = te.reduce_axis((0, 8), name="k1"), te.reduce_axis((0, 8), name="k2")
    c1 = te.compute((8, 8), lambda i, j: te.sum(a[i, k1].astype("int32") * b[j, k1].astype("int32"),
                                                axis=k1), name="c1")
    c2 = te.compute((8, 8), lambda i, j: te.sum(a[i, k2].astype("int32") * b[k2, j].astype("int32"),
                                                axis=k2), name="c2")
    out = te.compute((8, 8), lambda i, j: c1[i, j] + c2[i, j], name="out")
    assert epilogue.find(out) is None
    _check([a, b, out], expect_tensorized=False)


@pytest.mark.parametrize("dtypes", [("uint8", "uint8"), ("int8", "uint8"), ("int8", "int8")])
def test_8bit_pairs_are_re_based_exactly(dtypes):
    require_host("x86.vpdpbusd")
    a = te.placeholder((20, 72), dtypes[0], name="A")
    b = te.placeholder((48, 72), dtypes[1], name="B")
    out = topi.nn.dense(a, b, out_dtype="int32")
    report = _check([a, b, out], expect_tensorized=True)
    assert any(s.startswith("compensation") for s in report.stages)


def test_both_operands_re_based_correct_each_other_and_the_constant():
    plans = shift_plans(topi.nn.dense(te.placeholder((4, 8), "int8", name="A"),
                                      te.placeholder((16, 8), "uint8", name="B"),
                                      out_dtype="int32"), intrinsics.get("x86.vpdpbusd"))
    both = [p for p in plans if len(p.shifted) == 2]
    assert both and both[0].constant == 128 * -128 * 8
    assert len(both[0].corrections) == 2


@pytest.mark.parametrize("dtypes", [("uint8", "uint8"), ("int8", "uint8")])
def test_re_based_convs_with_padding_and_epilogue_are_exact(dtypes):
    require_host("x86.vpdpbusd")
    _check(_layer(*dtypes, tail="relu"), expect_tensorized=True, seed=3)


def test_extreme_operands_do_not_overflow_the_correction():
    require_host("x86.vpdpbusd")
    a = te.placeholder((16, 512), "uint8", name="A")
    b = te.placeholder((32, 512), "uint8", name="B")
    out = topi.nn.dense(a, b, out_dtype="int32")
    report = build_report([a, b, out])
    import tvm

    dev = tvm.cpu()
    ones = [np.full((16, 512), 255, np.uint8), np.full((32, 512), 255, np.uint8)]
    args = [tvm.runtime.tensor(x, dev) for x in ones] + [
        tvm.runtime.tensor(np.zeros((16, 32), np.int32), dev)]
    report.module(*args)
    assert (args[-1].numpy() == 255 * 255 * 512).all()
