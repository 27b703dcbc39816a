"""The 16-register float32 tile (AVX2's vfmadd231ps): 4 channel blocks x 3 columns, the
inner loop's operands held, and the conv columns widened to a multiple of 3 for it, the
extra columns re-reading the last real one where the input is read in place (a 1x1 conv's
channels then as blocks x lanes, so that its reads are affine)."""

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

import unit_tvm
from unit_tvm import frontends, intrinsics, ops
from unit_tvm.relax.core.recipe import Recipe
from unit_tvm.relax.cpu.qgraphs import tensorized_graph
from unit_tvm.rewriter import prepare_for
from unit_tvm.schedules import cpu
from unit_tvm.schedules.register_tiles import operand_reuse_tile, tiled_extent
from unit_tvm.target import instruction_target, restricted

from .conftest import require_host

AVX2 = "x86.vfmadd231ps"


def test_the_tile_holds_the_inner_loops_operands():
    """16 registers: accumulators + the inner loop's operands + one in flight. 4 blocks x 3
    columns fills them; 3 x 4 and 2 x 6 would need 17 and 19 (LLVM spilled both)."""
    assert operand_reuse_tile([1, 8, 56, 57], 1, 16, 12) == ((1, 4), (3, 3))
    assert operand_reuse_tile([1, 6, 16, 16], 1, 16, 12) == ((1, 6), (3, 2))
    assert operand_reuse_tile([1, 3, 16, 16], 1, 16, 12) != ((1, 3), (3, 4))
    # the lanes loop inner (a dense layer's column blocks after its rows): its operands held
    assert operand_reuse_tile([128, 96], 1, 16, 12) == ((0, 4), (1, 3))
    assert operand_reuse_tile([128, 16], 1, 16, 12) in (((0, 4), (1, 2)), ((0, 2), (1, 4)))


def test_columns_widen_by_less_than_an_eighth_for_twelve_accumulators():
    """ResNet's 56, 28, 14 columns take one or two more; 7 and 8 would need too many and keep
    the even rule; two channel blocks can never hold 12, and 24 divides already."""
    widened = [tiled_extent(e, reuse=True, blocks=b)
               for e, b in ((56, 8), (28, 16), (14, 32), (7, 64), (8, 8), (56, 2), (24, 8),
                            (17, 8), (73, 4))]
    assert widened == [57, 30, 15, 8, 8, 56, 24, 18, 75]
    assert tiled_extent(7, reuse=True) == 8 and tiled_extent(56) == 56


def test_a_window_keeps_an_odd_column_count_no_twelve_tile_fits():
    """A conv with a window keeps ResNet's 7 columns (one block x 7 columns ran its 7x7
    stage's 3x3 convs 5-10% faster than 2 x 4 on 8); where a 12-accumulator tile fits, it
    widens as before; a 1x1 conv still takes the extra column."""
    assert [tiled_extent(e, reuse=True, blocks=b, window=True)
            for e, b in ((7, 64), (5, 64), (14, 32), (56, 8), (3, 8))] == [7, 5, 15, 57, 3]
    intrin, avx2 = intrinsics.get(AVX2), restricted("avx2")
    three, _ = tensorized_graph(_recipe(64, 7, 3, 1), intrin, avx2)
    assert cpu.outer_extents(three)[-2] == 7
    assert dict(cpu.default(three, avx2).unroll) == {3: 7}
    one, _ = tensorized_graph(_recipe(64, 7, 1, 0), intrin, avx2)
    assert cpu.outer_extents(one)[-2] == 8


def _recipe(channels, hw, kernel, padding):
    return Recipe(kind="conv2d", in_shape=(1, channels, hw, hw),
                  w_shape=(channels, channels, kernel, kernel),
                  out_shape=(1, channels, hw, hw), out_channels=channels, stride=(1, 1),
                  dilation=(1, 1), padding=(padding,) * 4, dtype="float32", in_block=8,
                  out_block=8)


