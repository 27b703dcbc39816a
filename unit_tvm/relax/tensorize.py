"""UnitTensorize: the graph pass that puts tensorized kernels into a quantized Relax model.

For every int8 operator the quantizer produced (a call_tir of a PrimFunc carrying a recipe), it
picks the instruction (candidates in the Inspector's order — least padding, tile before vector —
raced by the tuner when tuning, or the database's fastest record), converts the layouts —
activations are quantized, zero-padded and packed to NCHW[x]c inside the kernel, constant weights
are packed to KCRS[x/4]c[y]k[4]c at compile time — and replaces the call with the Rewriter's
tensorized kernel, its epilogue (dequantization, bias, residual, relu) fused into the write-back.
Depthwise convs run on a lanewise instruction (vpermb + vpdpbusd: each lane sums window taps of its
own channel) where the host has one; other grouped int8 convs keep their plain int8 loop nest
(scheduled later by the default CPU schedule). Everything else is left for TVM's own
legalization: this is one pass in TVM's pipeline, not a fork of tvm.compile.
"""

import hashlib
import json
import warnings
from typing import NamedTuple

import tvm
from tvm import relax

from ..target import as_target
from ..tuner import Database, tune, tune_instruction
from .graph import is_nchw_max_pool, max_pool_on, readers as binding_readers, uses
from .qops import (ATTR, candidates, out_dtype, out_shape, pack_weight, plain_func,
                   plain_weight, tensorized_func, tensorized_graph, tuning_form)
from .u8_values import POOL_ATTR, blocked_pool_func, is_channel_concat, pool_out_shape


def _recipe_of(mod, call):
    if not isinstance(call, relax.Call) or call.op.name != "relax.call_tir":
        return None
    gv = call.args[0]
    func = mod.functions.get(gv) if isinstance(gv, tvm.ir.GlobalVar) else None
    if isinstance(func, tvm.tirx.PrimFunc) and func.attrs is not None and ATTR in func.attrs:
        return json.loads(str(func.attrs[ATTR]))
    return None


