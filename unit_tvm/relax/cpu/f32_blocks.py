"""Float32 edges in channel blocks: where a quantized conv's float32 result flows only through
elementwise ops (SiLU's sigmoid and multiply, hardswish's arithmetic, a squeeze-excitation
gate's per-channel multiply) and means over H and W into quantized convs, the conv writes
NCHW[y]c, the elementwise ops run on the blocks, each mean reshapes its blocked result back to
NCHW (a [1, C, 1, 1] tensor has the same bytes in both layouts) and the convs read the blocks.

Without it the producer writes float32 NCHW lane by lane (its accumulators hold 16 channels of
a pixel) and every reader packs NCHW back into channel vectors: a transpose on each side of
EfficientNet's and MobileNetV3's squeeze-excitation.

`regions` decides (on main, before UnitTensorize replaces its calls); `blocked_op` rewrites one
of a region's Relax ops while UnitTensorize's _Replace visits main."""

from typing import NamedTuple

import numpy as np
import tvm
from tvm import relax

from ..core.graph import readers as binding_readers
from ..core.graph import static_shape, vars_in
from ..core.recipe import candidates, is_bf16
from .edge_layouts import producers
from .qarith import round_up

# elementwise ops that compute the same thing on NCHW[b]c as on NCHW (scalar and per-channel
# second operands aside: see _side_operand)
ELEMENTWISE = frozenset({
    "relax.sigmoid", "relax.tanh", "relax.exp", "relax.sqrt", "relax.negative", "relax.abs",
    "relax.nn.relu", "relax.nn.silu", "relax.clip", "relax.add", "relax.subtract",
    "relax.multiply", "relax.divide", "relax.minimum", "relax.maximum", "relax.erf",
})
# reductions over H and W whose blocked form is the same reduction over the blocked H and W
SPATIAL_REDUCTIONS = frozenset({"relax.mean", "relax.sum"})


class F32Region(NamedTuple):
    """One float32 region: a conv's result and the values computed from it in blocks."""

    producer: int  # index of the conv call that writes NCHW[block]c
    block: int
    ops: tuple  # elementwise Calls computed on the blocks
    reductions: tuple  # mean / sum Calls over H and W reading the blocks
    readers: tuple  # (call index, "x" | "residual") of the convs reading the blocks
    gates: tuple = ()  # GateFold: gate multiplies the convs reading them compute instead


class GateFold(NamedTuple):
    """A multiply of a region value by a per-channel [1, C, 1, 1] gate (squeeze-excitation's)
    whose every reader is a quantized conv reading it as its input: each such conv multiplies
    its input by the gate as it quantizes it (recipe.x_gate), and the multiply is not
    computed."""

    op: object  # the multiply Call
    value: object  # its region operand, which the convs read instead
    gate: object  # its [1, C, 1, 1] operand, passed to the convs
    readers: tuple  # call indices of the convs


def regions(func, calls, recipes, target) -> dict:
    """{producer's call index: F32Region}: the float32 regions of main. A conv2d whose float32
    result (NCHW, written in its first instruction's output blocks) is read only by elementwise
    ops, spatial means and quantized conv2d ops (as input or residual), transitively, with
    every elementwise op's other operands scalars or per-channel [1, C, 1, 1] values; anything
    else reading a value of the region (the model's output, a reshape, a concat, a dense
    layer) keeps it NCHW."""
    bindings, call_index = producers(func, calls)
    readers_of = binding_readers(bindings)
    returned = set(vars_in(func.body.body))
    var_of = {i: v for v, i in call_index.items()}
    found = {}
    for i, recipe in enumerate(recipes):
        var = var_of.get(i)
        block = _producer_block(recipe, target)
        if var is None or block is None:
            continue
        region = _grow(var, recipe, readers_of, returned, call_index, calls, recipes)
        if region is None or not any(region[:3]):
            continue
        ops, reductions, readers, read_by = region
        if recipe.out_channels % block and not all(_finite_on_padding(b.value) for b in ops):
            continue
        gates = _gate_folds(ops, read_by, readers_of, call_index, returned, recipe)
        # a folded multiply is rewritten like the others, and left dead (DCE drops it)
        ops = [b.value for b in ops]
        found[i] = F32Region(i, block, tuple(ops), tuple(reductions), tuple(readers),
                             tuple(gates))
    return found


