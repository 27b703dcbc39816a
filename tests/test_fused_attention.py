"""Fused attention on CPUs (schedules/cpu_attention.py, relax/cpu/fused_attention.py): the kernel
against a numpy model of its bf16 rounding, torch's special values, and the graph rewrite on
attention spelled many ways."""

import math

import ml_dtypes
import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import te

import unit_tvm
from unit_tvm import frontends, intrinsics, lowering
from unit_tvm.relax import quantize
from unit_tvm.relax.cpu.fused_attention import KERNEL_NAME, fuse_attention, instruction
from unit_tvm.relax.quantization.ptq import inference_form
from unit_tvm.schedules import cpu_attention
from unit_tvm.testing import zoo
from unit_tvm.testing.attention import drawn_spelling

from .conftest import require_host
from .test_relax import _cos, _run
from .test_views import SEEDS, SplitHeads, _ops, drawn_attention


def _bf16(a):
    return a.astype(ml_dtypes.bfloat16).astype(np.float64)


def _reference(q, kt, v, scale, safe=True):
    """The kernel's arithmetic in float64: operands rounded to bf16, the exps rounded to bf16
    before their sum and the product (rows of -inf: 0 if safe, else NaN, as torch)."""
    s = (_bf16(q) @ _bf16(kt)) * scale
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        top = s.max(-1, keepdims=True)
        e = _bf16(np.exp(s - top))
        dead = np.isneginf(top)
        e = np.where(dead, 0.0, e)
        out = (e @ _bf16(v)) / e.sum(-1, keepdims=True)
        return np.where(dead, 0.0 if safe else np.nan, out)


def _build(shape, scale, safe, out_axes=None, instruction_name="x86.vdpbf16ps"):
    intrin = intrinsics.get(instruction_name)
    lanes = intrin.lanes
    tiles = cpu_attention.tiles_for(shape, lanes)
    b, m, d, n, dv = shape
    q, kt, v = (te.placeholder(s, "float32", name) for s, name in (
        ((b, m, d), "q"), ((b, d, n), "kt"), ((b, n, dv), "v")))
    read = cpu_attention.Operands(lambda h, i, c: q[h, i, c], lambda h, c, j: kt[h, c, j],
                                  lambda h, j, c: v[h, j, c])
    out = cpu_attention.attention_te(read, shape, tiles, scale, safe, lanes,
                                     intrin.reduction_width, intrin.input_dtypes[0], out_axes)
    func = cpu_attention.schedule(te.create_prim_func([q, kt, v, out]), tiles, intrin, lanes)
    return lowering.build(tvm.IRModule({"main": func}), unit_tvm.target.host())


def _call(lib, arrays, out_shape):
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a.astype(np.float32), dev) for a in arrays]
    args.append(tvm.runtime.tensor(np.zeros(out_shape, np.float32), dev))
    lib(*args)
    return args[-1].numpy()


# (batch, rows, depth, keys, v_depth): Whisper-like blocks, rows and keys padded (61 and 37
# tokens), a head depth of 8 (four pairs), keys fewer than one block, one query row, one task
# (a single head of one register tile of rows: TVM's StorageRewrite then folded E x V's
# accumulator tile into the dead K pack, and the kernel failed to lower)
SHAPES = [(2, 64, 64, 64, 64), (3, 61, 32, 37, 16), (2, 7, 8, 5, 32), (1, 1, 2, 1, 16),
          (2, 40, 16, 130, 48), (1, 4, 64, 17, 16)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("out_axes", [None, (1, 0, 2)])
def test_kernel_equals_its_bf16_arithmetic(shape, out_axes):
    """The fused kernel equals softmax(Q K^T * scale) V computed in float64 from the same
    bf16-rounded values, whatever the padding of rows and keys and the result's axis order;
    an index off by one row, key or head would be far outside the tolerance."""
    require_host("x86.vdpbf16ps")
    shape = cpu_attention.AttentionShape(*shape)
    b, m, d, n, dv = shape
    rng = np.random.default_rng(sum(shape))
    q, kt, v = (rng.standard_normal(s) for s in ((b, m, d), (b, d, n), (b, n, dv)))
    scale = 1 / math.sqrt(d)
    want = _reference(q, kt, v, scale)
    axes = out_axes or (0, 1, 2)
    got = _call(_build(shape, scale, True, out_axes), (q, kt, v), [want.shape[a] for a in axes])
    got = got.transpose(np.argsort(axes))
    # what is left: float32 sums and exp (2e-7), and an exp that rounds to the other bf16
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-3 * np.abs(want).max())
    assert _cos(got, want) > 0.99999