@tvm.transform.module_pass(opt_level=0, name="UnitTensorize")
class UnitTensorize:
    """tvm.transform.Pass: tensorize every quantized operator of a Relax module for `target`.

    database: a unit_tvm.tuner.Database (or path) whose instruction choices and configs are used;
    tune=True also tunes what is missing from it: per op shape (layers that differ only in their
    quantization constants count once), every candidate instruction's default config is timed
    and the fastest tuned. Ops no instruction fits keep TVM's schedule.
    """

    def __init__(self, target=None, database=None, tune=False, trials=None):
        self.target = as_target(target)
        self.database = database
        self.tune = tune
        self.trials = trials
        self.report = []  # (op, instruction or None, reason) per quantized op
        self.kernels = {}  # function name -> KernelInfo, for profiles
        self._graphs = {}  # (tuning form, instruction) -> prepared graph

    def transform_module(self, mod, ctx):  # noqa: D401 - tvm pass hook
        func = mod["main"]
        calls = []

        def collect(e):
            if _recipe_of(mod, e) is not None:
                calls.append(e)

        relax.analysis.post_order_visit(func.body, collect)
        recipes = [json.loads(json.dumps(_recipe_of(mod, c))) for c in calls]
        consumer = _packed_consumers(func, calls, recipes)
        pooled = _pooled_producers(func, calls, recipes)
        pool_readers = _pool_conv_readers(func, calls, recipes, pooled)
        blocked_pools = set()  # max-pools whose result stays in blocks for its conv readers
        concats = _packed_concats(mod, func, calls, recipes, self.target)
        for j, block in concats.readers.items():
            recipes[j]["in_block"] = block
        bb = relax.BlockBuilder(mod)
        built, replace, pools = {}, [], dict(concats.max_pools)
        for pool, block in concats.pools.items():
            func_p = blocked_pool_func(mod[pool.args[0]], block)
            name = f"{pool.args[0].name_hint}_blocked"
            replace.append((pool, bb.add_func(func_p.with_attr("global_symbol", name), name),
                            list(pool.args[1].fields),
                            relax.TensorType(pool_out_shape(mod[pool.args[0]], block), "uint8")))
        # calls come in post order (producers first): a producer's output block is known (its
        # instruction's) before its consumer's recipe is keyed
        for i, (call, recipe) in enumerate(zip(calls, recipes)):
            block = concats.producers.get(i)  # a concat's blocks are fixed for all its parts
            packed_out = i in consumer or i in pooled or block is not None
            key = json.dumps([recipe, packed_out, block], sort_keys=True)
            if key not in built:
                built[key] = self._entry(bb, recipe, packed_out, _recipe_of(mod, call),
                                         len(built), block)
            if built[key] is None:
                continue
            gv, layout_weight, final = built[key]
            for j, role in consumer.get(i, ()):
                recipes[j]["in_block" if role == "x" else "residual_block"] = final["out_block"]
            if i in pooled:
                pool, blk = pooled[i], final["out_block"]
                pools[pool] = blk
                if pool in pool_readers and final["out_channels"] % blk == 0:
                    blocked_pools.add(pool)
                    for j, role in pool_readers[pool]:
                        recipes[j]["in_block" if role == "x" else "residual_block"] = blk
            args = list(call.args[1].fields)
            args[1] = relax.const(layout_weight(args[1].value.numpy()))
            replace.append((call, gv, args, relax.TensorType(out_shape(final), out_dtype(final))))
        if not replace:
            return mod
        mod = bb.get()
        mod["main"] = _Replace(mod, replace, pools, blocked_pools).visit_expr(mod["main"])
        return _drop_unused_recipes(relax.transform.DeadCodeElimination()(mod))

    def _database(self):
        if self.database is None or isinstance(self.database, Database):
            return self.database
        return Database(self.database)

    def _entry(self, bb, recipe, packed_out, original, index, block=None):
        """(GlobalVar, weight layout function, final recipe) of the function that computes
        recipe — tensorized, else the plain int8 loop nest when the layout changes — or None to
        keep the call as it is. packed_out: the result goes to a packed edge (NCHW[y]c); block:
        y when the edge fixes it (a concat's parts), else the instruction's."""
        entry = self._build(recipe, packed_out, block)
        name = f"unit_{recipe['kind']}_{index}"
        label = self.report[-1][0] if self.report else recipe["kind"]
        if entry is not None:
            func_t, blocks, final = entry
            self.kernels[name] = KernelInfo(name, label, self.report[-1][1], macs(recipe))
            return (bb.add_func(func_t.with_attr("global_symbol", name), name),
                    lambda w: pack_weight(final, w, *blocks), final)
        if packed_out:
            found = candidates(recipe, self.target)
            recipe = dict(recipe, out_block=block or (found[0].channel_blocks[1] if found
                                                      else 16))
        if recipe != original:  # a packed edge: the plain loop nest reads / writes the blocks
            self.kernels[name] = KernelInfo(name, label, "", macs(recipe))
            func_p = plain_func(recipe).with_attr("global_symbol", name)
            return bb.add_func(func_p, name), lambda w: plain_weight(recipe, w), recipe
        return None

    def _build(self, recipe, packed_out, block=None):
        """(tensorized PrimFunc, (x, y), final recipe), or None with the reason reported. Every
        candidate instruction is an alternative (packed_out: with its own output block, or only
        those whose block is `block`); the database or a race of the tuner picks one, the rest
        are fallbacks in preference order."""
        label = f"{recipe['kind']} {recipe['in_shape']}->{recipe['out_shape']}"
        reasons = []
        found = [i for i in candidates(recipe, self.target)
                 if block is None or i.channel_blocks[1] == block]
        if recipe.get("groups", 1) != 1 and not found:
            # expected, not a warning: a grouped conv, or a depthwise one that is dilated or on
            # a host without a lanewise instruction; the int8 loop nest gets the default CPU
            # schedule
            self.report.append((label, None, f"grouped conv ({recipe['groups']} groups): "
                                             "int8 without a tensorized instruction"))
            return None

        def alternative(intrin):
            """(intrin, final recipe, prepared graph of its tuning form), or None with the
            reason kept. Layers of one shape share the tuning form (and its graph)."""
            final = dict(recipe, out_block=intrin.channel_blocks[1]) if packed_out else recipe
            form = tuning_form(final)
            key = (json.dumps(form, sort_keys=True), intrin.name)
            if key not in self._graphs:
                try:
                    self._graphs[key] = tensorized_graph(form, intrin)
                except ValueError as e:
                    reasons.append(f"{intrin.name}: {str(e).splitlines()[0]}")
                    self._graphs[key] = None
            return None if self._graphs[key] is None else (intrin, final, self._graphs[key])

        chosen, config = (found[0] if found else None), None
        database = self._database()
        remembered = _remembered_choice(database, recipe, (packed_out, block), self.target,
                                        found)
        if remembered is not None and alternative(remembered) is not None:
            # an earlier race decided: only that instruction's graph is built
            chosen = remembered
            config = tune(alternative(chosen)[2][0], chosen, self.target, database=database,
                          measure=bool(self.tune), trials=self.trials).config
        elif found and (database is not None or self.tune):
            alts = [a for a in map(alternative, found) if a is not None]
            try:
                index, result = tune_instruction(
                    [(intrin, graph[0]) for intrin, _, graph in alts], self.target,
                    trials=self.trials, database=database, measure=bool(self.tune))
                chosen, config = alts[index][0], result.config
                if database is not None and result.gops > 0:  # measured now or before
                    _remember_choice(database, recipe, (packed_out, block), self.target, chosen,
                                     result)
            except RuntimeError as e:
                reasons.append(str(e).splitlines()[0])
        for intrin in ([chosen] if chosen else []) + [i for i in found if i is not chosen]:
            alt = alternative(intrin)
            if alt is None:
                continue
            final = alt[1]
            try:
                func, blocks, _ = tensorized_func(final, intrin, self.target,
                                                  config if intrin is chosen else None)
            except (ValueError, RuntimeError, tvm.s_tir.ScheduleError) as e:
                reasons.append(f"{intrin.name}: {str(e).splitlines()[0]}")
                continue
            self.report.append((label, intrin.name, ""))
            return func, blocks, final
        reason = "; ".join(reasons) or "no instruction for its dtypes on this target"
        warnings.warn(f"UnitTensorize: {label} keeps TVM's schedule: {reason}", stacklevel=3)
        self.report.append((label, None, reason))
        return None


