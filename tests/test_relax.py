"""Models end to end: quantize + UnitTensorize + compile + run, against the fp32 model."""

import re

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

import unit_tvm
from unit_tvm import frontends, intrinsics
from unit_tvm.compiler import build_relax
from unit_tvm.relax import UnitTensorize, quantize, recipes
from unit_tvm.relax.core.recipe import Recipe, blocks_of, folds_width
from unit_tvm.relax.quantization.ptq import default_attention
from unit_tvm.testing import zoo

from .conftest import require_host

torch.manual_seed(0)


class SmallCNN(nn.Module):
    """conv + bn + relu, a residual block, a depthwise conv, pooling, a dense layer."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(32)
        self.c2 = nn.Conv2d(32, 32, 3, padding=1)
        self.b2 = nn.BatchNorm2d(32)
        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.pw = nn.Conv2d(32, 64, 1)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)) + y)
        y = nn.functional.relu6(self.pw(self.dw(y)))
        y = nn.functional.adaptive_avg_pool2d(nn.functional.max_pool2d(y, 2), 1).flatten(1)
        return self.fc(y)


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = zoo.EncoderLayer(hidden=64, heads=4, ffn=128)

    def forward(self, x):
        return self.layer(x)


class WideHeads(nn.Module):
    """Two heads of 64 (BERT's head size): the bf16 attention matmuls go to AMX tiles on an
    AMX host (TinyTransformer's heads of 16 stay on vdpbf16ps there)."""

    def __init__(self):
        super().__init__()
        self.layer = zoo.EncoderLayer(hidden=128, heads=2, ffn=128)

    def forward(self, x):
        return self.layer(x)


def _prepare(model, shape, n_cal=3):
    zoo._randomize(model, 0)
    model.eval()
    cal = zoo.inputs(shape, n_cal, seed=1)
    xs = zoo.inputs(shape, 3, seed=2)
    with torch.no_grad():
        refs = [model(torch.tensor(x)).numpy() for x in xs]
    return cal, xs, refs


def _run(ex, xs):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    outs = []
    for x in xs:
        out = vm["main"](tvm.runtime.tensor(x, tvm.cpu()))
        outs.append(out[0].numpy() if not hasattr(out, "numpy") else out.numpy())
    return outs


def _cos(a, b):
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return a @ b / np.linalg.norm(a) / np.linalg.norm(b)


def _assert_equals_plain_int8(ex, qmod, xs, refs):
    """The tensorized executable equals TVM's plain build of the same quantized module (same
    integer arithmetic), and both stay close to the fp32 model."""
    plain = _run(tvm.compile(qmod, target=unit_tvm.target.host()), xs)
    for got, base, ref in zip(_run(ex, xs), plain, refs):
        np.testing.assert_allclose(got, base, rtol=1e-5, atol=1e-5)
        assert _cos(got, ref) > 0.995


def _asm(ex):
    mods = [ex.mod] if hasattr(ex, "mod") else []
    text = ""
    while mods:
        m = mods.pop()
        if m.kind == "llvm":
            text += m.inspect_source("asm")
        mods += list(m.imports)
    return text


class Hardtanhs(nn.Module):
    """A hardtanh on a conv's own result before a residual add, and one after the sum."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(16, 16, 3, padding=1), nn.Conv2d(16, 16, 1)

    def forward(self, x):
        y = x + nn.functional.hardtanh(self.a(x), -0.5, 0.5)
        return nn.functional.hardtanh(self.b(y) + y, -1.0, 0.75)


def test_clamps_around_zero_fold_into_the_epilogue():
    """clip(v, lo < 0, hi) after the op's affine epilogue is clamped there, before the residual
    (Recipe.clamp); after the residual sum it is the end clamp (clip_min, clip_max): no float32
    clip op is left, and the tensorized kernels equal TVM's plain build of the module."""
    require_host("x86.vpdpbusd")
    model = Hardtanhs()
    cal, xs, refs = _prepare(model, (1, 16, 8, 8))
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal)
    assert "R.clip" not in qmod["main"].script()
    (_, a), (_, b) = recipes(qmod)
    assert a["clamp"] == [-0.5, 0.5] and a["residual"] and a.get("clip_min") is None, a
    assert b.get("clamp") is None and b["residual"], b
    assert (b["clip_min"], b["clip_max"], b["relu"]) == (-1.0, 0.75, False), b
    tmod = UnitTensorize(unit_tvm.target.host())(qmod)
    ex = build_relax(tmod, unit_tvm.target.host())
    _assert_equals_plain_int8(ex, qmod, xs, refs)
    assert all(-1.0 <= o.min() and o.max() <= 0.75 for o in _run(ex, xs))


def test_small_cnn_quantized_tensorized_close_to_fp32():
    require_host("x86.vpdpbusd")
    model = SmallCNN()
    cal, xs, refs = _prepare(model, (1, 3, 16, 16))
    mod = frontends.from_torch(model, [torch.tensor(xs[0])])
    qmod = quantize(mod, calibration_data=cal)
    kinds = [(r["kind"], r["relu"], r["residual"], r.get("clip_max")) for _, r in recipes(qmod)]
    # c1 (+bn+relu), c2 (+bn+residual+relu), dw (int8), pw (+relu6), fc
    assert kinds == [("conv2d", True, False, None), ("conv2d", True, True, None),
                     ("conv2d", False, False, None), ("conv2d", True, False, 6.0),
                     ("dense", False, False, None)]
    groups = [r.get("groups", 1) for _, r in recipes(qmod)]
    assert groups == [1, 1, 32, 1, 1]
    # c2 -> dw -> pw: single-consumer edges carry uint8 (requantized), through the depthwise
    # conv; c1's result, read by c2 as its input and as its residual, is uint8 too (shared)
    u8 = [(bool(r.get("in_u8")), bool(r.get("out_q"))) for _, r in recipes(qmod)]
    assert u8[0][1] and u8[1] == (True, True) and u8[2] == (True, True) and u8[3][0]
    r1, r2 = [r for _, r in recipes(qmod)][:2]
    assert r2["residual_q"] == r1["out_q"] == [r2["x_scale"], r2["x_zp"]]
    tpass = UnitTensorize(unit_tvm.target.host())
    tmod = tpass(qmod)
    # every uint8 edge stays in NCHW16c: written blocked, read blocked (c2's residual too);
    # pw's float32 result, read only by the max-pool, is written blocked and pooled so
    blocks = [(r.get("in_block"), r.get("out_block")) for _, r in recipes(tmod)
              if r["kind"] == "conv2d"]
    assert blocks == [(None, 16), (16, 16), (16, 16), (16, 16)]
    assert [r.get("residual_block") for _, r in recipes(tmod)][1] == 16
    ex = build_relax(tmod, unit_tvm.target.host())
    # every op is tensorized; the depthwise conv on the lanewise instruction where the host has
    # one (else int8 in TVM's loop nest); either way the activations around it stay uint8
    lanewise = unit_tvm.intrinsics.get("x86.vpermb.vpdpbusd").supported()
    assert [instr for _, instr, _ in tpass.report][2] == (
        "x86.vpermb.vpdpbusd" if lanewise else None)
    assert [bool(instr) for _, instr, _ in tpass.report] == [True, True, lanewise, True, True]
    asm = _asm(ex)
    assert "vpdpbusd" in asm or "tdpbusd" in asm  # really tensorized on this host
    plain = _run(tvm.compile(qmod, target=unit_tvm.target.host()), xs)
    for got, base, ref in zip(_run(ex, xs), plain, refs):
        # tensorized == TVM's plain int8 (same integer arithmetic), both close to fp32
        np.testing.assert_allclose(got, base, rtol=1e-5, atol=1e-5)
        assert _cos(got, ref) > 0.995


def test_transformer_block_and_percentile_calibration():
    require_host("x86.vpdpbusd")
    model = TinyTransformer()
    cal, xs, refs = _prepare(model, (1, 16, 64))
    mod = frontends.from_torch(model, [torch.tensor(xs[0])])
    report = []
    ex = unit_tvm.compile(mod, quantize={"calibration_data": cal, "method": "percentile",
                                         "percentile": 99.9}, report=report)
    # by default the two attention matmuls are bf16 where the host has a bf16 dot product,
    # else they stay fp32, reported with the reason
    left = [reason for op, instr, reason in report if op.startswith("relax.matmul")]
    bmm = [instr for op, instr, _ in report if op.startswith("bmm")]
    if default_attention(unit_tvm.target.host()) == "bf16":
        assert not left and bmm and all("bf16" in instr for instr in bmm), report
    else:
        assert len(left) == 2 and all("attention='bf16'" in reason for reason in left)
    for got, ref in zip(_run(ex, xs), refs):
        assert got.shape == ref.shape and _cos(got, ref) > 0.99


@pytest.mark.parametrize("model_cls, tokens, heads, hidden", [
    (TinyTransformer, 16, 4, 64), (TinyTransformer, 13, 4, 64), (WideHeads, 24, 2, 128)])
def test_bf16_attention_tensorized_equals_plain_and_fp32_attention(model_cls, tokens, heads,
                                                                   hidden):
    """attention="bf16": Q x K^T (with its 1 / sqrt(d) scale) and P x V as bf16 matmuls whose
    run-time operands are rounded and packed in the kernel; the tensorized build equals TVM's
    plain one up to float32 summation order, and the model stays as close to fp32 as with fp32
    attention. Token counts that fill no register tile or AMX tile (13, 24) are padded."""
    require_host("x86.vdpbf16ps")
    model = model_cls()
    cal, xs, refs = _prepare(model, (1, tokens, hidden))
    mod = frontends.from_torch(model, [torch.tensor(xs[0])])
    qmod = quantize(mod, calibration_data=cal, attention="bf16")
    bmm = [r for _, r in recipes(qmod) if r["kind"] == "bmm"]
    assert [(r["out_shape"], r["dtype"]) for r in bmm] == [
        ([heads, tokens, tokens], "bfloat16"), ([heads, tokens, hidden // heads], "bfloat16")]
    tpass = UnitTensorize()
    ex = build_relax(tpass(qmod), unit_tvm.target.host())
    assert all(instr for _, instr, _ in tpass.report), tpass.report
    assert "vdpbf16ps" in _asm(ex) or "tdpbf16ps" in _asm(ex)
    fp32_attention = build_relax(UnitTensorize()(quantize(mod, calibration_data=cal,
                                                          attention="fp32")),
                                 unit_tvm.target.host())
    plain = _run(tvm.compile(qmod, target=unit_tvm.target.host()), xs)
    for got, base, other, ref in zip(_run(ex, xs), plain, _run(fp32_attention, xs), refs):
        np.testing.assert_allclose(got, base, rtol=1e-4, atol=1e-5)
        assert _cos(got, ref) > _cos(other, ref) - 1e-3 and _cos(got, other) > 0.9999


@pytest.mark.parametrize("tokens", [13, 197])
def test_odd_token_counts_tensorized_and_padded_exactly(tokens):
    """ViT's 197 tokens (prime) and a short 13: the int8 dense rows are computed padded to a
    register tile (197 -> 198) and cropped, and so are the int8 attention matmuls (Q x K^T and
    P x V, 4 heads: their run-time operands quantized and packed in the kernel); the same
    results as TVM's plain build of the quantized model, close to fp32."""
    require_host("x86.vpdpbusd")
    model = TinyTransformer()
    cal, xs, refs = _prepare(model, (1, tokens, 64))
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal,
                    attention="int8")
    bmm = [r for _, r in recipes(qmod) if r["kind"] == "bmm"]
    assert [r["out_shape"] for r in bmm] == [[4, tokens, tokens], [4, tokens, 16]]
    assert bmm[1]["x_zp"] == 0  # P x V: the softmax is >= 0, no zero-point term
    tpass = UnitTensorize()
    ex = build_relax(tpass(qmod), unit_tvm.target.host())
    assert tpass.report and all(instr for _, instr, _ in tpass.report)
    plain = _run(tvm.compile(qmod, target=unit_tvm.target.host()), xs)
    for got, base, ref in zip(_run(ex, xs), plain, refs):
        assert _cos(got, base) > 0.99999 and _cos(got, ref) > 0.99


def test_onnx_frontend_path(tmp_path):
    require_host("x86.vpdpbusd")
    model = SmallCNN()
    cal, xs, refs = _prepare(model, (1, 3, 16, 16))
    path = frontends.export_onnx(model, [torch.tensor(xs[0])], str(tmp_path / "m.onnx"))
    mod = frontends.from_onnx(path)
    qmod = quantize(mod, calibration_data=cal)
    assert len(recipes(qmod)) >= 3
    ex = build_relax(UnitTensorize()(qmod), unit_tvm.target.host())
    for got, ref in zip(_run(ex, xs), refs):
        assert _cos(got, ref) > 0.995


def test_model_without_quantizable_ops_still_compiles():
    class Pool(nn.Module):
        def forward(self, x):
            return torch.softmax(nn.functional.max_pool2d(x, 2).flatten(1), -1)

    x = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype("float32")
    mod = frontends.from_torch(Pool(), [torch.tensor(x)])
    ex = unit_tvm.compile(mod, quantize={"calibration_data": [x]})
    (got,) = _run(ex, [x])
    np.testing.assert_allclose(got, Pool()(torch.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)


class Stem(nn.Module):
    """ResNet's stem and first block: conv-bn-relu, a 3x3/2 max-pool whose result feeds a conv
    and is the block's residual."""

    def __init__(self, channels=16):
        super().__init__()
        self.c0 = nn.Conv2d(3, channels, 3, stride=2, padding=1, bias=False)
        self.b0 = nn.BatchNorm2d(channels)
        self.c1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        y = nn.functional.max_pool2d(torch.relu(self.b0(self.c0(x))), 3, 2, 1)
        return torch.relu(self.c1(y) + y)


@pytest.mark.parametrize("channels", [16, 20])
def test_max_pool_runs_on_its_producers_uint8(channels):
    """conv -> relu -> max-pool -> conv (+ the pool as residual): the first conv requantizes
    for the second, the pool runs on uint8, the second conv reads it as is and dequantizes it
    as its residual. After UnitTensorize the first conv writes NCHW[y]c and the pool runs on
    those blocks (20 channels: the padding channels are sliced off after it). Same result as
    TVM's plain int8 build of the same graph, close to fp32."""
    require_host("x86.vpdpbusd")
    model = Stem(channels)
    cal, xs, refs = _prepare(model, (1, 3, 33, 33))
    mod = frontends.from_torch(model, [torch.tensor(xs[0])])
    qmod = quantize(mod, calibration_data=cal)
    (_, r0), (_, r1) = recipes(qmod)
    assert r0["out_q"] == [r1["x_scale"], r1["x_zp"]] and r1["in_u8"]
    assert r1["residual_q"] == r0["out_q"]
    (pool,) = [ln for ln in qmod["main"].script().splitlines() if "R.nn.max_pool2d" in ln]
    assert pool.split(") = ")[0].endswith('dtype="uint8"')  # the pool's result is uint8
    assert "R.astype" not in qmod["main"].script()  # nothing dequantizes it: not needed
    tpass = UnitTensorize(unit_tvm.target.host())
    tensorized = tpass(qmod)
    (pool,) = [ln for ln in tensorized["main"].script().splitlines() if "R.nn.max_pool2d" in ln]
    block = int(re.search(r'layout="NCHW(\d+)c"', pool).group(1))
    assert block in (8, 16, 32)
    assert ("R.strided_slice" in tensorized["main"].script()) == bool(channels % block)
    # whole blocks: the pool's result stays in them, read by the conv as input and residual
    whole = not channels % block
    (_, r1_t) = [(n, r) for n, r in recipes(tensorized) if r["residual"]][0]
    assert (r1_t.get("in_block"), r1_t.get("residual_block")) == ((block, block) if whole
                                                                 else (None, None))
    assert ("R.permute_dims" in tensorized["main"].script()) != whole
    ex = build_relax(tensorized, unit_tvm.target.host())
    assert all(instr for _, instr, _ in tpass.report), tpass.report
    _assert_equals_plain_int8(ex, qmod, xs, refs)


class PooledStem(nn.Module):
    """Inception's stem into its first block: conv -> max-pool, read by 1x1 convs and by an
    average pool feeding a conv."""

    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(3, 32, 3, padding=1)
        self.a, self.b = nn.Conv2d(32, 16, 1), nn.Conv2d(32, 16, 3, padding=1)
        self.p = nn.Conv2d(32, 16, 1)

    def forward(self, x):
        y = nn.functional.max_pool2d(torch.relu(self.c0(x)), 3, 2)
        pooled = self.p(nn.functional.avg_pool2d(y, 3, 1, 1))
        return torch.cat([torch.relu(self.a(y)), torch.relu(self.b(y)), pooled], 1)


def test_max_pool_read_by_convs_and_an_average_pool_stays_in_blocks():
    """The max-pool's result stays in its producer's blocks: the convs read them and the
    average pool runs on them (its NCHW16c kernel); no transpose back to NCHW. Equal to TVM's
    plain int8 build of the same graph."""
    require_host("x86.vpdpbusd")
    model = PooledStem()
    cal, xs, refs = _prepare(model, (1, 3, 23, 23))
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal)
    assert "qavg_pool" in qmod["main"].script()
    tpass = UnitTensorize(unit_tvm.target.host())
    tmod = tpass(qmod)
    script = tmod["main"].script()
    (pool,) = [ln for ln in script.splitlines() if "R.nn.max_pool2d" in ln]
    assert 'out_layout="NCHW16c"' in pool, pool
    assert "_blocked" in script and "R.permute_dims" not in script, script
    readers = [r for _, r in recipes(tmod) if r["in_shape"][1] == 32 and r.get("in_u8")]
    assert len(readers) == 3 and all(r.get("in_block") == 16 for r in readers), readers
    ex = build_relax(tmod, unit_tvm.target.host())
    assert all(instr for _, instr, _ in tpass.report), tpass.report
    _assert_equals_plain_int8(ex, qmod, xs, refs)


class Bottleneck(nn.Module):
    """A ResNet block with a projection shortcut: the 1x1 stride-2 shortcut's result is read
    only as the residual of the block's last conv."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(16, 16, 3, stride=2, padding=1)
        self.c2 = nn.Conv2d(16, 32, 1)
        self.proj = nn.Conv2d(16, 32, 1, stride=2)
        self.bp = nn.BatchNorm2d(32)

    def forward(self, x):
        return torch.relu(self.c2(torch.relu(self.c1(x))) + self.bp(self.proj(x)))


def test_projection_shortcut_travels_as_uint8():
    """The shortcut requantizes in the quantization of its own observed result, the adder
    dequantizes it in its epilogue, the edge is laid out NCHW[y]c; the result equals TVM's
    plain int8 build of the same graph and stays close to fp32."""
    require_host("x86.vpdpbusd")
    model = Bottleneck()
    cal, xs, refs = _prepare(model, (1, 16, 15, 15))
    mod = frontends.from_torch(model, [torch.tensor(xs[0])])
    qmod = quantize(mod, calibration_data=cal)
    by_shape = {(r["w_shape"][0], r["stride"][0], r["residual"]): r for _, r in recipes(qmod)}
    proj, adder = by_shape[(32, 2, False)], by_shape[(32, 1, True)]
    assert proj["out_q"] and adder["residual_q"] == proj["out_q"]
    scale, zp = proj["out_q"]
    assert 0 < zp < 255 and scale > 0  # a shortcut without relu has negative values too
    tpass = UnitTensorize(unit_tvm.target.host())
    tensorized = tpass(qmod)
    assert [r.get("residual_block") for _, r in recipes(tensorized) if r["residual"]] == [16]
    ex = build_relax(tensorized, unit_tvm.target.host())
    assert all(instr for _, instr, _ in tpass.report), tpass.report
    _assert_equals_plain_int8(ex, qmod, xs, refs)


def test_quantize_needs_calibration_and_a_known_dtype():
    model = SmallCNN()
    _, xs, _ = _prepare(model, (1, 3, 16, 16))
    mod = frontends.from_torch(model, [torch.tensor(xs[0])])
    with pytest.raises(ValueError, match="calibration_data is empty"):
        quantize(mod, calibration_data=[])
    with pytest.raises(ValueError, match="'int8', 'bfloat16' or 'float32'"):
        quantize(mod, calibration_data=xs, dtype="float16")


class Denormal(nn.Module):
    """SmallCNN reading its input scaled into float32's denormals (~1e-39): the first conv's
    calibrated range is too narrow for a uint8 step whose inverse float32 can hold."""

    def __init__(self):
        super().__init__()
        self.net = SmallCNN()

    def forward(self, x):
        return self.net(x * 1e-39)


def test_denormal_activations_quantize_to_the_zero_point():
    """A range of denormals gets the least step (u8_values.MIN_STEP): the model compiles
    (TVM refused the inverse step as a float32 literal) and its values, which no float32
    product keeps anyway, round to the zero point: the output stays the fp32 model's."""
    model = Denormal()
    cal, xs, refs = _prepare(model, (1, 3, 16, 16))
    mod = frontends.from_torch(model, [torch.tensor(xs[0])])
    ex = unit_tvm.compile(mod, quantize={"calibration_data": cal})
    for got, ref in zip(_run(ex, xs), refs):
        assert np.isfinite(got).all()
        assert _cos(got, ref) > 0.99


def _bf16(a):
    import ml_dtypes

    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


class TwoLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(72, 40)
        self.l2 = nn.Linear(40, 10)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


def test_bf16_dense_model_equals_bf16_arithmetic(rng):
    """quantize(dtype="bfloat16"): weights and activations rounded to bf16 (ties to even),
    float32 accumulation, bias and relu fused. Equal to that arithmetic in float64 up to f32
    accumulation error, and far from it if anything were not rounded or rounded twice."""
    require_host("x86.vdpbf16ps")
    model = TwoLinear()
    _, xs, refs = _prepare(model, (3, 72))
    mod = frontends.from_torch(model, [torch.tensor(xs[0])])
    qmod = quantize(mod, dtype="bfloat16")  # no calibration needed
    assert [(r["kind"], r["dtype"], r["relu"]) for _, r in recipes(qmod)] == [
        ("dense", "bfloat16", True), ("dense", "bfloat16", False)]
    tpass = UnitTensorize(unit_tvm.target.host())
    ex = build_relax(tpass(qmod), unit_tvm.target.host())
    assert all(instr for _, instr, _ in tpass.report), tpass.report
    assert any(m in _asm(ex) for m in ("tdpbf16ps", "vdpbf16ps"))
    w1, b1 = model.l1.weight.detach().numpy(), model.l1.bias.detach().numpy()
    w2, b2 = model.l2.weight.detach().numpy(), model.l2.bias.detach().numpy()
    for got, x in zip(_run(ex, xs), xs):
        h = np.maximum(_bf16(x) @ _bf16(w1).T + b1, 0)
        want = _bf16(h) @ _bf16(w2).T + b2
        bound = 1e-5 * (np.abs(_bf16(h)) @ np.abs(_bf16(w2)).T + np.abs(b2)) + 1e-6
        assert np.all(np.abs(got - want) <= bound)
        # fp32 activations (no rounding) would be off by far more than the bound somewhere
        unrounded = np.maximum(x @ _bf16(w1).T + b1, 0) @ _bf16(w2).T + b2
        assert np.any(np.abs(unrounded - want) > bound)


def test_bf16_models_tensorized_close_to_fp32():
    """A conv net (residual, depthwise left fp32), a transformer block (its two attention
    matmuls bf16 too, the default where bf16 runs) and a conv3d net (depth taps on padding
    skipped: bf16 pads with 0.0) in bf16: every conv/dense/bmm on a bf16 instruction, equal to
    TVM's plain bf16 loop nest, close to fp32."""
    require_host("x86.vdpbf16ps")
    for model, shape, n_ops in ((SmallCNN(), (1, 3, 16, 16), 4),
                                (TinyTransformer(), (1, 16, 64), 6),
                                (Video(), (1, 3, 5, 15, 15), 5)):
        _, xs, refs = _prepare(model, shape)
        mod = frontends.from_torch(model, [torch.tensor(xs[0])])
        qmod = quantize(mod, dtype="bfloat16")
        assert len(recipes(qmod)) == n_ops  # SmallCNN's depthwise conv stays fp32
        tpass = UnitTensorize(unit_tvm.target.host())
        ex = build_relax(tpass(qmod), unit_tvm.target.host())
        assert all(instr for _, instr, _ in tpass.report), tpass.report
        plain = _run(build_relax(qmod, unit_tvm.target.host()), xs)
        for got, base, ref in zip(_run(ex, xs), plain, refs):
            np.testing.assert_allclose(got, base, rtol=1e-4, atol=1e-4)
            assert _cos(got, ref) > 0.9999


def test_bf16_without_bf16_instructions_keeps_tvm_schedule():
    """On a CPU without AVX512-BF16 / AMX-BF16 the bf16 ops keep TVM's loop nest, with a
    warning naming why, and the model still computes the bf16 result."""
    model = TwoLinear()
    _, xs, _ = _prepare(model, (3, 72))
    mod = frontends.from_torch(model, [torch.tensor(xs[0])])
    qmod = quantize(mod, dtype="bfloat16")
    # this host without AVX512-BF16 and AMX (Skylake-SP's level, or less): its code runs here
    target = unit_tvm.target.restricted("avx512_core")
    tpass = UnitTensorize(target)
    with pytest.warns(UserWarning, match="no instruction for its dtypes"):
        tmod = tpass(qmod)
    assert [instr for _, instr, _ in tpass.report] == [None, None]
    got = _run(build_relax(tmod, target), xs)
    want = _run(build_relax(qmod, unit_tvm.target.host()), xs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_zoo_models_are_deterministic():
    a, shape = zoo.get("resnet18")
    b, _ = zoo.get("resnet18")
    x = torch.tensor(zoo.inputs(shape, 1)[0])
    with torch.no_grad():
        np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())
    with pytest.raises(KeyError, match="resnet50"):
        zoo.get("vgg")


def test_zoo_names_readable_without_torch_match_the_zoo():
    from unit_tvm.testing import ZOO_MODELS

    assert tuple(zoo.MODELS) == ZOO_MODELS


def test_requantization_between_quantized_ops():
    """conv -> relu -> conv: the first writes uint8 in the second's quantization; the result stays
    equal to TVM's plain int8 build and close to fp32."""
    require_host("x86.vpdpbusd")

    class Chain(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(8, 16, 3, padding=1)
            self.b = nn.Conv2d(16, 16, 3, padding=1)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    model = Chain()
    cal, xs, refs = _prepare(model, (1, 8, 12, 12))
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal)
    (first, r1), (second, r2) = recipes(qmod)
    assert r1["out_q"] == [r2["x_scale"], r2["x_zp"]] and r2["in_u8"]
    ex = build_relax(UnitTensorize()(qmod), unit_tvm.target.host())
    _assert_equals_plain_int8(ex, qmod, xs, refs)


def test_packed_edges_pad_channels_exactly():
    """Blocked (NCHW16c) uint8 edges whose channel counts are not multiples of 16 (24, 20), through
    a strided depthwise conv, and 1x1 convs that read their blocked input in place, whether its
    channels fill the last block (32) or not (24: the reduction stops at 24, the padding lanes
    hold real 0): equal to TVM's plain int8 build of the same quantized model."""
    require_host("x86.vpdpbusd")

    class Blocks(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(8, 24, 1)
            self.dw = nn.Conv2d(24, 24, 3, stride=2, padding=1, groups=24)
            self.b = nn.Conv2d(24, 32, 1)
            self.d = nn.Conv2d(32, 20, 1)  # reads b's NCHW16c result in place (32 = 2 blocks)
            self.c = nn.Conv2d(20, 12, 3)

        def forward(self, x):
            y = nn.functional.relu6(self.a(x))
            y = nn.functional.relu6(self.dw(y))
            return self.c(torch.relu(self.d(torch.relu(self.b(y)))))

    model = Blocks()
    cal, xs, refs = _prepare(model, (1, 8, 13, 13))
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal)
    tmod = UnitTensorize()(qmod)
    blocks = [(r.get("in_block"), r.get("out_block")) for _, r in recipes(tmod)]
    # every edge is blocked, each producer by its instruction's output block (20 channels pick
    # a 8-lane form where one exists)
    assert blocks[0] == (None, 16) and blocks[1] == (16, 16) and blocks[4][1] is None
    assert blocks[2][0] == 16 and blocks[2][1] == blocks[3][0] in (8, 16)
    assert blocks[3][1] == blocks[4][0] in (8, 16)
    script = {r["w_shape"][0]: tmod[name].script() for name, r in recipes(tmod)}
    assert 'T.sblock("xq")' not in script[20] and 'T.sblock("xq")' not in script[32]
    ex = build_relax(tmod, unit_tvm.target.host())
    plain = _run(tvm.compile(qmod, target=unit_tvm.target.host()), xs)
    for got, base, ref in zip(_run(ex, xs), plain, refs):
        np.testing.assert_allclose(got, base, rtol=1e-5, atol=1e-5)
        assert _cos(got, ref) > 0.99


class Depthwise(nn.Module):
    """Depthwise convs of every form the lanewise instruction meets: on the fp32 input (quantized
    in the kernel), on a blocked uint8 edge, channels not a multiple of 16, stride 2, a 5-wide
    window (two instructions per row), writing fp32 NCHW, and a dilated one (not lanewise)."""

    def __init__(self):
        super().__init__()
        self.d0 = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.a = nn.Conv2d(8, 40, 1)
        self.d1 = nn.Conv2d(40, 40, 3, stride=2, padding=1, groups=40)
        self.d2 = nn.Conv2d(40, 40, 5, padding=2, groups=40)
        self.d3 = nn.Conv2d(40, 40, 3, padding=2, dilation=2, groups=40)
        self.d4 = nn.Conv2d(40, 40, 3, padding=1, groups=40)

    def forward(self, x):
        y = nn.functional.relu6(self.a(self.d0(x)))
        y = nn.functional.relu6(self.d2(nn.functional.relu6(self.d1(y))))
        return self.d4(torch.relu(self.d3(y)))


def test_depthwise_convs_on_the_lanewise_instruction():
    """Each depthwise conv runs on vpermb + vpdpbusd (the dilated one keeps TVM's int8 loop nest)
    and the model equals TVM's plain int8 build of the same quantized model exactly."""
    require_host("x86.vpermb.vpdpbusd")
    model = Depthwise()
    cal, xs, refs = _prepare(model, (1, 8, 15, 15))
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal)
    tpass = UnitTensorize()
    tmod = tpass(qmod)
    used = [instr for _, instr, _ in tpass.report]
    assert used[0] == used[2] == used[3] == used[5] == "x86.vpermb.vpdpbusd"
    assert used[4] is None  # dilation 2 along the width: the taps are not neighbours
    ex = build_relax(tmod, unit_tvm.target.host())
    assert "vpermb" in _asm(ex)
    plain = _run(tvm.compile(qmod, target=unit_tvm.target.host()), xs)
    for got, base, ref in zip(_run(ex, xs), plain, refs):
        np.testing.assert_array_equal(got, base)
        assert _cos(got, ref) > 0.99


def _conv_recipe(**extra):
    recipe = {"kind": "conv2d", "in_shape": [1, 24, 10, 10], "w_shape": [32, 24, 1, 1],
              "out_shape": [1, 32, 10, 10], "out_channels": 32, "stride": [1, 1],
              "dilation": [1, 1], "padding": [0, 0, 0, 0], "x_scale": 0.1, "x_zp": 3,
              "relu": True, "clip_max": None, "residual": False, "in_u8": True,
              "out_q": [0.05, 0]}
    recipe.update(extra)
    return Recipe.from_dict(recipe)


@pytest.mark.parametrize("blocked", [True, False])
def test_write_back_vectorised_only_into_blocked_layout(blocked):
    """Into NCHW16c the epilogue reads accumulator lanes and writes output lanes in place: one
    vector loop. Into NCHW the lanes scatter across rows: scalar code, no gathers."""
    require_host("x86.vpdpbusd")
    from unit_tvm.relax.cpu.qops import tensorized_func
    from unit_tvm.relax.core.recipe import candidates

    target = unit_tvm.target.host()
    recipe = _conv_recipe(**({"in_block": 16, "out_block": 16} if blocked else {}))
    intrin = [i for i in candidates(recipe, target) if i.channel_blocks[1] == 16][0]
    func, _, _ = tensorized_func(recipe, intrin, target)
    text = func.script()
    out_block = text[text.index('T.sblock("out")') - 200:text.index('T.sblock("out")')]
    assert ("T.vectorized(16)" in out_block) == blocked


def _call_prim(func, arrays):
    """func (a PrimFunc) built alone for the host and run on numpy `arrays`; its last one,
    the output, as it comes back."""
    from unit_tvm.measure import to_device

    lib = unit_tvm.lowering.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                                  unit_tvm.target.host())
    tensors = to_device(arrays, tvm.cpu())
    lib["main"](*tensors)
    return tensors[-1].numpy()


@pytest.mark.parametrize("name", ["x86.vpdpbusd", "x86.vpdpbusd.256"])
def test_blocked_residual_keeps_the_write_back_vectorised(name):
    """A uint8 residual in 16-channel blocks added in the epilogue of a kernel with 16- or
    8-lane output blocks: the write-back stays one vector loop (its residual index was once
    (ko * 16 + ki) // 16, which TVM does not simplify, so the loop was not vectorised; LLVM
    vectorised it anyway: 0.4% on ResNet-50's adders, A/B), and the result equals the plain
    NCHW int8 op's."""
    require_host(name)
    from unit_tvm.relax.cpu.qops import plain_func, tensorized_func
    from unit_tvm.relax.cpu.weights import pack_weight
    from unit_tvm.testing.reference import pack_nchwc

    target = unit_tvm.target.host()
    intrin = intrinsics.get(name)
    lanes = intrin.channel_blocks[1]
    recipe = _conv_recipe(in_block=8, out_block=lanes, residual=True, residual_q=[0.1, 5],
                          residual_block=16)
    func, blocks, _ = tensorized_func(recipe, intrin, target)
    text = func.script()
    assert f"T.vectorized({lanes})" in text[text.index('T.sblock("out")') - 200:
                                            text.index('T.sblock("out")')]
    plain = plain_func(recipe.replace(in_block=None, out_block=None, residual_block=None))
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (1, 24, 10, 10)).astype("uint8")
    w = rng.integers(-127, 128, (32, 24, 1, 1)).astype("int8")
    comp = (3 * w.reshape(32, -1).astype(np.int32).sum(axis=1)).astype("int32")
    mult = rng.uniform(0.001, 0.01, 32).astype("float32")
    bias = rng.uniform(-1, 1, 32).astype("float32")
    res = rng.integers(0, 256, (1, 32, 10, 10)).astype("uint8")
    out = np.zeros((1, 32 // lanes, 10, 10, lanes), "uint8")
    got = _call_prim(func, [pack_nchwc(x, 8), pack_weight(recipe, w, blocks), comp, mult, bias,
                            pack_nchwc(res, 16), out])
    want = _call_prim(plain, [x, w, comp, mult, bias, res, np.zeros((1, 32, 10, 10), "uint8")])
    got = got.transpose(0, 1, 4, 2, 3).reshape(1, 32, 10, 10)
    assert 0 < got.mean() < 255  # neither all clipped nor all zero
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("vectorized", [False, True])
def test_requantization_rounds_and_clips_every_float(vectorized):
    """quantize_value, built as the kernels build it (scalar, and 16 lanes: vcvtps2dq and a
    saturating narrow on x86, frintx/fcvtzs on ARM): x / scale + zp rounded to nearest even and
    clipped to [0, 255] for in-range values and ties, values far outside int32, +-inf and
    denormals; NaN gives 0."""
    from tvm import te

    from unit_tvm.relax.cpu.qarith import quantize_value

    scale, zp = 0.25, 3
    rng = np.random.default_rng(0)
    ties = (np.arange(-8, 264) + 0.5 - zp) * scale  # exact halves: rounded to even
    xs = np.concatenate([rng.uniform(-20, 80, 4000), ties, [np.inf, -np.inf, 3e38, -3e38, 1e10,
                         -1e10, 2.0 ** 31 * scale, 1e-45, -1e-45, 0.0, -0.0, np.nan]])
    xs = np.resize(xs.astype("float32"), -(-len(xs) // 16) * 16)
    x = te.placeholder(xs.shape, "float32", name="x")
    out = te.compute(xs.shape, lambda i: quantize_value(x[i], scale, zp), name="out")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, out]))
    if vectorized:
        sch.vectorize(sch.split(sch.get_loops(sch.get_sblock("out"))[0], [None, 16])[1])
    got = _call_prim(sch.mod["main"], [xs, np.zeros(xs.shape, "uint8")])
    with np.errstate(invalid="ignore"):
        want = np.clip(np.rint(xs.astype(np.float64) / scale + zp), 0, 255)
    want[np.isnan(xs)] = 0
    np.testing.assert_array_equal(got, want.astype("uint8"))
    assert {0, 255} <= set(got.tolist()) and 0.3 < (got % 2 == 0).mean() < 0.7


@pytest.mark.parametrize("zp", [0, 7])
def test_relu_left_to_the_requantization_clip_is_bit_exact(monkeypatch, zp):
    """With a uint8 result of zero point 0 the requantization's clip at 0 does relu's work: the
    epilogue drops relu's max (one vector op of ~10 per 16 outputs) and every output stays the
    same; with another zero point relu stays."""
    from unit_tvm.relax.cpu import qarith
    from unit_tvm.relax.cpu.qops import plain_func

    recipe = _conv_recipe(out_q=[0.05, zp], x_zp=0)
    fast = plain_func(recipe)
    monkeypatch.setattr(qarith, "_clamped_at_zero", lambda r: False)
    with_relu = plain_func(recipe)
    text = fast.script()
    assert (text.count("T.max(") < with_relu.script().count("T.max(")) == (zp == 0)
    rng = np.random.default_rng(1)
    args = [rng.integers(0, 256, (1, 24, 10, 10)).astype("uint8"),
            rng.integers(-127, 128, (32, 24, 1, 1)).astype("int8"),
            rng.integers(-5000, 5000, 32).astype("int32"),
            rng.uniform(0.0005, 0.005, 32).astype("float32"),
            rng.uniform(-4, 4, 32).astype("float32"), np.zeros((1, 32, 10, 10), "uint8")]
    outs = [_call_prim(f, args) for f in (fast, with_relu)]
    assert (outs[0] == zp).mean() > 0.2 and (outs[0] > zp).mean() > 0.2  # both sides of relu
    np.testing.assert_array_equal(outs[0], outs[1])


def test_output_block_follows_the_instruction():
    """A 16-channel output block over 8-lane accumulators would mix accumulator blocks in one
    write-back tile (TVM derived a wrong loop nest for it): refused with a clear error."""
    from unit_tvm.relax.cpu.qgraphs import tensorized_graph

    recipe = _conv_recipe(in_block=16, out_block=16)
    with pytest.raises(ValueError, match="output block 16 differs"):
        tensorized_graph(recipe, intrinsics.get("x86.vpdpbusd.256"))
    tensorized_graph(recipe.replace(out_block=8), intrinsics.get("x86.vpdpbusd.256"))


def test_single_row_dense_on_every_instruction():
    """A classifier's dense has one row: on a 16-row AMX tile the row index simplified to 0 and
    left the write-back unplaceable (a TVM InternalError). Every instruction of this host builds
    it, and each result equals TVM's own build of the op."""
    import unit_tvm.tuner.search as search
    from unit_tvm.relax.cpu.qgraphs import tensorized_graph
    from unit_tvm.relax.core.recipe import candidates

    target = unit_tvm.target.host()
    recipe = Recipe(kind="dense", in_shape=(1, 200), w_shape=(40, 200), out_channels=40,
                    out_shape=(1, 40), x_scale=0.1, x_zp=3)
    found = candidates(recipe, target)
    if not found:
        pytest.skip(f"no u8 x s8 instruction runs on {target}")
    rng = np.random.default_rng(0)
    for intrin in found:
        prepared, _ = tensorized_graph(recipe, intrin)
        arrays = search._inputs(prepared, intrin, rng)
        expected = search.reference_output(prepared, arrays, target)
        args = unit_tvm.measure.to_device(arrays + [np.zeros_like(expected)], tvm.cpu())
        search.candidate_module(prepared, intrin, None, target)(*args)
        np.testing.assert_allclose(args[-1].numpy(), expected, rtol=1e-5, atol=1e-5,
                                   err_msg=intrin.name)


def test_tuned_model_remembers_its_instruction_choice(tmp_path, monkeypatch):
    """Tuning races every candidate instruction per op shape and records the winner (two layers
    of one shape, with their own scales, tune once); a second build with the database measures
    nothing and prepares only the chosen instruction's graph."""
    require_host("x86.vpdpbusd")
    import unit_tvm.relax.cpu.tensorize as tensorize
    from unit_tvm.tuner import Database, search

    class Three(nn.Module):
        def __init__(self):
            super().__init__()
            self.b = nn.Conv2d(8, 16, 1)
            self.c = nn.Conv2d(8, 16, 1)  # b's shape: tuned once for both
            self.d = nn.Conv2d(32, 16, 3, padding=1)

        def forward(self, x):
            # c's input has its own range, so its recipe has its own scale and zero point
            return self.d(torch.cat([torch.relu(self.b(x)), torch.relu(self.c(x * 3))], 1))

    model = Three()
    cal, xs, _ = _prepare(model, (1, 8, 10, 10))
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal)
    db = str(tmp_path / "db.jsonl")
    first = UnitTensorize(tune=True, trials=2, database=db)
    ex1 = build_relax(first(qmod), unit_tvm.target.host())
    choices = [r for r in Database(db).records() if r.get("choice")]
    chosen = [i for _, i, _ in first.report]
    assert len(chosen) == 3 and chosen[0] == chosen[1]
    assert [r["intrinsic"] for r in choices] == chosen[1:]

    def no_measuring(*a, **k):
        raise AssertionError("a remembered choice must not measure anything")

    prepared = []
    real_graph = tensorize.tensorized_graph
    monkeypatch.setattr(search, "candidate_module", no_measuring)
    monkeypatch.setattr(search, "reference_output", no_measuring)
    monkeypatch.setattr(tensorize, "tensorized_graph",
                        lambda r, i, t=None: prepared.append(i.name) or real_graph(r, i, t))
    second = UnitTensorize(tune=True, database=db)
    ex2 = build_relax(second(qmod), unit_tvm.target.host())
    assert prepared == [r["intrinsic"] for r in choices] and second.report == first.report
    assert len(qmod_recipes := recipes(qmod)) == 3 and qmod_recipes[0][1] != qmod_recipes[1][1]
    for a, b in zip(_run(ex1, xs), _run(ex2, xs)):
        np.testing.assert_array_equal(a, b)


