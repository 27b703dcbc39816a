"""Which edges of a model are laid out in channel blocks (NCHW[y]c) instead of NCHW: uint8
conv -> conv edges (input or residual), a conv's result read only by a max-pool (which then
runs on the blocks, and keeps them when only convs read it), and channel concats whose parts
and readers can all use the blocks. The last two hold for uint8 values (a quantized model's)
and float32 ones (a float32 model's, or what a quantized model leaves in float32): `EdgeDtype`
says what a conv writing or reading each looks like. UnitTensorize sets in_block / out_block /
residual_block from these answers."""

from dataclasses import dataclass
from typing import NamedTuple

import tvm
from tvm import relax

from ..core.graph import is_nchw_max_pool, readers as binding_readers, uses
from ..core.recipe import CONV_KINDS, candidates, is_bf16
from ..core.u8_values import is_channel_concat, is_nchw_avg_pool
from .u8_pools import POOL_ATTR


@dataclass(frozen=True)
class EdgeDtype:
    """The values of one dtype a blocked edge carries between 2-D convs and pools."""

    dtype: str  # "uint8": a quantized model's values; "float32": a float32 model's

    def written_by(self, recipe) -> bool:
        """Whether the conv's result is such a value: uint8 when it requantizes; float32 when
        it does not and is not a bfloat16 op (those keep NCHW edges)."""
        if recipe.kind != "conv2d" or len(recipe.out_shape) != 4:
            return False
        if self.dtype == "uint8":
            return recipe.out_q is not None
        return recipe.out_q is None and not is_bf16(recipe)

    def read_by(self, recipe) -> bool:
        """Whether the conv reads such a value as its whole input (not through a view)."""
        if recipe.kind != "conv2d":
            return False
        if self.dtype == "uint8":
            return bool(recipe.in_u8)
        return not recipe.in_u8 and recipe.x_view is None and not is_bf16(recipe)

    def residual_read_by(self, recipe) -> bool:
        """Whether the conv adds such a value as its residual."""
        return (recipe.kind == "conv2d" and bool(recipe.residual)
                and (recipe.residual_q is not None) == (self.dtype == "uint8"))

    def is_avg_pool(self, mod, value) -> bool:
        """Whether a binding's value is an NCHW average pool of such values: the quantizer's
        uint8 pool kernel, or Relax's float32 avg_pool2d."""
        return _is_pool_call(mod, value) if self.dtype == "uint8" else is_nchw_avg_pool(value)

    def is_concat(self, value) -> bool:
        """Whether a binding's value is a channel concat of such values (on axis 1: the blocked
        values are concatenated on the same axis)."""
        return is_channel_concat(value, self.dtype) and int(value.attrs.axis) == 1


U8 = EdgeDtype("uint8")
F32 = EdgeDtype("float32")


def producers(func, calls):
    """(bindings of main, {bound Var: index of the call in `calls` that it binds})."""
    bindings = [b for block in func.body.blocks for b in block.bindings]
    producer_of = {}
    for b in bindings:
        for i, c in enumerate(calls):
            if b.value.same_as(c):
                producer_of[b.var] = i
    return bindings, producer_of


def packed_consumers(func, calls, recipes):
    """{producer index: [(consumer index, "x" | "residual")]} of the edges that become
    NCHW[y]c (NCDHW[y]c between conv3d ops): where a conv's uint8 result (requantized) goes
    only to quantized convs of its own kind, as their input or as the residual they add, the
    producer writes NCHW[y]c (y: its instruction's output block, e.g. 16 for VNNI and AMX) and
    every reader reads the blocks, so neither a scatter to NCHW nor a repack sits between two
    int8 convs."""
    bindings, producer_of = producers(func, calls)
    count = uses(bindings, func)
    out = {}
    for j, (call, recipe) in enumerate(zip(calls, recipes)):
        if recipe.kind not in CONV_KINDS:
            continue
        fields = list(call.args[1].fields)
        roles = [(fields[0], "x", recipe.in_u8)]
        if recipe.residual:
            roles.append((fields[-1], "residual", recipe.residual_q))
        for arg, role, is_u8 in roles:
            i = producer_of.get(arg) if isinstance(arg, relax.Var) else None
            if (i is not None and is_u8 and recipes[i].kind == recipe.kind
                    and recipes[i].out_q):
                out.setdefault(i, []).append((j, role))
    var_of = {i: v for v, i in producer_of.items()}
    # an edge is laid out in blocks only when every one of its readers reads the blocks
    return {i: readers for i, readers in out.items() if len(readers) == count.get(var_of[i])}


