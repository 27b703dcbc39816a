"""Every public entry point checks its arguments and says what it expected, before TVM's C++."""

import pytest
from tvm import te

import unit_tvm
from unit_tvm import ops
from unit_tvm.prepare import prepare


@pytest.fixture
def dense():
    return ops.dense(16, 32, 64)


def test_build_wants_a_list_of_tensors(dense):
    with pytest.raises(TypeError, match=r"list of te tensors \[inputs..., output\]"):
        unit_tvm.build(dense)
    with pytest.raises(TypeError, match="te tensors"):
        unit_tvm.build([dense.op.input_tensors[0], "B", dense])


def test_build_names_the_bad_keyword(dense):
    tensors = [*dense.op.input_tensors, dense]
    with pytest.raises(TypeError, match="intrinsic must be an instruction name"):
        unit_tvm.build(tensors, intrinsic=42)
    with pytest.raises(TypeError, match="tune must be True or False"):
        unit_tvm.build(tensors, tune="yes")
    with pytest.raises(TypeError, match="trials must be a positive int"):
        unit_tvm.build(tensors, trials=0)
    with pytest.raises(TypeError, match="database must be a path"):
        unit_tvm.build(tensors, database=3.5)
    with pytest.raises(TypeError, match="target must be None, a dict"):
        unit_tvm.build(tensors, target="llvm -mcpu=znver4")


def test_build_of_a_placeholder_output_is_refused():
    a = te.placeholder((4,), "uint8", name="A")
    with pytest.raises(TypeError, match="made by te.compute"):
        unit_tvm.build([a])


def test_inspect_and_explain_check_their_arguments(dense):
    with pytest.raises(TypeError, match="te.Tensor made by te.compute"):
        unit_tvm.inspect("dense", "x86.vpdpbusd")
    with pytest.raises(TypeError, match="intrinsic must be an instruction name"):
        unit_tvm.explain(dense, 42)
    with pytest.raises(KeyError, match="known:"):
        unit_tvm.inspect(dense, "x86.nope")


def test_rewrite_checks_mapping_and_config(dense):
    with pytest.raises(TypeError, match="mapping must be a unit_tvm.Mapping"):
        unit_tvm.rewrite(dense, "x86.vpdpbusd", mapping="i:j")
    with pytest.raises(TypeError, match="config must be"):
        unit_tvm.rewrite(dense, "x86.vpdpbusd", config={"parallel": 1})


def test_tune_wants_a_prepared_op(dense):
    with pytest.raises(TypeError, match="Prepared op"):
        unit_tvm.tune(dense, "x86.vpdpbusd")
    with pytest.raises(TypeError, match="intrinsic must be"):
        unit_tvm.tune(prepare(dense, "x86.vpdpbusd"), 3)


def test_compile_wants_an_ir_module():
    with pytest.raises(TypeError, match="tvm.IRModule"):
        unit_tvm.compile("resnet18.onnx")
    import tvm

    with pytest.raises(TypeError, match="quantize must be None or a dict"):
        unit_tvm.compile(tvm.IRModule(), quantize=True)


def test_compile_names_the_kernel_tvm_cannot_build():
    """A kernel LLVM rejects (exp of an integer) fails with an error naming it, not only TVM's
    bare check that names neither the kernel nor the operator."""
    from tvm import relax, te, tirx

    from unit_tvm.compiler import KernelBuildError

    x = te.placeholder((8,), "int32", name="x")
    y = te.compute((8,), lambda i: tirx.exp(x[i]), name="y")
    bad = te.create_prim_func([x, y]).with_attr("global_symbol", "int_exp")
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType((8,), "int32"))
    with bb.function("main", [xv]):
        gv = bb.add_func(bad, "int_exp")
        bb.emit_func_output(bb.emit(relax.call_tir(gv, [xv], relax.TensorType((8,), "int32"))))
    with pytest.raises(KernelBuildError, match="'int_exp'.*llvm.exp"):
        unit_tvm.compile(bb.get())
