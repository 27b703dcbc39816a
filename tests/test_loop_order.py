"""The outermost loop of a default CPU config (schedules/loop_order.py): the order that re-reads
fewer bytes from beyond L2 (then L1), decided from the operands' sizes."""

import pytest

import unit_tvm
from unit_tvm import ops
from unit_tvm.prepare import prepare
from unit_tvm.schedules import cpu, loop_order
from unit_tvm.schedules.loop_order import Operand, TileOperands

MB = 1 << 20
# a conv's outer loops: batch, blocks of output channels (the weights vary), rows, columns
AXES = ("n", "k", "y", "x")


def _conv(weights: int, inputs: int) -> TileOperands:
    return TileOperands(Operand(frozenset({"k"}), weights),
                        Operand(frozenset({"n", "y", "x"}), inputs))


@pytest.mark.parametrize("weights, inputs, steps, first", [
    # 1x1 conv 256 -> 64 at 56x56: the 3 MB input would stream 4 times: rows first
    (64 << 10, 3 * MB, [1, 4, 28, 8], 2),
    # 1024 -> 2048 stride 2: 8 MB of weights would stream 7 times: blocks (already outermost)
    (8 * MB, 784 << 10, [1, 64, 7, 1], -1),
    # 3x3 64 -> 64 at 56x56: both fit L2; re-reading the input 4 times moves fewer bytes
    (144 << 10, 841 << 10, [1, 4, 28, 8], -1),
    # 1x1 64 -> 256 at 56x56: both fit L2; the input 16 times against the weights 28 times
    (64 << 10, 784 << 10, [1, 16, 28, 8], 2),
])
def test_the_order_that_rereads_fewer_bytes_goes_first(weights, inputs, steps, first):
    assert loop_order.front(_conv(weights, inputs), AXES, steps, MB) == first


def test_l2_size_decides_what_is_cheap_to_reread():
    """The same conv with a smaller L2: the input no longer fits and streams per block."""
    conv = _conv(144 << 10, 841 << 10)
    assert loop_order.front(conv, AXES, [1, 4, 28, 8], MB) == -1
    assert loop_order.front(conv, AXES, [1, 4, 28, 8], 512 << 10) == 2


def test_weights_in_l1_are_cheap_to_reread():
    """ResNet's stem (37 KB of weights re-read per row, 635 KB of input per pair of channel
    blocks): by bytes alone the blocks go first; where the weights fit L1 (48 KB, Zen 5), the
    rows. A 32 KB L1 keeps the blocks."""
    stem = _conv(37632, 635 << 10)
    steps = [1, 2, 112, 16]
    assert loop_order.front(stem, AXES, steps, MB) == -1
    assert loop_order.front(stem, AXES, steps, MB, 48 << 10) == 2
    assert loop_order.front(stem, AXES, steps, MB, 32 << 10) == -1
    zen5, zen3 = ({"kind": "llvm", "mcpu": cpu} for cpu in ("znver5", "znver3"))
    assert unit_tvm.target.l1_bytes(zen5) == 48 << 10
    assert unit_tvm.target.l1_bytes(zen3) == 32 << 10


def test_no_order_is_chosen_without_two_operands_or_with_a_shared_loop():
    assert loop_order.front(None, AXES, [1, 4, 28, 8], MB) == -1
    batched = TileOperands(Operand(frozenset({"b", "j"}), 4 * MB),
                           Operand(frozenset({"b", "i"}), 4 * MB))
    assert loop_order.front(batched, ("b", "i", "j"), [12, 16, 4], MB) == -1


def test_prepared_ops_take_the_model_s_order():
    """From real prepared ops: a dense layer's column blocks first (its weights outweigh its
    rows), a 1x1 conv over a large input its rows, a batched matmul the op's order."""
    intrin = unit_tvm.intrinsics.get("x86.vpdpbusd")
    target = unit_tvm.target.instruction_target(intrin)

    def front(op):
        return cpu.default(prepare(op, intrin), target).front

    assert front(ops.dense(128, 2048, 2048)) == 1
    wide_input = front(ops.conv2d_nchw(1024, 56, 64, 1))
    assert wide_input >= 0
    assert cpu.outer_extents(prepare(ops.conv2d_nchw(1024, 56, 64, 1), intrin))[wide_input] == 56
    assert front(ops.batch_matmul(12, 128, 128, 64)) == -1


def test_l2_of_known_and_unknown_cpus():
    l2 = unit_tvm.target.l2_bytes
    assert l2({"kind": "llvm", "mcpu": "znver3"}) == 512 << 10
    assert l2({"kind": "llvm", "mcpu": "sapphirerapids"}) == 2 * MB
    assert l2({"kind": "llvm"}) == unit_tvm.target.DEFAULT_L2_BYTES


def test_the_avx2_reuse_tile_keeps_the_channel_blocks_first():
    """Held to AVX2 (operand_reuse_tile's tile) the loop order's tiers are not applied: the
    stem's rows first (L1 tier) ran 2.1x slower there, a stride-2 3x3 whose 1.6 MB input
    outgrows L2 (L2 tier) 1.3x. Their blocks stay outermost; a dense layer's column blocks
    go in front of its rows."""
    from unit_tvm.bench.op_fp32 import fp32_instruction, fp32_op
    from unit_tvm.relax.core.recipe import Recipe
    from unit_tvm.relax.cpu.qgraphs import tensorized_graph

    avx2 = unit_tvm.target.restricted("avx2")
    intrin = fp32_instruction(avx2)
    stem = prepare(fp32_op("conv", (3, 230, 64, 7, 2), intrin), intrin)
    config = cpu.default(stem, avx2)
    assert config.front == -1, cpu.describe(config, stem)
    strided, _ = tensorized_graph(Recipe(
        kind="conv2d", in_shape=(1, 128, 56, 56), w_shape=(128, 128, 3, 3),
        out_shape=(1, 128, 28, 28), out_channels=128, stride=(2, 2), dilation=(1, 1),
        padding=(1, 1, 1, 1), dtype="float32", in_block=8, out_block=8), intrin, avx2)
    config = cpu.default(strided, avx2)
    assert config.front == -1, cpu.describe(config, strided)
    dense = prepare(fp32_op("gemm", (128, 768, 768), intrin), intrin)
    assert cpu.default(dense, avx2).front == cpu.lanes_loop(dense) == 1
