"""Re-emitting a model's main with its quantized ops: each chain quantize() found becomes one
call_tir of its int8 (or bf16) PrimFunc, emitted where the chain ends and after its inputs;
the pools and concats that run on uint8 values get their uint8 forms, every other reader a
dequantized copy."""

import tvm
import tvm_ffi
from tvm import relax

from ..core import u8_values
from ..core import views
from ..core.graph import dataflow_bindings, pool_on, vars_in
from ..core.recipe import is_float, out_dtype, out_shape
from ..cpu import qbmm
from ..cpu import u8_pools
from ..cpu.qops import plain_func

TMP = "__unit_tvm_main"  # the name a new main is built under, then installed by as_main


def as_main(mod):
    """The module with the function built as TMP installed as main (replacing the old one)."""
    funcs = {gv: f for gv, f in mod.functions.items() if gv.name_hint not in ("main", TMP)}
    new = tvm.IRModule(funcs, attrs=mod.attrs)
    new["main"] = mod[TMP].with_attr("global_symbol", "main")
    return new


class _Rewriter:
    """Re-emits main with every chain replaced by its int8 call (see rewrite)."""

    def __init__(self, mod, chains, by_end, pools, plan):
        self.func = mod["main"]
        self.by_end, self.pools, self.plan = by_end, pools, plan
        self.by_var = {b.var: b for b in dataflow_bindings(self.func)}
        self.removed = {m for c in chains for m in c.members if not m.same_as(c.end)}
        self.special = set(pools) | set(plan.concats) | set(plan.avg_pools) | set(plan.max_pools)
        self.bb = relax.BlockBuilder(mod)
        self.remap = {}  # original var -> its value in the new function (real-valued)
        self.u8_of = {}  # var -> (uint8 expression, QParams) of the values carried as uint8
        self.counter = [0]  # names of the functions added (shared with _emit_chain)

    def u8_source(self, var):
        """(uint8 expression, QParams) of a value carried as uint8 (a pool's or concat's, or a
        chain's requantized result), or None."""
        if var in self.u8_of:
            return self.u8_of[var]
        if var in self.by_end and self.by_end[var].recipe.out_q:
            return self.remap[var], u8_values.QParams(*self.by_end[var].recipe.out_q)
        return None

    def u8_value(self, var, value, q):
        """Emit `value`, var's uint8 result in quantization q; remap gets a dequantized copy."""
        self.u8_of[var] = (self.bb.emit(value), q)
        self.remap[var] = self._emit(self.by_var[var].var,
                                     u8_values.dequantize(self.u8_of[var][0], q))

    def _emit(self, var, value):
        """Emit value in the dataflow block, as an output when `var` is one."""
        return (self.bb.emit(value) if isinstance(var, relax.DataflowVar)
                else self.bb.emit_output(value))

    def concat(self, var, b):
        """A channel concat carried as uint8 in the plan's quantization."""
        q = self.plan.concats[var]
        parts = []
        for field in b.value.args[0].fields:
            found = self.u8_source(field)
            part = (u8_values.requantize(found[0], found[1], q) if found
                    else u8_values.quantize(_sub(field, self.remap), q))
            # a part already in q is the producer's own variable (what the layout pass
            # follows), not an alias of it
            parts.append(part if found and part.same_as(found[0]) else self.bb.emit(part))
        self.u8_value(var, relax.op.concat(parts, axis=1), q)

    def avg_pool(self, var, b):
        """An average pool on its uint8 producer, as an integer kernel."""
        pool = self.plan.avg_pools[var]
        src, q = self.u8_source(b.value.args[0])
        name = f"qavg_pool_{self.counter[0]}"
        self.counter[0] += 1
        func_p = u8_pools.avg_pool_func(b.value.args[0].ty.shape, b.value.attrs, pool)
        gv = self.bb.add_func(func_p.with_attr("global_symbol", name), name)
        src = u8_values.requantize(src, q, pool.source)
        arg = src if isinstance(src, relax.Var) else self.bb.emit(src)
        self.u8_value(var, relax.call_tir(gv, [arg], relax.TensorType(b.value.ty.shape, "uint8")),
                      pool.result)

    def emit_special(self, var, b):
        """A pool or concat that runs on uint8 values."""
        if var in self.pools or var in self.plan.max_pools:
            src, q = self.u8_source(b.value.args[0])
            self.u8_value(var, pool_on(b.value, src), q)
        elif var in self.plan.concats:
            self.concat(var, b)
        else:
            self.avg_pool(var, b)

    def emit_var(self, var):
        """Emit var after what it depends on (a chain's inputs, or the value's free vars)."""
        if var in self.remap or var not in self.by_var:
            return
        b = self.by_var[var]
        if var in self.by_end:
            op = self.by_end[var]
            chain, recipe, consts = op.chain, op.recipe, op.consts
            deps = ([chain.x_source] + ([chain.y_source] if chain.y is not None else [])
                    + ([chain.residual] if chain.residual is not None else []))
        else:
            deps = vars_in(b.value)
        for d in deps:
            self.emit_var(d)
        if var in self.by_end:
            self.remap[var] = _emit_chain(self.bb, chain, recipe, consts, self.remap,
                                          self.counter, b.var, self.u8_of)
        elif var in self.special:
            self.emit_special(var, b)
        else:
            self.remap[var] = self._emit(b.var, _sub(b.value, self.remap))

    def run(self):
        """The rewritten module (dead values dropped)."""
        func, bb = self.func, self.bb
        attrs = ({k: v for k, v in func.attrs.items() if k != "global_symbol"} if func.attrs
                 else None)
        with bb.function(TMP, list(func.params), attrs=attrs):
            with bb.dataflow():
                for b in dataflow_bindings(func):
                    if b.var not in self.removed:
                        self.emit_var(b.var)
                out = _sub(func.body.body, self.remap)
                if not isinstance(out, relax.Var) or out not in list(self.remap.values()):
                    out = bb.emit_output(out)
            bb.emit_func_output(out)
        return relax.transform.DeadCodeElimination()(as_main(bb.get()))