class KernelInfo(NamedTuple):
    """What the pass put behind one function name (for `unit-tvm profile`)."""

    name: str
    label: str  # op kind and shapes
    instruction: str  # "" when the int8 loop nest is not tensorized
    macs: int  # multiply-adds of the op


def macs(recipe) -> int:
    """Multiply-adds of a quantized op: every output element reduces over one weight row."""
    n = 1
    for d in recipe["out_shape"]:
        n *= int(d)
    for d in recipe["w_shape"][1:]:
        n *= int(d)
    return n


def _choice_key(recipe, edge):
    """Database workload key of the instruction choice for one quantized op (its shape); edge:
    (whether its result is packed, the block a concat fixes or None)."""
    packed_out, block = edge
    text = json.dumps([tuning_form(recipe), bool(packed_out)] + ([block] if block else []),
                      sort_keys=True)
    return "choice:" + hashlib.sha1(text.encode()).hexdigest()


def _remembered_choice(database, recipe, edge, target, found):
    """The candidate the latest race chose for this op (a database record), or None."""
    if database is None:
        return None
    rec = database.latest(_choice_key(recipe, edge), target)
    return next((i for i in found if rec is not None and i.name == rec["intrinsic"]), None)


def _remember_choice(database, recipe, edge, target, intrin, result):
    """Record which instruction won for this op, so that a later build of the model prepares
    only that one (each candidate's graph costs up to ~1 s to prepare)."""
    database.append(_choice_key(recipe, edge), target, intrin.name, result.config.key(),
                    result.gops, choice=True)


def _drop_unused_recipes(mod):
    """The module without the quantizer's int8 functions no call uses any more (DCE keeps them,
    and each would still be compiled)."""
    used = set()

    def visit(e):
        if isinstance(e, tvm.ir.GlobalVar):
            used.add(e.name_hint)

    for f in mod.functions.values():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    for gv, f in list(mod.functions.items()):
        if (isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and ATTR in f.attrs
                and gv.name_hint not in used):
            del mod[gv]
    return mod