def test_widened_columns_read_in_place_or_from_the_padded_copy():
    """A 1x1 conv on its producer's blocks reads them in place, the 15th column re-reading the
    14th; a padded 3x3 conv copies its input anyway and the copy covers 15 columns."""
    intrin, avx2 = intrinsics.get(AVX2), restricted("avx2")
    one, _ = tensorized_graph(_recipe(32, 14, 1, 0), intrin, avx2)
    assert cpu.outer_extents(one)[-2] == 15
    assert not one.stages, one.stages  # no copy of the input
    assert dict(cpu.default(one, avx2).unroll) == {1: 4, 3: 3}
    # its channels as blocks x lanes (affine reads), a window's taps keep one channel loop
    assert [ax.var.name for ax in one.core.op.reduce_axis] == ["rco", "rci", "rr", "rs"]
    three, _ = tensorized_graph(_recipe(32, 14, 3, 1), intrin, avx2)
    assert [ax.var.name for ax in three.core.op.reduce_axis] == ["rc", "rr", "rs"]
    assert cpu.outer_extents(three)[-2] == 15
    assert dict(cpu.default(three, avx2).unroll) == {1: 4, 3: 3}


class _Stage(nn.Module):
    """A 3x3 conv (its input padded and copied), 1x1 convs reading blocks in place (one
    strided), a residual: 14 and 7 columns (the last 3x3 conv's 7 kept, the strided 1x1's
    widened to 8)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(16, 32, 3, padding=1)
        self.b = nn.Conv2d(32, 32, 1)
        self.c = nn.Conv2d(32, 64, 1, stride=2)
        self.d = nn.Conv2d(64, 64, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.a(x))
        y = torch.relu(self.b(y) + y)
        return self.d(torch.relu(self.c(y)))


def test_widened_convs_match_pytorch_held_to_avx2(rng):
    """The model compiled held to AVX2 (every conv on vfmadd231ps, 14-column layers widened
    to 15, the 7-column 3x3 conv on one row tile of 7) against PyTorch fp32: within 1e-5
    relative."""
    require_host(AVX2)
    torch.manual_seed(0)
    model = _Stage().eval()
    x = rng.standard_normal((1, 16, 14, 14)).astype("float32")
    report: list = []
    ex = unit_tvm.compile(frontends.from_torch(model, [torch.tensor(x)]), restricted("avx2"),
                          report=report)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    got = (out[0] if isinstance(out, tvm.ir.Array) else out).numpy()
    with torch.no_grad():
        want = model(torch.tensor(x)).numpy()
    assert {row[1] for row in report} == {AVX2}, report
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def _op_conv(channels, hw, kernel, stride=1):
    return ops.conv2d_nchwc(1, channels, hw, hw, 32, kernel, kernel, stride, x=1, y=8,
                            a_dtype="float32", b_dtype="float32", acc="float32", word=1)


def test_an_op_takes_the_graph_pass_columns():
    """The op-level path (rewriter.prepare_for) asks the strategy for the columns of its
    default tile and prepares the op again with them: a 1x1 conv's 14 columns become 15
    (4 x 3), a stride-2 3x3's prime 17 become 18, ResNet's 7 stay with a window and become
    8 without; on 32 registers nothing changes."""
    avx2 = restricted("avx2")
    intrin = intrinsics.get(AVX2)
    for op, columns, unroll in ((_op_conv(64, 14, 1), 15, {1: 4, 3: 3}),
                                (_op_conv(16, 35, 3, 2), 18, {1: 4, 3: 3}),
                                (_op_conv(64, 9, 3), 7, {3: 7}),
                                (_op_conv(64, 7, 1), 8, {1: 2, 3: 4})):
        prepared = prepare_for(op, intrin, avx2)
        assert cpu.outer_extents(prepared)[-2] == columns, op
        assert dict(cpu.default(prepared, avx2).unroll) == unroll, op
    wide = intrinsics.get("x86.vfmadd231ps.512")
    op = ops.conv2d_nchwc(1, 64, 14, 14, 32, 1, 1, 1, x=1, y=16, a_dtype="float32",
                          b_dtype="float32", acc="float32", word=1)
    assert cpu.outer_extents(prepare_for(op, wide, instruction_target(wide)))[-2] == 14


def test_a_strided_pointwise_op_keeps_its_columns():
    """A stride-2 1x1 conv built on its own keeps its 28 columns (2 x 4 tiles): more would
    be read from a padded copy of its whole input, four times the pixels it reads (Table I's
    L15 held to AVX2: 45-79% of the peak widened to 30, 85-91% on 28); with weights beyond
    L2 it widens as before (512 -> 1024: 14 columns -> 15)."""
    avx2 = restricted("avx2")
    intrin = intrinsics.get(AVX2)
    prepared = prepare_for(_op_conv(64, 56, 1, 2), intrin, avx2)
    assert cpu.outer_extents(prepared)[-2] == 28
    assert dict(cpu.default(prepared, avx2).unroll) == {1: 2, 3: 4}
    big = ops.conv2d_nchwc(1, 512, 28, 28, 1024, 1, 1, 2, x=1, y=8, a_dtype="float32",
                           b_dtype="float32", acc="float32", word=1)
    assert cpu.outer_extents(prepare_for(big, intrin, avx2))[-2] == 15


@pytest.mark.parametrize("channels,hw,kernel,stride",
                         [(64, 14, 1, 1), (16, 35, 3, 2), (16, 28, 1, 2)])
def test_widened_op_matches_numpy(channels, hw, kernel, stride, rng):
    """The widened op-level convs, built held to AVX2, against numpy (extra columns cropped)."""
    require_host(AVX2)
    op = _op_conv(channels, hw, kernel, stride)
    d = rng.standard_normal((1, channels, hw, hw, 1)).astype("float32")
    w = rng.standard_normal((4, channels, kernel, kernel, 1, 8, 1)).astype("float32")
    mod = unit_tvm.build([*op.op.input_tensors, op], restricted("avx2"), intrinsic=AVX2)
    out = np.zeros([int(s) for s in op.shape], "float32")
    args = [tvm.runtime.tensor(a) for a in (d, w, out)]
    mod(*args)
    x = np.lib.stride_tricks.sliding_window_view(d[0, :, :, :, 0], (kernel, kernel), (1, 2))
    x = x[:, ::stride, ::stride]
    k = w[:, :, :, :, 0, :, 0].transpose(0, 4, 1, 2, 3).reshape(32, channels, kernel, kernel)
    want = np.einsum("chwrs,kcrs->khw", x, k)
    got = args[-1].numpy()[0].transpose(0, 3, 1, 2).reshape(32, *want.shape[1:])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_a_dense_layers_rows_sit_outside_its_column_blocks():
    """A dense layer's rows run outside its column blocks, so its tile holds the blocks'
    weights: 128 rows of 256 blocks widen to 132 (6 rows x 2 blocks, 15 registers), not to
    129 (3 x 4 would hold 4 weights: 17); 96 blocks keep 128 (4 rows x 3 blocks)."""
    assert tiled_extent(128, reuse=True, blocks=256, columns_inner=False) == 132
    assert tiled_extent(128, reuse=True, blocks=256) == 129
    assert tiled_extent(128, reuse=True, blocks=96, columns_inner=False) == 128
    avx2, intrin = restricted("avx2"), intrinsics.get(AVX2)
    op = ops.dense_packed(128, 2048, 16, 8, 1, "float32", "float32", "float32", word=1)
    prepared = prepare_for(op, intrin, avx2)
    assert cpu.outer_extents(prepared) == [132, 256]
    assert dict(cpu.default(prepared, avx2).unroll) == {0: 6, 1: 2}


def test_widened_dense_op_matches_numpy(rng):
    """A dense op whose rows widen (13 -> 14: no 12-accumulator tile on 8 blocks, the even
    rule), built held to AVX2, against numpy (the extra row cropped)."""
    require_host(AVX2)
    op = ops.dense_packed(13, 64, 24, 8, 1, "float32", "float32", "float32", word=1)
    a = rng.standard_normal((13, 24)).astype("float32")
    b = rng.standard_normal((8, 24, 1, 8, 1)).astype("float32")
    assert cpu.outer_extents(prepare_for(op, intrinsics.get(AVX2), restricted("avx2")))[0] > 13
    mod = unit_tvm.build([*op.op.input_tensors, op], restricted("avx2"), intrinsic=AVX2)
    args = [tvm.runtime.tensor(x) for x in (a, b, np.zeros((13, 64), "float32"))]
    mod(*args)
    want = a @ b[:, :, 0, :, 0].transpose(0, 2, 1).reshape(64, 24).T
    np.testing.assert_allclose(args[-1].numpy(), want, rtol=1e-5, atol=1e-5)
