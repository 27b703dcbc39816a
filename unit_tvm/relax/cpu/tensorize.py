"""UnitTensorize: the graph pass that puts tensorized kernels into a quantized Relax model.

For every int8 operator the quantizer produced (a call_tir of a PrimFunc carrying a recipe), it
picks the instruction (candidates in unit_tvm.selection's order, raced by the tuner when
tuning, or the database's fastest record), converts the layouts (which uint8 edges stay in
channel blocks: edge_layouts.py) —
activations are quantized, zero-padded and packed to NCHW[x]c inside the kernel, constant weights
are packed to KCRS[x/4]c[y]k[4]c at compile time — and replaces the call with the Rewriter's
tensorized kernel, its epilogue (dequantization, bias, residual, relu) fused into the write-back.
Depthwise convs run on a lanewise instruction (vpermb + vpdpbusd: each lane sums window taps of its
own channel) where the host has one; other grouped int8 convs keep their plain int8 loop nest
(scheduled later by the default CPU schedule). Everything else is left for TVM's own
legalization: this is one pass in TVM's pipeline, not a fork of tvm.compile.
"""

import functools
import hashlib
import json
import math
import warnings
from typing import NamedTuple

import tvm
from tvm import relax

from ... import intrinsics, schedules
from ...runner import prepare_host
from ...target import as_target
from ...tuner import Database, tune, tune_instruction
from ..core.graph import pool_on
from ..core.leftovers import pixel_convs_as_matmuls
from ..core.recipe import (ATTR, Recipe, candidates, for_instruction, out_dtype, out_shape,
    tuning_form)
from .edge_layouts import blocked_pools_and_concats, packed_consumers
from .f32_blocks import blocked_op, regions as f32_regions
from .qgraphs import tensorized_graph
from .qops import plain_func, tensorized_func
from .u8_pools import blocked_pool_func, pool_out_shape
from .weights import pack_weight, plain_weight, rebased_comp


def _with_edge_block(recipe, role, block):
    """The recipe reading its input (role "x") or its residual in NCHW[block]c."""
    return recipe.replace(**{"in_block" if role == "x" else "residual_block": block})


def _recipe_of(mod, call):
    if not isinstance(call, relax.Call) or call.op.name != "relax.call_tir":
        return None
    gv = call.args[0]
    func = mod.functions.get(gv) if isinstance(gv, tvm.ir.GlobalVar) else None
    if isinstance(func, tvm.tirx.PrimFunc) and func.attrs is not None and ATTR in func.attrs:
        return Recipe.from_json(str(func.attrs[ATTR]))
    return None


