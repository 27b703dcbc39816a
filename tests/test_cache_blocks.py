"""Cache blocks of a long reduction (schedules/cache_blocks.py): where the register tile's
weight panel outgrows L1 and the input steps to another cache line every reduction step (an
NCHW plane per channel), the default splits the reduction so that every tile below the block
re-reads the panel from L1; the kernels stay exact."""

import numpy as np
import pytest
import tvm

import unit_tvm
from unit_tvm import intrinsics, ops
from unit_tvm.rewriter import prepare_for
from unit_tvm.schedules import cpu
from unit_tvm.schedules.cache_blocks import reduction_chunk
from unit_tvm.target import host, restricted

from .conftest import require_host

L1 = 48 * 1024


def test_the_chunk_fits_half_of_l1_and_divides_the_reduction():
    """1024 channels of a 2-block zmm tile (128 B a step): 128 KB, chunks of 128 (16 KB); 576
    channels: 192; a panel within half of L1, a window whose step alone fills it, one tile
    below, a GEMM's contiguous rows, weights beyond L2: none."""
    assert reduction_chunk([1024, 1, 1], 128, L1, 28, 784) == 128
    assert reduction_chunk([576, 1, 1], 128, L1, 28, 784) == 192
    assert reduction_chunk([128, 1, 1], 128, L1, 28, 784) is None
    assert reduction_chunk([256, 3, 3], 128, L1, 28, 1024) is None
    assert reduction_chunk([1024, 1, 1], 128, L1, 1, 784) is None
    assert reduction_chunk([4096], 128, L1, 16, 4) is None
    assert reduction_chunk([1024, 1, 1], 128, L1, 28, 784, weights_in_l2=False) is None


def _nchw_1x1(channels, out, hw, lanes):
    return ops.conv2d_nchwc(1, channels, hw, hw, out, 1, 1, 1, x=1, y=lanes,
                            a_dtype="float32", b_dtype="float32", acc="float32", word=1)


@pytest.mark.parametrize("name,level", [("x86.vfmadd231ps.512", None),
                                        ("x86.vfmadd231ps", "avx2")])
def test_a_deep_nchw_1x1_conv_runs_in_cache_blocks_and_matches_numpy(name, level, rng):
    """576 -> 128 channels at 14x14 from NCHW planes (4 tiles of channel blocks: one per
    thread on up to 4 cores): the default splits the channels into blocks (reported by
    describe) and the kernel matches numpy."""
    intrin = intrinsics.get(name)
    target = restricted(level) if level else host()
    if intrin.missing_features(target):
        pytest.skip(f"{name}: this host lacks {intrin.missing_features(target)}")
    lanes = intrin.lanes
    op = _nchw_1x1(576, 128, 14, lanes)
    prepared = prepare_for(op, intrin, target)
    config = cpu.default(prepared, target)
    assert config.reduce_split and 576 % config.reduce_split[0][1] == 0, config
    assert "in blocks of" in cpu.describe(config, prepared)
    require_host(name)
    d = rng.standard_normal((1, 576, 14, 14, 1)).astype("float32")
    w = rng.standard_normal((128 // lanes, 576, 1, 1, 1, lanes, 1)).astype("float32")
    mod = unit_tvm.build([*op.op.input_tensors, op], target, intrinsic=name)
    args = [tvm.runtime.tensor(a) for a in (d, w, np.zeros([int(s) for s in op.shape],
                                                            "float32"))]
    mod(*args)
    k = w[:, :, 0, 0, 0, :, 0].transpose(0, 2, 1).reshape(128, 576)
    want = np.einsum("kc,chw->khw", k, d[0, :, :, :, 0])
    got = args[-1].numpy()[0].transpose(0, 3, 1, 2).reshape(128, 14, 14)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_a_cache_block_that_does_not_divide_is_refused():
    """A config whose cache block does not divide the reduction is a ValueError, not a
    failure inside TVM's tensorize."""
    intrin = intrinsics.get("x86.vfmadd231ps")
    target = restricted("avx2")
    prepared = prepare_for(_nchw_1x1(576, 64, 14, 8), intrin, target)
    config = cpu.CpuConfig(unroll=cpu.default(prepared, target).unroll,
                           reduce_split=((0, 100),))
    with pytest.raises(ValueError, match="cache block"):
        cpu.schedule(prepared, intrin, config, target)


def test_the_tuner_measures_cache_blocks_the_default_declines():
    """Weights beyond L2 (1024 -> 512: 2 MB) keep the default's reduction whole; the tuner's
    seeds (measured right after the default) hold it in cache blocks, and so does its space.
    Where the default blocks it already, nothing more."""
    intrin, target = intrinsics.get("x86.vfmadd231ps"), restricted("avx2")
    prepared = prepare_for(_nchw_1x1(1024, 512, 14, 8), intrin, target)
    assert not cpu.default(prepared, target).reduce_split
    seeds = cpu.seeds(prepared, target)
    assert len(seeds) == 1 and seeds[0].reduce_split == ((0, 128),), seeds
    assert seeds[0] in cpu.space(prepared, target)
    blocked = prepare_for(_nchw_1x1(576, 128, 14, 8), intrin, target)
    assert cpu.default(blocked, target).reduce_split and not cpu.seeds(blocked, target)
