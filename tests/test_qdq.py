"""Models that arrive quantized (ONNX QuantizeLinear / DequantizeLinear pairs, quantization/qdq.py):
quantize() runs them int8 with the model's own activation scales and int8 weights, with the
same uint8 edges and fused epilogues as a float32 model, and agrees with ONNX Runtime running
the same file."""

import re

import numpy as np
import onnx
import pytest
import torch
import tvm
from onnx import numpy_helper
from torch import nn
from tvm import relax

import unit_tvm
from unit_tvm import frontends
from unit_tvm.compiler import build_relax
from unit_tvm.relax import UnitTensorize, quantize, recipes
from unit_tvm.relax.core.graph import const_value, op_name
from unit_tvm.relax.core.u8_values import QParams
from unit_tvm.relax.quantization.ptq import inference_form as quantize_inference_form
from unit_tvm.relax.quantization.qdq import fake_quantization
from unit_tvm.testing import zoo

from .conftest import require_host
from .test_relax import _run


class Residual(nn.Module):
    """A stem, a max-pool, a ResNet basic block and a pooled dense head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.a, self.b = nn.Conv2d(16, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.stem(x)), 2)
        x = torch.relu(x + self.b(torch.relu(self.a(x))))
        return self.fc(x.mean((2, 3)))


class TwoBlocks(nn.Module):
    """A stem and two ResNet basic blocks: the first block's output is read by a conv and by
    the second block's residual add."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.convs = nn.ModuleList(nn.Conv2d(16, 16, 3, padding=1) for _ in range(4))

    def forward(self, x):
        x = torch.relu(self.stem(x))
        for a, b in (self.convs[:2], self.convs[2:]):
            x = torch.relu(x + b(torch.relu(a(x))))
        return x.mean((2, 3))


class Clamped(nn.Module):
    """A hardtanh, which ONNX Runtime's quantizer drops into the pair after the conv, read by a
    float32 sigmoid and a conv whose residual sum is clamped the same way."""

    def __init__(self):
        super().__init__()
        self.stem, self.b = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 1)

    def forward(self, x):
        y = nn.functional.hardtanh(self.stem(x), -1.0, 1.0)
        return nn.functional.hardtanh(self.b(y) + 3.0 * torch.sigmoid(y), -0.5, 2.0)


def _qdq_file(tmp_path, shape=(1, 3, 16, 16), exclude=(), module=Residual, per_channel=True,
              qoperator=False, activations="QUInt8", dedicated=False):
    """(fp32 ONNX path, ONNX Runtime's QDQ (or QOperator) quantization of it, calibration
    inputs); exclude: op types left in float32."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    model = zoo._randomize(module(), 0).eval()
    cal = zoo.inputs(shape, 4, seed=1)
    fp32 = frontends.export_onnx(model, [torch.tensor(cal[0])], str(tmp_path / "fp32.onnx"))

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = iter([{"input0": x} for x in cal])

        def get_next(self):
            return next(self.samples, None)

    qdq = str(tmp_path / "qdq.onnx")
    excluded = [n.name for n in onnx.load(fp32).graph.node if n.op_type in exclude]
    quantize_static(fp32, qdq, Reader(), per_channel=per_channel,
                    quant_format=QuantFormat.QOperator if qoperator else QuantFormat.QDQ,
                    activation_type=getattr(QuantType, activations),
                    weight_type=QuantType.QInt8, nodes_to_exclude=excluded,
                    extra_options={"DedicatedQDQPair": dedicated})
    return fp32, qdq, cal


def _onnx_runtime(path, xs):
    import onnxruntime as ort

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return [session.run(None, {"input0": x})[0] for x in xs]


def _activation_scales(path):
    """The scales of the file's QuantizeLinear nodes (the activations')."""
    model = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return {float(inits[n.input[1]]) for n in model.graph.node if n.op_type == "QuantizeLinear"
            and n.input[1] in inits}


def _cos(a, b):
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_an_onnx_runtime_qdq_model_runs_int8_with_its_own_scales(tmp_path):
    """No quantize / dequantize op is left; every quantized op reads with one of the file's
    activation scales; the ReLUs ONNX Runtime's quantizer dropped come back in the convs'
    epilogues and the edges between convs carry uint8 as for the float32 file; the result
    matches ONNX Runtime running the QDQ file and TVM's plain build of the quantized module."""
    require_host("x86.vpdpbusd")
    fp32, qdq, cal = _qdq_file(tmp_path)
    xs = zoo.inputs((1, 3, 16, 16), 3, seed=2)
    expected = _onnx_runtime(qdq, xs)
    qmod = quantize(frontends.from_onnx(onnx.load(qdq)), calibration_data=cal)
    script = qmod["main"].script()
    assert "R.quantize" not in script and "R.dequantize" not in script, script
    found = recipes(qmod)
    assert len(found) == 4
    file_scales = _activation_scales(qdq)
    for name, r in found:
        assert any(np.isclose(r["x_scale"], s, rtol=1e-6) for s in file_scales), (name, r)
    assert [r["relu"] for _, r in found] == [True, True, True, False]
    plain_fp32 = quantize(frontends.from_onnx(onnx.load(fp32)), calibration_data=cal)
    u8_edges = [ln for ln in script.splitlines() if "call_tir" in ln and '"uint8"' in ln]
    assert len(u8_edges) == sum("call_tir" in ln and '"uint8"' in ln
                                for ln in plain_fp32["main"].script().splitlines()) > 0
    tpass = UnitTensorize(unit_tvm.target.host())
    got = _run(build_relax(tpass(qmod), unit_tvm.target.host()), xs)
    assert all(instr for _, instr, _ in tpass.report), tpass.report
    plain = _run(tvm.compile(qmod, target=unit_tvm.target.host()), xs)
    for g, p, e in zip(got, plain, expected):
        np.testing.assert_allclose(g, p, rtol=1e-5, atol=1e-5)
        assert _cos(g, e) > 0.9999