def _gate_folds(ops, read_by, readers_of, call_index, returned, recipe):
    """The region's multiplies by a per-channel gate that only quantized convs read, as their
    input (GateFold)."""
    shape = list(recipe.out_shape)
    gate_shape = [shape[0], shape[1], 1, 1]
    folds = []
    for b in ops:
        if b.value.op.name != "relax.multiply" or b.var in returned:
            continue
        a, g = b.value.args
        if static_shape(a) != shape:
            a, g = g, a
        if static_shape(a) != shape or static_shape(g) != gate_shape:
            continue
        bindings = readers_of.get(b.var, [])
        convs = [call_index.get(r.var) for r in bindings]
        roles = [role for j, role, v in read_by if v.same_as(b.var)]
        if bindings and None not in convs and roles == ["x"] * len(convs):
            folds.append(GateFold(b.value, a, g, tuple(convs)))
    return folds


def _finite_on_padding(call):
    """Whether an elementwise op keeps a padding lane finite: all but a division by something
    other than a constant scalar (a per-channel divisor is padded with zeros). The readers
    multiply the lanes up to their reduction's width by zero weights, and inf * 0 is NaN."""
    if call.op.name != "relax.divide":
        return True
    divisor = call.args[1]
    return isinstance(divisor, tvm.ir.expr.Constant) and divisor.value.numpy().size == 1


def _producer_block(recipe, target):
    """The output block a conv2d's float32 result would be written in, or None where it is not
    a region's producer (requantized, not 4-D, one pixel, no instruction). One pixel: NCHW is
    already channel vectors, and a per-channel operand would have the region's shape. Channels
    need not fill the last block: its padding lanes start at 0.0 (qarith.packed_output), stay
    finite through the region's ops (_finite_on_padding) and are left out by every reader."""
    if (recipe.kind != "conv2d" or recipe.out_q or is_bf16(recipe)
            or len(recipe.out_shape) != 4 or recipe.out_shape[0] != 1
            or recipe.out_shape[2] * recipe.out_shape[3] == 1):
        return None
    found = candidates(recipe, target)
    return found[0].channel_blocks[1] if found else None


def _grow(var, recipe, readers_of, returned, call_index, calls, recipes):
    """(elementwise bindings, reductions, conv readers (index, role), the same with the value
    each reads) reached from var, or None where a value of the region has a reader that cannot
    read blocks, or an elementwise op reads a full-size value from outside the region."""
    shape = list(recipe.out_shape)
    ops, reductions, readers, read_by = [], [], [], []
    todo, inside = [var], set()
    while todo:
        v = todo.pop()
        if v in inside:
            continue
        inside.add(v)
        if v in returned:
            return None
        for b in readers_of.get(v, []):
            value = b.value
            j = call_index.get(b.var)
            if j is not None:
                roles = _conv_roles(v, calls[j], recipes[j])
                if not roles:
                    return None
                readers += [(j, role) for role in roles if (j, role) not in readers]
                read_by += [(j, role, v) for role in roles]
            elif _is_spatial_reduction(value, v):
                if not any(value.same_as(r) for r in reductions):
                    reductions.append(value)
            elif _is_elementwise(value, shape, b.var):
                if not any(b.var.same_as(o.var) for o in ops):
                    ops.append(b)
                todo.append(b.var)
            else:
                return None
    # a full-size operand must be a region value too (not, say, another branch's NCHW result)
    if any(static_shape(a) == shape and not any(a.same_as(v) for v in inside)
           for op in ops for a in op.value.args if _is_tensor(a)):
        return None
    return ops, reductions, readers, read_by