@tvm.transform.module_pass(opt_level=0, name="UnitTensorize")
class UnitTensorize:
    """tvm.transform.Pass: tensorize every quantized operator of a Relax module for `target`.

    database: a unit_tvm.tuner.Database (or path) whose instruction choices and configs are used;
    tune=True also tunes what is missing from it: per op shape (layers that differ only in their
    quantization constants count once), every candidate instruction's default config is timed
    and the fastest tuned. Ops no instruction fits keep TVM's schedule. runner: where tuning
    measures (default: this machine; see unit_tvm.fleet.RpcRunner).
    """

    def __init__(self, target=None, database=None, tune=False, trials=None, runner=None):
        self.target = as_target(target)
        # the kernels usually run in this process: its TVM thread pool sized before any run
        prepare_host()
        self.runner = runner
        self.database = database
        self.tune = tune
        self.trials = trials
        self.report = []  # (op, instruction or None, reason) per quantized op
        self.kernels = {}  # function name -> KernelInfo, for profiles
        self._graphs = {}  # (tuning form, instruction) -> prepared graph
        self.untuned = []  # ops the database had no config for (tune=False): default configs

    def transform_module(self, mod, ctx):  # noqa: D401 - tvm pass hook
        self.untuned = []
        mod = pixel_convs_as_matmuls(mod)  # float32 leftovers that are matrix-vector products
        func = mod["main"]
        calls = []

        def collect(e):
            if _recipe_of(mod, e) is not None:
                calls.append(e)

        relax.analysis.post_order_visit(func.body, collect)
        recipes = [_recipe_of(mod, c) for c in calls]
        consumer = packed_consumers(func, calls, recipes)
        pooled, pool_readers, concats = blocked_pools_and_concats(mod, func, calls, recipes,
                                                                  self.target)
        f32 = f32_regions(func, calls, recipes, self.target)
        region_ops = {}  # elementwise / reduction call -> block, of the regions made blocked
        gated = {}  # call index -> (its input in the region, the gate it multiplies it by)
        # pools whose result stays in blocks for its conv readers or a blocked concat
        blocked_pools = set(concats.blocked_pools)
        for j, block in concats.readers.items():
            recipes[j] = recipes[j].replace(in_block=block)
        bb = relax.BlockBuilder(mod)
        built, replace, pools = {}, [], dict(concats.relax_pools)
        replace += [_blocked_avg_pool(bb, mod, pool, block)
                    for pool, block in concats.pools.items()]
        # calls come in post order (producers first): a producer's output block is known (its
        # instruction's) before its consumer's recipe is keyed
        for i, (call, recipe) in enumerate(zip(calls, recipes)):
            block = concats.producers.get(i)  # a concat's blocks are fixed for all its parts
            region = f32.get(i)
            if region is not None:
                block = region.block  # the region's ops are rewritten for this block
            packed_out = i in consumer or i in pooled or block is not None
            key = (recipe, packed_out, block)  # a Recipe is frozen and hashable
            if key not in built:
                built[key] = self._entry(bb, recipe, packed_out, _recipe_of(mod, call),
                                         len(built), block)
            if built[key] is None:
                continue
            gv, arguments, final = built[key]
            for j, role in [*consumer.get(i, ()), *(region.readers if region else ())]:
                recipes[j] = _with_edge_block(recipes[j], role, final.out_block)
            for fold in region.gates if region else ():
                for j in fold.readers:  # the conv multiplies its input by the gate itself
                    recipes[j] = recipes[j].replace(x_gate=True)
                    gated[j] = (fold.value, fold.gate)
            if region is not None:
                region_ops.update({op: region.block for op in region.ops + region.reductions})
            if i in pooled:
                pool, blk = pooled[i], final.out_block
                pools[pool] = blk
                if pool in pool_readers and final.out_channels % blk == 0:
                    blocked_pools.add(pool)
                    for j, role in pool_readers[pool].convs:
                        recipes[j] = _with_edge_block(recipes[j], role, blk)
                    replace += [_blocked_avg_pool(bb, mod, avg, blk)
                                for avg in pool_readers[pool].avg_pools]
                    pools.update({avg: blk for avg in pool_readers[pool].relax_pools})
                    blocked_pools.update(pool_readers[pool].relax_pools)
            args = arguments(list(call.args[1].fields))
            if i in gated:  # the gated value's operands: the region value, then the gate
                args = [*gated[i], *args[1:]]
            replace.append((call, gv, args, relax.TensorType(out_shape(final), out_dtype(final))))
        self._warn_untuned()
        if not replace:
            return mod
        mod = bb.get()
        mod["main"] = _Replace(mod, replace, pools, blocked_pools, region_ops).visit_expr(
            mod["main"])
        return _drop_unused_recipes(relax.transform.DeadCodeElimination()(mod))

    def _database(self):
        if self.database is None or isinstance(self.database, Database):
            return self.database
        return Database(self.database)

    def _entry(self, bb, recipe, packed_out, original, index, block=None):
        """(GlobalVar, arguments function, final recipe) of the function that computes
        recipe — tensorized, else the plain int8 loop nest when the layout changes — or None to
        keep the call as it is. packed_out: the result goes to a packed edge (NCHW[y]c); block:
        y when the edge fixes it (a concat's parts), else the instruction's."""
        entry = self._build(recipe, packed_out, block)
        name = f"unit_{recipe.kind}_{index}"
        label = self.report[-1][0] if self.report else recipe.kind
        if entry is not None:
            func_t, blocks, final, config = entry
            self.kernels[name] = KernelInfo(name, label, self.report[-1][1], macs(recipe),
                                            config)
            bound = intrinsics.get(self.report[-1][1]).weight_bound
            return (bb.add_func(func_t.with_attr("global_symbol", name), name),
                    functools.partial(_kernel_arguments, recipe=final, blocks=blocks,
                                      weight_bound=bound), final)
        if packed_out:
            found = candidates(recipe, self.target)
            recipe = recipe.replace(out_block=block or (found[0].channel_blocks[1] if found
                                                        else 16))
        if recipe != original:  # a packed edge: the plain loop nest reads / writes the blocks
            self.kernels[name] = KernelInfo(name, label, "", macs(recipe))
            func_p = plain_func(recipe).with_attr("global_symbol", name)
            return (bb.add_func(func_p, name),
                    functools.partial(_plain_arguments, recipe=recipe), recipe)
        return None

    def _warn_untuned(self):
        """One warning for the ops a database was given for but that run default configs:
        only for a database that holds records (for another model, or from an older unit-tvm
        whose kernels' loop nests differ); an empty or absent one means nothing was tuned yet."""
        database = self._database()
        if self.untuned and database is not None and database.records():
            warnings.warn(f"UnitTensorize: {database.path} has no config for {len(self.untuned)} "
                          f"ops (e.g. {self.untuned[0]}): they run their default configs; tune "
                          "them (tune=True, `--tune`) if the database is from another model or "
                          "an older unit-tvm", stacklevel=3)

    def _note_untuned(self, label, result):
        """Remember an op that a database was given for but that runs its default config."""
        if self.database is not None and not self.tune and not result.from_database:
            self.untuned.append(label)

    def _build(self, recipe, packed_out, block=None):
        """(tensorized PrimFunc, (x, y), final recipe, config described), or None with the
        reason reported. Every candidate instruction is an alternative (packed_out: with its own
        output block, or only those whose block is `block`); the database or a race of the tuner
        picks one, the rest are fallbacks in preference order."""
        label = f"{recipe.kind} {list(recipe.in_shape)}->{list(recipe.out_shape)}"
        reasons = []
        found = [i for i in candidates(recipe, self.target)
                 if block is None or i.channel_blocks[1] == block]
        if recipe.groups != 1 and not found:
            # expected, not a warning: a grouped conv, or a depthwise one that is dilated or on
            # a host without a lanewise instruction; the int8 loop nest gets the default CPU
            # schedule
            self.report.append((label, None, f"grouped conv ({recipe.groups} groups): "
                                             "int8 without a tensorized instruction"))
            return None

        def alternative(intrin):
            """(intrin, final recipe, prepared graph of its tuning form), or None with the
            reason kept. Layers of one shape share the tuning form (and its graph)."""
            final = for_instruction(recipe, intrin)
            if packed_out:
                final = final.replace(out_block=intrin.channel_blocks[1])
            form = tuning_form(final)
            key = (form, intrin.name)
            if key not in self._graphs:
                try:
                    self._graphs[key] = tensorized_graph(form, intrin, self.target)
                except ValueError as e:
                    reasons.append(f"{intrin.name}: {str(e).splitlines()[0]}")
                    self._graphs[key] = None
            return None if self._graphs[key] is None else (intrin, final, self._graphs[key])

        chosen, config = (found[0] if found else None), None
        database = self._database()
        remembered, record = _remembered_choice(database, recipe, (packed_out, block),
                                                self.target, found)
        if remembered is not None and alternative(remembered) is not None:
            # an earlier race decided: only that instruction's graph is built
            chosen = remembered
            result = tune(alternative(chosen)[2][0], chosen, self.target, database=database,
                          measure=bool(self.tune), trials=self.trials, runner=self.runner,
                          prior=record)
            config = result.config
            self._note_untuned(label, result)
        elif found and (database is not None or self.tune):
            alts = [a for a in map(alternative, found) if a is not None]
            try:
                index, result = tune_instruction(
                    [(intrin, graph[0]) for intrin, _, graph in alts], self.target,
                    trials=self.trials, database=database, measure=bool(self.tune),
                    runner=self.runner)
                chosen, config = alts[index][0], result.config
                self._note_untuned(label, result)
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
                func, blocks, prepared = tensorized_func(final, intrin, self.target,
                                                         config if intrin is chosen else None)
            except (ValueError, RuntimeError, tvm.s_tir.ScheduleError) as e:
                reasons.append(f"{intrin.name}: {str(e).splitlines()[0]}")
                continue
            self.report.append((label, intrin.name, _weight_form(final, intrin)))
            return func, blocks, final, self._described(
                config if intrin is chosen else None, prepared)
        reason = "; ".join(reasons) or "no instruction for its dtypes on this target"
        warnings.warn(f"UnitTensorize: {label} keeps TVM's schedule: {reason}", stacklevel=3)
        self.report.append((label, None, reason))
        return None

    def _described(self, config, prepared):
        """The config a kernel was scheduled with, in words; '(default)' when it is the
        strategy's default (no database record, or the record chose it)."""
        strategy = schedules.for_target(self.target)
        default = strategy.default(prepared, self.target)
        used = default if config is None else config
        return strategy.describe(used, prepared) + (" (default)" if used == default else "")