def pooled_producers(func, calls, recipes, edge=U8):
    """{producer index: max-pool call} where a conv's result (of `edge`'s dtype) goes only to
    an NCHW max-pool (ResNet's and Inception's stems): the conv writes NCHW[y]c, as for a conv
    consumer, so its write-back is contiguous vectors instead of a transpose, and the pool runs
    on the blocks."""
    bindings, producer_of = producers(func, calls)
    count = uses(bindings, func)
    out = {}
    for b in bindings:
        src = b.value.args[0] if is_nchw_max_pool(b.value) else None
        i = producer_of.get(src) if isinstance(src, relax.Var) else None
        if i is not None and count.get(src) == 1 and edge.written_by(recipes[i]):
            out[i] = b.value
    return out


class PoolReaders(NamedTuple):
    """Who reads a blocked max-pool's result, when all of them can read the blocks."""

    convs: list  # (reader index, "x" | "residual"), the average pools' readers included
    avg_pools: list  # the quantizer's uint8 average pool calls read only by convs, as input
    relax_pools: list | tuple = ()  # Relax's float32 average pools read only by convs, as input


def pool_conv_readers(mod, func, calls, recipes, pooled, edge=U8):
    """{max-pool call: PoolReaders} of the blocked max-pools (see pooled_producers) whose every
    use is a conv reading the pool's result as its input or adding it as its residual (ResNet's
    stem pool, read by the first block's first conv and by its last as the shortcut), or an
    average pool read only by such convs (Inception's first block): the pool's result can stay
    in blocks."""
    bindings, producer_of = producers(func, calls)
    count = uses(bindings, func)
    readers_of = binding_readers(bindings)
    var_of = {b.value: b.var for b in bindings if any(b.value.same_as(p) for p in pooled.values())}

    def conv_readers(var):
        found = []
        for j, (call, recipe) in enumerate(zip(calls, recipes)):
            if recipe.kind != "conv2d":
                continue
            fields = list(call.args[1].fields)
            if edge.read_by(recipe) and fields[0].same_as(var):
                found.append((j, "x"))
            if edge.residual_read_by(recipe) and fields[-1].same_as(var):
                found.append((j, "residual"))
        return found

    out = {}
    for pool, var in var_of.items():
        direct, behind, avg = conv_readers(var), [], []
        for b in readers_of.get(var, []):
            convs = conv_readers(b.var) if edge.is_avg_pool(mod, b.value) else []
            if convs and all(role == "x" for _, role in convs) and len(convs) == count.get(
                    b.var):
                avg.append(b.value)
                behind += convs
        if direct + behind and len(direct) + len(avg) == count.get(var):
            # the quantizer's pool kernels are replaced by blocked ones, Relax's run in blocks
            out[pool] = (PoolReaders(direct + behind, avg) if edge.dtype == "uint8"
                         else PoolReaders(direct + behind, [], avg))
    return out


class ConcatEdges(NamedTuple):
    """Channel concats laid out NCHW[block]c: their parts' producers write the blocks, the
    concat joins them along the block axis, its readers read them."""

    producers: dict  # call index -> block
    readers: dict  # call index (a conv reading a blocked concat or pool) -> block
    pools: dict  # uint8 average pool call (POOL_ATTR) -> block
    # Relax pool call (a max-pool, or a float32 average pool) -> block: pooled in blocks, its
    # result back to NCHW unless it is in blocked_pools
    relax_pools: dict
    # those of relax_pools whose result stays in blocks: a part of a blocked concat, or an
    # average pool only convs read
    blocked_pools: frozenset = frozenset()


def _is_pool_call(mod, value):
    if not (isinstance(value, relax.Call) and value.op.name == "relax.call_tir"):
        return False
    f = mod.functions.get(value.args[0]) if isinstance(value.args[0], tvm.ir.GlobalVar) else None
    return isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and POOL_ATTR in f.attrs