def _conv_roles(var, call, recipe):
    """How a quantized op reads var: ["x"], ["residual"], both, or [] where it cannot read
    blocks (not a conv2d, or var in another argument)."""
    fields = list(call.args[1].fields)
    # (a bf16 conv could round the blocks as well; no model has needed it, so it is not tested)
    if recipe.kind != "conv2d" or recipe.in_u8 or recipe.x_view or is_bf16(recipe):
        return []
    roles = []
    if fields[0].same_as(var):
        roles.append("x")
    if recipe.residual and not recipe.residual_q and fields[-1].same_as(var):
        roles.append("residual")
    others = fields[1:-1] if recipe.residual else fields[1:]
    if any(f.same_as(var) for f in others):
        return []
    return roles


def _is_tensor(expr):
    return isinstance(getattr(expr, "ty", None), relax.TensorType)


def _is_spatial_reduction(value, var):
    """A mean or sum of var over its H and W axes (keepdims or not), nothing else."""
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name in SPATIAL_REDUCTIONS and value.args[0].same_as(var)):
        return False
    axes = value.attrs.axis
    return axes is not None and sorted(int(a) % 4 for a in axes) == [2, 3]


def _is_elementwise(value, shape, out_var):
    """An elementwise op whose result has the region's shape and whose operands are region
    values, scalars or per-channel values (see _side_operand)."""
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name in ELEMENTWISE and static_shape(out_var) == shape):
        return False
    for a in value.args:
        if not _is_tensor(a):
            continue  # a clip's bounds
        s = static_shape(a)
        if s is None or (s != shape and _side_operand(s, shape) is None):
            return False
    return True


def _side_operand(s, shape):
    """How an operand of shape s broadcast against the region's NCHW shape reads in blocks:
    "scalar" (every dimension 1: broadcasts against NCHW[b]c as it is), "channel" ([1, C, 1, 1]
    or [C, 1, 1]: reshaped to [1, C / b, 1, 1, b]), or None."""
    if all(d == 1 for d in s):
        return "scalar"
    c = shape[1]
    if tuple(s) in ((1, c, 1, 1), (c, 1, 1)):
        return "channel"
    return None


def blocked_op(builder, call, args, block):
    """The region op `call` on NCHW[block]c: args are its visited arguments (region values
    already blocked); a per-channel operand is reshaped to [1, C / block, 1, 1, block]; a
    spatial reduction runs over the blocked H and W and its result is reshaped to the call's
    NCHW shape (the same bytes: channel c is block c // b, lane c % b), less the padding
    lanes of a partly full last block."""
    if call.op.name in SPATIAL_REDUCTIONS:
        reduce = relax.op.mean if call.op.name == "relax.mean" else relax.op.sum
        blocked = builder.emit(reduce(args[0], axis=[2, 3], keepdims=True))
        c = static_shape(call.args[0])[1]
        padded = round_up(c, block)
        if padded == c:
            return relax.op.reshape(blocked, call.ty.shape)
        # the padding lanes' results are dropped
        flat = builder.emit(relax.op.reshape(blocked, [1, padded]))
        return relax.op.reshape(builder.emit(relax.op.strided_slice(flat, [1], [0], [c])),
                                call.ty.shape)
    shape = static_shape(call)
    new_args = []
    for a, original in zip(args, call.args):
        s = static_shape(original)
        if s is not None and s != shape and _side_operand(s, shape) == "channel":
            a = builder.emit(_channel_blocks(a, shape[1], block, str(original.ty.dtype)))
        new_args.append(a)
    return relax.Call(call.op, new_args, call.attrs, call.ty_args)


def _channel_blocks(value, channels, block, dtype):
    """A per-channel value ([1, C, 1, 1] or [C, 1, 1]) as [1, C / block, 1, 1, block], the
    padding lanes of a partly full last block holding zeros."""
    n = round_up(channels, block) // block
    if n * block == channels:
        return relax.op.reshape(value, [1, n, 1, 1, block])
    flat = relax.op.reshape(value, [1, channels])
    zeros = relax.const(np.zeros((1, n * block - channels), dtype))
    return relax.op.reshape(relax.op.concat([flat, zeros], axis=1), [1, n, 1, 1, block])
