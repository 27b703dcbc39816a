"""Values known only at run time (a slice whose bounds are graph inputs, as a decoder reading its
cache up to the current position): the graph passes leave them to TVM instead of failing."""

import numpy as np
import pytest
import tvm
from tvm import relax

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import unit_tvm  # noqa: E402
from unit_tvm import frontends  # noqa: E402


def _slice_model(path):
    """y = Slice(relu(x @ W), starts, ends) on axis 1, starts / ends graph inputs."""
    w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Slice", ["r", "starts", "ends", "axes"], ["y"])]
    graph = helper.make_graph(
        nodes, "run_time_slice",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 16]),
         helper.make_tensor_value_info("starts", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("ends", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array([1], np.int64), "axes")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return w


@pytest.mark.parametrize("quantize", [False, True], ids=["float32", "int8"])
def test_a_slice_bounded_by_inputs_compiles_and_is_right(tmp_path, quantize):
    w = _slice_model(tmp_path / "m.onnx")
    mod = frontends.from_onnx(str(tmp_path / "m.onnx"))
    rng = np.random.default_rng(1)
    samples = [[rng.standard_normal((1, 32, 16)).astype(np.float32), np.array([s], np.int64),
                np.array([s + 8], np.int64)] for s in (0, 3)]
    ex = unit_tvm.compile(mod, quantize={"calibration_data": samples} if quantize else None)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for x, start, end in samples:
        got = vm["main"](*[tvm.runtime.tensor(a) for a in (x, start, end)]).numpy()
        want = np.maximum(x @ w, 0)[:, int(start[0]):int(end[0])]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=(0.05 if quantize else 1e-4)
                                   * np.abs(want).max())