@pytest.mark.parametrize("exclude", [(), ("Gemm",)], ids=["whole", "dense_left_float"])
def test_compile_runs_a_qdq_model_as_its_pairs_say_without_calibration(tmp_path, exclude):
    """unit_tvm.compile with no quantize argument: the ops the file quantizes run int8 with its
    scales (no calibration inputs needed), an op it left in float32 stays float32, and the
    result matches ONNX Runtime running the file."""
    require_host("x86.vpdpbusd")
    _, qdq, _ = _qdq_file(tmp_path, exclude=exclude)
    xs = zoo.inputs((1, 3, 16, 16), 3, seed=2)
    report = []
    ex = unit_tvm.compile(frontends.from_onnx(onnx.load(qdq)), report=report)
    tensorized = [op for op, instr, _ in report if instr]
    assert len(tensorized) == (3 if exclude else 4), report
    assert all(op.startswith("conv2d") for op in tensorized[:3]), report
    for got, want in zip(_run(ex, xs), _onnx_runtime(qdq, xs)):
        assert _cos(got, want) > 0.9999


def test_a_clip_the_quantizer_dropped_comes_back_in_the_epilogues(tmp_path):
    """The hardtanhs live on only as their pairs' ranges: the stem clamps its result for its
    float32 reader (no clip op of its own), the second conv its residual sum, and the
    result matches ONNX Runtime running the file (without the clamps the sigmoid reads values
    beyond 1: max error 0.6 where ONNX Runtime's is 0.05 from the float32 model)."""
    require_host("x86.vpdpbusd")
    fp32, qdq, cal = _qdq_file(tmp_path, module=Clamped)
    assert "Clip" not in {n.op_type for n in onnx.load(qdq).graph.node}
    qmod = quantize(frontends.from_onnx(onnx.load(qdq)), calibration_data=())
    ops = {b.var: b.value for b in qmod["main"].body.blocks[0].bindings}
    clipped = [ops.get(v.args[0]) for v in ops.values()
               if isinstance(v, relax.Call) and v.op.name == "relax.clip"]
    assert clipped and not any("call_tir" in str(c.op) for c in clipped), clipped  # sigmoid's
    (_, stem), (_, second) = recipes(qmod)
    assert np.allclose(stem["clamp"], (-1.0, 1.0), atol=0.02) and not stem["residual"], stem
    assert second["residual"] and second["clamp"][0] < 0 < second["clamp"][1], second  # its pair
    assert np.isclose(second["clip_min"], -0.5, atol=0.02), second
    assert np.isclose(second["clip_max"], 2.0, atol=0.02), second
    xs = zoo.inputs((1, 3, 16, 16), 3, seed=2)
    got = _run(unit_tvm.compile(frontends.from_onnx(onnx.load(qdq))), xs)
    for g, want in zip(got, _onnx_runtime(qdq, xs)):
        assert g.min() >= -0.51 and g.max() <= 2.01
        np.testing.assert_allclose(g, want, atol=0.05)


