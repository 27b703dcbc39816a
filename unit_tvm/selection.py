"""Which instruction an operation gets: the one rule, and its thresholds.

Op level (`unit_tvm.build`), the graph pass (`UnitTensorize`), bench-op and the tuner's race
all decide through this module; the numbers that decide are named here and nowhere else.

The rule. Instructions are preferred in registry order (`intrinsics._MODULES` lists the
fastest first: AMX tiles, then 512-bit vectors, then narrower ones; on ARM smmla, then sdot).
An instruction whose zero padding multiplies the op's work by more than MAX_WASTE is passed
over for the next one. Among the forms of one family (`Intrinsic.family`: AMX tdpbusd alone or
chained) the one that pads least is used. When every instruction pads more than MAX_WASTE, the
one that pads least is still better than none. An instruction that takes the activation only
re-based (uint8 as int8, x - 128: arm.smmla and arm.sdot for a u8 x s8 op) is a candidate only
where none takes the op's dtypes as they are; it costs one xor per activation byte. Where
measuring is cheap (bench-op, `tune=True`) a race replaces the guess: candidates up to
RACE_WASTE are timed with their default configs, and those within RACE_CLOSE of the fastest
are tuned.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .intrinsics import Intrinsic

# An instruction is passed over for the next one when padding makes it compute this much more.
MAX_WASTE = 1.5
# A benchmark races every candidate up to this much padding: AMX on 80 channels padded to 128
# still beats the vector instructions 3x, and a race only costs time.
RACE_WASTE = 1.75
# The tuner's race: alternatives whose default config is within RACE_CLOSE of the fastest are
# tuned too, RACE_MOST in all.
RACE_CLOSE = 1.05
RACE_MOST = 2
# After the race (or from the database, whose records come from separate tuning runs), a later
# alternative replaces an earlier one only when it is faster by more than this: two runs of one
# kernel on the shared VM differ by a few %, and the preference order is the better guess then.
RACE_KEEP = 1.03


@dataclass(frozen=True)
class Candidate:
    """One instruction for one op: how much padding multiplies the work, and what the caller
    prepared for it (a Prepared op and its schedule, or nothing)."""

    intrinsic: Intrinsic
    waste: float
    prepared: object = None

    @property
    def fits(self) -> bool:
        """Whether its padding is within MAX_WASTE."""
        return self.waste <= MAX_WASTE


def mapping_waste(mapping) -> float:
    """Work the instruction does / work the op needs, from a Mapping's padded loops."""
    waste = 1.0
    for m in mapping.loops:
        waste *= (m.op_extent + m.padding) / m.op_extent
    return waste


def channel_waste(intrin: Intrinsic, reduce: int, columns: int) -> float:
    """The same factor for a packed layout: the reduction padded to the instruction's input
    block, the output channels (columns) to its output block."""
    x, y = intrin.channel_blocks
    return (-(-reduce // x) * x / reduce) * (-(-columns // y) * y / columns)


def preferred(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Candidates (given in registry order) best first, by the rule above: those that fit, by
    family in the order their first fitting form appears and within a family by least padding
    (ties: registry order); then the rest by least padding."""
    cands = list(candidates)
    family_rank = {}
    for c in cands:
        if c.fits:
            family_rank.setdefault(c.intrinsic.family, len(family_rank))
    fits = sorted((c for c in cands if c.fits),
                  key=lambda c: (family_rank[c.intrinsic.family], c.waste))
    rest = sorted((c for c in cands if not c.fits), key=lambda c: c.waste)
    return fits + rest


def with_rebased(exact: Iterable[Candidate], rebased: Iterable[Candidate]) -> list[Candidate]:
    """preferred(exact) when any instruction takes the op's dtypes as they are, else
    preferred(rebased): re-basing is the fallback, never a reason to pass one over."""
    return preferred(exact) or preferred(rebased)


def first_choice(intrins: Iterable[Intrinsic],
                 evaluate: Callable[[Intrinsic], Candidate | None]) -> Candidate | None:
    """preferred(...)[0] over `intrins` (registry order), evaluating lazily: once one fits,
    only the other forms of its family are evaluated (preparing an op for an instruction
    costs up to a second). evaluate returns None for an instruction that cannot run the op."""
    seen, family = [], None
    for intrin in intrins:
        if family is not None and intrin.family != family:
            continue
        cand = evaluate(intrin)
        if cand is None:
            continue
        seen.append(cand)
        if cand.fits and family is None:
            family = intrin.family
    ordered = preferred(seen)
    return ordered[0] if ordered else None


def worth_racing(candidates: Iterable[Candidate]) -> list[Candidate]:
    """The candidates a benchmark times (registry order kept): every tile form within
    RACE_WASTE, and the first vector instruction within it (a later vector instruction is a
    narrower form of the same work, never faster)."""
    out, vector = [], False
    for c in candidates:
        if c.waste > RACE_WASTE:
            continue
        if not c.intrinsic.tile:
            if vector:
                continue
            vector = True
        out.append(c)
    return out