def _weight_form(recipe, intrin) -> str:
    """A note on the weights' form where the quantizer weighed the bounded forms ("" elsewhere):
    what bounding them cost, or why the layer kept 8-bit weights."""
    loss = recipe.w_pair_loss
    if loss is None:
        return ""
    groups = "quads" if (recipe.w_pair_words or 1) > 1 else "pairs"
    if intrin.weight_bound is not None:
        return f"weights bounded in {groups} for {intrin.name}: est. cosine loss {loss:.1e}"
    if recipe.w_pair_bound is not None:
        return f"weights bounded in {groups} (est. cosine loss {loss:.1e}), not needed here"
    return f"8-bit weights: bounding them in pairs would lose est. cosine {loss:.1e}"


def _blocked_avg_pool(bb, mod, pool, block):
    """(call, GlobalVar, arguments, result type): the uint8 average pool `pool` replaced by its
    NCHW[block]c form, for a blocked input (u8_pools.blocked_pool_func)."""
    func_p = blocked_pool_func(mod[pool.args[0]], block)
    name = f"{pool.args[0].name_hint}_blocked"
    return (pool, bb.add_func(func_p.with_attr("global_symbol", name), name),
            list(pool.args[1].fields),
            relax.TensorType(pool_out_shape(mod[pool.args[0]], block), "uint8"))