def test_a_16_bit_qdq_file_runs_as_the_float_rounding_it_says(tmp_path):
    """Pairs of 16-bit activations are no int8 edges: compile runs them as TVM's float32
    quantize / dequantize ops, says so, and matches ONNX Runtime on the file (it asked for
    calibration inputs instead: "calibration_data is empty")."""
    _, path, _ = _qdq_file(tmp_path, activations="QUInt16")
    xs = zoo.inputs((1, 3, 16, 16), 2, seed=2)
    mod = frontends.from_onnx(onnx.load(path))
    with pytest.warns(UserWarning, match=r"\['uint16'\], not 8-bit"):
        ex = unit_tvm.compile(mod)
    for got, want in zip(_run(ex, xs), _onnx_runtime(path, xs)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_float_model_still_needs_calibration():
    model = zoo._randomize(Residual(), 0).eval()
    mod = frontends.from_torch(model, [torch.zeros(1, 3, 16, 16)])
    with pytest.raises(ValueError, match="calibration_data is empty"):
        quantize(mod, calibration_data=[])


def _pair(bb, x, scale, zp, dtype="uint8"):
    q = bb.emit(relax.op.quantize(x, relax.const(scale, "float32"), relax.const(zp, dtype),
                                  axis=1, out_dtype=dtype))
    return bb.emit(relax.op.dequantize(q, relax.const(scale, "float32"),
                                       relax.const(zp, dtype), axis=1))


@pytest.mark.parametrize("before,scale,zp,dtype,reader,clamp,want", [
    # the ReLU (or ReLU6) the quantizer dropped: clamped to the pair's range for an add...
    ("none", 0.05, 0, "uint8", "add", (0.0, 12.75), QParams(0.05, 0)),
    # ...a ReLU for a conv, which quantizes with the pair's scale and clamps the top itself
    ("none", 0.05, 0, "uint8", "conv", "relu", QParams(0.05, 0)),
    ("relu", 0.05, 0, "uint8", "add", (0.0, 12.75), QParams(0.05, 0)),  # a dropped ReLU6 cap
    ("relu", 0.05, 0, "uint8", "conv", None, QParams(0.05, 0)),  # non-negative: nothing to do
    # a dropped Clip or hardtanh around 0
    ("none", 0.02, 128, "uint8", "add", (-2.56, 2.54), QParams(0.02, 128)),
    ("none", 0.02, 128, "uint8", "conv", None, QParams(0.02, 128)),
    ("none", 0.05, -128, "int8", "add", (0.0, 12.75), QParams(0.05, 0)),  # int8 from -128
    ("none", 0.05, 0, "int8", "add", (-6.4, 6.35), QParams(0.05, 128)),  # symmetric int8
    ("none", 0.05, 255, "uint8", "add", (-12.75, 0.0), QParams(0.05, 255)),  # ending at 0
])
def test_a_pair_becomes_its_input_clamped_unless_quantized_readers_clamp_it(
        before, scale, zp, dtype, reader, clamp, want):
    """A pair is its input clamped to its range (ONNX Runtime drops a ReLU, ReLU6 or Clip
    before a pair); where only quantized convs read it, they clamp it themselves: its input as
    it is, or a ReLU of it where the range starts at 0 and it can be negative. The pair's
    quantization is kept for what a quantized op reads."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 4, 3, 3], "float32"))
    weight = relax.const(np.full((4, 4, 1, 1), 0.25, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(x) if before == "relu" else x * relax.const(2.0))
            pair = _pair(bb, y, scale, zp, dtype)
            read = (relax.op.nn.conv2d(pair, weight) if reader == "conv"
                    else pair + relax.const(1.0))
            out = bb.emit_output(read)
        bb.emit_func_output(out)
    mod, scales = fake_quantization(bb.get())
    script = mod["main"].script()
    assert "quantize" not in script, script
    assert scales and all(np.isclose(q.scale, want.scale) and q.zp == want.zp
                          for q in scales.values()), scales
    clips = [ln for ln in script.splitlines() if "R.clip" in ln]
    relus = script.count("R.nn.relu") - (before == "relu")
    if clamp in (None, "relu"):
        assert not clips and relus == (clamp == "relu"), script
    else:
        bounds = [float(v) for v in re.findall(r"T\.float64\(([-\d.e]+)\)", clips[0])]
        assert len(clips) == 1 and np.allclose(bounds, clamp, rtol=1e-6), clips
    a = np.random.default_rng(0).standard_normal((1, 4, 3, 3)).astype("float32")
    (got,) = _run(unit_tvm.lowering.compile_relax(mod, unit_tvm.target.host()), [a])
    y = np.maximum(a, 0) if before == "relu" else a * 2
    if clamp == "relu":
        y = np.maximum(y, 0)
    elif clamp is not None:
        y = np.clip(y, *clamp)
    want_out = (np.full((1, 4, 3, 3), 0.25 * y.sum(axis=1, keepdims=True)) if reader == "conv"
                else y + 1.0)
    np.testing.assert_allclose(got, want_out, rtol=1e-5, atol=1e-5)


def test_a_pair_with_a_dequantize_per_reader_clamps_for_its_float_reader():
    """A file may give each reader of a quantized value its own DequantizeLinear (ONNX
    Runtime's DedicatedQDQPair): that a conv quantizes one of them itself does not clamp what
    the float32 add reads from the other (it read a ReLU of x, uncapped, before)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 4, 3, 3], "float32"))
    weight = relax.const(np.full((4, 4, 1, 1), 0.25, "float32"))
    scale, zp = relax.const(0.05, "float32"), relax.const(0, "uint8")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(x * relax.const(16.0))
            q = bb.emit(relax.op.quantize(y, scale, zp, axis=1, out_dtype="uint8"))
            to_conv = bb.emit(relax.op.dequantize(q, scale, zp, axis=1))
            to_add = bb.emit(relax.op.dequantize(q, scale, zp, axis=1))
            conv = bb.emit(relax.op.nn.conv2d(to_conv, weight))
            out = bb.emit_output(relax.op.add(conv, to_add + relax.const(1.0)))
        bb.emit_func_output(out)
    mod, _ = fake_quantization(bb.get())
    assert "quantize" not in mod["main"].script()
    a = np.random.default_rng(0).standard_normal((1, 4, 3, 3)).astype("float32")
    (got,) = _run(unit_tvm.lowering.compile_relax(mod, unit_tvm.target.host()), [a])
    y = np.clip(a * 16, 0.0, 12.75)
    want = np.full((1, 4, 3, 3), 0.25 * y.sum(axis=1, keepdims=True)) + y + 1.0
    assert (a * 16).max() > 12.75  # the cap matters on this input
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_dequantize_per_reader_gives_the_recipes_of_one_shared(tmp_path):
    """ONNX Runtime's DedicatedQDQPair gives every reader its own DequantizeLinear: the copies
    become one pair, so the convs fuse the ReLUs and write uint8 as for the plain file (the
    stem's ReLU ran separately here, and ResNet-18's file had ten such ReLUs)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shared_file = _qdq_file(tmp_path / "a", module=TwoBlocks)[1]
    shared = quantize(frontends.from_onnx(onnx.load(shared_file)), calibration_data=())
    dedicated_file = _qdq_file(tmp_path / "b", module=TwoBlocks, dedicated=True)[1]
    kinds = [n.op_type for n in onnx.load(dedicated_file).graph.node]
    assert kinds.count("DequantizeLinear") > kinds.count("QuantizeLinear"), kinds
    dedicated = quantize(frontends.from_onnx(onnx.load(dedicated_file)), calibration_data=())
    assert [r for _, r in recipes(dedicated)] == [r for _, r in recipes(shared)]
    assert "R.nn.relu" not in dedicated["main"].script()


def test_dequantized_constants_fold_per_channel():
    """A per-channel int8 weight (axis 0) and a scalar-quantized constant become the float32
    values ONNX defines: (q - zero point) * scale along the axis."""
    rng = np.random.default_rng(1)
    w = rng.integers(-127, 128, (8, 4, 3, 3)).astype("int8")
    scales = (rng.random(8) * 0.1 + 0.01).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 4, 5, 5], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            weight = bb.emit(relax.op.dequantize(relax.const(w), relax.const(scales),
                                                 relax.const(np.zeros(8, "int8")), axis=0))
            out = bb.emit_output(relax.op.nn.conv2d(x, weight))
        bb.emit_func_output(out)
    mod, _ = fake_quantization(bb.get())
    assert "dequantize" not in mod["main"].script()
    a = rng.standard_normal((1, 4, 5, 5)).astype("float32")
    (got,) = _run(unit_tvm.lowering.compile_relax(mod, unit_tvm.target.host()), [a])
    real = torch.tensor(w.astype("float32") * scales[:, None, None, None])
    want = nn.functional.conv2d(torch.tensor(a), real).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_max_pool_or_reshape_keeps_its_inputs_quantization():
    """NNCF puts no pair after a max-pool: a conv reading the pool (or a reshape of a pair's
    value, as a dense head reads it) reads values of the pair's grid, so it takes the pair's
    quantization."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 4, 8, 8], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = _pair(bb, bb.emit(relax.op.nn.relu(x)), 0.05, 0)
            pooled = bb.emit(relax.op.nn.max_pool2d(y, 2, 2))
            flat = bb.emit(relax.op.reshape(pooled, [1, 64]))
            out = bb.emit_output(flat)
        bb.emit_func_output(out)
    mod, scales = fake_quantization(bb.get())
    bindings = mod["main"].body.blocks[0].bindings
    # relu, the pair's cap (the model's max-pool reads the pair: it may be a dropped ReLU6)...
    assert [op_name(b.value) for b in bindings] == [
        "relax.nn.relu", "relax.clip", "relax.nn.max_pool2d", "relax.reshape"], mod["main"]
    assert all(b.var in scales for b in bindings[1:]), mod["main"]
    assert {q.zp for q in scales.values()} == {0}


