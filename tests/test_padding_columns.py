"""conv2d taps that read only padding columns (schedules/padding_taps.skip_padding_columns): gone
from the code where the input's zero point is 0, kept where it is not; exact either way."""

import numpy as np
import pytest
import tvm

import unit_tvm
from unit_tvm import intrinsics
from unit_tvm.relax.core.recipe import Recipe
from unit_tvm.relax.cpu.qops import tensorized_func
from unit_tvm.schedules import padding_taps

from .conftest import require_host
from .test_width_fold import tensorized_and_plain


def _recipe(c, k, hw, window, pad, stride=1, dilation=1, zp=0):
    (h, w), (r, s), (ph, pw) = hw, window, pad
    oh = (h + 2 * ph - dilation * (r - 1) - 1) // stride + 1
    ow = (w + 2 * pw - dilation * (s - 1) - 1) // stride + 1
    return Recipe.from_dict({
        "kind": "conv2d", "in_shape": [1, c, h, w], "w_shape": [k, c, r, s],
        "out_shape": [1, k, oh, ow], "out_channels": k, "stride": [stride, stride],
        "dilation": [dilation, dilation], "padding": [ph, pw, ph, pw], "x_scale": 0.03,
        "x_zp": zp, "relu": True, "clip_max": None, "residual": False, "out_q": [0.05, 0],
        "in_u8": True, "in_block": 16, "out_block": 16})


def _run_both(recipe, intrin, rng):
    """(tensorized output, plain output, tensorized kernel's assembly) on the same inputs."""
    n, c, h, w = recipe.in_shape
    x = rng.integers(0, 256, size=(n, c // 16, h, w, 16)).astype("uint8")
    got, want, func, _ = tensorized_and_plain(recipe, intrin, x, rng, mult=(2e-6, 1e-5))
    lib = unit_tvm.lowering.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                                  unit_tvm.target.host())
    return got, want, lib.inspect_source("asm")


@pytest.mark.parametrize("c, k, hw, window, pad, stride, dilation", [
    (32, 32, (7, 7), (3, 3), (1, 1), 1, 1),     # ResNet's last stage: one tile per row
    (32, 16, (14, 14), (3, 3), (1, 1), 1, 1),   # two tiles per row
    (16, 32, (17, 17), (1, 7), (0, 3), 1, 1),   # Inception's 1x7: 18 columns computed
    (16, 16, (15, 13), (3, 3), (1, 1), 2, 1),   # strided
    (16, 16, (12, 12), (3, 3), (2, 2), 1, 2),   # dilated
])
def test_padding_columns_skipped_exactly(c, k, hw, window, pad, stride, dilation, rng):
    require_host("x86.vpdpbusd")
    recipe = _recipe(c, k, hw, window, pad, stride, dilation)
    got, want, _ = _run_both(recipe, intrinsics.get("x86.vpdpbusd"), rng)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) > 20


def test_skipped_taps_vanish_from_the_code(rng, monkeypatch):
    """A 7-column row in one register tile: with the tile's columns and the window's unrolled,
    each tap's condition is a constant, so the 2 x 2 taps of the edge columns (per block of
    output channels and window row) are not in the code at all, rather than guarded at run
    time: 14 accumulators x 3 x 3 taps = 126 instructions without the skip, 114 with it."""
    require_host("x86.vpdpbusd")
    intrin = intrinsics.get("x86.vpdpbusd")
    recipe = _recipe(32, 32, (7, 7), (3, 3), (1, 1))
    _, _, asm = _run_both(recipe, intrin, rng)
    monkeypatch.setattr(padding_taps, "skip_padding_columns", lambda func, *args: func)
    _, _, asm_all = _run_both(recipe, intrin, rng)
    assert asm.count("vpdpbusd") < asm_all.count("vpdpbusd")


def test_nonzero_zero_point_keeps_its_padding_taps(rng, monkeypatch):
    """With a zero point other than 0 the padding adds zp * w, which the compensation term
    takes away again: nothing may be skipped."""
    require_host("x86.vpdpbusd")
    intrin = intrinsics.get("x86.vpdpbusd")
    recipe = _recipe(16, 16, (7, 7), (3, 3), (1, 1), zp=5)
    calls = []
    real = padding_taps.skip_padding_columns
    monkeypatch.setattr(padding_taps, "skip_padding_columns",
                        lambda *a: calls.append(a) or real(*a))
    got, want, _ = _run_both(recipe, intrin, rng)
    np.testing.assert_array_equal(got, want)
    assert not calls


def test_skipped_only_where_the_tile_spans_the_row():
    """14x14 outputs: a 14-column register tile makes every tap's condition a constant once the
    window's columns are unrolled, so the padding taps are skipped; two 7-column tiles per row
    would leave the conditions in the code (they depend on which tile runs), so neither the
    unroll nor the predicate is added."""
    from unit_tvm.schedules.cpu import CpuConfig

    intrin = intrinsics.get("x86.vpdpbusd")
    recipe = _recipe(32, 32, (14, 14), (3, 3), (1, 1))
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    row = CpuConfig(unroll=((3, 14),), parallel=2)
    half = CpuConfig(unroll=((2, 2), (3, 7)), parallel=2)
    for config, skips in ((row, True), (half, False)):
        script = tensorized_func(recipe, intrin, target, config)[0].script()
        assert ("rs in T.unroll(3)" in script) == skips
        guarded = [ln for ln in script.splitlines() if "T.where(" in ln and "rs" in ln]
        assert bool(guarded) == skips, guarded


def test_the_tuner_times_the_kernel_that_runs():
    """The skip is part of the CPU strategy's schedule, which is what the tuner builds its
    candidates from: a row-wide candidate already has its padding taps guarded and the window's
    columns unrolled, the same TIR the model's kernel gets."""
    from unit_tvm.relax.cpu.qgraphs import tensorized_graph
    from unit_tvm.rewriter import schedule
    from unit_tvm.schedules.cpu import CpuConfig

    intrin = intrinsics.get("x86.vpdpbusd")
    recipe = _recipe(32, 32, (14, 14), (3, 3), (1, 1))
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    row = CpuConfig(unroll=((3, 14),), parallel=2)
    prepared, _ = tensorized_graph(recipe, intrin)
    # rows (skipped at run time) and columns (where static), inside the 14x14 input padded by 1
    assert [(z.axis, z.lo, z.hi, z.static_only) for z in prepared.zero_padding] == [
        (2, 1, 15, False), (3, 1, 15, True)]
    candidate = schedule(prepared, intrin, row, target).mod["main"]
    kernel = tensorized_func(recipe, intrin, target, row)[0]
    assert "rs in T.unroll(3)" in candidate.script()
    tvm.ir.assert_structural_equal(candidate.body, kernel.body)
    prepared_zp, _ = tensorized_graph(_recipe(32, 32, (14, 14), (3, 3), (1, 1), zp=5), intrin)
    assert not prepared_zp.zero_padding
