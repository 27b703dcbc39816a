"""The instruction-selection rule (unit_tvm.selection), on the registry's own instructions."""

from unit_tvm import intrinsics, selection
from unit_tvm.selection import Candidate

AMX = [intrinsics.get(n) for n in ("x86.tdpbusd.x4", "x86.tdpbusd.x2", "x86.tdpbusd")]
VNNI = intrinsics.get("x86.vpdpbusd")
VNNI256 = intrinsics.get("x86.vpdpbusd.256")


def _names(cands):
    return [c.intrinsic.name for c in cands]


def test_first_fitting_family_then_least_padding_within_it():
    # the x4 chain pads 288 channels to 512 (too much), x2 to 384, alone to 320
    cands = [Candidate(AMX[0], 512 / 288), Candidate(AMX[1], 384 / 288),
             Candidate(AMX[2], 320 / 288), Candidate(VNNI, 1.0), Candidate(VNNI256, 1.0)]
    assert _names(selection.preferred(cands)) == [
        "x86.tdpbusd", "x86.tdpbusd.x2", "x86.vpdpbusd", "x86.vpdpbusd.256", "x86.tdpbusd.x4"]


def test_nothing_fits_least_padding_wins():
    cands = [Candidate(AMX[2], 3.0), Candidate(VNNI, 2.0), Candidate(VNNI256, 1.6)]
    assert _names(selection.preferred(cands)) == ["x86.vpdpbusd.256", "x86.vpdpbusd",
                                                  "x86.tdpbusd"]


def test_first_choice_is_preferred_first_and_skips_other_families():
    wastes = {AMX[0].name: 2.0, AMX[1].name: 1.4, AMX[2].name: 1.1, VNNI.name: 1.0}
    evaluated = []

    def evaluate(intrin):
        evaluated.append(intrin.name)
        return Candidate(intrin, wastes[intrin.name])

    chosen = selection.first_choice([*AMX, VNNI], evaluate)
    full = selection.preferred([Candidate(i, wastes[i.name]) for i in [*AMX, VNNI]])
    assert chosen.intrinsic is full[0].intrinsic is AMX[2]
    assert VNNI.name not in evaluated  # a faster family fits: the vector one is not prepared


def test_first_choice_none_when_nothing_runs_the_op():
    assert selection.first_choice([VNNI, VNNI256], lambda intrin: None) is None


def test_worth_racing_keeps_tile_forms_and_the_first_vector_instruction():
    cands = [Candidate(AMX[0], 1.8), Candidate(AMX[1], 1.2), Candidate(AMX[2], 1.1),
             Candidate(VNNI, 1.0), Candidate(VNNI256, 1.0)]
    assert _names(selection.worth_racing(cands)) == ["x86.tdpbusd.x2", "x86.tdpbusd",
                                                     "x86.vpdpbusd"]


def test_channel_waste_pads_both_blocks():
    x, y = VNNI.channel_blocks  # 4 input channels per word, 16 output lanes
    assert selection.channel_waste(VNNI, 3, 64) == 4 / 3
    assert selection.channel_waste(VNNI, 80, 20) == 32 / 20
    assert (x, y) == (4, 16)


def _conv_recipe(channels):
    from unit_tvm.relax.core.recipe import Recipe

    return Recipe(kind="conv2d", in_shape=(1, channels, 8, 8), w_shape=(32, channels, 3, 3),
                  out_shape=(1, 32, 8, 8), out_channels=32, x_scale=0.1, x_zp=7,
                  stride=(1, 1), dilation=(1, 1), padding=(1, 1, 1, 1))


def test_rebased_instructions_only_where_none_takes_the_dtypes():
    """A u8 x s8 conv: on aarch64 only s8 x s8 instructions exist, so they run it re-based
    (smmla first, sdot where smmla pads too much; udot takes no s8 weights); on x86 the u8 x s8
    ones are used as they are and nothing is re-based."""
    from unit_tvm.cross import aarch64
    from unit_tvm.relax.core.recipe import candidates, dtypes, for_instruction
    from unit_tvm.target import host

    arm = aarch64.target()
    assert [i.name for i in candidates(_conv_recipe(64), arm)] == ["arm.smmla", "arm.sdot"]
    assert [i.name for i in candidates(_conv_recipe(3), arm)] == ["arm.sdot", "arm.smmla"]
    signed = for_instruction(_conv_recipe(64), intrinsics.get("arm.smmla"))
    assert signed.x_signed and dtypes(signed) == ("int8", "int8", "int32")
    for intrin in candidates(_conv_recipe(64), host()):
        assert intrin.input_dtypes[0] == "uint8"
        assert for_instruction(_conv_recipe(64), intrin) == _conv_recipe(64)
    exact, rebased = [Candidate(VNNI, 1.2)], [Candidate(intrinsics.get("arm.sdot"), 1.0)]
    assert _names(selection.with_rebased(exact, rebased)) == ["x86.vpdpbusd"]
    assert _names(selection.with_rebased([], rebased)) == ["arm.sdot"]


def test_rebased_zero_point_term_keeps_the_sums_exact():
    """sum((x - 128) * w) - rebased_comp == sum(x * w) - comp, exactly, at the int8 extremes."""
    import numpy as np

    from unit_tvm.relax.cpu.weights import rebased_comp

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (5, 300)).astype(np.int64)
    w = rng.integers(-128, 128, (7, 300)).astype(np.int8)
    x[0], w[0] = 255, -128
    zp = 200
    comp = (zp * w.astype(np.int64).sum(axis=1)).astype(np.int32)
    u8 = x @ w.astype(np.int64).T - comp
    s8 = (x - 128) @ w.astype(np.int64).T - rebased_comp(comp, w)
    np.testing.assert_array_equal(u8, s8)
