"""ONNX files in the QOperator format (QLinearConv, QGemm, com.microsoft QLinearAdd...) read as
their QDQ form (unit_tvm/onnx_qoperator.py): TVM's importer refuses the ops themselves; the
QDQ form runs int8 with the file's scales like any QDQ file."""

import numpy as np
import onnx
import pytest
from onnx import helper

import unit_tvm
from unit_tvm import frontends
from unit_tvm.onnx_qoperator import is_qoperator, qoperator_as_qdq
from unit_tvm.relax import quantize, recipes
from unit_tvm.testing import zoo

from .conftest import require_host
from .test_qdq import _onnx_runtime, _qdq_file, _run


def _distance(got, want):
    return np.mean([np.linalg.norm(g - w) / np.linalg.norm(w) for g, w in zip(got, want)])


def test_a_qoperator_file_runs_int8_as_close_to_float_as_onnx_runtime(tmp_path):
    """ONNX Runtime's QOperator file of a stem, max-pool, basic block and dense head: every
    QLinear op becomes DequantizeLinear -> op -> QuantizeLinear (the max-pool wrapped the same
    way, so the pairs stay adjacent), all four compute ops run tensorized without calibration,
    and the result is as close to the float32 model as ONNX Runtime running the file."""
    require_host("x86.vpdpbusd")
    fp32, path, _ = _qdq_file(tmp_path, qoperator=True)
    model = onnx.load(path)
    assert is_qoperator(model)
    ops = {n.op_type for n in model.graph.node}
    assert {"QLinearConv", "QLinearAdd", "QGemm", "MaxPool"} <= ops, ops
    converted = qoperator_as_qdq(model)
    kinds = [n.op_type for n in converted.graph.node]
    assert not is_qoperator(converted) and "MaxPool" in kinds
    pool = kinds.index("MaxPool")
    assert kinds[pool - 1] == "DequantizeLinear" and kinds[pool + 1] == "QuantizeLinear"
    # one DequantizeLinear per quantized value, shared by its readers (the block input feeds
    # a conv and the residual add): one pair, whose ReLU the conv before it takes once
    read = [n.input[0] for n in converted.graph.node if n.op_type == "DequantizeLinear"]
    assert len(read) == len(set(read)), read
    xs = zoo.inputs((1, 3, 16, 16), 4, seed=2)
    report = []
    got = _run(unit_tvm.compile(frontends.from_onnx(model), report=report), xs)
    assert [bool(instr) for _, instr, _ in report] == [True] * 4, report
    qmod = quantize(frontends.from_onnx(model), calibration_data=())
    assert [r["relu"] for _, r in recipes(qmod)] == [True, True, True, False]
    reference = _onnx_runtime(fp32, xs)
    file_distance = _distance(_onnx_runtime(path, xs), reference)
    assert _distance(got, reference) <= 1.25 * file_distance + 1e-4, file_distance


def test_ops_without_a_qdq_form_stay_as_they_are():
    """A QLinearSoftmax with the opset 11 semantics over a non-last axis (a 2-D coercion) and
    an op the table does not know are kept, for TVM's importer to name; a model without
    QOperator ops comes back unchanged."""
    f32 = onnx.TensorProto.FLOAT
    inits = [helper.make_tensor("s", f32, [], [0.1]),
             helper.make_tensor("z", onnx.TensorProto.UINT8, [], [128])]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("QLinearSoftmax", ["q", "s", "z", "s", "z"], ["y"],
                              domain="com.microsoft", axis=1, opset=11),
             helper.make_node("QLinearReduceMean", ["y", "s", "z", "s", "z"], ["m"],
                              domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["m", "s", "z"], ["out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f32, [2, 3, 4])],
                              [helper.make_tensor_value_info("out", f32, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    assert is_qoperator(model)
    kept = [n.op_type for n in qoperator_as_qdq(model).graph.node]
    assert kept == ["QuantizeLinear", "QLinearSoftmax", "QLinearReduceMean", "DequantizeLinear"]
    plain = helper.make_model(helper.make_graph(nodes[:1], "g", graph.input, graph.output, inits))
    assert qoperator_as_qdq(plain) is plain


def _qlinear_matmul(rng, scale_dtype, *, weights="s8", b_const=True, quantize_input=False):
    """A QLinearMatMul (opset 21) of random integers, and its input: a uint8 tensor, or a float
    one quantized by a QuantizeLinear in the file (so that its DequantizeLinear is a pair)."""
    m_, k, n = 6, 96, 20
    if weights == "s8":
        b, bz = rng.integers(-127, 128, (k, n)).astype(np.int8), np.array(0, np.int8)
    else:  # uint8 weights with a zero point: 9-bit integers once centred
        b, bz = rng.integers(0, 256, (k, n)).astype(np.uint8), np.array(37, np.uint8)
    a_scale = np.array(rng.uniform(0.005, 0.02), scale_dtype)
    values = {"as": a_scale, "az": np.array(113, np.uint8),
              "bs": rng.uniform(0.002, 0.02, n).astype(scale_dtype),
              "bz": bz, "ys": np.array(rng.uniform(0.05, 0.2), scale_dtype),
              "yz": np.array(118, np.uint8)}
    ints = rng.integers(0, 256, (m_, k))
    nodes = [helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                              ["y"])]
    feeds = {}
    if quantize_input:
        nodes.insert(0, helper.make_node("QuantizeLinear", ["x", "as", "az"], ["a"]))
        feeds["x"] = ((ints - 113) * a_scale.astype(np.float64)).astype(scale_dtype)
    else:
        feeds["a"] = ints.astype(np.uint8)
    if b_const:
        values["b"] = b
    else:
        feeds["b"] = b
    inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype),
                                            v.shape) for name, v in feeds.items()]
    out = helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, [m_, n])
    inits = [onnx.numpy_helper.from_array(v, name) for name, v in values.items()]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, [out], inits),
                              opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model, feeds


