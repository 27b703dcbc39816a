"""pair_weights: int8 weights bounded in pairs (quads) for the pre-VNNI pair (quad) form, the
per-layer choice among them and 8-bit weights, and the instructions' saturation they avoid."""

import numpy as np
import pytest
import tvm

from unit_tvm import intrinsics, measure, microkernel
from unit_tvm.intrinsics import PairSumBound
from unit_tvm.relax.core.recipe import Blocks
from unit_tvm.relax.cpu.weights import pack_conv_weight, pack_dense_weight
from unit_tvm.relax.quantization import pair_weights
from unit_tvm.relax.quantization.weight_scales import int8_weight_scales
from unit_tvm.target import host

from .conftest import require_host

BOUND = PairSumBound(128)
QUAD = PairSumBound(128, words=2)


@pytest.mark.parametrize("shape", [(8, 3, 7, 7), (16, 5, 3, 3), (12, 64), (4, 33, 1, 1),
                                   (6, 4, 3, 3, 3)])
def test_pair_bounded_weights_obey_the_bound_in_either_packing(shape, rng):
    """Whatever the weights (heavy tails included), the pair scales make every adjacent pair
    of input channels and of window columns obey |q0| + |q1| <= 128 after rounding."""
    w = rng.standard_t(2, size=shape).astype(np.float32)
    moments = np.ones(shape[:2])
    choice = pair_weights.choose(w, int8_weight_scales(w), [BOUND], moments)
    pq = pair_weights.quantized(w, np.maximum(pair_weights.max_group_sums(w, BOUND), 1e-12) / 127)
    assert pair_weights.obey(pq, BOUND)
    if choice.bound is not None:
        assert pair_weights.obey(choice.wq, BOUND)
    # 8-bit weights of the same tensor break it (their pairs reach 2 x 127)
    assert not pair_weights.obey(pair_weights.quantized(w, int8_weight_scales(w)), BOUND)


@pytest.mark.parametrize("shape", [(8, 3, 7, 7), (16, 13, 3, 3), (12, 64), (4, 33, 1, 1)])
def test_quad_bounded_weights_obey_quads_and_pairs(shape, rng):
    """The quad scales (max quad sum / 126: rounding adds up to 4 half steps) make every
    int16 group of the quad form obey the bound, and the pairs of either packing too (quad
    weights may run on the pair form); checked on the packed layout as the kernel reads it."""
    w = rng.standard_t(2, size=shape).astype(np.float32)
    choice = pair_weights.choose(w, int8_weight_scales(w), [QUAD], np.ones(shape[:2]))
    qq = pair_weights.quantized(w, np.maximum(pair_weights.max_group_sums(w, QUAD), 1e-12) / 126)
    for wq in [qq] + ([choice.wq] if choice.bound is not None else []):
        assert pair_weights.obey(wq, QUAD) and pair_weights.obey(wq, BOUND)
        # as the quad form's kernels read them: [.., 2 words, 8 lanes, 4]
        pack = pack_conv_weight if wq.ndim > 2 else pack_dense_weight
        assert QUAD.holds_packed(pack(wq, Blocks(8, 8, 4)))
    # groups are (0, 1, 4, 5) and (2, 3, 6, 7): a pair of one word plus the same of the next
    assert QUAD.holds([[64, 0, 127, 0, 0, 64, 0, 0]])
    assert not QUAD.holds([[64, 0, 0, 0, 0, 65, 0, 0]])
    assert QUAD.implies(BOUND) and not BOUND.implies(QUAD)


def test_gaussian_layers_take_the_pair_form_and_an_outlier_layer_keeps_8_bits(rng):
    """Gaussian weights lose ~2e-5 of output cosine (estimated) and take the pair form; a
    channel with one large pair, where the pair grid is twice as coarse as the
    8-bit one for its many small weights, loses more than MAX_COSINE_LOSS and keeps 8-bit
    weights."""
    limit = pair_weights.MAX_COSINE_LOSS[1]
    w = rng.standard_normal((32, 64, 3, 3)).astype(np.float32)
    moments = np.ones((32, 64))
    choice = pair_weights.choose(w, int8_weight_scales(w), [BOUND], moments)
    assert choice.bound == BOUND and 0 < choice.loss < limit
    # one large pair per channel over small weights: the pair grid doubles every step
    few = 0.01 * rng.standard_normal((4, 1000)).astype(np.float32)
    few[:, :2] = 1.0
    kept = pair_weights.choose(few, int8_weight_scales(few), [BOUND], np.ones((4, 1000)))
    assert kept.bound is None and kept.loss > limit
    np.testing.assert_array_equal(kept.wq, pair_weights.quantized(few, int8_weight_scales(few)))


