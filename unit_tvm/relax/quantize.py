"""Post-training static quantization of a Relax model (fp32 -> int8 compute).

Every conv2d (grouped and depthwise included), ungrouped conv3d and dense/matmul whose weight is
a constant becomes one int8 operator:
- weights: per-output-channel symmetric int8, after folding the per-channel affine ops that
  follow (bias add, inference batch norm: add/subtract/multiply/divide by constants); the
  bias takes back the mean of what the rounding loses on the calibration inputs (bias
  correction: a depthwise conv's 9 weights per channel do not average their errors out);
- activations: per-tensor asymmetric uint8 (u8 x s8 is what vpdpbusd and AMX take), range from
  calibration by min/max or by percentile;
- int32 accumulation; the dequantization (zero-point compensation and scales), the bias, a
  residual add and a relu / relu6 / gelu that follow are fused into the operator's epilogue;
- requantization between quantized ops: a quantized op whose only consumer is another one
  writes uint8 in the consumer's quantization; so does one whose only consumer is a max-pool
  feeding quantized ops (max commutes with the monotonic quantization): the pool runs on uint8,
  4x less memory than fp32, and other users of its result get it dequantized (which edges
  carry uint8: relax/requantize.py).
A model that arrives quantized (ONNX QuantizeLinear / DequantizeLinear pairs) keeps its own
activation scales where its quantized ops read them, and its int8 weights (relax/qdq.py).
Grouped and depthwise convs are int8 too (UnitTensorize runs depthwise ones on a lanewise
instruction, other grouped ones on TVM's plain loop nest), so the activations around them stay
uint8. Activation x activation matmuls (attention) follow `attention`: fp32; int8 where their
int8 product stays within qbmm.MIN_COSINE of the fp32 one on the calibration inputs
(relax/qbmm.py); or bf16 (both operands rounded to bf16 in the kernel, float32 sums), which
UnitTensorize runs on a bf16 dot-product instruction. Pooling and softmax stay fp32.

dtype="bfloat16" prepares the model for bf16 dot products (x86.vdpbf16ps): the same ops and
fused epilogues, with weights rounded to bf16 after folding, activations rounded to bf16 inside
the op and float32 accumulation; no calibration is needed. Grouped convs stay fp32 there (no
bf16 instruction here fits a depthwise window, and bf16 would only lose precision).
"""

import json
from typing import NamedTuple

import ml_dtypes
import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ..runner import prepare_host
from ..target import as_target, host, is_host
from . import qbmm, u8_pools, u8_values, views
from .qdq import fake_quantization
from .chains import epilogue_fields, find_chains
from .frontend_fixes import clamps_as_clips, frontend_fixes
from .graph import dataflow_bindings, max_pool_on
from .graph import uses as count_uses
from .qops import plain_func
from .recipe import (ATTR, CONV_KINDS, QuantizedOp, Recipe, candidates, implied_clamps_dropped,
                     out_dtype, out_shape)
from .requantize import (
    requantize_edges,
    requantize_shared_edges,
    requantize_shortcuts,
    requantize_through_pools,
    residual_only_ends,
)
from .weight_scales import int8_weight_scales

_TMP = "__unit_tvm_main"
# how quantize computes matmuls between two activations (its `attention` argument)
ATTENTION = ("fp32", "int8", "bf16")


def _as_main(mod):
    """The module with the function built as _TMP installed as main (replacing the old one)."""
    funcs = {gv: f for gv, f in mod.functions.items() if gv.name_hint not in ("main", _TMP)}
    new = tvm.IRModule(funcs, attrs=mod.attrs)
    new["main"] = mod[_TMP].with_attr("global_symbol", "main")
    return new