def test_a_changed_kernel_keeps_its_tuned_loops_and_a_missing_one_warns(tmp_path):
    """A database whose kernel records no longer match (the kernels' arithmetic changed, so
    their loop nests hash differently) still configures each op from its instruction-choice
    record; a database with records for other ops only leaves them on default configs, with one
    warning that says so."""
    require_host("x86.vpdpbusd")
    import json
    import warnings

    from unit_tvm.tuner import Database

    model = nn.Sequential(nn.Conv2d(8, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 16, 1))
    cal, xs, _ = _prepare(model, (1, 8, 12, 12))
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal)
    db = tmp_path / "db.jsonl"
    tuned = UnitTensorize(tune=True, trials=3, database=str(db))
    tuned(qmod)
    lines = [json.loads(line) for line in db.read_text().splitlines()]
    choices = [r for r in lines if r.get("choice")]
    assert len(choices) == 2
    stale = tmp_path / "stale.jsonl"  # only the choices: no kernel record matches any more
    stale.write_text("".join(json.dumps(r) + "\n" for r in choices))
    rebuilt = UnitTensorize(database=str(stale))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rebuilt(qmod)
    assert rebuilt.untuned == []
    assert [k.config for k in rebuilt.kernels.values()] == [
        k.config for k in tuned.kernels.values()]
    other = tmp_path / "other.jsonl"  # records of other ops only
    other.write_text("".join(json.dumps({**r, "workload": "x" + r["workload"]}) + "\n"
                             for r in lines))
    untuned = UnitTensorize(database=str(other))
    with pytest.warns(UserWarning, match="has no config for 2 ops"):
        untuned(qmod)
    assert len(untuned.untuned) == 2 and len(Database(str(other)).records()) == len(lines)