def _drawn_shapes(seed, count):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield (cpu_attention.AttentionShape(
            int(rng.choice([1, 2, 3, 5])), int(rng.choice([1, 3, 4, 17, 33, 64, 100])),
            int(rng.choice([2, 6, 8, 24, 64, 80])), int(rng.choice([1, 2, 15, 16, 17, 65, 130])),
            int(rng.choice([16, 48, 64, 80]))), [None, (1, 0, 2)][int(rng.integers(0, 2))],
            bool(rng.integers(0, 2)))


def test_drawn_shapes_equal_their_bf16_arithmetic():
    """Sixteen drawn shapes (heads, rows, depths and keys of every residue, one task or many,
    the result permuted or not, safe or plain softmax) against the float64 model: the way the
    single-task failure of 1 x 4 x 64 x 17 was found (60 such shapes, 4 failed)."""
    require_host("x86.vdpbf16ps")
    for n, (shape, axes, safe) in enumerate(_drawn_shapes(7, 16)):
        b, m, d, keys, dv = shape
        rng = np.random.default_rng(n)
        q, kt, v = (rng.standard_normal(s) for s in ((b, m, d), (b, d, keys), (b, keys, dv)))
        want = _reference(q, kt, v, 1 / math.sqrt(d), safe)
        order = axes or (0, 1, 2)
        got = _call(_build(shape, 1 / math.sqrt(d), safe, axes), (q, kt, v),
                    [want.shape[a] for a in order]).transpose(np.argsort(order))
        assert _cos(got, want) > 0.99999, (shape, axes, safe)
        np.testing.assert_allclose(got, want, rtol=0, atol=4e-3 * np.abs(want).max())


@pytest.mark.parametrize("safe", [True, False])
def test_special_values_as_torch(safe):
    """A row whose scores are all -inf gives 0 (torch's safe softmax) or NaN (a plain
    softmax); a NaN in Q makes its row NaN; +inf scores make their row NaN (inf - inf); the
    other rows are unaffected."""
    require_host("x86.vdpbf16ps")
    shape = cpu_attention.AttentionShape(2, 8, 16, 24, 16)
    rng = np.random.default_rng(5)
    q, v = rng.standard_normal((2, 8, 16)), rng.standard_normal((2, 24, 16))
    kt = np.abs(rng.standard_normal((2, 16, 24))) + 0.5  # every key's first element > 0
    q[0, 1, 0] = -np.inf  # row 1 of head 0: every score -inf
    q[1, 2, 3] = np.nan  # row 2 of head 1: NaN
    q[1, 5, 0] = np.inf  # row 5 of head 1: every score +inf
    got = _call(_build(shape, 0.25, safe), (q, kt, v), (2, 8, 16))
    with torch.no_grad():
        s = torch.tensor(_bf16(q) @ _bf16(kt)) * 0.25
        p = torch.ops.aten._safe_softmax(s, -1) if safe else torch.softmax(s, -1)
    assert np.all(got[0, 1] == 0) if safe else np.all(np.isnan(got[0, 1]))
    assert np.all(np.isnan(got[1, 2])) and np.all(np.isnan(got[1, 5]))
    assert torch.isnan(p[1, 2]).all() and torch.isnan(p[1, 5]).all()
    live = np.ones((2, 8), bool)
    live[0, 1] = live[1, 2] = live[1, 5] = False
    want = _reference(q, kt, v, 0.25, safe)
    np.testing.assert_allclose(got[live], want[live], atol=4e-3 * np.abs(want[live]).max())


def _fused_kernels(mod):
    return [gv.name_hint for gv in mod.functions if gv.name_hint.startswith(KERNEL_NAME)]


def _softmaxes(mod):
    """The softmaxes and attention matmuls left outside a fused kernel: Relax ops, or kernels
    of their own (torch's safe softmax as one te kernel, a float32 matmul on its own)."""
    kernels = [gv.name_hint for gv, f in mod.functions.items()
               if isinstance(f, tvm.tirx.PrimFunc) and ("softmax" in gv.name_hint
                                                       or gv.name_hint.startswith("qbmm"))]
    return [n for n in _ops(mod) if "softmax" in n or n == "relax.matmul"] + kernels