def observe(mod, outputs, calibration_data, target):
    """Run the fp32 model (TVM, on this CPU) on the calibration inputs; the values `outputs`
    (vars of main) take, each flattened over all inputs. target: the model's target (its own
    build is used where it runs here)."""
    func = mod["main"]
    bindings = dataflow_bindings(func)
    bb = relax.BlockBuilder(mod)  # the module's other functions stay callable
    params = list(func.params)
    with bb.function(_TMP, params):
        with bb.dataflow():
            for b in bindings:
                bb.emit_normalized(b)
            out = bb.emit_output(relax.Tuple(outputs))
        bb.emit_func_output(out)
    cal = _as_main(bb.get())
    from ..compiler import build_relax  # the fp32 model with the default CPU schedule: faster

    # Calibration runs here: a model compiled for another machine (aarch64, a wider x86) is
    # observed in fp32 on this one, so both builds of one model get the same quantization.
    ex = build_relax(cal, target if is_host(target) else host())
    # calibration's kernels are this thread's first parallel ones: TVM sizes its pool for
    # good on the first (half the CPUs unless told), and the model's inferences share it
    prepare_host()
    vm = relax.VirtualMachine(ex, tvm.cpu())
    seen = [[] for _ in outputs]
    for sample in calibration_data:
        sample = sample if isinstance(sample, (list, tuple)) else [sample]
        res = vm["main"](*[tvm.runtime.tensor(np.asarray(s), tvm.cpu()) for s in sample])
        for i in range(len(outputs)):
            seen[i].append(res[i].numpy().reshape(-1))
    return [np.concatenate(s) for s in seen]


def inference_form(mod: tvm.IRModule) -> tvm.IRModule:
    """The module as quantize() looks for chains in it: batch norms decomposed into affine ops,
    constants folded, torch.export's (value, indices)[0] around pools and batch norms bound to
    the value itself; the frontends' output repaired as unit_tvm.compile does (frontend_fixes),
    so that every caller of quantize sees the same graph."""
    mod = relax.transform.DecomposeOpsForInference()(frontend_fixes(mod))
    mod = clamps_as_clips(relax.transform.FoldConstant()(mod))
    return relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(mod))


def _activation_qparams(values, method, percentile):
    if method == "minmax":
        lo, hi = float(values.min()), float(values.max())
    elif method == "percentile":
        lo, hi = (float(v) for v in np.percentile(values, [100 - percentile, percentile]))
    else:
        raise ValueError(f"calibration method must be 'minmax' or 'percentile', got {method!r}")
    lo, hi = min(lo, 0.0), max(hi, 0.0)  # 0.0 must be exact (padding, relu)
    scale = (hi - lo) / 255.0 if hi > lo else 1.0
    zp = int(np.clip(round(-lo / scale), 0, 255))
    return scale, zp


def _recipe(chain, **quantization):
    """The op's recipe: shapes, fused epilogue and `quantization` (x_scale and x_zp for int8,
    dtype="bfloat16" for bf16)."""
    x_shape = [int(s) for s in chain.x.ty.shape]
    out_shape = [int(s) for s in chain.end_shape]
    fields = dict(kind=chain.kind, in_shape=x_shape, w_shape=list(chain.wq.shape),
                  out_shape=out_shape, out_channels=int(chain.wq.shape[0]), **quantization,
                  **epilogue_fields(chain), residual=chain.residual is not None)
    if chain.kind == "dense":  # leading dims flattened into rows around the kernel
        rows = int(np.prod(x_shape[:-1]))
        fields.update(in_shape=[rows, x_shape[-1]], out_shape=[rows, out_shape[-1]])
        if len(x_shape) != 2:
            fields["nd_in_shape"] = x_shape
        if out_shape != fields["out_shape"]:
            fields["nd_out_shape"] = out_shape
    if chain.kind in CONV_KINDS:
        a = chain.attrs
        fields.update(stride=[int(v) for v in a.strides], dilation=[int(v) for v in a.dilation],
                      padding=[int(v) for v in a.padding], groups=int(a.groups))
    return Recipe.from_dict(fields)