def _kernel_arguments(args, recipe, blocks, weight_bound=None):
    """A quantized call's arguments as its tensorized kernel reads them: the weight packed for
    the instruction, and with an activation the kernel re-bases to int8 (x_signed) the
    zero-point term re-based too. A bmm's operands are activations: its kernel packs them.
    weight_bound: the instruction's PairSumBound, checked on the packed words (the pair and
    quad forms would saturate on weights that break it: never a wrong answer)."""
    if recipe.kind == "bmm":
        return args
    weight = args[1].value.numpy()
    packed = pack_weight(recipe, weight, blocks)
    if weight_bound is not None and not weight_bound.holds_packed(packed):
        raise RuntimeError(f"UnitTensorize: the weights of {recipe.kind} {list(recipe.w_shape)} "
                           f"break the pair-sum bound {weight_bound} of the instruction "
                           "chosen for them; it would saturate")
    args[1] = relax.const(packed)
    if recipe.x_signed:
        args[2] = relax.const(rebased_comp(args[2].value.numpy(), weight))
    return args


def _plain_arguments(args, recipe):
    """A quantized call's arguments as the plain int8 loop nest on a packed edge reads them."""
    args[1] = relax.const(plain_weight(recipe, args[1].value.numpy()))
    return args


class KernelInfo(NamedTuple):
    """What the pass put behind one function name (for `unit-tvm profile`)."""

    name: str
    label: str  # op kind and shapes
    instruction: str  # "" when the int8 loop nest is not tensorized
    macs: int  # multiply-adds of the op that read real input
    config: str = ""  # the strategy's config, in words ("" for an int8 loop nest)