@pytest.mark.parametrize("hw", [(17, 17), (17, 31)])
def test_odd_widths_are_computed_exactly(hw):
    """Inception's 17x17 layers (1x7, 7x1 and a strided 3x3): a 17-column row has no register
    tile width that divides it and is held by one tile as wide as the row; a 31-column row is
    too wide for one, so 32 columns are computed and the extra one cropped. Both equal TVM's
    plain int8 build of the same quantized model."""
    require_host("x86.vpdpbusd")
    from unit_tvm.schedules.register_tiles import tiled_extent

    assert [tiled_extent(e) for e in (7, 8, 17, 23, 31, 35, 56, 71, 73, 149)] == [
        7, 8, 17, 23, 32, 35, 56, 72, 75, 150]

    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(16, 32, (1, 7), padding=(0, 3))
            self.b = nn.Conv2d(32, 24, (7, 1), padding=(3, 0))
            self.c = nn.Conv2d(24, 16, 3, stride=2)

        def forward(self, x):
            return self.c(torch.relu(self.b(torch.relu(self.a(x)))))

    model = Odd()
    cal, xs, refs = _prepare(model, (1, 16, *hw))
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal)
    tpass = UnitTensorize()
    ex = build_relax(tpass(qmod), unit_tvm.target.host())
    assert all(instr for _, instr, _ in tpass.report)
    plain = _run(tvm.compile(qmod, target=unit_tvm.target.host()), xs)
    for got, base, ref in zip(_run(ex, xs), plain, refs):
        np.testing.assert_array_equal(got, base)
        assert _cos(got, ref) > 0.995