def quantize(mod, params=None, calibration_data=(), *, dtype="int8", method="minmax",
             percentile=99.99, target=None, attention=None):
    """Quantize `mod` (Relax IRModule with fp32 main) to int8 compute; returns the new module.

    params: {name: array} bound into main as constants first (None when weights are already
    constants). calibration_data: iterable of inputs (arrays or tuples of arrays) for main.
    A model that arrives quantized (QDQ pairs, relax/qdq.py) needs none: without it, the ops
    its pairs quantize run int8 and the others stay float32, as in the model.
    Each quantized op becomes a call_tir of an int8 PrimFunc carrying its recipe (attr
    "unit_tvm.recipe"), scheduled by TVM's defaults; UnitTensorize then tensorizes them.
    dtype="bfloat16": bf16 dot products with float32 accumulation instead (no calibration).
    attention: how matmuls between two activations (attention's) are computed: "fp32";
    "int8" (int8 models only) where their int8 product stays close to the fp32 one on the
    calibration inputs (relax/qbmm.py; measured no faster than fp32 at BERT's and ViT's
    sizes); "bf16": operands rounded to bf16, float32 sums. None: `default_attention(target)`.
    """

    if dtype not in ("int8", "bfloat16"):
        raise ValueError(f"dtype must be 'int8' or 'bfloat16', got {dtype!r}")
    if attention is not None and attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION} or None, got {attention!r}")
    target = as_target(target)
    attention = attention or default_attention(target)
    if params:
        mod = relax.transform.BindParams("main", params)(mod)
    mod = inference_form(mod)
    if dtype == "int8":  # a QDQ model's pairs: its own activation scales (relax/qdq.py)
        mod, model_scales = fake_quantization(mod)
    else:
        model_scales = {}
    func = mod["main"]
    found = find_chains(func)
    bf16_bmms = [c for c in found if c.kind == "bmm" and attention == "bf16"]
    chains = [c for c in found if c.kind != "bmm" or (attention == "int8" and dtype == "int8")]
    if dtype == "bfloat16":
        return _to_bfloat16(mod, [c for c in chains if c.kind == "dense"
                                  or int(c.attrs.groups) == 1], bf16_bmms)
    samples = list(calibration_data)
    if model_scales and not samples:
        # a QDQ model without calibration inputs: int8 where its pairs say, float32 elsewhere
        chains = [c for c in chains if c.kind != "bmm" and c.x in model_scales]
    if not chains:
        return _to_bfloat16(mod, [], bf16_bmms)
    shortcuts = residual_only_ends(func, chains)
    seen = _calibrate(mod, chains, shortcuts, samples, target, model_scales,
                      lambda v: _activation_qparams(v, method, percentile))
    by_end = {}
    for chain, vals in zip(chains, seen.x):
        given = model_scales.get(chain.x)
        x_scale, x_zp = given if given else _activation_qparams(vals, method, percentile)
        chain.end_shape = [int(s) for s in _struct_shape(func, chain.end)]
        if chain.kind == "bmm":
            op = qbmm.quantized_bmm(chain, vals, seen.y[chain], float(x_scale), int(x_zp))
        else:
            op = _quantized_op(chain, float(x_scale), int(x_zp), _channel_means(chain, vals))
        if op is not None:  # a bmm that fails its accuracy guard stays fp32
            by_end[chain.end] = op
    chains = [c for c in chains if c.end in by_end]
    requantize_edges(func, chains, by_end)
    requantize_shared_edges(func, chains, by_end)
    known = [(c, q) for c, q in zip(shortcuts, seen.shortcut_q) if q is not None]
    requantize_shortcuts(chains, by_end, [c for c, _ in known], [q for _, q in known])
    pools = requantize_through_pools(func, chains, by_end)
    plan = u8_values.plan(dataflow_bindings(func), func, chains, by_end, pools)
    if model_scales:  # a pair's cap on a ReLU; a float model's ReLU6 keeps its recipe (and
        for op in by_end.values():  # the tuned configs its databases hold)
            op.recipe = implied_clamps_dropped(op.recipe)
    # bf16 matmuls read and write float32: decided after the uint8 edges, which they keep out of
    return _rewrite(mod, chains + bf16_bmms, {**by_end, **_bf16_bmm_ops(func, bf16_bmms, chains)},
                    pools, plan)