def packed_concats(mod, func, calls, recipes, target, edge=U8):
    """The concats of `edge`'s dtype (uint8: the quantizer's, u8_values) whose every part is a
    conv writing that dtype read only by the concat (or an inner concat of such parts) and
    whose every reader is a conv reading it as its input, an average pool read only by such
    convs, or a max-pool (pooled in blocks, its result turned back to NCHW for its readers):
    laid out in the blocks of the first part's instruction, when every part's channels are
    whole blocks. A second round admits parts that are such max-pools of a blocked concat
    (Inception's grid reductions: two strided convs and a pool of the block's input), whose
    result then stays in blocks. Others stay NCHW."""
    bindings, producer_of = producers(func, calls)
    count = uses(bindings, func)
    value_of = {b.var: b.value for b in bindings}
    readers_of = binding_readers(bindings)
    blocked = {}  # concat var -> block, as decided

    def parts(var):
        """(producer call indices, inner concat vars, max-pool part vars) of a concat, or
        None."""
        found, inner, pools = [], [], []
        for f in value_of[var].args[0].fields:
            if not isinstance(f, relax.Var) or count.get(f) != 1:
                return None
            i = producer_of.get(f)
            if i is not None and edge.written_by(recipes[i]):
                found.append(i)
            elif edge.is_concat(value_of.get(f)) and parts(f) is not None:
                sub, sub_inner, sub_pools = parts(f)
                found, inner, pools = found + sub, inner + [f] + sub_inner, pools + sub_pools
            elif is_nchw_max_pool(value_of.get(f)) and value_of[f].args[0] in blocked:
                pools.append(f)
            else:
                return None
        return found, inner, pools

    def conv_reader(b, var):
        i = producer_of.get(b.var)
        return (i is not None and edge.read_by(recipes[i])
                and b.value.args[1].fields[0].same_as(var)
                and not (recipes[i].residual and b.value.args[1].fields[-1].same_as(var)))

    out = ConcatEdges({}, {}, {}, {})
    blocked_pools = set()
    inner_done = set()
    for _ in range(2):  # the second round: parts pooled from a concat the first one blocked
        for b in reversed(bindings):  # outer concats first: an inner one goes with its outer
            if not edge.is_concat(b.value) or b.var in inner_done or b.var in blocked:
                continue
            found = parts(b.var)
            readers = readers_of.get(b.var, [])
            if found is None or len(readers) != count.get(b.var) or not found[0]:
                continue
            pools = [r for r in readers if edge.is_avg_pool(mod, r.value)]
            max_pools = [r for r in readers if is_nchw_max_pool(r.value)]
            pool_readers = [(p, readers_of.get(p.var, [])) for p in pools]
            if not (all(conv_reader(r, b.var) or r in pools or r in max_pools
                        for r in readers) and all(
                    rs and len(rs) == count.get(p.var) and all(conv_reader(r, p.var) for r in rs)
                    for p, rs in pool_readers)):
                continue
            first = candidates(recipes[found[0][0]], target)
            block = first[0].channel_blocks[1] if first else 16
            if any(recipes[i].out_channels % block for i in found[0]) or any(
                    blocked[value_of[f].args[0]] != block for f in found[2]):
                continue
            inner_done.update(found[1])
            blocked[b.var] = block
            blocked_pools.update(value_of[f] for f in found[2])
            out.producers.update({i: block for i in found[0]})
            for r in readers + [r for _, rs in pool_readers for r in rs]:
                if r not in pools and r not in max_pools:
                    out.readers[producer_of[r.var]] = block
            if edge.dtype == "uint8":  # the quantizer's pool kernels, replaced by blocked ones
                out.pools.update({p.value: block for p in pools})
            else:  # Relax's average pools, run in blocks for their conv readers
                out.relax_pools.update({p.value: block for p in pools})
                blocked_pools.update(p.value for p in pools)
            out.relax_pools.update({p.value: block for p in max_pools})
    return out._replace(blocked_pools=frozenset(blocked_pools))


def blocked_pools_and_concats(mod, func, calls, recipes, target):
    """(pooled_producers, pool_conv_readers, packed_concats) for uint8 and float32 values
    together: a conv writes one dtype, so each answer holds each call once."""
    pooled, pool_readers, concats = {}, {}, []
    for edge in (U8, F32):
        found = pooled_producers(func, calls, recipes, edge)
        pooled.update(found)
        pool_readers.update(pool_conv_readers(mod, func, calls, recipes, found, edge))
        concats.append(packed_concats(mod, func, calls, recipes, target, edge))
    u8, f32 = concats
    merged = ConcatEdges({**u8.producers, **f32.producers}, {**u8.readers, **f32.readers},
                         u8.pools, {**u8.relax_pools, **f32.relax_pools},
                         u8.blocked_pools | f32.blocked_pools)
    return pooled, pool_readers, merged