class InceptionLike(nn.Module):
    """Two Inception-style blocks: branches of convs (one ending in an inner concat, one after
    an average pool) concatenated; the concat read by a strided conv, a max-pool (both into a
    second concat) and an average pool feeding a conv."""

    def __init__(self):
        super().__init__()
        conv = nn.Conv2d
        self.stem = conv(3, 16, 3, padding=1)
        self.b1, self.b2a, self.b2b = conv(16, 16, 1), conv(16, 8, 1), conv(8, 16, 3, padding=1)
        self.b3, self.b3x = conv(16, 16, 1), conv(16, 16, (1, 3), padding=(0, 1))
        self.b3y, self.bp = conv(16, 16, (3, 1), padding=(1, 0)), conv(16, 16, 1)
        self.down, self.head = conv(80, 32, 3, stride=2), conv(48, 32, 1)
        self.pooled, self.pooled2 = conv(80, 16, 1), conv(48, 16, 1)
        self.e1, self.e2, self.e3 = conv(112, 16, 1), conv(112, 16, 3, padding=1), conv(112, 16, 1)

    def forward(self, x):
        r = torch.relu
        x = r(self.stem(x))
        y = r(self.b3(x))
        cat1 = torch.cat([r(self.b1(x)), r(self.b2b(r(self.b2a(x)))),
                          torch.cat([r(self.b3x(y)), r(self.b3y(y))], 1),
                          r(self.bp(nn.functional.avg_pool2d(x, 3, 1, 1)))], 1)
        cat2 = torch.cat([r(self.down(cat1)), nn.functional.max_pool2d(cat1, 3, 2)], 1)
        # a block whose parts are all convs and whose readers convs and a pool: NCHW16c
        e = torch.cat([r(self.e1(cat2)), torch.cat([r(self.e2(cat2)), r(self.e3(cat2))], 1)], 1)
        a = self.head(e).mean((2, 3))
        b = self.pooled(nn.functional.avg_pool2d(cat1, 3, 1, 1, count_include_pad=False))
        c = self.pooled2(nn.functional.avg_pool2d(e, 3, 1, 1))
        return torch.cat([a, b.mean((2, 3)), c.mean((2, 3))], 1)