def rewrite(mod: tvm.IRModule, chains: list, by_end: dict, pools: dict | None = None,
            plan: u8_values.U8Plan | None = None) -> tvm.IRModule:
    """Re-emit main with every chain replaced by its int8 call. Emission follows dependencies:
    a chain is emitted where it ends, after its inputs (a residual may be defined later in the
    original order, e.g. a downsample branch). pools: {max-pool var: (scale, zp)} of the pools
    that run on their uint8 producer; plan: the uint8 concats and pools (u8_values.plan).
    Their uint8 results go to the convs that read uint8, a dequantized copy to every other user
    (DCE drops it when there is none)."""
    return _Rewriter(mod, chains, by_end, pools or {},
                     plan or u8_values.U8Plan({}, {}, {})).run()


def _emit_chain(bb, chain, recipe, consts, remap, counter, var, u8_of):
    name = f"q{recipe.kind}_{counter[0]}"
    counter[0] += 1
    gv = bb.add_func(plain_func(recipe).with_attr("global_symbol", name), name)
    x_arg = u8_of[chain.x][0] if recipe.in_u8 and chain.x in u8_of else _sub(chain.x_source,
                                                                                       remap)
    residual = None
    if chain.residual is not None:
        residual = (u8_of[chain.residual][0] if recipe.residual_q
                    and chain.residual in u8_of else _sub(chain.residual, remap))
    if recipe.nd_in_shape is not None:  # N-D dense: rows flattened around the kernel
        x_arg = bb.emit(relax.op.reshape(x_arg, recipe.in_shape))
    elif chain.x_view is not None:  # through the layout ops before it (relax/core/views.py)
        x_arg = views.emit_operand(bb, x_arg, chain.x_view, recipe.in_shape)
    if residual is not None and recipe.nd_out_shape is not None:
        residual = bb.emit(relax.op.reshape(residual, recipe.out_shape))
    args = [x_arg]
    if recipe.kind == "bmm":  # the run-time operand (int8: quantized, and its zero-point term)
        y_arg = _sub(chain.y_source, remap)
        if chain.y_view is not None:
            y_arg = views.emit_operand(bb, y_arg, chain.y_view, recipe.w_shape)
        elif [int(v) for v in chain.y.ty.shape] != list(recipe.w_shape):
            y_arg = bb.emit(relax.op.reshape(y_arg, recipe.w_shape))
        if is_float(recipe):
            args.append(y_arg)
        else:
            yq = bb.emit(qbmm.quantized_y(y_arg, recipe.y_scale))
            args += [yq, bb.emit(qbmm.zero_point_term(yq, recipe.x_zp))]
    args += [relax.const(c) for c in consts]
    if residual is not None:
        args.append(residual)
    call = relax.call_tir(gv, args, relax.TensorType(out_shape(recipe), out_dtype(recipe)))
    if recipe.nd_out_shape is not None:
        call = relax.op.reshape(bb.emit(call), recipe.nd_out_shape)
    return bb.emit(call) if isinstance(var, relax.DataflowVar) else bb.emit_output(call)


def _sub(expr, remap):
    """expr with vars replaced per remap (a structural copy)."""
    if not remap:
        return expr

    def on_var(v, m):
        for old, new in remap.items():
            if v.same_as(old):
                return new
        return v

    return tvm_ffi.structural_mutate(expr, [(relax.Var, on_var), (relax.DataflowVar, on_var)])
