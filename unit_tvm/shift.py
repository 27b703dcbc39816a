"""Re-basing 8-bit operands so that a u8 x s8 instruction computes s8 x s8, u8 x u8 and s8 x u8.

With x' = x + dx and y' = y + dy (dx, dy in {0, +128, -128}: s8 -> u8 adds 128, u8 -> s8
subtracts 128, both exact in 8 bits),

    sum_k x*y = sum_k x'*y' - dx * sum_k y - dy * sum_k x - dx * dy * K

exactly in int32, where K is the number of reduction iterations. The instruction computes the
first sum; each correction is a reduction over one operand alone (computed once per call, e.g.
128 * sum_k B[j, k] for a dense), and K is a constant. Padding added for the instruction reads
zeros of the *shifted* operands and adds nothing. Only sums have such a correction: a max or
min of shifted products is not the shifted max, so those ops are never shifted.
"""

from dataclasses import dataclass
from itertools import combinations

import tvm_ffi
from tvm import te, tirx

from .indexing import vars_in
from .inspector import NoMatch, compute_isomorphism
from .te_expr import combiner, is_load, loads, mutate_expr, recompute

SHIFT = 128
_TO = {"int8": ("uint8", SHIFT), "uint8": ("int8", -SHIFT)}


def rebased_dtype(dtype: str) -> str | None:
    """The dtype an 8-bit operand of `dtype` becomes when re-based (int8 <-> uint8), or None
    for a dtype that cannot be."""
    return _TO[dtype][0] if dtype in _TO else None


@dataclass(frozen=True)
class Correction:
    """sum over the reduction of `delta` * (the other operand), indexed by the output axes that
    operand reads: subtracted from the instruction's result."""

    tensor: te.Tensor
    axes: tuple  # positions of the op's output axes the tensor is indexed by


@dataclass(frozen=True)
class Shift:
    """An op whose 8-bit operands were re-based for an instruction, and its exact correction."""

    op: te.Tensor  # the op reading the shifted operands
    shifted: tuple  # names of the original tensors that were shifted
    stages: tuple  # names of the shift and correction computes
    corrections: tuple  # Correction, each subtracted from the core
    constant: int  # dx * dy * K, subtracted as well

    def corrected(self, core_value, out_indices):
        """The op's value from the instruction's result `core_value` at output indices."""
        for c in self.corrections:
            core_value = core_value - c.tensor(*[out_indices[p] for p in c.axes])
        if self.constant:
            core_value = core_value - tirx.const(self.constant, "int32")
        return core_value


def _product_operands(op):
    """The two distinct tensors whose cast product an integer sum reduces, or None."""
    body = op.body[0]
    if combiner(op) != "sum" or str(op.output(0).dtype) != "int32":
        return None
    src = body.source[0]
    if type(src).__name__ != "Mul":
        return None
    found = []
    for side in (src.a, src.b):
        if type(side).__name__ != "Cast" or not is_load(side.value):
            return None
        found.append(side.value.args[0])
    if found[0].same_as(found[1]) or any(str(t.dtype) not in _TO for t in found):
        return None
    return found


def _shifted(t):
    dtype, delta = _TO[str(t.dtype)]
    return te.compute(t.shape, lambda *i: (t(*i).astype("int32") + delta).astype(dtype),
                      name=f"{t.op.name}_{'u8' if dtype == 'uint8' else 's8'}")


def _correction(op, tensor, delta, index):
    """sum_k delta * other(...) over the axes the other operand reads (see module doc)."""
    red = op.body[0]
    src = red.source[0]
    other = [c for c in loads(src) if not c.args[0].same_as(tensor)]
    used = set().union(*[vars_in(i) for c in other for i in list(c.args)[1:]])
    positions = [p for p, ax in enumerate(op.axis) if ax.var.name in used]
    axes = [op.axis[p] for p in positions]

    def on_cast(node, m):
        if is_load(node.value) and node.value.args[0].same_as(tensor):
            return tirx.const(delta, str(node.ty))
        return m.default_mutate(node)

    body = tvm_ffi.structural_mutate(src, [(tirx.Cast, on_cast)])
    names = [ax.var.name for ax in axes]

    def fcompute(*vs):
        vm = dict(zip(names, vs))
        new_red = [te.reduce_axis((0, int(r.dom.extent)), name=r.var.name) for r in red.axis]
        vm.update({r.var.name: n.var for r, n in zip(red.axis, new_red)})
        return te.sum(mutate_expr(body, lambda t, idx: t(*idx), vm), axis=new_red)

    comp = te.compute([int(ax.dom.extent) for ax in axes], fcompute,
                      name=f"compensation{index}" if index else "compensation")
    return Correction(comp, tuple(positions))


def shift_plans(op, intrin) -> list:
    """Every Shift of op's 8-bit operands (one operand first, then both) under which `intrin`'s
    compute matches; [] when the instruction is not u8 x s8 or op is not an integer sum of a
    product of two 8-bit tensors."""
    if set(intrin.input_dtypes) != {"uint8", "int8"}:
        return []
    operands = _product_operands(op.op)
    if operands is None:
        return []
    k_total = 1
    for r in op.op.body[0].axis:
        k_total *= int(r.dom.extent)
    plans = []
    for n in (1, 2):
        for chosen in combinations(operands, n):
            pairs = [(t, _shifted(t)) for t in chosen]
            new = recompute(op.op, lambda t, idx, pairs=pairs: next(
                (s for o, s in pairs if o.same_as(t)), t)(*idx))
            try:
                compute_isomorphism(new.op, intrin)
            except NoMatch:
                continue
            corrections = tuple(_correction(op.op, t, _TO[str(t.dtype)][1], i)
                                for i, t in enumerate(chosen))
            deltas = [_TO[str(t.dtype)][1] for t in chosen]
            constant = deltas[0] * deltas[1] * k_total if n == 2 else 0
            stages = tuple(s.op.name for _, s in pairs) + tuple(
                c.tensor.op.name for c in corrections)
            plans.append(Shift(new, tuple(t.op.name for t in chosen), stages, corrections,
                               constant))
    return plans
