"""Operand prologues (relax/gpu/operands.py): the layout ops and casts before a Tensor Core
kernel's operand, read as one te stage through a strided view of their source, give the
operand's values (run on this CPU against numpy), and are taken only where the kernel's loads
stay whole vectors."""

import numpy as np
import pytest
import tvm
from tvm import relax

from unit_tvm.relax.gpu import operands as gpu_operands
from unit_tvm.target import host


def _chain(source_shape, source_dtype, steps):
    """(source var, operand var, {var: value}) of a chain of relax ops built on a parameter."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(source_shape, source_dtype))
    values = {}
    with bb.function("main", [x]):
        with bb.dataflow():
            cur = x
            for step in steps:
                call = step(cur)
                nxt = bb.emit(call)
                values[nxt] = bb.normalize(call)
                cur = nxt
            out = bb.emit_output(cur)
        bb.emit_func_output(out)
    return x, cur, values


def _numpy(source, steps_np):
    for step in steps_np:
        source = step(source)
    return source


CASES = {
    # Q out of a fused Q/K/V projection: heads split, then the first third sliced
    "q_of_qkv": ((32, 192), "float16", [
        lambda v: relax.op.reshape(v, (1, 32, 3, 2, 32)),
        lambda v: relax.op.permute_dims(v, [2, 0, 3, 1, 4]),
        lambda v: relax.op.strided_slice(v, [0], [0], [1]),
        lambda v: relax.op.squeeze(v, [0]),
        lambda v: relax.op.squeeze(v, [0])], [
        lambda a: a.reshape(1, 32, 3, 2, 32), lambda a: a.transpose(2, 0, 3, 1, 4),
        lambda a: a[0:1], lambda a: a[0], lambda a: a[0]], (2, 32, 32), True),
    # heads put back side by side after attention, read from float32 (rounded once)
    "heads_back_from_f32": ((2, 16, 32), "float32", [
        lambda v: relax.op.astype(v, "float16"),
        lambda v: relax.op.permute_dims(v, [1, 0, 2]),
        lambda v: relax.op.reshape(v, (16, 64))], [
        lambda a: a.astype(np.float16), lambda a: a.transpose(1, 0, 2),
        lambda a: a.reshape(16, 64)], (16, 64), True),
    # a slice from the end, every other row, and a broadcast of a size-1 axis
    "negative_step_broadcast": ((4, 1, 48), "float16", [
        lambda v: relax.op.strided_slice(v, [0], [-3], [4], [2]),
        lambda v: relax.op.broadcast_to(v, (2, 8, 48))], [
        lambda a: a[1:4:2], lambda a: np.broadcast_to(a, (2, 8, 48))], (16, 48), True),
    # K^T: the operand's rows are columns of the source, no whole vector to copy
    "transposed": ((16, 64), "float16", [
        lambda v: relax.op.permute_dims(v, [1, 0])], [lambda a: a.T], (64, 16), False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_operand_prologue_replays_the_ops(case):
    shape, dtype, steps, steps_np, operand_shape, whole = CASES[case]
    x, last, values = _chain(shape, dtype, steps)
    found = gpu_operands.find(last, values.get, list(operand_shape), "float16")
    if not whole:
        assert found is None or found.source is not x
        # the index maps still hold where the loads are not whole vectors
        view = gpu_operands._view(shape, list(values.values()), operand_shape)
        found = gpu_operands.Prologue(x, int(np.prod(shape)), dtype, view, "float16")
    assert found is not None and found.source.same_as(x)
    src, op = gpu_operands.te_operand(found, operand_shape, "float16", "A")
    lib = tvm.tirx.build(tvm.te.create_prim_func([src, op]), target=host())
    data = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    out = tvm.runtime.tensor(np.zeros(operand_shape, "float16"), tvm.cpu())
    lib(tvm.runtime.tensor(data.reshape(-1), tvm.cpu()), out)  # the kernel reads it flat
    want = _numpy(data, steps_np).astype(np.float16).reshape(operand_shape)
    np.testing.assert_array_equal(out.numpy(), want)


def test_reshapes_alone_are_no_prologue():
    x, last, values = _chain((8, 64), "float16", [lambda v: relax.op.reshape(v, (1, 8, 64)),
                                                  lambda v: relax.op.reshape(v, (8, 64))])
    assert gpu_operands.find(last, values.get, [8, 64], "float16") is None
