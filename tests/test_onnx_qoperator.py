"""ONNX files in the QOperator format (QLinearConv, QGemm, com.microsoft QLinearAdd...) read as
their QDQ form (unit_tvm/onnx_qoperator.py): TVM's importer refuses the ops themselves; the
QDQ form runs int8 with the file's scales like any QDQ file."""

import numpy as np
import onnx
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