class _Calibration(NamedTuple):
    """What the calibration inputs give: each quantized op's input values (None where the
    model's own quantization stands in), each residual-only end's quantization (None: not
    known), each activation x activation matmul's second operand's values."""

    x: list
    shortcut_q: list
    y: dict


def _calibrate(mod, chains, shortcuts, samples, target, model_scales, qparams) -> _Calibration:
    """Observe the float32 model on `samples`. Without samples, a model whose every quantized
    op's input has the model's own quantization (a QDQ model's pairs) needs none: its weights
    are already on their int8 grid, so there is no rounding error for a bias to take back."""
    bmms = [c for c in chains if c.kind == "bmm"]
    if not samples:
        if any(c.x not in model_scales for c in chains) or bmms:
            raise ValueError("calibration_data is empty: at least one input is needed")
        return _Calibration([None] * len(chains), [model_scales.get(c.end) for c in shortcuts],
                            {})
    values = observe(mod, [c.x for c in chains] + [c.end for c in shortcuts]
                      + [c.y for c in bmms], samples, target)
    ends = values[len(chains):len(chains) + len(shortcuts)]
    return _Calibration(values[:len(chains)],
                        [model_scales.get(c.end) or qparams(v) for c, v in zip(shortcuts, ends)],
                        dict(zip(bmms, values[len(chains) + len(shortcuts):])))


def default_attention(target) -> str:
    """"bf16" where `target` has an instruction for a bf16 matmul between activations
    (x86.vdpbf16ps, AMX-BF16), else "fp32". BERT-base at 128 tokens on Zen 4 (vdpbf16ps): 3-4%
    faster end to end than fp32 attention at the same cosine to fp32 (docs/RESULTS.md
    2026-11-26); without such an instruction bf16 would run as a slower loop nest."""
    probe = Recipe(kind="bmm", in_shape=(1, 64, 64), w_shape=(1, 64, 64),
                   out_shape=(1, 64, 64), out_channels=64, dtype="bfloat16")
    return "bf16" if candidates(probe, as_target(target)) else "fp32"


def _channel_means(chain, values):
    """Mean of each input channel (convs: axis 1; dense: the last axis) of the activation's
    calibration `values` (flattened over every input); zeros without values."""
    shape = [int(s) for s in chain.x.ty.shape]
    if values is None:
        return np.zeros(shape[-1] if chain.kind == "dense" else shape[1])
    if chain.kind == "dense":
        return values.reshape(-1, shape[-1]).mean(axis=0)
    per = values.reshape(-1, *shape[1:])
    return per.mean(axis=tuple(a for a in range(per.ndim) if a != 1))