def _run_feeds(model, feeds, report=None):
    import tvm
    from tvm import relax

    ex = unit_tvm.compile(frontends.from_onnx(model), report=report)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](
        *[tvm.runtime.tensor(v, tvm.cpu()) for v in feeds.values()])
    return out.numpy()


def _specified(model, feeds):
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, feeds)[0]


@pytest.mark.parametrize("case", ["float16", "float16-runtime-b", "float16-quantized-input",
                                  "u8-weights", "u8-weights-quantized-input", "float32"])
def test_qlinear_matmul_gives_the_specified_integers(case, rng):
    """QLinearMatMul is rint(C * a_scale * b_scale / y_scale + y_zp) with the multiplier
    computed in the scales' type: float16 scales (opset 21) gave 254 where 255 is specified
    (the multiplier's float16 rounding was lost; with constant weights, a TypeError in TVM's
    importer), and uint8 weights with a zero point were rounded again onto an int8 grid
    (one step off in 3% of outputs). Every output now equals ONNX's reference."""
    dtype = np.float32 if case == "float32" else np.float16
    model, feeds = _qlinear_matmul(rng, dtype, weights="u8" if "u8" in case else "s8",
                                   b_const="runtime" not in case,
                                   quantize_input="quantized-input" in case)
    np.testing.assert_array_equal(_run_feeds(model, feeds), _specified(model, feeds))


def test_a_paired_qlinear_matmul_with_int8_weights_still_runs_int8(rng):
    """The exact form is taken only where needed: an input quantized in the file with the
    op's scale and symmetric int8 weights run tensorized, and still give the specified
    integers."""
    require_host("x86.vpdpbusd")
    model, feeds = _qlinear_matmul(rng, np.float32, quantize_input=True)
    report = []
    got = _run_feeds(model, feeds, report)
    assert [bool(instr) for _, instr, _ in report] == [True], report
    np.testing.assert_array_equal(got, _specified(model, feeds))


@pytest.mark.parametrize("op", ["QLinearMatMul", "QLinearConv"])
def test_onnx_specification_cases(op):
    """ONNX's own test cases of the op (uint8 / int8, float32 / float16 scales, 2-D / 3-D),
    with scales, zero points and weights constant as in a file, equal their expected
    outputs exactly."""
    from onnx.backend.test.case.node import collect_testcases

    cases = [c for c in collect_testcases() if c.model.graph.node[0].op_type == op]
    assert cases, op
    for case in cases:
        (ins, outs), graph = case.data_sets[0], case.model.graph
        inits = [onnx.numpy_helper.from_array(v, i.name)
                 for v, i in zip(ins[1:], graph.input[1:])]
        model = helper.make_model(helper.make_graph(graph.node, "g", graph.input[:1],
                                                    graph.output, inits),
                                  opset_imports=case.model.opset_import)
        model.ir_version = case.model.ir_version
        got = _run_feeds(model, {graph.input[0].name: ins[0]})
        np.testing.assert_array_equal(got, outs[0], err_msg=case.name)


def test_float16_scales_where_the_schema_takes_float32_are_refused():
    """QLinearConv's schema takes float32 scales only: a float16 scale is named in a clear
    error instead of a dtype clash inside TVM's importer."""
    f16, u8 = onnx.TensorProto.FLOAT16, onnx.TensorProto.UINT8
    inits = [helper.make_tensor("s", f16, [], [0.1]), helper.make_tensor("z", u8, [], [128]),
             helper.make_tensor("w", u8, [2, 3, 1, 1], [128] * 6)]
    node = helper.make_node("QLinearConv", ["x", "s", "z", "w", "s", "z", "s", "z"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", u8, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", u8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(ValueError, match="QLinearConv .*scale s is not float32"):
        qoperator_as_qdq(model)