@pytest.mark.parametrize("seed", SEEDS)
def test_drawn_spellings_fused_equal_fp32_attention(seed, monkeypatch):
    """Attention spelled six drawn ways (relax/core/views.py's test models: heads split, sliced,
    transposed and merged differently, Q scaled or the scores): every one becomes one fused
    kernel reading its operands in place (no matmul or softmax left), and the built module is
    as close to the fp32-attention module as bf16 rounding allows. (The size policy is turned
    off: at 16 tokens separate kernels are the faster choice.)"""
    require_host("x86.vdpbf16ps")
    monkeypatch.setattr(cpu_attention, "MIN_SCORES_BYTES", 0)
    mod, cal, xs = drawn_attention(seed)
    host = unit_tvm.target.host()
    qmod = quantize(mod, calibration_data=cal, attention="bf16")
    assert len(_fused_kernels(qmod)) == 1 and not _softmaxes(qmod), _softmaxes(qmod)
    layout = {"relax.permute_dims", "relax.take", "relax.split", "relax.strided_slice",
              "relax.squeeze"} & set(_ops(qmod))
    # the operands read where the projections left them (through x[i], split and chunk too;
    # batch 2 too, whose batch and head axes do not merge), the result written merged; only
    # the interleaved merge is not a view of the result
    spelling = drawn_spelling(seed)
    if spelling.mask == "padding":  # the mask's own reading of the input's first feature
        layout -= {"relax.take", "relax.strided_slice"}
    interleaved = spelling.merge == "interleave"
    assert layout == ({"relax.permute_dims"} if interleaved else set()), layout
    fp32 = _run(tvm.compile(quantize(mod, calibration_data=cal, attention="fp32"), target=host),
                xs)
    for got, other in zip(_run(unit_tvm.compiler.build_relax(qmod, host), xs), fp32):
        assert _cos(got, other) > 0.9999
        np.testing.assert_allclose(got, other, atol=2e-2 * np.abs(other).max())


class LongAttention(nn.Module):
    """torch's scaled_dot_product_attention over `tokens` tokens, 4 heads of 16."""

    def __init__(self, tokens):
        super().__init__()
        self.tokens = tokens
        self.qkv = nn.Linear(64, 192)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, 4, 16).permute(2, 0, 3, 1, 4)
        o = nn.functional.scaled_dot_product_attention(q, k, v)
        return o.transpose(1, 2).reshape(b, s, 64)


@pytest.mark.parametrize("tokens,fused", [(256, True), (128, False)])
def test_fusion_where_scores_outgrow_the_caches(tokens, fused):
    """SDPA (torch's safe softmax) is fused where its scores reach MIN_SCORES_BYTES (4 heads x
    256 x 256 float32: 1 MiB) and left to separate kernels below (128 tokens)."""
    require_host("x86.vdpbf16ps")
    model = LongAttention(tokens).eval()
    x = torch.tensor(zoo.inputs((1, tokens, 64), 1, seed=3)[0])
    mod = inference_form(frontends.from_torch(model, [x]))
    out = fuse_attention(mod, unit_tvm.target.host())
    assert bool(_fused_kernels(out)) == fused
    if fused:
        with torch.no_grad():
            want = model(x).numpy()
        got = _run(unit_tvm.compiler.build_relax(out, unit_tvm.target.host()), [x.numpy()])[0]
        assert _cos(got, want) > 0.9999