def macs(recipe) -> int:
    """Multiply-adds of a quantized op that read real input: every output element reduces over
    one weight row, less the window taps that fall in the padding (the count oneDNN's and the
    op benchmark's GOPS use; a kernel that computes those taps shows them as lost peak)."""
    if recipe.kind in ("dense", "bmm"):
        return math.prod(recipe.out_shape) * recipe.in_shape[-1]
    batch, channels = recipe.out_shape[0], recipe.out_shape[1]
    window = recipe.w_shape[2:]
    n = batch * channels * recipe.w_shape[1]
    for axis, taps in enumerate(window):
        n *= taps_inside(recipe.in_shape[2 + axis], recipe.out_shape[2 + axis], taps,
                          recipe.stride[axis], recipe.dilation[axis], recipe.padding[axis])
    return n


def taps_inside(extent, out, taps, stride, dilation=1, pad=0):
    """(output position, window tap) pairs along one axis whose input index is inside it."""
    return sum(0 <= o * stride + t * dilation - pad < extent
               for o in range(out) for t in range(taps))


def _choice_key(recipe, edge):
    """Database workload key of the instruction choice for one quantized op (its shape); edge:
    (whether its result is packed, the block a concat fixes or None)."""
    packed_out, block = edge
    text = json.dumps([tuning_form(recipe).to_dict(), bool(packed_out)]
                      + ([block] if block else []), sort_keys=True)
    return "choice:" + hashlib.sha1(text.encode()).hexdigest()


def _remembered_choice(database, recipe, edge, target, found):
    """(candidate, record) of the latest race's choice for this op, or (None, None)."""
    if database is None:
        return None, None
    rec = database.latest(_choice_key(recipe, edge), target)
    chosen = next((i for i in found if rec is not None and i.name == rec["intrinsic"]), None)
    return chosen, rec if chosen is not None else None


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

    def __init__(self, mod, replace, pools=None, blocked=frozenset(), region_ops=None):
        super().__init__(mod)
        self.replace = replace
        self.pools = pools or {}  # Relax pool call -> channel block of its (now packed) input
        self.blocked = blocked  # those of the pools whose readers read the blocks
        self.region_ops = region_ops or {}  # float32 region op -> block (f32_blocks.py)

    def visit_call_(self, call):
        for old, gv, args, ty in self.replace:
            if call.same_as(old):
                return relax.call_tir(gv, [self.visit_expr(a) for a in args], ty)
        for pool, block in self.pools.items():
            if call.same_as(pool):
                return self._blocked_pool(call, block)
        for op, block in self.region_ops.items():
            if call.same_as(op):
                return blocked_op(self.builder_, call, [self.visit_expr(a) for a in call.args],
                                  block)
        return super().visit_call_(call)

    def _blocked_pool(self, call, block):
        """The NCHW max- or average pool on its producer's NCHW[block]c result: pooled in that
        layout (the window's loads are contiguous channel vectors), then one transpose back to
        NCHW for the pool's readers (a quarter of the data the producer wrote)."""
        pooled = pool_on(call, self.visit_expr(call.args[0]), f"NCHW{block}c")
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
