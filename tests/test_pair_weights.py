"""pair_weights: int8 weights bounded in pairs for the pre-VNNI pair form (vpmaddubsw), the
per-layer choice between them and 8-bit weights, and the instruction's saturation they avoid."""

import numpy as np
import pytest
import tvm

from unit_tvm import intrinsics, measure, microkernel
from unit_tvm.intrinsics import PairSumBound
from unit_tvm.relax.quantization import pair_weights
from unit_tvm.relax.quantization.weight_scales import int8_weight_scales
from unit_tvm.target import host

from .conftest import require_host

BOUND = PairSumBound(128)


@pytest.mark.parametrize("shape", [(8, 3, 7, 7), (16, 5, 3, 3), (12, 64), (4, 33, 1, 1),
                                   (6, 4, 3, 3, 3)])
def test_pair_bounded_weights_obey_the_bound_in_either_packing(shape, rng):
    """Whatever the weights (heavy tails included), the pair scales make every adjacent pair
    of input channels and of window columns obey |q0| + |q1| <= 128 after rounding."""
    w = rng.standard_t(2, size=shape).astype(np.float32)
    moments = np.ones(shape[:2])
    choice = pair_weights.choose(w, int8_weight_scales(w), BOUND, moments)
    pq = pair_weights.quantized(w, np.maximum(pair_weights.max_pair_sums(w), 1e-12) / 127)
    assert pair_weights.pairs_obey(pq, BOUND)
    if choice.pair_bound is not None:
        assert pair_weights.pairs_obey(choice.wq, BOUND)
    # 8-bit weights of the same tensor break it (their pairs reach 2 x 127)
    assert not pair_weights.pairs_obey(pair_weights.quantized(w, int8_weight_scales(w)), BOUND)


def test_gaussian_layers_take_the_pair_form_and_an_outlier_layer_keeps_8_bits(rng):
    """Gaussian weights lose ~2e-5 of output cosine (estimated) and take the pair form; a
    channel with one large pair, where the pair grid is twice as coarse as the
    8-bit one for its many small weights, loses more than PAIR_MAX_COSINE_LOSS and keeps 8-bit
    weights."""
    w = rng.standard_normal((32, 64, 3, 3)).astype(np.float32)
    moments = np.ones((32, 64))
    choice = pair_weights.choose(w, int8_weight_scales(w), BOUND, moments)
    assert choice.pair_bound == 128 and 0 < choice.pair_loss < pair_weights.PAIR_MAX_COSINE_LOSS
    # one large pair per channel over small weights: the pair grid doubles every step
    few = 0.01 * rng.standard_normal((4, 1000)).astype(np.float32)
    few[:, :2] = 1.0
    kept = pair_weights.choose(few, int8_weight_scales(few), BOUND, np.ones((4, 1000)))
    assert kept.pair_bound is None and kept.pair_loss > pair_weights.PAIR_MAX_COSINE_LOSS
    np.testing.assert_array_equal(kept.wq, pair_weights.quantized(few, int8_weight_scales(few)))


def test_weights_already_within_the_bound_keep_their_integers():
    """A QDQ file's weights that obey the bound already keep the file's integers (no loss)."""
    wq = np.tile(np.array([100, -28, 64, 64], np.int8), (3, 2))
    scales = np.full(3, 0.01)
    w = (wq * 0.01).astype(np.float32)
    choice = pair_weights.choose(w, scales, BOUND, np.ones((3, 8)))
    assert choice.pair_bound == 128 and choice.pair_loss == 0.0
    np.testing.assert_array_equal(choice.wq, wq)


def test_no_bound_means_8_bit_weights(rng):
    w = rng.standard_normal((4, 16)).astype(np.float32)
    choice = pair_weights.choose(w, int8_weight_scales(w), None, np.ones((4, 16)))
    assert choice.pair_bound is None and choice.pair_loss is None


@pytest.mark.parametrize("name", ["x86.vpmaddubsw", "x86.vpmaddubsw.256"])
def test_pair_form_is_exact_on_full_u8_with_bounded_weights(name, rng):
    """The pair form on u8 activations up to 255 (outside its u7 range) is exact when the
    weights obey the pair bound: random pairs within it, and (-128, 0), (64, 64) at a = 255."""
    require_host(name)
    intrin = intrinsics.get(name)
    assert intrin.weight_bound == BOUND
    func, (a_t, b_t), out = microkernel.instruction_kernel(intrin, 64)
    lib = tvm.tirx.build(func, target=host())
    a = rng.integers(0, 256, [int(x) for x in a_t.shape]).astype("uint8")
    a[:8] = 255
    b = rng.integers(-128, 128, [int(x) for x in b_t.shape]).astype(np.int64)
    room = 128 - np.abs(b[..., 0::2])  # each pair's second element within what the first leaves
    b[..., 1::2] = np.clip(rng.integers(-128, 128, room.shape), -room, np.minimum(room, 127))
    b[:4, :, 0::2], b[:4, :, 1::2] = -128, 0
    b[4:8, :, 0::2], b[4:8, :, 1::2] = 64, 64
    b = b.astype(np.int8)
    assert BOUND.holds(b)
    args = measure.to_device([a, b, np.zeros([int(x) for x in out.shape], "int32")], tvm.cpu())
    lib(*args)
    want = np.einsum("nk,nik->ni", a.astype(np.int64), b.astype(np.int64))
    np.testing.assert_array_equal(args[-1].numpy(), want)



def test_weights_that_arrived_quantized_keep_their_integers(rng):
    """A QDQ file's int8 weights that break the bound are not requantized onto the pair grid:
    the file's integers are the model (the layer runs on the exact int16 form instead)."""
    wq = rng.integers(-127, 128, (6, 16)).astype(np.int8)
    scales = np.full(6, 0.02)
    w = (wq * 0.02).astype(np.float32)
    choice = pair_weights.choose(w, scales, BOUND, np.ones((6, 16)), given=True)
    assert choice.pair_bound is None
    np.testing.assert_array_equal(choice.wq, wq)
