"""The GPU path's chain matcher (relax/gpu/epilogue.py) on small hand-built graphs: which ops
after a matmul its kernel takes, in which order, and where it stops."""

import numpy as np
import pytest
from tvm import relax

from unit_tvm.relax.gpu import epilogue as gpu_epilogue


def _chain_after(steps, dtype="float16", shape=(1, 8, 16)):
    """(Chain or None, the bindings' vars) for a batched matmul followed by `steps` (each a
    function of the previous value and the matmul's result's shape)."""
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType(shape, dtype))
    b = relax.Var("b", relax.TensorType((shape[0], shape[2], shape[2]), dtype))
    other = relax.Var("other", relax.TensorType(shape, "float32"))
    with bb.function("main", [a, b, other]):
        with bb.dataflow():
            mm = bb.emit(relax.op.matmul(a, b))
            cur, names = mm, []
            for step in steps:
                cur = bb.emit(step(cur, other))
                names.append(cur)
            out = bb.emit_output(cur)
        bb.emit_func_output(out)
    func = bb.get()["main"]
    start = func.body.blocks[0].bindings[0].value
    return gpu_epilogue.find_chains(func, [start]).get(start), names


def _const(value, dtype="float16"):
    return relax.const(np.array(value, dtype))


def test_scale_then_cast_ends_the_scores_chain():
    chain, names = _chain_after([lambda v, o: relax.op.reshape(v, (1, 1, 8, 16)),
                                 lambda v, o: relax.op.divide(v, _const(8.0)),
                                 lambda v, o: relax.op.astype(v, "float32")])
    assert chain.bias is None and chain.scale == ("relax.divide", 8.0)
    assert chain.cast == "float32" and chain.shape == (1, 1, 8, 16)
    assert gpu_epilogue.out_dtype(chain, "float16") == "float32"


@pytest.mark.parametrize("left", [False, True])
def test_a_scalar_multiply_scales_from_either_side(left):
    def scaled(v, o):
        return relax.op.multiply(_const(0.125), v) if left else relax.op.multiply(v, _const(0.125))
    chain, _ = _chain_after([scaled])
    assert chain.scale == ("relax.multiply", 0.125)


def test_a_constant_divided_by_the_result_is_no_scale():
    chain, _ = _chain_after([lambda v, o: relax.op.divide(_const(1.0), v)])
    assert chain is None


def test_bias_cast_residual_and_a_last_cast():
    """bias, cast to float32, a float32 residual, ReLU: the kernel writes float32; with the
    cast after the ReLU instead it is the chain's last cast."""
    bias = _const(np.arange(16) / 16)
    chain, _ = _chain_after([lambda v, o: relax.op.add(v, bias),
                             lambda v, o: relax.op.astype(v, "float32"),
                             lambda v, o: relax.op.add(o, v),
                             lambda v, o: relax.op.nn.relu(v)])
    assert chain.bias is not None and chain.cast == "float32" and chain.residual is not None
    assert chain.bounds == (0.0, None) and chain.cast_last is None
    chain, _ = _chain_after([lambda v, o: relax.op.add(v, bias),
                             lambda v, o: relax.op.nn.relu(v),
                             lambda v, o: relax.op.astype(v, "float32")])
    assert chain.cast is None and chain.cast_last == "float32"
    assert gpu_epilogue.out_dtype(chain, "float16") == "float32"


def test_a_reshape_that_moves_the_channels_ends_the_chain():
    bias = _const(np.ones(16))
    chain, names = _chain_after([lambda v, o: relax.op.add(v, bias),
                                 lambda v, o: relax.op.reshape(v, (1, 16, 8)),
                                 lambda v, o: relax.op.nn.relu(v)])
    assert chain.bounds is None and chain.shape == (1, 8, 16)  # the bias add alone
