"""UnitTensorize: the graph pass that puts tensorized kernels into a quantized Relax model.

For every int8 operator the quantizer produced (a call_tir of a PrimFunc carrying a recipe), it
picks the instruction (Inspector: least padding, tile before vector), converts the layouts —
activations are quantized, zero-padded and packed to NCHW[x]c inside the kernel, constant weights
are packed to KCRS[x/4]c[y]k[4]c at compile time — and replaces the call with the Rewriter's
tensorized kernel, its epilogue (dequantization, bias, residual, relu) fused into the write-back.
Tuned configurations come from the tuning database when present. Grouped/depthwise int8 convs keep
their plain int8 loop nest (scheduled later by the default CPU schedule). Everything else is left
for TVM's own legalization: this is one pass in TVM's pipeline, not a fork of tvm.compile.
"""

import json
import warnings

import tvm
from tvm import relax

from ..target import as_target
from .qops import ATTR, candidates, pack_weight, tensorized_func, tensorized_graph


def _recipe_of(mod, call):
    if not isinstance(call, relax.Call) or call.op.name != "relax.call_tir":
        return None
    gv = call.args[0]
    func = mod.functions.get(gv) if isinstance(gv, tvm.ir.GlobalVar) else None
    if isinstance(func, tvm.tirx.PrimFunc) and func.attrs is not None and ATTR in func.attrs:
        return json.loads(str(func.attrs[ATTR]))
    return None


def _configs(prepared, intrin, target, database, tune, trials):
    if database is None and not tune:
        return None
    from ..tuner import tune as run_tune

    return run_tune(prepared, intrin, target, database=database, measure=bool(tune),
                    trials=trials).config


@tvm.transform.module_pass(opt_level=0, name="UnitTensorize")
class UnitTensorize:
    """tvm.transform.Pass: tensorize every quantized operator of a Relax module for `target`.

    database: a unit_tvm.tuner.Database (or path) whose configs are used; tune=True also tunes
    workloads missing from it (each distinct op once). Ops no instruction fits keep TVM's schedule.
    """

    def __init__(self, target=None, database=None, tune=False, trials=None):
        self.target = as_target(target)
        self.database = database
        self.tune = tune
        self.trials = trials
        self.report = []  # (op, instruction or None, reason) per quantized op

    def transform_module(self, mod, ctx):  # noqa: D401 - tvm pass hook
        func = mod["main"]
        calls = []

        def collect(e):
            if _recipe_of(mod, e) is not None:
                calls.append(e)

        relax.analysis.post_order_visit(func.body, collect)
        bb = relax.BlockBuilder(mod)
        built, replace = {}, {}
        for call in calls:
            recipe = _recipe_of(mod, call)
            key = json.dumps(recipe, sort_keys=True)
            if key not in built:
                entry = self._build(recipe)
                if entry is not None:
                    func_t, blocks = entry
                    name = f"unit_{recipe['kind']}_{len(built)}"
                    entry = (bb.add_func(func_t.with_attr("global_symbol", name), name), blocks)
                built[key] = entry
            if built[key] is None:
                continue
            gv, blocks = built[key]
            args = list(call.args[1].fields)
            args[1] = relax.const(pack_weight(recipe, args[1].value.numpy(), *blocks))
            replace[call] = relax.call_tir(gv, args, call.ty)
        if not replace:
            return mod
        mod = bb.get()
        mod["main"] = _replace_calls(mod["main"], replace)
        return relax.transform.DeadCodeElimination()(mod)

    def _build(self, recipe):
        """(tensorized PrimFunc, (x, y)), or None with the reason reported."""
        label = f"{recipe['kind']} {recipe['in_shape']}->{recipe['out_shape']}"
        if recipe.get("groups", 1) != 1:
            # expected, not a warning: no dot-product instruction fits a depthwise window; the
            # int8 loop nest gets the default CPU schedule
            self.report.append((label, None, f"grouped conv ({recipe['groups']} groups): "
                                             "int8 without a tensorized instruction"))
            return None
        reasons = []
        for intrin in candidates(recipe, self.target):
            try:
                graph = tensorized_graph(recipe, intrin)
                config = _configs(graph[0], intrin, self.target, self.database, self.tune,
                                  self.trials)
                func, blocks, _ = tensorized_func(recipe, intrin, self.target, config, graph)
            except (ValueError, RuntimeError, tvm.s_tir.ScheduleError) as e:
                reasons.append(f"{intrin.name}: {str(e).splitlines()[0]}")
                continue
            self.report.append((label, intrin.name, ""))
            return func, blocks
        reason = "; ".join(reasons) or "no u8 x s8 instruction on this target"
        warnings.warn(f"UnitTensorize: {label} keeps TVM's schedule: {reason}", stacklevel=3)
        self.report.append((label, None, reason))
        return None


def _replace_calls(func, replace):
    import tvm_ffi

    def on_call(call, m):
        for old, new in replace.items():
            if call.same_as(old):
                return new
        return m.default_mutate(call)

    return tvm_ffi.structural_mutate(func, [(relax.Call, on_call)])
