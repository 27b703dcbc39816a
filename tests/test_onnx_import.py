"""ONNX files as exported that TVM's importer refuses (shapes computed at run time) or imports
into ops no fast path sees (einsum attention)."""

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper
from tvm import relax

import unit_tvm
from unit_tvm import frontends
from unit_tvm.relax.frontend.fixes import frontend_fixes, matmul_einsum

from .conftest import require_host


def _const(name, value, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _shape_computing_conv(kind):
    """x [1, 4, 6, 12], its W changed by an amount computed from Shape at run time, then a 3x3
    conv and a relu. "pad": padded up to a multiple of 7 (Swin's window partition; TVM's
    importer refuses it); "slice": its first third kept (torch.chunk in MaxViT; TVM imports it
    with shapes unknown)."""
    rng = np.random.default_rng(0)
    nodes = [h.make_node("Shape", ["x"], ["shape"])]
    if kind == "pad":
        nodes += [h.make_node("Gather", ["shape", "three"], ["w"], axis=0),
                  h.make_node("Mod", ["w", "seven"], ["w_mod"]),
                  h.make_node("Sub", ["seven", "w_mod"], ["short"]),
                  h.make_node("Mod", ["short", "seven"], ["pad"]),
                  h.make_node("Concat", ["zeros7", "pad"], ["pads"], axis=0),
                  h.make_node("Pad", ["x", "pads"], ["changed"])]
    else:  # the first of three chunks along W, as torch.chunk exports it
        nodes += [h.make_node("Gather", ["shape", "three1"], ["w"], axis=0),
                  h.make_node("Add", ["w", "two1"], ["w2"]),
                  h.make_node("Div", ["w2", "three1"], ["chunk"]),
                  h.make_node("Slice", ["x", "zero", "chunk", "three1"], ["changed"])]
    nodes += [h.make_node("Conv", ["changed", "weight", "bias"], ["conv"], kernel_shape=[3, 3]),
              h.make_node("Relu", ["conv"], ["y"])]
    inits = [_const("three", 3), _const("three1", [3]), _const("seven", [7]),
             _const("zeros7", [0] * 7), _const("zero", [0]), _const("two1", [2]),
             _const("weight", rng.standard_normal((8, 4, 3, 3)), np.float32),
             _const("bias", rng.standard_normal(8), np.float32)]
    out_w = 12 if kind == "pad" else 2  # 14 or 4 columns, then a 3-wide window
    graph = h.make_graph(nodes, f"{kind}_conv",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 12])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, out_w])],
                         [i for i in inits if any(i.name in n.input for n in nodes)])
    # IR version 9 as exporters write it (onnx 1.23's default is newer than ONNX Runtime reads)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("kind", ["pad", "slice"])
def test_shapes_computed_at_run_time_import_after_folding(kind):
    ort = pytest.importorskip("onnxruntime")
    require_host("x86.vpdpbusd")
    model = _shape_computing_conv(kind)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, 4, 6, 12)).astype(np.float32) for _ in range(4)]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    refs = [session.run(None, {"x": x})[0] for x in xs]
    mod = frontends.from_onnx(model)
    assert frontends._unknown_shapes(mod) == 0
    for quantize in (None, {"calibration_data": xs}):
        report = []
        vm = relax.VirtualMachine(unit_tvm.compile(mod, quantize=quantize, report=report),
                                  tvm.cpu())
        if quantize:  # the conv behind the folded pad runs on the instruction
            assert any(instr for _, instr, _ in report), report
        for x, ref in zip(xs, refs):
            got = vm["main"](tvm.runtime.tensor(x)).numpy()
            assert got.shape == ref.shape
            if quantize is None:
                np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
            else:
                cos = float((got * ref).sum() / np.linalg.norm(got) / np.linalg.norm(ref))
                assert cos > 0.99


def test_without_folding_the_first_import_stands(monkeypatch):
    """Where the folded model cannot be had (no onnxruntime), TVM's own error comes out, or
    its import with the shapes it could not know."""
    monkeypatch.setattr(frontends, "_folded_onnx", lambda model, shapes: None)
    with pytest.raises(Exception) as refused:
        frontends.from_onnx(_shape_computing_conv("pad"))
    assert "concat" in str(refused.value).lower() or "shape" in str(refused.value).lower()
    assert frontends._unknown_shapes(frontends.from_onnx(_shape_computing_conv("slice"))) > 0


