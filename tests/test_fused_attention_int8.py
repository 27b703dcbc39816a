"""The int8 fused attention (schedules/cpu_attention_int8.py, quantize's attention="int8"):
the kernel against a numpy model of its arithmetic, against float attention, with special
values, and in a model."""

import math

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import unit_tvm
from unit_tvm import frontends, intrinsics
from unit_tvm.relax import quantize
from unit_tvm.relax.cpu.attention_check import int8_attention
from unit_tvm.relax.cpu.fused_attention import instruction
from unit_tvm.schedules import cpu_attention
from unit_tvm.testing import zoo

from .conftest import require_host
from .test_fused_attention import (LongAttention, _build, _call, _drawn_shapes, _fused_kernels,
                                   _softmaxes)
from .test_relax import _cos, _run

VPDPBUSD = "x86.vpdpbusd"


def _check(got, want, v):
    # an exp at a code's rounding boundary may round to the next code (the kernel's exp is
    # good to bf16's precision): a few codes of 1/255 of a row's weight, times |V|
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-2 * np.abs(v).max())
    assert _cos(got, want) > 0.9999


@pytest.mark.parametrize("out_axes", [None, (1, 0, 2)])
def test_kernel_equals_its_int8_arithmetic_and_stays_close_to_float(out_axes):
    """Whisper-like blocks and a padded shape (61 rows, 37 keys): the kernel equals the numpy
    model of its arithmetic (an index off by one row, key or head would be far outside the
    tolerance) and float64 attention to a cosine of 0.999."""
    require_host(VPDPBUSD)
    for shape in [(2, 64, 64, 64, 64), (3, 61, 32, 37, 16)]:
        shape = cpu_attention.AttentionShape(*shape)
        b, m, d, n, dv = shape
        rng = np.random.default_rng(sum(shape))
        q, kt, v = (rng.standard_normal(s) for s in ((b, m, d), (b, d, n), (b, n, dv)))
        scale = 1 / math.sqrt(d)
        axes = out_axes or (0, 1, 2)
        want = int8_attention(q, kt, v, scale)
        got = _call(_build(shape, scale, True, out_axes, VPDPBUSD), (q, kt, v),
                    [want.shape[a] for a in axes]).transpose(np.argsort(axes))
        _check(got, want, v)
        exact = torch.softmax(torch.tensor(q @ kt * scale), -1).numpy() @ v
        assert _cos(got, exact) > 0.999


@pytest.mark.parametrize("name", [VPDPBUSD, "x86.vpdpbusd.256"])
def test_drawn_shapes_equal_their_int8_arithmetic(name):
    """Eight drawn shapes (heads, rows, depths and keys of every residue the instruction's
    words allow, the result permuted or not) against the numpy model, with 16 lanes and with
    AVX-VNNI's 8 (the instruction Alder Lake's cores get)."""
    require_host(name)
    intrin = unit_tvm.intrinsics.get(name)
    drawn = [(s, a) for s, a, _ in _drawn_shapes(11, 24)
             if cpu_attention.fits(s, intrin.lanes, intrin.reduction_width)][:8]
    assert len(drawn) == 8
    for n, (shape, axes) in enumerate(drawn):
        b, m, d, keys, dv = shape
        rng = np.random.default_rng(n)
        q, kt, v = (rng.standard_normal(s) for s in ((b, m, d), (b, d, keys), (b, keys, dv)))
        want = int8_attention(q, kt, v, 1 / math.sqrt(d))
        order = axes or (0, 1, 2)
        got = _call(_build(shape, 1 / math.sqrt(d), True, axes, name), (q, kt, v),
                    [want.shape[a] for a in order]).transpose(np.argsort(order))
        _check(got, want, v)


def test_special_values_are_quantized_as_int8_ops_quantize_them():
    """NaN and infinite inputs follow int8 quantization (NaN to code 0, infinities clipped to
    the ends), and the head's scale counts only its finite values: every result is finite and
    equals the numpy model; a head without special values is untouched by another's."""
    require_host(VPDPBUSD)
    shape = cpu_attention.AttentionShape(2, 8, 16, 24, 16)
    rng = np.random.default_rng(5)
    q, kt, v = (rng.standard_normal(s) for s in ((2, 8, 16), (2, 16, 24), (2, 24, 16)))
    q[1, 2, 3], q[1, 5, 0], kt[1, 4, 7], v[1, 3, 2] = np.nan, np.inf, -np.inf, np.nan
    got = _call(_build(shape, 0.25, True, None, VPDPBUSD), (q, kt, v), (2, 8, 16))
    assert np.isfinite(got).all()
    want = int8_attention(q, kt, v, 0.25)
    _check(got, want, np.nan_to_num(v, posinf=0, neginf=0))
    clean = [a.copy() for a in (q, kt, v)]
    for a in clean:
        a[1] = 1.0
    np.testing.assert_array_equal(
        _call(_build(shape, 0.25, True, None, VPDPBUSD), clean, (2, 8, 16))[0], got[0])


