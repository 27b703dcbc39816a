"""relax/frontend/conv1d_lift.py and the broadcast-weight matmul repair (frontend_fixes.py): conv1d
becomes a conv2d of height 1 with the elementwise ops after it kept 4-D, and the values are
those of the module before (TVM's own float32 build of both); in a quantized model every such
conv and nn.MultiheadAttention's projections run int8 on the instruction, against PyTorch."""

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

import unit_tvm
from unit_tvm import frontends
from unit_tvm.relax.frontend.conv1d_lift import conv1d_as_conv2d
from unit_tvm.relax.frontend.fixes import frontend_fixes

from .conftest import require_host
from .test_views import _ops


def _run(mod, *xs):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*(tvm.runtime.tensor(x) for x in xs))
    return out.numpy() if hasattr(out, "numpy") else out[0].numpy()


class _Chain(nn.Module):
    """conv1d -> bias -> GELU -> conv1d (strided, dilated) -> batch norm -> + residual conv
    -> ReLU -> a transpose that reads the 3-D value."""

    def __init__(self, groups=1):
        super().__init__()
        self.a = nn.Conv1d(8, 16, 3, padding=1)
        self.b = nn.Conv1d(16, 16, 5, stride=2, padding=4, dilation=2, groups=groups)
        self.bn = nn.BatchNorm1d(16)
        self.skip = nn.Conv1d(8, 16, 1, stride=2, bias=False)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        y = self.bn(self.b(nn.functional.gelu(self.a(x))))
        return torch.relu(y + self.skip(x)).transpose(1, 2)