def test_concats_and_pools_carry_uint8():
    """Inception's concats run on uint8: the branch convs requantize into the concat's
    quantization (an inner concat's too), the concat's conv readers read it as is, an average
    pool sums it in integers and requantizes for its conv, a max-pool of it is requantized into
    the next concat. After UnitTensorize the concats whose parts are all convs and whose readers
    are convs and pools are NCHW16c throughout: parts write blocks, the pools run on them, and
    a concat whose part is a max-pool of such a concat (Inception's grid reduction) too.
    Equal to TVM's plain build of the same quantized graph, close to fp32."""
    require_host("x86.vpdpbusd")
    model = InceptionLike()
    cal, xs, refs = _prepare(model, (1, 3, 15, 15))
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal)
    script = qmod["main"].script()
    concats = [ln for ln in script.splitlines() if "R.concat" in ln]
    assert sum('dtype="uint8"' in ln.split(") = ")[0] for ln in concats) == 5, concats
    assert sum("qavg_pool" in ln for ln in script.splitlines() if "call_tir" in ln) == 2
    by_name = dict(recipes(qmod))
    assert sum(bool(r.get("in_u8")) for r in by_name.values()) >= 6  # down, pooled, head...
    tpass = UnitTensorize(unit_tvm.target.host())
    tmod = tpass(qmod)
    tscript = tmod["main"].script()
    blocked = [ln for ln in tscript.splitlines() if "R.concat" in ln
               and re.search(r"R.Tensor\(\(1, \d+, \d+, \d+, 16\)", ln.split(") = ")[0])]
    assert len(blocked) == 5, tscript  # cat1, cat2, e and the inner concats of cat1 and e
    assert "qavg_pool" in tscript and "_blocked" in tscript
    # cat1's max-pool runs on its blocks and hands them to cat2 (a part beside a conv's)
    pool = [ln for ln in tscript.splitlines() if "max_pool2d" in ln]
    assert len(pool) == 1 and 'out_layout="NCHW16c"' in pool[0], pool
    assert "permute_dims" not in tscript  # no edge goes back to NCHW
    ex = build_relax(tmod, unit_tvm.target.host())
    assert all(instr for _, instr, _ in tpass.report), tpass.report
    _assert_equals_plain_int8(ex, qmod, xs, refs)