@relax.expr_functor.mutator
class _Replace(relax.PyExprMutator):
    """Main with each listed call_tir replaced (new function, arguments, result type); bindings
    whose type changes (a packed layout) get new variables, and their users follow."""

    def __init__(self, mod, replace, pools=None, blocked=frozenset()):
        super().__init__(mod)
        self.replace = replace
        self.pools = pools or {}  # max-pool call -> channel block of its (now packed) input
        self.blocked = blocked  # those of the pools whose readers read the blocks

    def visit_call_(self, call):
        for old, gv, args, ty in self.replace:
            if call.same_as(old):
                return relax.call_tir(gv, [self.visit_expr(a) for a in args], ty)
        for pool, block in self.pools.items():
            if call.same_as(pool):
                return self._blocked_pool(call, block)
        return super().visit_call_(call)

    def _blocked_pool(self, call, block):
        """The NCHW max-pool on its producer's NCHW[block]c result: pooled in that layout (the
        window's loads are contiguous channel vectors), then one transpose back to NCHW for
        the pool's readers (a quarter of the data the producer wrote)."""
        pooled = max_pool_on(call, self.visit_expr(call.args[0]), f"NCHW{block}c")
        if any(call.same_as(p) for p in self.blocked):
            return pooled  # every reader is a conv that reads the blocks
        pooled = self.builder_.emit(pooled)
        nchw = self.builder_.emit(relax.op.permute_dims(pooled, [0, 1, 4, 2, 3]))
        n, c, h, w = call.ty.shape
        padded = int(pooled.ty.shape[1]) * block
        if padded == int(c):
            return relax.op.reshape(nchw, call.ty.shape)
        # the producer padded its channels up to whole blocks: the pool's readers get C of them
        nchw = self.builder_.emit(relax.op.reshape(nchw, [n, padded, h, w]))
        return relax.op.strided_slice(nchw, axes=[1], begin=[0], end=[c])


def _producers(func, calls):
    """(bindings of main, {bound Var: index of the call in `calls` that it binds})."""
    bindings = [b for block in func.body.blocks for b in block.bindings]
    producer_of = {}
    for b in bindings:
        for i, c in enumerate(calls):
            if b.value.same_as(c):
                producer_of[b.var] = i
    return bindings, producer_of


def _packed_consumers(func, calls, recipes):
    """{producer index: [(consumer index, "x" | "residual")]} of the edges that become
    NCHW[y]c: where a conv's uint8 result (requantized) goes only to quantized convs, as their
    input or as the residual they add, the producer writes NCHW[y]c (y: its instruction's
    output block, e.g. 16 for VNNI and AMX) and every reader reads the blocks, so neither a
    scatter to NCHW nor a repack sits between two int8 convs."""
    bindings, producer_of = _producers(func, calls)
    count = uses(bindings, func)
    out = {}
    for j, (call, recipe) in enumerate(zip(calls, recipes)):
        if recipe["kind"] != "conv2d":
            continue
        fields = list(call.args[1].fields)
        roles = [(fields[0], "x", recipe.get("in_u8"))]
        if recipe.get("residual"):
            roles.append((fields[-1], "residual", recipe.get("residual_q")))
        for arg, role, is_u8 in roles:
            i = producer_of.get(arg) if isinstance(arg, relax.Var) else None
            if (i is not None and is_u8 and recipes[i]["kind"] == "conv2d"
                    and recipes[i].get("out_q")):
                out.setdefault(i, []).append((j, role))
    var_of = {i: v for v, i in producer_of.items()}
    # an edge is laid out in blocks only when every one of its readers reads the blocks
    return {i: readers for i, readers in out.items() if len(readers) == count.get(var_of[i])}


def _pooled_producers(func, calls, recipes):
    """{producer index: max-pool call} where a conv's uint8 result goes only to a NCHW max-pool
    (ResNet's stem): the conv writes NCHW[y]c, as for a conv consumer, so its write-back is
    contiguous vectors instead of a transpose, and the pool runs on the blocks."""
    bindings, producer_of = _producers(func, calls)
    count = uses(bindings, func)
    out = {}
    for b in bindings:
        src = b.value.args[0] if is_nchw_max_pool(b.value) else None
        i = producer_of.get(src) if isinstance(src, relax.Var) else None
        if (i is not None and count.get(src) == 1 and recipes[i]["kind"] == "conv2d"
                and recipes[i].get("out_q") and len(recipes[i]["out_shape"]) == 4):
            out[i] = b.value
    return out