@pytest.mark.parametrize("dtype,want", [("uint8", QParams(0.08, 0)),
                                        ("int8", QParams(0.08, 128))])
def test_a_per_channel_pair_gives_one_quantization_over_its_channels(dtype, want):
    """NNCF quantizes a depthwise conv's input per channel; unit-tvm's activations are per
    tensor, so the pair gives the step and zero point that hold every channel's range."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 4, 3, 3], "float32"))
    scales = relax.const(np.array([0.01, 0.02, 0.04, 0.08], "float32"))
    zps = relax.const(np.zeros(4, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(x))
            q = bb.emit(relax.op.quantize(y, scales, zps, axis=1, out_dtype=dtype))
            out = bb.emit_output(relax.op.dequantize(q, scales, zps, axis=1))
        bb.emit_func_output(out)
    _, found = fake_quantization(bb.get())
    (got,) = set(found.values())
    assert got.zp == want.zp and np.isclose(got.scale, want.scale, rtol=1e-3), got


def _depthwise_after_pair(activation, top=6.0, returned=False):
    """conv 1x1 (4 -> 8) + bias, `activation`, a uint8 pair with a scale per channel (ranges
    1:100, NNCF's form), then a depthwise 3x3 conv with a channel multiplier of 2 on int8
    per-channel weights (returned: the pair's value is an output too); (module, the pair's
    scales)."""
    rng = np.random.default_rng(3)
    scales = (top / 255.0) * np.geomspace(0.01, 1.0, 8).astype("float32")
    w1 = relax.const(rng.standard_normal((8, 4, 1, 1)).astype("float32"))
    b1 = relax.const(rng.standard_normal((1, 8, 1, 1)).astype("float32"))
    steps = rng.uniform(0.5, 2.0, 16).astype("float32") / 127
    w2 = rng.integers(-127, 128, (16, 1, 3, 3)).astype("float32") * steps[:, None, None, None]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 4, 9, 9], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(x, w1)), b1))
            act = {"relu6": lambda v: relax.op.clip(v, 0.0, 6.0), "relu": relax.op.nn.relu,
                   "silu": relax.op.nn.silu}[activation]
            y = bb.emit(act(y))
            s, z = relax.const(scales), relax.const(np.zeros(8, "uint8"))
            q = bb.emit(relax.op.quantize(y, s, z, axis=1, out_dtype="uint8"))
            dequantized = relax.op.dequantize(q, s, z, axis=1)
            d = bb.emit_output(dequantized) if returned else bb.emit(dequantized)
            out = bb.emit_output(relax.op.nn.conv2d(d, relax.const(w2), padding=1, groups=8))
        bb.emit_func_output(relax.Tuple([d, out]) if returned else out)
    return bb.get(), scales


@pytest.mark.parametrize("activation", ["relu6", "relu"])
def test_a_per_channel_pair_before_depthwise_convs_keeps_the_files_integers(activation):
    """A per-channel pair that depthwise convs read (NNCF's) becomes one scale per tensor
    exactly: the value is multiplied by S / s[c] before the ReLU (folded into the conv before
    it) and the depthwise weights by s[c] / S, so the integers are the file's: the compiled
    model equals the module run with its float32 rounding ops; over the channels' union (the
    fallback) the 1:100 channels would lose most of their steps."""
    mod, scales = _depthwise_after_pair(activation)
    _, found = fake_quantization(quantize_inference_form(mod))
    assert [q.scale for q in set(found.values())] == [pytest.approx(float(scales.max()))]
    xs = zoo.inputs((1, 4, 9, 9), 3, seed=5)
    want = _run(build_relax(mod, unit_tvm.target.host()), xs)
    qmod = quantize(mod)
    # the first conv reads the float32 input (no pair): only the depthwise one is int8
    assert [r["groups"] for _, r in recipes(qmod)] == [8], qmod["main"]
    got = _run(unit_tvm.compile(mod), xs)
    for g, w in zip(got, want):
        # the values of the smallest channels are 1/100 of the largest's
        for c in range(16):
            np.testing.assert_allclose(g[0, c], w[0, c], rtol=1e-4,
                                       atol=1e-4 * np.abs(w[0, c]).max())


@pytest.mark.parametrize("activation,top,returned", [("silu", 6.0, False), ("relu6", 8.0, False),
                                                     ("relu6", 6.0, True)])
def test_a_per_channel_pair_that_cannot_be_rescaled_takes_the_union(activation, top, returned):
    """SiLU does not commute with a scale per channel, a ReLU6 whose pair reaches beyond 6
    clamps at 6 below the integers' top, and a pair's value the model returns must keep its
    values: those pairs keep one quantization over the union of the channels' ranges."""
    mod, scales = _depthwise_after_pair(activation, top, returned)
    _, found = fake_quantization(quantize_inference_form(mod))
    (got,) = set(found.values())
    assert got.zp == 0 and np.isclose(got.scale, scales.max(), rtol=1e-6)
    assert "relax.multiply" not in [op_name(b.value) for b in fake_quantization(
        quantize_inference_form(mod)).mod["main"].body.blocks[0].bindings]


def test_a_float_squeeze_excitation_conv_runs_as_a_matmul():
    """NNCF leaves a squeeze-excitation's 1x1 convs (on one pooled pixel) in float32; the graph
    pass runs such a conv as a matmul, which the default CPU schedule tiles (the conv's loop
    nest ran serially), with the conv's result."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((24, 96, 1, 1)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 96, 7, 7], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            pooled = bb.emit(relax.op.mean(x, axis=[2, 3], keepdims=True))
            squeezed = bb.emit(relax.op.nn.conv2d(pooled, relax.const(w)))
            out = bb.emit_output(relax.op.sigmoid(squeezed))
        bb.emit_func_output(out)
    mod = UnitTensorize(unit_tvm.target.host())(bb.get())
    script = mod["main"].script()
    assert "R.matmul" in script and "conv2d" not in script, script
    a = rng.standard_normal((1, 96, 7, 7)).astype("float32")
    (got,) = _run(build_relax(mod, unit_tvm.target.host()), [a])
    want = torch.sigmoid(nn.functional.conv2d(torch.tensor(a).mean((2, 3), keepdim=True),
                                              torch.tensor(w))).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_end_clamp_that_the_uint8_result_implies_is_dropped_bit_for_bit():
    """A pair's cap on a value read as uint8 in the pair's own quantization cuts nothing the
    saturation does not: it leaves the recipe (and its tuning form matches the float32
    model's); a cap inside the range stays. The pairs' clamps never split a tuning form."""
    from unit_tvm.relax.core.recipe import Recipe, implied_clamps_dropped, tuning_form

    base = Recipe(kind="dense", in_shape=(4, 16), w_shape=(16, 16), out_shape=(4, 16),
                  out_channels=16, relu=True, x_scale=0.1, x_zp=3, out_q=(0.05, 0))
    capped = base.replace(clip_max=255 * 0.05 * (1 - 1e-7))
    assert implied_clamps_dropped(capped) == base
    assert implied_clamps_dropped(base.replace(clip_max=6.0)).clip_max == 6.0  # 6 < 12.75
    both = base.replace(relu=False, out_q=(0.05, 100), clip_min=-5.0, clip_max=7.75)
    assert implied_clamps_dropped(both) == base.replace(relu=False, out_q=(0.05, 100))
    assert implied_clamps_dropped(both.replace(out_q=None)) == both.replace(out_q=None)
    # the arithmetic agrees: quantizing the clamped and the raw value gives the same integers
    v = np.linspace(-20, 20, 4001)
    for lo, hi, zp in ((-5.0, 7.75, 100), (None, 12.75, 0)):
        raw = np.clip(np.round(v / 0.05) + zp, 0, 255)
        cut = np.clip(v, lo if lo is not None else -np.inf, hi)
        assert np.array_equal(np.clip(np.round(cut / 0.05) + zp, 0, 255), raw)
    clamped = base.replace(clamp=(-1.0, 1.0), residual=True)
    assert tuning_form(clamped) == tuning_form(base.replace(residual=True))
    assert tuning_form(both) == tuning_form(base.replace(relu=False, out_q=(0.05, 100)))
    assert tuning_form(base.replace(clip_max=6.0)) != tuning_form(base)  # a ReLU6 stays apart


def test_a_weight_on_an_int8_grid_keeps_its_integers():
    """A dequantized int8 weight (per tensor, or per channel with a batch norm folded in) keeps
    its grid: the integers are the file's, rounding them again loses nothing. A float32
    weight gets max|w| / 127 per channel."""
    from unit_tvm.relax.quantization.weight_scales import int8_weight_scales

    rng = np.random.default_rng(3)
    q = rng.integers(-127, 128, (32, 16, 3, 3))
    q[5] = rng.integers(-40, 41, (16, 3, 3))  # a channel far from the per-tensor maximum
    q[6] = 2 * rng.integers(-30, 31, (16, 3, 3))  # only even integers: a coarser grid fits
    for per_channel in (np.full(32, 0.013), rng.uniform(0.5, 2.0, 32) * 0.013):
        w = (q * per_channel.reshape(-1, 1, 1, 1)).astype(np.float32)
        scales = int8_weight_scales(w)
        back = np.round(w / scales.reshape(-1, 1, 1, 1))
        assert np.abs(back).max() <= 127
        np.testing.assert_allclose(back * scales.reshape(-1, 1, 1, 1), w, rtol=1e-6, atol=0)
        assert np.isclose(scales[6], 2 * per_channel[6], rtol=1e-6)
    w = rng.standard_normal((8, 27)).astype(np.float32)
    np.testing.assert_allclose(int8_weight_scales(w), np.abs(w).max(axis=1) / 127, rtol=1e-6)


def test_a_per_tensor_qdq_file_runs_with_its_own_int8_weights(tmp_path):
    """quantize() of ONNX Runtime's per-tensor file multiplies the file's int8 weights: each
    conv's weight times its scales equals the file's dequantized weight (before, a second
    rounding onto max / 127 per channel moved them by up to half a step)."""
    _, qdq, _ = _qdq_file(tmp_path, per_channel=False)
    mod = frontends.from_onnx(onnx.load(qdq))
    file_weights = [const_value(b.value.args[1]) for b in _bindings(fake_quantization(mod).mod)
                    if op_name(b.value) == "relax.nn.conv2d"]
    qmod = quantize(mod, calibration_data=())
    calls = [b.value.args[1].fields for b in _bindings(qmod)
             if isinstance(b.value, relax.Call) and "call_tir" in str(b.value.op)]
    x_scales = [r["x_scale"] for _, r in recipes(qmod)]
    assert len(file_weights) == 3 and len(calls) == 4
    for w, args, x_scale in zip(file_weights, calls, x_scales):
        wq, mult = const_value(args[1]).astype(np.float64), const_value(args[3])
        assert np.ptp(mult) <= 1e-6 * mult.max()  # the file's one scale
        got = wq * (mult.astype(np.float64) / x_scale).reshape(-1, 1, 1, 1)
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=0)


def _bindings(mod):
    return mod["main"].body.blocks[0].bindings