class ConcatOfAFloatValue(nn.Module):
    """A concat read by a conv whose parts are a conv's result and a float32 value no conv
    produced (an activation of the input): that part is quantized into the concat's uint8."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(8, 16, 1), nn.Conv2d(24, 16, 3, padding=1)

    def forward(self, x):
        return self.b(torch.cat([torch.relu(self.a(x)), torch.sigmoid(x) * 4.0], 1))


def test_a_concat_part_no_conv_produced_is_quantized_into_it():
    """The float32 part is quantized where the concat is built (this crashed in quantize()
    before: the clip's bounds); the result equals TVM's plain build and stays close to fp32."""
    require_host("x86.vpdpbusd")
    model = ConcatOfAFloatValue()
    cal, xs, refs = _prepare(model, (1, 8, 10, 10))
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal)
    concats = [ln for ln in qmod["main"].script().splitlines() if "R.concat" in ln]
    assert len(concats) == 1 and 'dtype="uint8"' in concats[0].split(") = ")[0], concats
    tpass = UnitTensorize(unit_tvm.target.host())
    ex = build_relax(tpass(qmod), unit_tvm.target.host())
    assert all(instr for _, instr, _ in tpass.report), tpass.report
    _assert_equals_plain_int8(ex, qmod, xs, refs)



@pytest.mark.parametrize("block", [0, 16], ids=["nchw", "nchw16c"])
@pytest.mark.parametrize("shape,window,stride,padding,include_pad", [
    ((1, 5, 9, 11), 3, 2, 1, False),  # strided: NCHW on the te graph, default schedule
    ((1, 5, 9, 11), 3, 1, 1, True),  # rows of 9 interior columns: one 8-lane vector + overlap
    ((1, 16, 20, 30), (3, 5), 1, (1, 2), False),  # 16 lanes, overlapping last vector, 4 edges
    ((1, 32, 17, 17), 3, 1, 1, True),  # Inception's 17x17
    ((1, 32, 8, 8), 3, 1, 1, True),  # Inception's 8x8: 6 interior columns, 4-lane vectors
    ((1, 16, 10, 9), (2, 3), 2, (0, 1), True),  # strided in blocks, an edge column each side
])
def test_uint8_average_pool_is_the_pool_of_real_values(shape, window, stride, padding,
                                                       include_pad, block):
    """u8_pools.avg_pool_func (and blocked_pool_func on NCHW16c) == quantize(avg_pool2d(
    dequantize(x))) computed in float64 (padding is real 0.0), up to one step where a value lies
    on a rounding tie; both layouts give the same bytes."""
    from unit_tvm.relax.core import u8_values
    from unit_tvm.relax.cpu import u8_pools
    from unit_tvm.relax.cpu.default_schedule import DefaultCPUSchedule

    n, c, h, w = shape
    if block and c % block:
        pytest.skip(f"{c} channels are not whole blocks of {block}")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, shape, dtype=np.uint8)
    src, dst = u8_values.QParams(0.0513, 37), u8_values.QParams(0.0297, 12)
    call = relax.op.nn.avg_pool2d(relax.Var("x", relax.TensorType(shape, "float32")), window,
                                  stride, padding, count_include_pad=include_pad)
    func = u8_pools.avg_pool_func(shape, call.attrs, u8_values.AvgPoolPlan(src, dst))

    def run(f, data, out_shape):
        mod = DefaultCPUSchedule()(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}))
        out = tvm.runtime.tensor(np.zeros(out_shape, np.uint8))
        tvm.compile(mod, target=unit_tvm.target.host())(tvm.runtime.tensor(data), out)
        return out.numpy()

    real = torch.tensor((x.astype(np.float64) - src.zp) * src.scale)
    pooled = nn.functional.avg_pool2d(real, window, stride, padding,
                                      count_include_pad=include_pad).numpy()
    want = np.clip(np.round(pooled / dst.scale) + dst.zp, 0, 255)
    got = run(func, x, want.shape)
    diff = np.abs(got.astype(np.int64) - want)
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01
    if block:
        from unit_tvm.testing.reference import pack_nchwc

        blocked = run(u8_pools.blocked_pool_func(func, block), pack_nchwc(x, block),
                      u8_pools.pool_out_shape(func, block))
        np.testing.assert_array_equal(blocked, pack_nchwc(got, block))


class TinyDecoder(nn.Module):
    """GPT-2's masking path: position ids from a boolean mask's cumsum (int64 in PyTorch, bool in
    TVM's frontend until unit_tvm's frontend fixes), a causal mask, token and position tables."""

    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(64, 32), nn.Embedding(32, 32)
        self.layer = zoo.EncoderLayer(hidden=32, heads=2, ffn=64)
        self.head = nn.Linear(32, 64)

    def forward(self, ids):
        positions = torch.ones_like(ids, dtype=torch.bool).cumsum(-1) - 1
        h = self.tok(ids) + self.pos(positions)
        n = ids.shape[1]
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool))
        scores = (h @ h.transpose(-1, -2)).masked_fill(~causal, float("-inf")).softmax(-1)
        return self.head(self.layer(scores @ h))


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
def test_causal_decoder_with_bool_cumsum_compiles(int8):
    if int8:
        require_host("x86.vpdpbusd")
    torch.manual_seed(0)
    model = zoo._randomize(TinyDecoder(), 0).eval()
    ids = torch.randint(0, 64, (1, 12))
    mod = frontends.from_torch(model, [ids])
    assert 'R.cumsum(lv, axis=-1, dtype=None' in mod["main"].script()  # the frontend's bool sum
    quant = {"calibration_data": [ids.numpy()], "attention": "int8"} if int8 else None
    report = []
    ex = unit_tvm.compile(mod, quantize=quant, report=report)
    assert all(instr for _, instr, _ in report) and (report or not int8)
    # the attention matmuls (two in forward, two in the layer; the masked one included) are
    # tensorized too (int8, or float32 on the multiply-add): none is left to TVM's loops
    assert len([op for op, _, _ in report if op.startswith("bmm")]) == 4
    (got,) = _run(ex, [ids.numpy()])
    ref = model(ids).detach().numpy()
    if int8:
        assert _cos(got, ref) > 0.99
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_non_finite_full_compiles():
    """torch.full of -inf (the causal mask of many decoders) compiles: TVM 0.27's legalization
    of such a full raised a TypeError (frontend_fixes)."""
    class Causal(nn.Module):
        def forward(self, x):
            return torch.softmax(x + torch.full((8, 8), float("-inf")).triu(1), -1)

    x = torch.tensor(zoo.inputs((1, 8, 8), 1, seed=1)[0])
    got = _run(unit_tvm.compile(frontends.from_torch(Causal(), [x])), [x.numpy()])[0]
    np.testing.assert_allclose(got, Causal()(x).numpy(), rtol=1e-5, atol=1e-6)


class Grouped(nn.Module):
    """RegNet/ResNeXt-style grouped convs: groups of 16 channels (blocks of the instruction tile
    them), of 32 with stride 2 on a blocked uint8 edge, groups of 8 output channels (a
    16-lane block would span two groups: only an 8-lane instruction runs them), then an
    ungrouped conv with fewer output channels than a block."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(8, 64, 1)
        self.g16 = nn.Conv2d(64, 64, 3, padding=1, groups=4)
        self.g32 = nn.Conv2d(64, 64, 3, stride=2, padding=1, groups=2)
        self.g8 = nn.Conv2d(64, 64, 3, padding=1, groups=8)
        self.tail = nn.Conv2d(64, 6, 1)

    def forward(self, x):
        y = torch.relu(self.g16(torch.relu(self.a(x))))
        return self.tail(torch.relu(self.g8(torch.relu(self.g32(y)))))


def test_grouped_convs_tensorized_where_blocks_tile_the_groups():
    """Grouped convs whose groups the instruction's channel blocks tile run on it, and the model
    equals TVM's plain int8 build of the same quantized model exactly."""
    require_host("x86.vpdpbusd")

    model = Grouped()
    cal, xs, refs = _prepare(model, (1, 8, 12, 12))
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal)
    assert [r.get("groups", 1) for _, r in recipes(qmod)] == [1, 4, 2, 8, 1]
    tpass = UnitTensorize()
    tmod = tpass(qmod)
    used = [instr for _, instr, _ in tpass.report]
    assert used[0] and used[1] and used[2] and used[4], tpass.report
    # 8 output channels per group: an 8-lane instruction (vpdpbusd.256) or TVM's int8 loop nest
    assert used[3] is None or intrinsics.get(used[3]).channel_blocks[1] == 8, tpass.report
    ex = build_relax(tmod, unit_tvm.target.host())
    assert "vpdpbusd" in _asm(ex)  # the grouped kernels really run the host's instruction
    plain = _run(tvm.compile(qmod, target=unit_tvm.target.host()), xs)
    for got, base, ref in zip(_run(ex, xs), plain, refs):
        np.testing.assert_array_equal(got, base)
        assert _cos(got, ref) > 0.99