@pytest.mark.parametrize("eq,shapes", [
    ("bhid,bhjd->bhij", [(2, 3, 4, 8), (2, 3, 5, 8)]),
    ("bhij,bhjd->bhid", [(2, 3, 4, 5), (2, 3, 5, 8)]),
    ("ik,kj->ji", [(4, 6), (6, 5)]),
    ("bij,bjk->kbi", [(2, 4, 6), (2, 6, 5)]),
])
def test_matmul_einsums_become_matmuls(eq, shapes):
    """Every einsum that is a batched matrix product becomes permute_dims + matmul with the
    same result; the rest stay einsums."""
    x, y = (relax.Var(n, relax.TensorType(s, "float32")) for n, s in zip("xy", shapes))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.einsum((x, y), eq)))
        bb.emit_func_output(out)
    fixed = frontend_fixes(bb.get())
    assert "R.einsum" not in fixed["main"].script() and "R.matmul" in fixed["main"].script()
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    vm = relax.VirtualMachine(tvm.compile(fixed, target="llvm"), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
    np.testing.assert_allclose(got, np.einsum(eq, *args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("eq", ["ii->i", "ab,cd->abcd", "b...d,b...d->b...", "ij,jk,kl->il",
                                "bij,bjk->bik,"])
def test_other_einsums_are_not_read_as_matmuls(eq):
    assert matmul_einsum(eq) is None


def test_einsum_attention_from_onnx_compiles_int8():
    """An attention block written with Einsum (as MaxViT's export is) compiles with its two
    products as matmuls and agrees with ONNX Runtime."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(0)
    nodes = [h.make_node("MatMul", ["x", "wk"], ["k"]), h.make_node("MatMul", ["x", "wv"], ["v"]),
             h.make_node("Einsum", ["x", "k"], ["s"], equation="bhid,bhjd->bhij"),
             h.make_node("Mul", ["s", "scale"], ["ss"]),
             h.make_node("Softmax", ["ss"], ["p"], axis=-1),
             h.make_node("Einsum", ["p", "v"], ["y"], equation="bhij,bhjd->bhid")]
    inits = [_const("wk", rng.standard_normal((32, 32)) / 6, np.float32),
             _const("wv", rng.standard_normal((32, 32)) / 6, np.float32),
             _const("scale", 32 ** -0.5, np.float32)]
    shape = [1, 2, 16, 32]
    graph = h.make_graph(nodes, "einsum_attention",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9)
    xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    mod = frontends.from_onnx(model)
    assert "einsum" not in mod["main"].script() and mod["main"].script().count("R.matmul") == 4
    vm = relax.VirtualMachine(unit_tvm.compile(mod, quantize={"calibration_data": xs}),
                              tvm.cpu())
    for x in xs:
        got, ref = vm["main"](tvm.runtime.tensor(x)).numpy(), session.run(None, {"x": x})[0]
        cos = float((got * ref).sum() / np.linalg.norm(got) / np.linalg.norm(ref))
        assert cos > 0.99


@pytest.mark.parametrize("bounds,fused", [
    ((0.0, 6.0), (True, 6.0)),  # MobileNetV2's ReLU6
    ((0.0, None), (True, None)),  # Clip with only a lower bound of 0: a ReLU
    ((-1.0, 1.0), "clamp"),  # a clamp around 0: the conv's own result clamped (Recipe.clamp)
])
def test_onnx_clip_between_convs_becomes_the_conv_epilogue(bounds, fused):
    """ONNX Clip (opset 11+, bounds as inputs) imports as TOPI maximum / minimum call_tirs;
    quantize's graph reads them as relax relu / clip, so the conv before a ReLU6 fuses it and
    writes uint8 for the next conv. Close to ONNX Runtime and equal to TVM's plain build of
    the quantized module."""
    require_host("x86.vpdpbusd")
    ort = pytest.importorskip("onnxruntime")
    from unit_tvm.relax import quantize, recipes

    rng = np.random.default_rng(0)
    lo, hi = bounds
    clip_inputs = ["c1", "lo", "hi" if hi is not None else ""]
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1] * 4),
             h.make_node("Clip", clip_inputs, ["r"]),
             h.make_node("Conv", ["r", "w2", "b2"], ["y"], kernel_shape=[1, 1])]
    inits = [_const("w1", rng.standard_normal((16, 8, 3, 3)) / 8, np.float32),
             _const("b1", rng.standard_normal(16) * 0.1, np.float32),
             _const("w2", rng.standard_normal((16, 16, 1, 1)) / 4, np.float32),
             _const("b2", rng.standard_normal(16) * 0.1, np.float32),
             _const("lo", lo, np.float32)] + ([_const("hi", hi, np.float32)] if hi else [])
    graph = h.make_graph(nodes, "conv_clip_conv",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 10, 10])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 10, 10])],
                         inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9)
    xs = [rng.standard_normal((1, 8, 10, 10)).astype(np.float32) * 2 for _ in range(4)]
    qmod = quantize(frontends.from_onnx(model), calibration_data=xs)
    script = qmod["main"].script()
    assert "maximum" not in script and "minimum" not in script, script
    first = recipes(qmod)[0][1]
    if fused == "clamp":
        assert not first["relu"] and first["clamp"] == [-1.0, 1.0], first
        assert "R.clip" not in script, script
    else:
        assert (first["relu"], first.get("clip_max")) == fused
        assert sum("call_tir" in ln and '"uint8"' in ln for ln in script.splitlines()) == 1
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ex = unit_tvm.compile(frontends.from_onnx(model), quantize={"calibration_data": xs})
    vm = relax.VirtualMachine(ex, tvm.cpu())
    plain = relax.VirtualMachine(tvm.compile(qmod, target=unit_tvm.target.host()), tvm.cpu())
    for x in xs:
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(got, plain["main"](tvm.runtime.tensor(x)).numpy(),
                                   rtol=1e-5, atol=1e-5)
        ref = session.run(None, {"x": x})[0]
        assert float((got * ref).sum() / np.linalg.norm(got) / np.linalg.norm(ref)) > 0.999
