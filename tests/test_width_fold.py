"""Convs over few input channels (an RGB stem, a grayscale input) read a word of window columns
per reduction lane instead of a word of padded channels (recipe.folds_width): exact against the
plain int8 loop nest on every instruction this host runs, and chosen only where it pads less."""

import numpy as np
import pytest
import torch
import tvm
from torch import nn

import unit_tvm
from unit_tvm import frontends, intrinsics
from unit_tvm.compiler import build_relax
from unit_tvm.relax import UnitTensorize, quantize
from unit_tvm.relax.core.recipe import Recipe, blocks_of, candidates, folds_width, out_shape
from unit_tvm.relax.cpu import qgraphs
from unit_tvm.relax.cpu.qops import plain_func, tensorized_func
from unit_tvm.relax.cpu.weights import pack_weight, plain_weight

from .conftest import require_host
from .test_relax import _call_prim, _prepare, _run


def _recipe(c, k, window, stride=1, pad=0, hw=(12, 13), **extra):
    r, s = window
    oh = (hw[0] + 2 * pad - r) // stride + 1
    ow = (hw[1] + 2 * pad - s) // stride + 1
    d = {"kind": "conv2d", "in_shape": [1, c, *hw], "w_shape": [k, c, r, s],
         "out_shape": [1, k, oh, ow], "out_channels": k, "stride": [stride, stride],
         "dilation": [1, 1], "padding": [pad] * 4, "x_scale": 0.03, "x_zp": 9, "relu": True,
         "clip_max": None, "residual": False, "out_q": [0.05, 0]}
    d.update(extra)
    return Recipe.from_dict(d)


@pytest.mark.parametrize("c, window, extra, intrin, folds", [
    (3, (7, 7), {}, "x86.vpdpbusd", True),       # ResNet's stem: 8/7 instead of 4/3
    (1, (5, 5), {}, "x86.vpdpbusd.256", True),   # grayscale
    (3, (3, 3), {}, "x86.vpdpbusd", False),      # 4/3 either way: channels stay the lanes
    (4, (7, 7), {}, "x86.vpdpbusd", False),      # whole words of channels: nothing padded
    (3, (7, 7), {}, "x86.tdpbusd", False),       # AMX reads 64 channels, not one word
    (3, (7, 7), {"dilation": [1, 2]}, "x86.vpdpbusd", False),  # columns not neighbours
    (3, (7, 7), {"in_block": 4, "in_u8": True}, "x86.vpdpbusd", False),  # producer's blocks
    (3, (7, 7), {}, "arm.smmla", True),
])
def test_folds_only_where_it_pads_less(c, window, extra, intrin, folds):
    recipe = _recipe(c, 16, window, **extra)
    assert folds_width(recipe, blocks_of(intrinsics.get(intrin))) is folds


def test_selection_sees_the_folded_padding():
    """smmla (8-channel words) pads an RGB stem 8/3 as channels, but 8/7 as folded columns:
    the folded waste is what selection weighs, so it stays a candidate within MAX_WASTE."""
    target = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu",
                                "mattr": ["+neon", "+dotprod", "+i8mm"]})
    names = [i.name for i in candidates(_recipe(3, 64, (7, 7), 2, 3), target)]
    assert names[0] == "arm.smmla", names
    names = [i.name for i in candidates(_recipe(3, 64, (3, 3), 2, 1), target)]
    assert names[0] == "arm.sdot", names  # 3 channels in words of 8 would waste 8/3


def tensorized_and_plain(recipe, intrin, x, rng, mult=(1e-4, 1e-3)):
    """(tensorized output, plain int8 loop nest's output, tensorized PrimFunc, its Blocks) of
    `recipe` on input x with the same random int8 weights, zero-point term, multipliers and
    biases."""
    k = recipe.out_channels
    w = rng.integers(-127, 128, size=recipe.w_shape).astype("int8")
    comp = (recipe.x_zp * w.reshape(k, -1).astype(np.int64).sum(1)).astype("int32")
    args = [rng.uniform(*mult, k).astype("float32"), rng.normal(size=k).astype("float32"),
            np.zeros(out_shape(recipe), "uint8")]
    func, blocks, _ = tensorized_func(recipe, intrin, unit_tvm.target.host())
    got = _call_prim(func, [x, pack_weight(recipe, w, blocks), comp, *args])
    want = _call_prim(plain_func(recipe), [x, plain_weight(recipe, w), comp, *args])
    return got, want, func, blocks