def _quantized_op(chain, x_scale, x_zp, x_mean):
    """The QuantizedOp of a chain with a constant weight: per-channel int8 weights (the chain's
    scale folded in; weight_scales.py), the zero-point term, the dequantization multiplier and
    the bias. The bias also takes the mean of what rounding the weights loses (bias correction,
    as NNCF's and oneDNN's calibrations do): x_mean (per input channel) times the rounding error
    summed over each output channel's window, where one activation channel meets one weight."""
    per_channel = (-1,) + (1,) * (chain.weight.ndim - 1)  # broadcast over output channels
    w = chain.weight * chain.scale.reshape(per_channel)
    w_scale = int8_weight_scales(w)
    chain.wq = np.clip(np.round(w / w_scale.reshape(per_channel)), -127, 127).astype(np.int8)
    recipe = _recipe(chain, x_scale=x_scale, x_zp=x_zp)
    wsum = chain.wq.reshape(chain.wq.shape[0], -1).astype(np.int64).sum(axis=1)
    # [K, C per group]: each output channel's rounding error per input channel of its group
    lost = (w - chain.wq * w_scale.reshape(per_channel)).reshape(w.shape[0], w.shape[1], -1)
    group_means = np.asarray(x_mean, np.float64).reshape(recipe.groups, w.shape[1])
    means = group_means[np.arange(w.shape[0]) // (w.shape[0] // recipe.groups)]
    shift = chain.shift + (lost.sum(axis=2) * means).sum(axis=1)
    consts = [chain.wq, (x_zp * wsum).astype(np.int32),
              (x_scale * w_scale).astype(np.float32), shift.astype(np.float32)]
    return QuantizedOp(chain, recipe, consts)


def _bf16_bmm_ops(func, bmms, chains=()) -> dict:
    """{end var: QuantizedOp} of bmm chains computed in bf16 (qbmm.bf16_bmm), with the layout
    ops around them folded in (relax/views.py; `chains`: the model's other quantized ops)."""
    bindings = dataflow_bindings(func)
    views.fold_bmm_layouts(bindings, count_uses(bindings, func), bmms, [*chains, *bmms])
    for chain in bmms:
        chain.end_shape = [int(s) for s in _struct_shape(func, chain.end)]
    return {chain.end: qbmm.bf16_bmm(chain) for chain in bmms}


def _to_bfloat16(mod, chains, bmms=()):
    """mod with every chain one bf16 op: weights (per-channel scale folded in) rounded to bf16,
    the bias (shift) kept in float32; and every bmm chain of `bmms` one bf16 bmm; edges
    between ops stay float32."""

    if not chains and not bmms:
        return mod
    func = mod["main"]
    by_end = _bf16_bmm_ops(func, bmms, chains)
    for chain in chains:
        w = chain.weight * chain.scale.reshape((-1,) + (1,) * (chain.weight.ndim - 1))
        chain.wq = w.astype(np.float32).astype(ml_dtypes.bfloat16)
        chain.end_shape = [int(s) for s in _struct_shape(func, chain.end)]
        by_end[chain.end] = QuantizedOp(chain, _recipe(chain, dtype="bfloat16"),
                                        [chain.wq, chain.shift.astype(np.float32)])
    return _rewrite(mod, list(chains) + list(bmms), by_end)


def _struct_shape(func, var):
    for b in dataflow_bindings(func):
        if b.var.same_as(var):
            return b.var.ty.shape
    raise KeyError(var)


def _free_vars(expr):
    found = []

    def visit(e):
        if isinstance(e, relax.Var):
            found.append(e)

    relax.analysis.post_order_visit(expr, visit)
    return found


class _Rewriter:
    """Re-emits main with every chain replaced by its int8 call (see _rewrite)."""
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
            self.u8_value(var, max_pool_on(b.value, src), q)
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
            deps = _free_vars(b.value)
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
        with bb.function(_TMP, list(func.params), attrs=attrs):
            with bb.dataflow():
                for b in dataflow_bindings(func):
                    if b.var not in self.removed:
                        self.emit_var(b.var)
                out = _sub(func.body.body, self.remap)
                if not isinstance(out, relax.Var) or out not in list(self.remap.values()):
                    out = bb.emit_output(out)
            bb.emit_func_output(out)
        return relax.transform.DeadCodeElimination()(_as_main(bb.get()))


def _rewrite(mod, chains, by_end, pools=None, plan=None):
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
    elif chain.x_view is not None:  # through the layout ops before it (relax/views.py)
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
        if recipe.dtype == "bfloat16":
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


def recipes(mod):
    """[(name, recipe as a dict: Recipe.to_dict)] of the quantized ops in a module."""
    out = []
    for gv, f in mod.functions.items():
        if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and ATTR in f.attrs:
            out.append((gv.name_hint, json.loads(str(f.attrs[ATTR]))))
    return out