@pytest.mark.parametrize("groups", [1, 16])
def test_conv1d_chain_lifted_with_same_values(groups):
    torch.manual_seed(0)
    model = _Chain(groups).eval()
    x = np.random.default_rng(0).standard_normal((1, 8, 37)).astype("float32")
    mod = frontends.from_torch(model, [torch.tensor(x)])
    lifted = frontend_fixes(mod)
    ops = _ops(lifted)
    assert "relax.nn.conv1d" not in ops and ops.count("relax.nn.conv2d") == 3
    # one squeeze, for the transpose: the GELU, batch norm, residual add and ReLU stay 4-D
    assert ops.count("relax.squeeze") == 1, ops
    want = model(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(_run(lifted, x), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_run(lifted, x), _run(mod, x), rtol=1e-5, atol=1e-5)


def _conv1d_module(x_shape, w_shape, **attrs):
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    w = relax.const(np.random.default_rng(1).standard_normal(w_shape).astype("float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv1d(x, w, **attrs))
        bb.emit_func_output(out)
    return bb.get()


def test_asymmetric_padding_and_broadcast_operands():
    """padding (2, 1), stride 3, dilation 2, groups 2; then + a (C, W) matrix (rank 2: the new
    axis before its last), * a row over time (rank 1: as it is) and - a scalar."""
    mod = _conv1d_module((1, 8, 23), (6, 4, 3), strides=3, padding=(2, 1), dilation=2, groups=2)
    func = mod["main"]
    rng = np.random.default_rng(5)
    col, row = (relax.const(rng.standard_normal(s).astype("float32")) for s in ((6, 8), (8,)))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 23), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(relax.Call(func.body.blocks[0].bindings[0].value.op,
                                   [x, func.body.blocks[0].bindings[0].value.args[1]],
                                   func.body.blocks[0].bindings[0].value.attrs))
            y = bb.emit(relax.op.multiply(bb.emit(relax.op.add(c, col)), row))
            out = bb.emit_output(relax.op.subtract(y, relax.const(0.5, "float32")))
        bb.emit_func_output(out)
    mod = bb.get()
    lifted = conv1d_as_conv2d(mod)
    assert _ops(lifted).count("relax.squeeze") == 1 and "relax.nn.conv1d" not in _ops(lifted)
    x = rng.standard_normal((1, 8, 23)).astype("float32")
    got, want = _run(lifted, x), _run(mod, x)
    assert got.shape == want.shape == (1, 6, 8)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_other_layouts_left_alone():
    mod = _conv1d_module((1, 20, 8), (16, 8, 3), data_layout="NWC", kernel_layout="OIW")
    assert "relax.nn.conv1d" in _ops(conv1d_as_conv2d(mod))


def test_a_rank_4_operand_is_not_lifted_through():
    """conv1d's (1, 4, 9) result plus a (2, 1, 4, 9) tensor is rank 4: squeezing the height
    axis out of that sum would be wrong, so the add reads the squeeze."""
    x = relax.Var("x", relax.TensorType((1, 3, 9), "float32"))
    y = relax.Var("y", relax.TensorType((2, 1, 4, 9), "float32"))
    w = relax.const(np.ones((4, 3, 1), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv1d(x, w))
            out = bb.emit_output(relax.op.add(c, y))
        bb.emit_func_output(out)
    mod = bb.get()
    lifted = conv1d_as_conv2d(mod)
    rng = np.random.default_rng(2)
    xs = rng.standard_normal((1, 3, 9)).astype("float32"), rng.standard_normal(
        (2, 1, 4, 9)).astype("float32")
    assert _run(lifted, *xs).shape == (2, 1, 4, 9)
    np.testing.assert_allclose(_run(lifted, *xs), _run(mod, *xs), rtol=1e-5, atol=1e-5)


def _broadcast_matmul_module(x_shape, w_shape, batch, x_batch):
    """matmul(broadcast_to(x, x_batch + rows), broadcast_to(w, batch + w's shape))."""
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    w = relax.const(np.random.default_rng(3).standard_normal(w_shape).astype("float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            xb = bb.emit(relax.op.broadcast_to(x, (*x_batch, *x_shape[-2:])))
            wb = bb.emit(relax.op.broadcast_to(w, (*batch, *w_shape)))
            out = bb.emit_output(relax.op.matmul(xb, wb))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("x_shape, x_batch, batch, broadcasts_left", [
    ((30, 1, 16), (30,), (30,), 0),  # torch's expand + bmm of a linear layer: both go
    ((1, 1, 16), (30,), (30,), 1),  # x broadcast to 30: that broadcast stays, the weight's goes
    ((30, 1, 16), (30,), (2, 30), 1),  # the weight's adds an axis x lacks: kept (x's is a no-op)
])
def test_broadcast_weight_matmul(x_shape, x_batch, batch, broadcasts_left):
    mod = _broadcast_matmul_module(x_shape, (16, 24), batch, x_batch)
    fixed = frontend_fixes(mod)
    assert _ops(fixed).count("relax.broadcast_to") == broadcasts_left
    x = np.random.default_rng(4).standard_normal(x_shape).astype("float32")
    got, want = _run(fixed, x), _run(mod, x)
    assert got.shape == want.shape == (*batch, x_shape[-2], 24)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


class _SpeechBlock(nn.Module):
    """Two conv1d (the second strided) with GELU, then torch's own transformer layer (batch
    first: nn.MultiheadAttention projects a non-contiguous 3-D input)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(20, 64, 3, padding=1)
        self.c2 = nn.Conv1d(64, 64, 3, stride=2, padding=1)
        self.layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, activation="gelu",
                                                batch_first=True)

    def forward(self, x):
        x = nn.functional.gelu(self.c2(nn.functional.gelu(self.c1(x))))
        return self.layer(x.transpose(1, 2))


def test_speech_block_runs_int8_on_the_instruction():
    require_host("x86.vpdpbusd")
    torch.manual_seed(0)
    model = _SpeechBlock().eval()
    xs = [np.random.default_rng(i).standard_normal((1, 20, 64)).astype("float32")
          for i in range(6)]
    report = []
    ex = unit_tvm.compile(frontends.from_torch(model, [torch.tensor(xs[0])]),
                          quantize={"calibration_data": xs[:4]}, report=report)
    left = [row for row in report if row[1] is None and "conv" in str(row[0]) + str(row[2])]
    assert not left, left
    assert not [row for row in report if "constant operand" in str(row[2])], report
    assert sum("conv2d" in str(row[0]) and row[1] is not None for row in report) == 2, report
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for x in xs[4:]:
        want = model(torch.tensor(x)).detach().numpy()
        got = vm["main"](tvm.runtime.tensor(x))
        got = got.numpy() if hasattr(got, "numpy") else got[0].numpy()
        cos = float((want * got).sum() / np.linalg.norm(want) / np.linalg.norm(got))
        assert cos > 0.999, cos


class _MaskedAttention(nn.Module):
    """scaled_dot_product_attention with an additive mask (torch's safe softmax inside)."""

    def forward(self, q, k, v, mask):
        return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_safe_softmax_same_values_with_masked_rows_and_nans():
    """Rows all -inf give 0 (not NaN), a row of -inf and a NaN keeps torch's NaN, the rest
    are the softmax: the rewritten module and the imported one agree everywhere."""
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((1, 2, 5, 8)).astype("float32") for _ in range(3))
    mask = np.zeros((1, 2, 5, 5), "float32")
    mask[0, 0, 1, :] = -np.inf  # every key masked: 0 out
    mask[0, 1, 3, :2] = -np.inf  # some masked
    mask[0, 1, 4, :] = -np.inf
    mask[0, 1, 4, 2] = np.nan  # -inf and a NaN: NaN out, as torch gives
    args = [torch.tensor(a) for a in (q, k, v, mask)]
    mod = frontends.from_torch(_MaskedAttention().eval(), args)
    fixed = frontend_fixes(mod)
    assert "relax.logical_not" in _ops(mod) and "relax.logical_not" not in _ops(fixed)
    got, before = _run(fixed, q, k, v, mask), _run(mod, q, k, v, mask)
    want = _MaskedAttention()(*args).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[0, 1, 4]).all() and (got[0, 0, 1] == 0).all()
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[ok], before[ok], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tokens", [48, 60])
def test_safe_softmax_compiled_by_unit_tvm(tokens):
    """The same through unit_tvm.compile, whose default CPU schedule runs the kernel row by row
    (48 tokens: 16-lane partial sums; 60: 4-lane ones), with masked rows among 96."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 2, tokens, 8)).astype("float32") for _ in range(3))
    mask = np.where(rng.random((1, 2, tokens, tokens)) < 0.3, -np.inf, 0).astype("float32")
    mask[0, 1, 5, :] = -np.inf
    args = [torch.tensor(a) for a in (q, k, v, mask)]
    ex = unit_tvm.compile(frontends.from_torch(_MaskedAttention().eval(), args))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    got = vm["main"](*(tvm.runtime.tensor(a) for a in (q, k, v, mask)))
    got = got.numpy() if hasattr(got, "numpy") else got[0].numpy()
    want = _MaskedAttention()(*args).numpy()
    assert not np.isnan(got).any() and (got[0, 1, 5] == 0).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["whisper_encoder", "wav2vec2_base"])
def test_speech_zoo_models_int8(name):
    """The zoo's speech encoders: every conv, dense layer and attention matmul on an
    instruction (a float32 leftover is a report row without one) and the output within cosine
    0.999 of PyTorch fp32."""
    require_host("x86.vpdpbusd")
    from unit_tvm.testing import zoo

    model, shape = zoo.get(name)
    xs = zoo.inputs(shape, 5)
    report = []
    ex = unit_tvm.compile(frontends.from_torch(model, [torch.tensor(xs[0])]),
                          quantize={"calibration_data": xs[:4]}, report=report)
    assert report and all(row[1] is not None for row in report), report
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(xs[4]))
    got = got.numpy() if hasattr(got, "numpy") else got[0].numpy()
    with torch.no_grad():
        want = model(torch.tensor(xs[4])).numpy()
    cos = float((want * got).sum() / np.linalg.norm(want) / np.linalg.norm(got))
    assert cos > 0.999, cos


@pytest.mark.parametrize("shape, groups", [
    ((2, 6, 11), 6),  # wav2vec2's: one channel per group over time
    ((1, 4, 5, 7), 4),  # an instance norm of an image
    ((1, 6, 11), 3),  # two channels per group: left as it is
])
def test_channel_group_norm_as_layer_norm(shape, groups):
    torch.manual_seed(1)
    norm = nn.GroupNorm(groups, shape[1]).eval()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    x = np.random.default_rng(8).standard_normal(shape).astype("float32") * 3 + 1
    mod = frontends.from_torch(norm, [torch.tensor(x)])
    fixed = frontend_fixes(mod)
    assert ("relax.nn.group_norm" in _ops(fixed)) == (groups != shape[1])
    want = norm(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(_run(fixed, x), want, rtol=1e-4, atol=1e-4)
