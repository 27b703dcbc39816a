"""Mapping: which loops of a tensor operation carry which loops of an instruction."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LoopMatch:
    """One instruction loop bound to one operation loop.

    op_index is the loop's position in the op's axes (data-parallel axes, then reduction axes),
    which is also its position in the loop nest te.create_prim_func makes. `padding` is how many
    iterations must be added to op_extent to make it a multiple of intrin_extent.
    """

    intrin_loop: str
    intrin_extent: int
    kind: str  # "S" data-parallel or "R" reduction
    op_loop: str
    op_index: int
    op_extent: int
    padding: int = 0

    @property
    def fit(self):
        """'equal', 'divisible' or 'padded'."""
        if self.padding:
            return "padded"
        return "equal" if self.op_extent == self.intrin_extent else "divisible"


@dataclass(frozen=True)
class OperandAccess:
    """How one op operand is read by the instruction's loops under a mapping."""

    op_tensor: str
    intrin_operand: str
    contiguous: bool  # the region one instruction reads is dense in the instruction's layout
    broadcast_along: tuple = ()  # instruction loops the operand does not vary along
    strides: tuple = ()  # element stride of the op tensor along each instruction loop


@dataclass(frozen=True)
class Mapping:
    """A feasible way to compute part of an operation with an instruction (UNIT §III-B)."""

    intrinsic: str
    op: str
    loops: tuple  # LoopMatch, in the instruction's loop order
    operands: tuple = field(default=())  # OperandAccess per instruction input operand

    @property
    def padded(self):
        return any(m.padding for m in self.loops)

    def op_indices(self):
        """Positions of the op loops used, in instruction loop order."""
        return [m.op_index for m in self.loops]

    def __str__(self):
        parts = [f"{self.intrinsic} on {self.op}:"]
        for m in self.loops:
            pad = f" (+{m.padding} padding)" if m.padding else ""
            parts.append(f"  {m.kind} {m.intrin_loop}[{m.intrin_extent}] -> {m.op_loop}"
                         f"[{m.op_extent}] {m.fit}{pad}")
        for a in self.operands:
            how = "contiguous" if a.contiguous else "strided (packed before use)"
            bc = f", broadcast along {','.join(a.broadcast_along)}" if a.broadcast_along else ""
            parts.append(f"  operand {a.intrin_operand} <- {a.op_tensor}: {how}{bc}")
        return "\n".join(parts)