class Video(nn.Module):
    """A video-ResNet-style block: a (3, 7, 7) stem with stride (1, 2, 2) over 3 channels (its
    columns folded into the reduction), a 3x3x3 stride-2 conv, a 3x3x3 conv adding a 1x1x1
    stride-2 projection shortcut, on odd extents (5 frames of 15x15), then a classifier."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv3d(3, 16, (3, 7, 7), stride=(1, 2, 2), padding=(1, 3, 3), bias=False)
        self.bn = nn.BatchNorm3d(16)
        self.a = nn.Conv3d(16, 32, 3, stride=2, padding=1)
        self.b = nn.Conv3d(32, 32, 3, padding=1)
        self.down = nn.Conv3d(16, 32, 1, stride=2)
        self.fc = nn.Linear(32, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.stem(x)))
        z = torch.relu(self.b(torch.relu(self.a(y))) + self.down(y))
        return self.fc(z.mean((2, 3, 4)))


def test_conv3d_quantized_and_tensorized_exactly():
    """Every conv3d becomes an int8 op (bn, relu and the shortcut add fused; uint8 edges, the
    stem's shared by two readers), each runs on the host's instruction (skipping padding-only
    depth taps where that is exact), and the model equals TVM's plain build of the same
    quantized model exactly, close to fp32."""
    require_host("x86.vpdpbusd")
    model = Video()
    cal, xs, refs = _prepare(model, (1, 3, 5, 15, 15))
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal)
    rs = [r for _, r in recipes(qmod)]
    assert [(r["kind"], r["relu"], r["residual"]) for r in rs] == [
        ("conv3d", True, False), ("conv3d", True, False), ("conv3d", False, False),
        ("conv3d", True, True), ("dense", False, False)]
    assert rs[0]["out_q"] and rs[1]["in_u8"] and rs[2]["in_u8"]  # the stem's shared edge
    assert rs[3]["in_u8"] and rs[3]["residual_q"] == rs[2]["out_q"]  # a uint8 shortcut
    # after a relu the zero point is 0: those kernels skip the depth taps reading only padding
    # (schedules/padding_taps.py), the stem (zero point != 0) computes them
    assert rs[0]["x_zp"] != 0 and rs[1]["x_zp"] == rs[3]["x_zp"] == 0
    # the stem reads its 7 columns as the reduction lanes (recipe.folds_width)
    assert folds_width(Recipe.from_dict(rs[0]), blocks_of(intrinsics.get("x86.vpdpbusd")))
    tpass = UnitTensorize()
    tmod = tpass(qmod)
    assert all(instr for _, instr, _ in tpass.report), tpass.report
    ex = build_relax(tmod, unit_tvm.target.host())
    asm = _asm(ex)
    assert "vpdpbusd" in asm or "tdpbusd" in asm
    plain = _run(tvm.compile(qmod, target=unit_tvm.target.host()), xs)
    for got, base, ref in zip(_run(ex, xs), plain, refs):
        np.testing.assert_array_equal(got, base)
        assert _cos(got, ref) > 0.99


def test_ops_left_in_fp32_are_reported_with_the_reason():
    """A grouped conv3d has no int8 form: compile() reports it (and warns) instead of leaving
    it slow silently; the ungrouped one next to it is quantized."""
    from unit_tvm.relax.core.leftovers import fp32_leftovers

    model = nn.Sequential(nn.Conv3d(4, 8, 3, padding=1), nn.ReLU(), nn.Conv3d(8, 8, 3, groups=2))
    cal, xs, _ = _prepare(model, (1, 4, 4, 6, 6), n_cal=1)
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal)
    assert [r["kind"] for _, r in recipes(qmod)] == ["conv3d"]
    (left,) = fp32_leftovers(qmod)
    assert left.op.startswith("relax.nn.conv3d") and "grouped (2 groups)" in left.reason
    report = []
    with pytest.warns(UserWarning, match="1 compute-heavy ops stay float32: 1 x relax.nn.conv3d"):
        unit_tvm.compile(frontends.from_torch(model, [torch.tensor(xs[0])]),
                         quantize={"calibration_data": cal}, report=report)
    assert [reason for op, _, reason in report if op.startswith("relax.")] == [left.reason]


class Conv3dZoo(nn.Module):
    """conv3d shapes nobody tuned for: 5 input and 6 output channels (neither a whole block),
    a (2+1)D factorised pair ((1, 3, 3) then (3, 1, 1)), a dilated window, unequal strides
    and an even window."""

    def __init__(self):
        super().__init__()
        self.spatial = nn.Conv3d(5, 24, (1, 3, 3), padding=(0, 1, 1))
        self.temporal = nn.Conv3d(24, 20, (3, 1, 1), padding=(1, 0, 0))
        self.dilated = nn.Conv3d(20, 16, 3, padding=2, dilation=2)
        self.strided = nn.Conv3d(16, 6, (2, 3, 2), stride=(2, 1, 2), padding=(1, 1, 0))

    def forward(self, x):
        y = torch.relu(self.temporal(torch.relu(self.spatial(x))))
        return self.strided(torch.relu(self.dilated(y)))


def test_conv3d_shapes_nobody_tuned_for_are_exact():
    require_host("x86.vpdpbusd")
    model = Conv3dZoo()
    cal, xs, refs = _prepare(model, (2, 5, 6, 9, 11))
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal)
    assert [r["kind"] for _, r in recipes(qmod)] == ["conv3d"] * 4
    tpass = UnitTensorize()
    ex = build_relax(tpass(qmod), unit_tvm.target.host())
    assert all(instr for _, instr, _ in tpass.report), tpass.report
    plain = _run(tvm.compile(qmod, target=unit_tvm.target.host()), xs)
    for got, base, ref in zip(_run(ex, xs), plain, refs):
        np.testing.assert_array_equal(got, base)
        assert _cos(got, ref) > 0.99


def _conv3d_recipe(window, stride, padding, **extra):
    """A uint8 -> uint8 conv3d, 16 -> 32 channels over 4 frames of 6 x 7, with a residual."""
    c, k, (d, h, w_) = 16, 32, (4, 6, 7)
    out = [(e + sum(padding[a::3]) - t) // st + 1
           for a, (e, t, st) in enumerate(zip((d, h, w_), window, stride))]
    recipe = {"kind": "conv3d", "in_shape": [1, c, d, h, w_], "w_shape": [k, c, *window],
              "out_shape": [1, k, *out], "out_channels": k, "stride": list(stride),
              "dilation": [1, 1, 1], "padding": list(padding), "x_scale": 0.1, "x_zp": 0,
              "relu": True, "clip_max": None, "residual": True, "residual_q": [0.1, 5],
              "in_u8": True, "out_q": [0.05, 0]}
    recipe.update(extra)
    return Recipe.from_dict(recipe)


@pytest.mark.parametrize("window, stride, padding, unroll", [
    ((3, 3, 3), (1, 1, 1), (1, 1, 1, 1, 1, 1), None),  # the producer's blocks copied padded
    # a tile of one row: the window rows reading only padding are skipped at run time
    ((3, 3, 3), (1, 1, 1), (1, 1, 1, 1, 1, 1), ((4, 7),)),
    ((1, 1, 1), (2, 2, 2), (0,) * 6, None),  # a shortcut reading the blocks in place
])
def test_conv3d_on_blocked_edges_is_exact(window, stride, padding, unroll):
    """A conv3d reading its input and residual in NCDHW16c and writing NCDHW16c (the uint8
    edges between conv3d ops), tensorized and as the plain int8 loop nest (the fallback),
    equals the plain NCDHW op bit for bit; with its padding frames and rows skipped (zero
    point 0) too."""
    require_host("x86.vpdpbusd")
    from unit_tvm.relax.cpu.qops import plain_func, tensorized_func
    from unit_tvm.relax.cpu.weights import pack_weight, plain_weight
    from unit_tvm.schedules.cpu import CpuConfig
    from unit_tvm.testing.reference import pack_nchwc, unpack_nchwc

    target = unit_tvm.target.host()
    blocked = _conv3d_recipe(window, stride, padding, in_block=16, out_block=16,
                             residual_block=16)
    flat = blocked.replace(in_block=None, out_block=None, residual_block=None)
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, flat.in_shape).astype("uint8")
    w = rng.integers(-127, 128, flat.w_shape).astype("int8")
    comp = np.zeros(32, "int32")  # x_zp = 0
    mult = rng.uniform(0.001, 0.004, 32).astype("float32")
    bias = rng.uniform(-1, 1, 32).astype("float32")
    res = rng.integers(0, 256, flat.out_shape).astype("uint8")
    want = _call_prim(plain_func(flat), [x, w, comp, mult, bias, res,
                                         np.zeros(flat.out_shape, "uint8")])
    assert 0 < want.mean() < 255  # neither all clipped nor all zero
    out = np.zeros(pack_nchwc(want, 16).shape, "uint8")
    intrin = intrinsics.get("x86.vpdpbusd")
    config = CpuConfig(unroll=unroll, parallel=2) if unroll else None
    func, blocks, _ = tensorized_func(blocked, intrin, target, config)
    if unroll:
        assert re.search(r"if i\d \+ rr >= 1 and i\d \+ rr < 7", func.script())
    got = _call_prim(func, [pack_nchwc(x, 16), pack_weight(blocked, w, blocks), comp, mult,
                            bias, pack_nchwc(res, 16), out])
    np.testing.assert_array_equal(unpack_nchwc(got), want)
    got = _call_prim(plain_func(blocked), [pack_nchwc(x, 16), plain_weight(blocked, w), comp,
                                           mult, bias, pack_nchwc(res, 16), out])
    np.testing.assert_array_equal(unpack_nchwc(got), want)
    # the shortcut reads the producer's blocks as they are: no copy of its input
    assert ('T.sblock("xq")' in func.script()) == any(padding)


class OutlierProduct(nn.Module):
    """(x * mask) @ (x^T * s): one entry of s is 10^4 times the others, in the row of the second
    operand that the masked feature of the first multiplies by zero. Per-tensor int8 of the
    second operand then rounds every entry that matters to zero."""

    def __init__(self):
        super().__init__()
        scale, mask = torch.ones(8, 12), torch.ones(8)
        scale[3, 5], mask[3] = 1e4, 0.0
        self.register_buffer("scale", scale)
        self.register_buffer("mask", mask)

    def forward(self, x):
        return (x * self.mask) @ (x.transpose(-1, -2) * self.scale)


def test_attention_matmul_that_int8_would_spoil_stays_fp32():
    """The accuracy guard: a matmul between activations whose int8 product strays from the
    fp32 one on the calibration inputs stays fp32 (reported with the reason), exactly as
    the fp32 model computes it."""
    from unit_tvm.relax.cpu import qbmm
    from unit_tvm.relax.core.leftovers import fp32_leftovers

    model = OutlierProduct().eval()
    cal, xs, refs = _prepare(model, (2, 12, 8), n_cal=2)
    x = np.stack(cal)
    y = np.swapaxes(x, -1, -2) * model.scale.numpy()
    x = x * model.mask.numpy()
    assert qbmm.fits_int8(x, y, 0.05, 128, qbmm.y_scale_of(y)) < qbmm.MIN_COSINE
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal,
                    attention="int8")
    assert not recipes(qmod)
    (left,) = fp32_leftovers(qmod)
    assert left.op.startswith("relax.matmul")
    for got, ref in zip(_run(build_relax(qmod, unit_tvm.target.host()), xs), refs):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)


class EmptyCache(nn.Module):
    """Keys appended to an empty cache as Hugging Face's decoders do (GPT-2, Llama): torch.cat
    skips an empty 1-D tensor whatever the other inputs' rank."""

    def forward(self, k):
        past = torch.zeros(0)
        return torch.cat([past, k], dim=-2) * 2.0, torch.cat([past, k, k], dim=-2)


def test_cat_with_an_empty_cache_translates():
    """TVM's translator refused the differing ranks; the frontend drops the empty inputs."""
    k = zoo.inputs((1, 2, 5, 4), 1)[0]
    mod = frontends.from_torch(EmptyCache(), [torch.tensor(k)])
    vm = relax.VirtualMachine(tvm.compile(mod, target=unit_tvm.target.host()), tvm.cpu())
    one, two = vm["main"](tvm.runtime.tensor(k))
    np.testing.assert_allclose(one.numpy(), k * 2.0)
    np.testing.assert_allclose(two.numpy(), np.concatenate([k, k], axis=-2))


class SmallMobileBlock(nn.Module):
    """A stem conv, a strided conv, a depthwise conv and a dense: every int8 kind a pre-VNNI
    host now tensorizes."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 48, 3, padding=1, stride=2), nn.ReLU(),
            nn.Conv2d(48, 48, 3, padding=1, groups=48), nn.ReLU(),
            nn.Flatten(), nn.Linear(48 * 6 * 6, 10))

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("level,pair,depthwise", [
    ("avx512_core", "x86.vpmaddubsw", "x86.vpunpck.vpmaddwd"),
    ("avx2", "x86.vpmaddubsw.256", "x86.vpunpck.vpmaddwd.256"),
])
def test_pre_vnni_hosts_tensorize_every_int8_op_exactly(level, pair, depthwise):
    """Held to Skylake-SP's level (AVX512BW, no VNNI) or to AVX2, an int8 model's convs and
    dense run on vpmaddubsw over weights the quantizer bounded for it (it would saturate on
    8-bit ones): the quad form where 8 input channels fill its block (weights bounded in
    quads), the pair form on the 3-channel stem (bounded in pairs: quads would pad it past
    selection's limit); its depthwise conv on the exact lanewise int16 form. The kernels equal
    the plain int8 loop nest of the same quantized module, and the model stays within cosine
    0.999 of float32."""
    quad = pair.replace("vpmaddubsw", "vpmaddubsw.quad")
    target = unit_tvm.target.restricted(level)
    if not intrinsics.get(pair).supported(target):
        pytest.skip(f"this CPU has no {pair} ({level} is above it)")
    model = SmallMobileBlock()
    cal, xs, refs = _prepare(model, (1, 3, 12, 12))
    mod = frontends.from_torch(model, [torch.tensor(xs[0])])
    qmod = quantize(mod, calibration_data=cal, target=target)
    forms = [(r.get("groups", 1), r.get("w_pair_bound"), r.get("w_pair_words"))
             for _, r in recipes(qmod)]
    assert forms == [(1, 128, None), (1, 128, 2), (48, None, None), (1, 128, 2)]
    tpass = UnitTensorize(target)
    got = _run(build_relax(tpass(qmod), target), xs)
    assert [instr for _, instr, _ in tpass.report] == [pair, quad, depthwise, quad], tpass.report
    assert all("est. cosine loss" in note for _, instr, note in tpass.report
               if instr in (pair, quad))
    want = _run(build_relax(qmod, target), xs)  # TVM's loops over the same int8 weights
    for g, w, r in zip(got, want, refs):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max())
        assert _cos(g, r) > 0.999