def _pool_conv_readers(func, calls, recipes, pooled):
    """{max-pool call: [(reader index, "x" | "residual")]} of the blocked max-pools (see
    _pooled_producers) whose every use is a quantized conv reading the pool's uint8 result as
    its input or adding it as its residual (ResNet's stem pool, read by the first block's
    first conv and by its last as the shortcut): the pool's result can stay in blocks."""
    bindings, producer_of = _producers(func, calls)
    count = uses(bindings, func)
    var_of = {b.value: b.var for b in bindings if any(b.value.same_as(p) for p in pooled.values())}
    out = {}
    for pool, var in var_of.items():
        found = []
        for j, (call, recipe) in enumerate(zip(calls, recipes)):
            if recipe["kind"] != "conv2d":
                continue
            fields = list(call.args[1].fields)
            if recipe.get("in_u8") and fields[0].same_as(var):
                found.append((j, "x"))
            if recipe.get("residual") and recipe.get("residual_q") and fields[-1].same_as(var):
                found.append((j, "residual"))
        if found and len(found) == count.get(var):
            out[pool] = found
    return out


class _ConcatEdges(NamedTuple):
    """uint8 channel concats laid out NCHW[block]c: their parts' producers write the blocks,
    the concat joins them along the block axis, its readers read them."""

    producers: dict  # call index -> block
    readers: dict  # call index (a conv reading a blocked concat or pool) -> block
    pools: dict  # average pool call (uint8, POOL_ATTR) -> block
    max_pools: dict  # max-pool call -> block (pooled in blocks, its result back to NCHW)


def _is_u8_concat(value):
    return is_channel_concat(value, "uint8")


def _is_pool_call(mod, value):
    if not (isinstance(value, relax.Call) and value.op.name == "relax.call_tir"):
        return False
    f = mod.functions.get(value.args[0]) if isinstance(value.args[0], tvm.ir.GlobalVar) else None
    return isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and POOL_ATTR in f.attrs


def _packed_concats(mod, func, calls, recipes, target):
    """The uint8 concats (u8_values) whose every part is a requantizing conv read only by the
    concat (or an inner concat of such parts) and whose every reader is a conv reading it as its
    input, an average pool read only by such convs, or a max-pool (pooled in blocks, its result
    turned back to NCHW for its readers): laid out in the blocks of the first part's
    instruction, when every part's channels are whole blocks. Others stay NCHW."""
    bindings, producer_of = _producers(func, calls)
    count = uses(bindings, func)
    value_of = {b.var: b.value for b in bindings}
    readers_of = binding_readers(bindings)

    def parts(var):
        """(producer call indices, inner concat vars) of a concat, or None."""
        found, inner = [], []
        for f in value_of[var].args[0].fields:
            if not isinstance(f, relax.Var) or count.get(f) != 1:
                return None
            i = producer_of.get(f)
            if i is not None and recipes[i]["kind"] == "conv2d" and recipes[i].get("out_q"):
                found.append(i)
            elif _is_u8_concat(value_of.get(f)) and parts(f) is not None:
                sub, sub_inner = parts(f)
                found, inner = found + sub, inner + [f] + sub_inner
            else:
                return None
        return found, inner

    def conv_reader(b, var):
        i = producer_of.get(b.var)
        return (i is not None and recipes[i]["kind"] == "conv2d" and recipes[i].get("in_u8")
                and b.value.args[1].fields[0].same_as(var)
                and not (recipes[i].get("residual") and b.value.args[1].fields[-1].same_as(var)))

    out = _ConcatEdges({}, {}, {}, {})
    inner_done = set()
    for b in reversed(bindings):  # outer concats first: an inner one goes with its outer one
        if not _is_u8_concat(b.value) or b.var in inner_done:
            continue
        found = parts(b.var)
        readers = readers_of.get(b.var, [])
        if found is None or len(readers) != count.get(b.var):
            continue
        pools = [r for r in readers if _is_pool_call(mod, r.value)]
        max_pools = [r for r in readers if is_nchw_max_pool(r.value)]
        pool_readers = [(p, readers_of.get(p.var, [])) for p in pools]
        if not (all(conv_reader(r, b.var) or r in pools or r in max_pools for r in readers) and all(
                rs and len(rs) == count.get(p.var) and all(conv_reader(r, p.var) for r in rs)
                for p, rs in pool_readers)):
            continue
        first = candidates(recipes[found[0][0]], target)
        block = first[0].channel_blocks[1] if first else 16
        if any(recipes[i]["out_channels"] % block for i in found[0]):
            continue
        inner_done.update(found[1])
        out.producers.update({i: block for i in found[0]})
        for r in readers + [r for _, rs in pool_readers for r in rs]:
            if r not in pools and r not in max_pools:
                out.readers[producer_of[r.var]] = block
        out.pools.update({p.value: block for p in pools})
        out.max_pools.update({p.value: block for p in max_pools})
    return out