def test_fastest_bound_within_its_loss_is_chosen(rng):
    """Bounds are tried fastest first: a Gaussian layer takes the quad form (loss within
    MAX_COSINE_LOSS[2], more than the pair form would lose); a layer whose quads would lose too
    much (large weights spread one per quad over small ones) falls back to the pair form."""
    w = rng.standard_normal((32, 256)).astype(np.float32)
    quad = pair_weights.choose(w, int8_weight_scales(w), [QUAD, BOUND], np.ones((32, 256)))
    pair = pair_weights.choose(w, int8_weight_scales(w), [BOUND], np.ones((32, 256)))
    assert quad.bound == QUAD and pair.bound == BOUND
    assert pair.loss < quad.loss <= pair_weights.MAX_COSINE_LOSS[2]
    # one quad (0, 1, 4, 5) of two large weights over 1024 small ones: the quad grid is twice
    # the 8-bit one for all of them, the pairs (one large weight each) keep it
    spread = 0.01 * rng.standard_normal((4, 1024)).astype(np.float32)
    spread[:, 0] = spread[:, 4] = 1.0
    kept = pair_weights.choose(spread, int8_weight_scales(spread), [QUAD, BOUND],
                               np.ones((4, 1024)))
    assert kept.bound == BOUND


def test_weights_already_within_the_bound_keep_their_integers():
    """A QDQ file's weights that obey the bound already keep the file's integers (no loss)."""
    wq = np.tile(np.array([100, -28, 64, 64], np.int8), (3, 2))
    scales = np.full(3, 0.01)
    w = (wq * 0.01).astype(np.float32)
    choice = pair_weights.choose(w, scales, [BOUND], np.ones((3, 8)))
    assert choice.bound == BOUND and choice.loss == 0.0
    np.testing.assert_array_equal(choice.wq, wq)


def test_no_bound_means_8_bit_weights(rng):
    w = rng.standard_normal((4, 16)).astype(np.float32)
    choice = pair_weights.choose(w, int8_weight_scales(w), [], np.ones((4, 16)))
    assert choice.bound is None and choice.loss is None


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
    choice = pair_weights.choose(w, scales, [QUAD, BOUND], np.ones((6, 16)), given=True)
    assert choice.bound is None
    np.testing.assert_array_equal(choice.wq, wq)


@pytest.mark.parametrize("name", ["x86.vpmaddubsw.quad", "x86.vpmaddubsw.quad.256"])
def test_quad_form_is_exact_on_full_u8_with_quad_bounded_weights(name, rng):
    """The quad form (two vpmaddubsw added by vpaddw, then vpmaddwd) on u8 activations up to
    255 is exact on weights under its bound, at the bound's edges (a quad of -128, or 64 + 64
    from the two words, against a = 255); without the bound the int16 sum wraps."""
    require_host(name)
    intrin = intrinsics.get(name)
    assert intrin.weight_bound == QUAD
    func, (a_t, b_t), out = microkernel.instruction_kernel(intrin, 64)
    lib = tvm.tirx.build(func, target=host())
    assert all(m in lib.inspect_source("asm") for m in ("vpmaddubsw", "vpaddw", "vpmaddwd"))
    a = rng.integers(0, 256, [int(x) for x in a_t.shape]).astype("uint8")  # [n, 8]
    a[:8] = 255
    b = rng.integers(-32, 33, [int(x) for x in b_t.shape]).astype(np.int64)  # [n, 2, lanes, 4]
    b[:4] = 0
    b[:2, 0, :, 0], b[2:4, 0, :, 1], b[2:4, 1, :, 1] = -128, 64, 64
    b = b.astype(np.int8)
    assert QUAD.holds_packed(b)
    args = measure.to_device([a, b, np.zeros([int(x) for x in out.shape], "int32")], tvm.cpu())
    lib(*args)
    logical = b.transpose(0, 2, 1, 3).reshape(64, intrin.lanes, 8).astype(np.int64)
    want = np.einsum("nk,nik->ni", a.astype(np.int64), logical)
    np.testing.assert_array_equal(args[-1].numpy(), want)
    # outside the bound: 255 * 127 * 2 (pair) * 2 (words) does not fit int16
    a[:] = 255
    b = np.full_like(b, 127)
    args = measure.to_device([a, b, np.zeros([int(x) for x in out.shape], "int32")], tvm.cpu())
    lib(*args)
    assert not QUAD.holds_packed(b)
    assert (args[-1].numpy() != 8 * 255 * 127).all()


def test_checks_in_row_chunks_decide_as_on_the_whole_weight(monkeypatch):
    # the checks run over output channels a chunk at a time (an LLM head's float64 temporaries):
    # chunks that do not divide the rows decide exactly as one pass over the whole weight
    rng = np.random.default_rng(5)
    w = rng.standard_normal((37, 24, 3)).astype(np.float32)
    w[5, 3, 1] = 9.0  # one large weight: the 8-bit integers break the pair bound there
    m2 = rng.uniform(0.5, 2.0, (37, 24))
    scales = int8_weight_scales(w)
    whole = pair_weights.choose(w, scales, [QUAD, BOUND], m2)
    sums = pair_weights.max_group_sums(w, BOUND)
    cosine = pair_weights.estimated_cosine(w, whole.wq, whole.scales, m2)
    monkeypatch.setattr(pair_weights, "CHUNK_ROWS", 8)
    chunked = pair_weights.choose(w, scales, [QUAD, BOUND], m2)
    assert chunked.bound == whole.bound and np.array_equal(chunked.wq, whole.wq)
    assert np.array_equal(pair_weights.max_group_sums(w, BOUND), sums)
    assert abs(pair_weights.estimated_cosine(w, whole.wq, whole.scales, m2) - cosine) < 1e-12
    assert not pair_weights.obey(pair_weights.quantized(w, scales), BOUND)