class MaskedAttention(SplitHeads):
    """SplitHeads with a mask added to its scores, as `kind` says: "triu" (a constant, -1e4
    above the diagonal, added after the scale, as older Hugging Face decoders do),
    "sdpa_causal" (torch's SDPA with is_causal: -inf above the diagonal, a safe softmax),
    "sdpa_mask" (SDPA with an additive mask computed from the input: float32's lowest on the
    keys whose first feature is below -0.5, [batch, 1, 1, keys]), "masked_fill" (nanoGPT's
    causal mask: a buffer of ones below the diagonal, the rest of the scores filled with -inf),
    "where_keep" (older Hugging Face GPT-2: torch.where(causal, scores, float32's lowest)),
    "before_scale" (the mask added before the scale: the scale would apply to it too, not the
    pattern)."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.register_buffer("tril", torch.tril(torch.ones(24, 24)).view(1, 1, 24, 24))

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = (m(x).view(b, s, self.heads, self.d).transpose(1, 2)
                   for m in (self.q, self.k, self.v))
        if self.kind.startswith("sdpa"):
            padded = (x[:, :, 0] < -0.5) & (torch.arange(s) > 0)
            mask = torch.where(padded, torch.finfo(torch.float32).min, 0.0)[:, None, None, :]
            att = nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=self.kind == "sdpa_causal",
                attn_mask=mask if self.kind == "sdpa_mask" else None)
        elif self.kind in ("masked_fill", "where_keep"):
            scores = torch.matmul(q, k.transpose(-1, -2)) / self.d ** 0.5
            causal = self.tril[:, :, :s, :s]
            scores = (scores.masked_fill(causal == 0, float("-inf")) if self.kind == "masked_fill"
                      else torch.where(causal.bool(), scores, torch.finfo(torch.float32).min))
            att = torch.matmul(torch.softmax(scores, -1), v)
        else:
            mask = torch.triu(torch.full((s, s), -1e4), 1)
            scores = torch.matmul(q, k.transpose(-1, -2))
            scores = (scores / self.d ** 0.5 + mask if self.kind == "triu"
                      else (scores + mask) / self.d ** 0.5)
            att = torch.matmul(torch.softmax(scores, -1), v)
        return self.out(att.transpose(1, 2).reshape(b, s, h))


@pytest.mark.parametrize("kind", ["triu", "sdpa_causal", "sdpa_mask", "masked_fill",
                                  "where_keep", "before_scale"])
@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_masked_attention_fused_equals_torch(kind, precision, monkeypatch):
    """A mask on the scaled scores (added: a constant, or computed from the input at run time
    and broadcast over heads and rows; or a condition whose scores a scalar replaces, either
    way round) is read by the fused kernel: one kernel, no softmax
    left, in bf16 and int8 alike, and the model stays as close to torch as the unmasked one (a
    mask read at the wrong head, row or key would move the padded and future keys' weights).
    Added before the scale it is not the pattern: separate kernels, still right."""
    require_host("x86.vdpbf16ps" if precision == "bf16" else "x86.vpdpbusd")
    monkeypatch.setattr(cpu_attention, "MIN_SCORES_BYTES", 0)
    model = zoo._randomize(MaskedAttention(kind), 5).eval()
    x = torch.tensor(zoo.inputs((2, 24, 64), 1, seed=6)[0])
    assert (x[:, 1:, 0] < -0.5).any(axis=1).all()  # both inputs have padded keys
    mod = frontends.from_torch(model, [x])
    host = unit_tvm.target.host()
    if precision == "bf16":
        out = fuse_attention(inference_form(mod), host)
    else:
        out = quantize(mod, calibration_data=[x.numpy()])
    fused = kind != "before_scale"
    assert bool(_fused_kernels(out)) == fused
    assert ("relax.nn.softmax" in _softmaxes(out)) != fused
    with torch.no_grad():
        want = model(x).numpy()
    got = _run(unit_tvm.compiler.build_relax(out, host), [x.numpy()])[0]
    assert _cos(got, want) > (0.9999 if precision == "bf16" else 0.999)


def test_instruction_is_a_vector_bf16_dot_product():
    """The kernel's instruction: x86.vdpbf16ps where the target has AVX512-BF16 (also on AMX
    hosts: the tile instructions are not this schedule's), none on other targets."""
    bf16 = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"})
    assert instruction(bf16).name == "x86.vdpbf16ps"
    assert instruction(tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})) is None
    assert instruction(tvm.target.Target({"kind": "cuda", "arch": "sm_80"})) is None


class WideScale(nn.Module):
    """K scaled by a constant of shape [1, 1, 1, 1] before its transpose: the multiply adds an
    axis to 3-D heads, so the transpose after it counts one more axis than its input has."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(64, 192)
        self.register_buffer("c", torch.full((1, 1, 1, 1), 0.25))

    def forward(self, x):
        q, k, v = (t.reshape(4, 16, 16) for t in self.qkv(x[0]).split(64, -1))
        kt = (k * self.c).transpose(-1, -2)  # [1, 4, 16, 16], the last two axes swapped
        att = torch.softmax(torch.matmul(q.reshape(1, 4, 16, 16), kt), -1)
        return torch.matmul(att, v.reshape(1, 4, 16, 16)).transpose(1, 2).reshape(1, 16, 64)


def test_scale_that_adds_axes_is_read_as_it_is(monkeypatch):
    """Such a multiply is not folded into the kernel's scale (the views after it would be
    composed over the wrong axes: the pass stopped with "cannot reshape"): the kernel reads its
    result, and the model stays right."""
    require_host("x86.vdpbf16ps")
    monkeypatch.setattr(cpu_attention, "MIN_SCORES_BYTES", 0)
    model = WideScale().eval()
    zoo._randomize(model, 4)
    x = torch.tensor(zoo.inputs((1, 16, 64), 1, seed=4)[0])
    out = fuse_attention(inference_form(frontends.from_torch(model, [x])),
                         unit_tvm.target.host())
    assert _fused_kernels(out)
    with torch.no_grad():
        want = model(x).numpy()
    got = _run(unit_tvm.compiler.build_relax(out, unit_tvm.target.host()), [x.numpy()])[0]
    assert _cos(got, want) > 0.9999
