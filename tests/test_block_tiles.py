"""A conv's default register tile on 32 vector registers: 2 output-channel blocks x 7 columns
(or a whole row of 8) where its loops allow, rows x columns elsewhere; the kernels so tiled
compute the conv (float32 within rounding, int8 exactly)."""

import numpy as np
import pytest
import tvm

import unit_tvm
from unit_tvm import intrinsics, measure, ops
from unit_tvm.rewriter import prepare_for
from unit_tvm.schedules import cpu
from unit_tvm.schedules import register_tiles as rt
from unit_tvm.target import instruction_target

from .conftest import require_host

STREAM = (1, 16)  # a conv's channel blocks: the loop the instruction's vector operand follows


@pytest.mark.parametrize("extents, tile", [
    ([1, 4, 56, 56, 1], ((1, 2), (3, 7))),  # ResNet's 56 columns: 2 blocks x 7 columns
    ([1, 4, 112, 112, 1], ((1, 2), (3, 7))),  # the stem
    ([1, 4, 147, 147, 1], ((1, 2), (3, 7))),  # Inception's 147 (3 rows x 3 columns before)
    ([1, 24, 8, 8, 1], ((1, 2), (3, 8))),  # a row of exactly 8: whole
    ([1, 12, 71, 72, 1], ((1, 3), (3, 4))),  # no 7 in 72: the idle-tile rule's 3 x 4 stays
    ([1, 3, 28, 28, 1], ((2, 2), (3, 7))),  # an odd number of blocks: rows x columns
    ([1, 8, 17, 17, 1], ((3, 17),)),  # 17 columns: the whole-row tile
    ([128, 48], ((0, 8), (1, 2))),  # a dense layer's blocks are innermost: stream_tile
])
def test_conv_tiles_two_channel_blocks_by_seven_columns(extents, tile):
    """Where the vector operand's loop sits above the rows and columns, the tile reuses each
    broadcast for two blocks; 16 registers (no wide budget) keep rows x columns."""
    assert rt.default_tile(extents, rt.ACCUMULATORS, len(extents) - 2, rt.WIDE_TILE,
                           STREAM) == tile
    assert rt.default_tile([1, 4, 56, 56, 1], 8, 3, None, STREAM) != ((1, 2), (3, 7))


@pytest.mark.parametrize("extents, known, unknown", [
    ([1, 3, 35, 35, 1], ((1, 3), (3, 7)), ((3, 7),)),  # 3 blocks x 7: 29 registers
    ([1, 3, 28, 28, 1], ((1, 3), (3, 7)), ((2, 2), (3, 7))),
    ([1, 5, 73, 75, 1], ((1, 5), (3, 3)), ((3, 5),)),  # idle at 5: the wide budget's 15
    ([1, 9, 8, 8, 1], ((2, 4), (3, 4)), ((2, 4), (3, 4))),  # 3 x 8 would need 33 registers
])
def test_known_registers_allow_three_blocks(extents, known, unknown):
    """Where the instruction's scratch registers are known (32 free), an odd number of blocks
    takes 3 x 7 and a tile still idle takes the wide budget; unknown, neither."""
    args = (extents, rt.ACCUMULATORS, 3, rt.WIDE_TILE, STREAM)
    assert rt.default_tile(*args, registers=32) == known
    assert rt.default_tile(*args) == unknown


def _conv_reference(data, kern, stride):
    """conv2d_nchwc's result from its packed operands, in numpy (float64 or int64)."""
    _, cb, h, w, x = data.shape
    kb, _, r, s, xw, y, word = kern.shape
    d = data[0].transpose(0, 3, 1, 2).reshape(cb * x, h, w)
    k = kern.transpose(0, 5, 1, 4, 6, 2, 3).reshape(kb * y, cb * x, r, s)
    win = np.lib.stride_tricks.sliding_window_view(d, (r, s), axis=(1, 2))[:, ::stride, ::stride]
    return np.einsum("chwrs,kcrs->khw", win, k)


def _tiled_conv(name, dtypes, stride, rng, blocks=4):
    """(result, reference) of a stride-`stride` 3x3 conv, `blocks` blocks of 16 output
    channels, 14 output columns, built for intrinsic `name` with its default config (the block
    tile: 2 blocks x 7 columns, 3 x 7 where the blocks are odd)."""
    intrin = intrinsics.get(name)
    x, y = intrin.channel_blocks
    size = 13 * stride + 3
    op = ops.conv2d_nchwc(1, 16, size, size, 16 * blocks, 3, 3, stride, x=x, y=y,
                          a_dtype=dtypes[0], b_dtype=dtypes[1], acc=dtypes[2],
                          word=intrin.weight_word)
    target = instruction_target(intrin)
    config = cpu.default(prepare_for(op, intrin, target), target)
    assert config.unroll == ((1, 2 if blocks % 2 == 0 else 3), (3, 7)), config
    data_t, kern_t = op.op.input_tensors
    if dtypes[0] == "float32":
        arrays = [rng.standard_normal([int(d) for d in t.shape]).astype("float32")
                  for t in (data_t, kern_t)]
    else:
        arrays = [rng.integers(0, 256, [int(d) for d in data_t.shape]).astype("uint8"),
                  rng.integers(-128, 128, [int(d) for d in kern_t.shape]).astype("int8")]
    mod = unit_tvm.build([data_t, kern_t, op], intrinsic=intrin)
    out = np.zeros([int(s) for s in op.shape], dtypes[2])
    args = measure.to_device(arrays + [out], tvm.cpu())
    mod(*args)
    got = args[-1].numpy()[0].transpose(0, 3, 1, 2).reshape(16 * blocks, 14, 14)
    wide = "float64" if dtypes[0] == "float32" else "int64"
    return got, _conv_reference(*(a.astype(wide) for a in arrays), stride)


@pytest.mark.parametrize("blocks", [4, 3])
def test_float32_block_tile_computes_the_conv(rng, blocks):
    """A stride-2 float32 conv on the block tile (AVX-512 multiply-add; 4 and 3 blocks of 16
    output channels: 2 x 7 and 3 x 7) matches numpy."""
    require_host("x86.vfmadd231ps.512")
    got, want = _tiled_conv("x86.vfmadd231ps.512", ("float32", "float32", "float32"), 2, rng,
                            blocks)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("blocks", [4, 3])
def test_int8_block_tile_is_exact(rng, blocks):
    """The same convs in int8 on vpdpbusd (stride 1): the int32 sums are exact."""
    require_host("x86.vpdpbusd")
    got, want = _tiled_conv("x86.vpdpbusd", ("uint8", "int8", "int32"), 1, rng, blocks)
    np.testing.assert_array_equal(got, want)
