"""Dense weights packed in the panel their register tile reads (Blocks.panel): the layout, and
kernels reading it equal to the plain int8 op on every instruction of this host."""

import platform

import numpy as np
import pytest

import unit_tvm
from unit_tvm import schedules
from unit_tvm.relax.core.recipe import Blocks, Recipe, candidates
from unit_tvm.relax.cpu.qops import plain_func, tensorized_func
from unit_tvm.relax.cpu.weights import dense_weight_shape, pack_dense_weight, pack_weight

from .test_relax import _call_prim


def test_a_panel_interleaves_column_blocks_per_reduction_step():
    """[N, K] in panels of p blocks is the blocked layout with each p blocks' reduction steps
    side by side: element [a, kb, q, ...] is block a * p + q's; padding stays zero."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (150, 70)).astype("int8")  # 10 blocks of 16, K padded to 72
    blocked = pack_dense_weight(w, Blocks(4, 16, 4))
    panel = pack_dense_weight(w, Blocks(4, 16, 4, panel=5))
    assert panel.shape == dense_weight_shape(150, 70, Blocks(4, 16, 4, panel=5)) == (
        2, 18, 5, 1, 16, 4)
    want = blocked.reshape(2, 5, *blocked.shape[1:]).transpose(0, 2, 1, 3, 4, 5)
    np.testing.assert_array_equal(panel, want)
    assert pack_dense_weight(w, Blocks(4, 16, 4, panel=1)).shape == blocked.shape
    with pytest.raises(ValueError, match="panel of 4 blocks does not divide 10"):
        pack_dense_weight(w, Blocks(4, 16, 4, panel=4))


# this host, and on x86 the same host held to the pre-VNNI classes (their code runs here)
_LEVELS = ("native", "avx512_core", "avx2") if platform.machine() == "x86_64" else ("native",)


@pytest.mark.parametrize("level", _LEVELS)
def test_single_row_dense_reads_its_tile_panel_on_every_instruction(level):
    """A decode step's GEMV (one row): its default tile takes several column blocks, its
    weights are packed in that panel, and the result equals the plain int8 op's on every
    instruction of this host at `level` (weights within the quad form's bound, which the
    recipe states, so the pre-VNNI quad and pair forms are candidates too)."""
    target = unit_tvm.target.restricted(level)
    n, k = 256, 192
    recipe = Recipe(kind="dense", in_shape=(1, k), w_shape=(n, k), out_channels=n,
                    out_shape=(1, n), x_scale=0.1, x_zp=3, w_pair_bound=128, w_pair_words=2)
    found = candidates(recipe, target)
    if not found:
        pytest.skip(f"no u8 x s8 instruction runs on {target}")
    rng = np.random.default_rng(0)
    # float32 input the kernels quantize to uint8 themselves (scale 0.1, zero point 3)
    x = ((rng.integers(0, 256, (1, k)) - 3) * 0.1).astype("float32")
    w = rng.integers(-32, 32, (n, k)).astype("int8")  # |w0| + |w1| + |w4| + |w5| <= 128
    comp = (3 * w.astype(np.int32).sum(axis=1)).astype("int32")
    mult = rng.uniform(0.001, 0.01, n).astype("float32")
    bias = rng.uniform(-1, 1, n).astype("float32")
    want = _call_prim(plain_func(recipe), [x, w, comp, mult, bias, np.zeros((1, n), "float32")])
    panels = {}
    for intrin in found:
        func, blocks, prepared = tensorized_func(recipe, intrin, target)
        assert intrin.supported(target), intrin.name
        strategy = schedules.for_target(target)
        panels[intrin.name] = blocks.panel
        assert blocks.panel == strategy.weight_panel(strategy.default(prepared, target),
                                                     prepared), intrin.name
        got = _call_prim(func, [x, pack_weight(recipe, w, blocks), comp, mult, bias,
                                np.zeros((1, n), "float32")])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=intrin.name)
    assert max(panels.values()) > 1, panels
    if level == "avx2":  # AVX2's 8-column blocks: 8 of them in one stream
        assert panels.get("x86.vpmaddubsw.quad.256") == 8, panels