def test_int8_attention_in_a_model():
    """quantize(attention="int8") fuses SDPA at 256 tokens into one kernel on vpdpbusd (no
    softmax or matmul left) and the model stays within int8 rounding of torch's."""
    require_host(VPDPBUSD)
    assert instruction(unit_tvm.target.host(), "int8").name == VPDPBUSD
    model = LongAttention(256).eval()
    zoo._randomize(model, 3)
    cal = zoo.inputs((1, 256, 64), 2, seed=1)
    x = zoo.inputs((1, 256, 64), 1, seed=3)[0]
    mod = frontends.from_torch(model, [torch.tensor(x)])
    qmod = quantize(mod, calibration_data=cal, attention="int8")
    kernels = _fused_kernels(qmod)
    assert len(kernels) == 1 and not _softmaxes(qmod), _softmaxes(qmod)
    info = qmod[kernels[0]].attrs["unit_tvm.kernel_info"]
    assert str(info["instruction"]) == VPDPBUSD
    with torch.no_grad():
        want = model(torch.tensor(x)).numpy()
    got = _run(unit_tvm.compiler.build_relax(qmod, unit_tvm.target.host()), [x])[0]
    assert _cos(got, want) > 0.999


def test_int8_attention_needs_the_instruction():
    """An exact u8 x s8 dot product: vpdpbusd, or without VNNI the int16 vpmaddwd form (never
    the vpmaddubsw pair form, which saturates for u8 >= 128: Q's and P's codes reach 255);
    none without AVX2 (Sandy Bridge) or on a GPU target: no int8 kernel."""
    assert instruction(tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"}),
                       "int8").name == "x86.vpmaddwd"
    assert instruction(tvm.target.Target({"kind": "llvm", "mcpu": "sandybridge"}),
                       "int8") is None
    assert instruction(tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake"}),
                       "int8").name == VPDPBUSD
    assert instruction(tvm.target.Target({"kind": "llvm", "mcpu": "alderlake"}),
                       "int8").name == "x86.vpdpbusd.256"
    assert instruction(tvm.target.Target({"kind": "cuda", "arch": "sm_80"}), "int8") is None


def test_long_attention_defaults_to_int8_where_the_cpu_has_vnni():
    """quantize's default: long attention in int8 in an int8 model where the target has an
    exact u8 x s8 dot product (its other attention matmuls as default_attention), as
    default_attention in a bf16 model or without one."""
    from unit_tvm.relax.quantization.ptq import default_attention, default_fused_attention

    vnni = tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake"})
    plain = tvm.target.Target({"kind": "llvm", "mcpu": "sandybridge"})  # AVX, no AVX2
    assert default_fused_attention(vnni) == "int8"
    assert default_fused_attention(vnni, "bfloat16") == default_attention(vnni) == "fp32"
    assert default_fused_attention(plain) == "fp32"
    assert default_fused_attention(tvm.target.Target({"kind": "llvm",
                                                      "mcpu": "skylake-avx512"})) == "int8"
    require_host(VPDPBUSD)
    model = LongAttention(256).eval()
    x = zoo.inputs((1, 256, 64), 1, seed=3)[0]
    qmod = quantize(frontends.from_torch(model, [torch.tensor(x)]),
                    calibration_data=zoo.inputs((1, 256, 64), 1, seed=1))
    info = qmod[_fused_kernels(qmod)[0]].attrs["unit_tvm.kernel_info"]
    assert str(info["instruction"]) == VPDPBUSD


def _sharp_attention(sharpness):
    """LongAttention at 256 tokens whose Q and K projections are scaled by `sharpness`."""
    model = zoo._randomize(LongAttention(256).eval(), 3)
    with torch.no_grad():
        model.qkv.weight[:128] *= sharpness
    return model


def _attention_kernel_instruction(qmod):
    kernels = _fused_kernels(qmod)
    assert len(kernels) <= 1
    return str(qmod[kernels[0]].attrs["unit_tvm.kernel_info"]["instruction"]) if kernels else ""