def _outputs_equal_plain(recipe, intrin, rng):
    """The tensorized kernel (folded or not) and the plain int8 loop nest on the same inputs."""
    x = rng.normal(size=recipe.in_shape).astype("float32")
    got, want, _, blocks = tensorized_and_plain(recipe, intrin, x, rng)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) > 20  # not a saturated output: the comparison means something
    return blocks


@pytest.mark.parametrize("name", ["x86.vpdpbusd", "x86.vpdpbusd.256"])
@pytest.mark.parametrize("c, k, window, stride, pad, hw", [
    (3, 16, (7, 7), 2, 3, (30, 29)),   # a stem: stride 2, odd width (computed padded, cropped)
    (1, 24, (5, 5), 1, 2, (11, 17)),   # grayscale, 17 columns, 24 channels: a padded block
    (2, 8, (1, 7), 1, 3, (9, 17)),     # a 1x7 window
    (1, 16, (3, 3), 2, 0, (19, 23)),   # no padding, a 3-column window (one word, a zero tap)
])
def test_width_folded_kernels_equal_plain_int8(name, c, k, window, stride, pad, hw, rng):
    require_host(name)
    intrin = intrinsics.get(name)
    for out_block in (None, intrin.channel_blocks[1]):
        recipe = _recipe(c, k, window, stride, pad, hw, out_block=out_block)
        assert folds_width(recipe, blocks_of(intrin))
        blocks = _outputs_equal_plain(recipe, intrin, rng)
        assert blocks.x == blocks.word


def _recipe3d(c, k, window, stride, pad, dhw, **extra):
    out = [(e + 2 * p - t) // st + 1 for e, t, st, p in zip(dhw, window, stride, pad)]
    d = {"kind": "conv3d", "in_shape": [1, c, *dhw], "w_shape": [k, c, *window],
         "out_shape": [1, k, *out], "out_channels": k, "stride": list(stride),
         "dilation": [1, 1, 1], "padding": list(pad) * 2, "x_scale": 0.03, "x_zp": 9,
         "relu": True, "clip_max": None, "residual": False, "out_q": [0.05, 0]}
    d.update(extra)
    return Recipe.from_dict(d)


@pytest.mark.parametrize("name", ["x86.vpdpbusd", "x86.vpdpbusd.256"])
@pytest.mark.parametrize("c, k, window, stride, pad, dhw, folds", [
    (3, 16, (3, 7, 7), (1, 2, 2), (1, 3, 3), (3, 14, 17), True),  # a video ResNet's stem
    (2, 24, (1, 1, 5), (2, 1, 1), (0, 0, 2), (4, 5, 11), True),  # padded output block
    (3, 16, (3, 3, 3), (1, 1, 1), (1, 1, 1), (3, 6, 7), False),  # 4/3 either way
])
def test_width_folded_conv3d_equals_plain_int8(name, c, k, window, stride, pad, dhw, folds,
                                               rng):
    """A conv3d over few channels folds its window's columns like a conv2d (same rule), into
    NCDHW and into NCDHW[y]c for conv readers, and equals the plain int8 loop nest."""
    require_host(name)
    intrin = intrinsics.get(name)
    for out_block in (None, intrin.channel_blocks[1]):
        recipe = _recipe3d(c, k, window, stride, pad, dhw, out_block=out_block)
        assert folds_width(recipe, blocks_of(intrin)) is folds
        _outputs_equal_plain(recipe, intrin, rng)


class Stem(nn.Module):
    """ResNet's stem on a small image, then a conv reading its uint8 blocks."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 7, stride=2, padding=3)
        self.c2 = nn.Conv2d(32, 16, 3, padding=1)

    def forward(self, x):
        return self.c2(torch.relu(self.c1(x)))


def test_stem_in_a_model_is_folded_and_exact(monkeypatch):
    require_host("x86.vpdpbusd")
    folded = []

    def spy(recipe, blocks):
        decision = folds_width(recipe, blocks)
        folded.append(decision)
        return decision

    monkeypatch.setattr(qgraphs, "folds_width", spy)
    model = Stem()
    cal, xs, refs = _prepare(model, (1, 3, 40, 40))
    qmod = quantize(frontends.from_torch(model, [torch.tensor(xs[0])]), calibration_data=cal)
    tpass = UnitTensorize()
    ex = build_relax(tpass(qmod), unit_tvm.target.host())
    assert all(instr for _, instr, _ in tpass.report), tpass.report
    assert True in folded and False in folded  # the stem folded, the 32-channel conv not
    plain = _run(tvm.compile(qmod, target=unit_tvm.target.host()), xs)
    for got, base in zip(_run(ex, xs), plain):
        np.testing.assert_array_equal(got, base)
