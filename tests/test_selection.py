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