@pytest.mark.parametrize("mcpu,fallback", [(None, "x86.vdpbf16ps"), ("cascadelake", "")])
def test_sharp_attention_is_not_fused_in_int8(mcpu, fallback):
    """The accuracy guard (relax/cpu/attention_check.py): where the int8 kernel's arithmetic
    strays from float attention on the calibration inputs (Q and K scaled 6x: cosine 0.9958;
    unscaled 0.9997), the default quantize fuses that attention in bf16 where the target has
    the bf16 kernel (the model then within 0.9997 of the one with fp32 attention; the int8
    kernel's rounding would add to what the int8 projections lose) and leaves it to separate
    fp32 kernels where it has not (Cascade Lake: VNNI without BF16); the same model unscaled
    keeps the int8 kernel."""
    require_host(VPDPBUSD)
    target = (unit_tvm.target.host() if mcpu is None
              else tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))
    if fallback:
        require_host(fallback)
    cal = zoo.inputs((1, 256, 64), 2, seed=1)
    x = zoo.inputs((1, 256, 64), 1, seed=3)[0]
    for sharpness, want in ((1.0, VPDPBUSD), (6.0, fallback)):
        mod = frontends.from_torch(_sharp_attention(sharpness), [torch.tensor(x)])
        qmod = quantize(mod, calibration_data=cal, target=target)
        assert _attention_kernel_instruction(qmod) == want, (sharpness, mcpu)
        assert bool(_softmaxes(qmod)) == (not want)
    if mcpu is None:  # the fallback's accuracy, against fp32 attention in the int8 model
        fp32 = quantize(mod, calibration_data=cal, attention="fp32")
        got, other = (_run(unit_tvm.compiler.build_relax(m, target), [x])[0]
                      for m in (qmod, fp32))
        assert _cos(got, other) > 0.999


@pytest.mark.parametrize("seed", [0, 7])
def test_drawn_spellings_fused_in_int8_stay_close_to_fp32_attention(seed, monkeypatch):
    """Attention spelled two drawn ways (relax/core/views.py's test models), quantized with the
    default attention: one int8 kernel reading its operands through the views (its per-head
    ranges too), no softmax or matmul left, and the model within int8 rounding of the one
    with fp32 attention (measured over eleven seeds: cosine 0.99941-0.99982; an operand read
    through a wrong view gives far less). The size policy is turned off."""
    from .test_views import drawn_attention

    require_host(VPDPBUSD)
    monkeypatch.setattr(cpu_attention, "MIN_SCORES_BYTES", 0)
    mod, cal, xs = drawn_attention(seed)
    host = unit_tvm.target.host()
    qmod = quantize(mod, calibration_data=cal)
    kernels = _fused_kernels(qmod)
    assert len(kernels) == 1 and not _softmaxes(qmod), _softmaxes(qmod)
    assert str(qmod[kernels[0]].attrs["unit_tvm.kernel_info"]["instruction"]) == VPDPBUSD
    fp32 = _run(tvm.compile(quantize(mod, calibration_data=cal, attention="fp32"), target=host),
                xs)
    for got, other in zip(_run(unit_tvm.compiler.build_relax(qmod, host), xs), fp32):
        assert _cos(got, other) > 0.999


@pytest.mark.parametrize("level,form", [("avx512_core", "x86.vpmaddwd"),
                                        ("avx2", "x86.vpmaddwd.256")])
def test_int8_attention_without_vnni_runs_on_the_int16_form(level, form):
    """Held to Skylake-SP's level or to AVX2, long attention is still one int8 kernel, on the
    exact int16 form (2 products a lane), and stays within cosine 0.999 of torch."""
    target = unit_tvm.target.restricted(level)
    if not intrinsics.get(form).supported(target) or not unit_tvm.target.is_host(target):
        pytest.skip(f"this CPU (or the ISA level it is held to) has no {form}")
    model = LongAttention(256).eval()
    x = zoo.inputs((1, 256, 64), 1, seed=3)[0]
    mod = frontends.from_torch(model, [torch.tensor(x)])
    cal = zoo.inputs((1, 256, 64), 2, seed=1)
    qmod = quantize(mod, calibration_data=cal, target=target)
    (kernel,) = _fused_kernels(qmod)
    assert form in str(qmod[kernel].attrs["unit_tvm.kernel_info"])
    vm = relax.VirtualMachine(unit_tvm.compile(mod, target, quantize={"calibration_data": cal}),
                              tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x))
    got = (out if hasattr(out, "numpy") else out[0]).numpy().astype(np.float64)
    with torch.no_grad():
        want = model(torch.tensor(x)).numpy().astype(np.float64)
    assert got.ravel() @ want.ravel() / np.linalg.norm(got) / np.linalg.norm(want) > 0.999


def test_quantizing_for_an_instruction_this_cpu_lacks_is_a_clear_error():
    """Calibration runs the model here: with long attention already fused for vpdpbusd on a
    CPU without it, quantize says so instead of LLVM aborting the process."""
    vnni = unit_tvm.target.instruction_target(intrinsics.get(VPDPBUSD))
    if unit_tvm.target.is_host(vnni):
        pytest.skip("this CPU runs vpdpbusd: nothing to refuse")
    model = LongAttention(256).eval()
    x = zoo.inputs((1, 256, 64), 1, seed=3)[0]
    with pytest.raises(ValueError, match="cannot run x86.vpdpbusd"):
        quantize(frontends.from_torch(model, [torch.tensor(x)]),
                 calibration_data=zoo.inputs((1, 256, 64), 1, seed=1), target=vnni)
