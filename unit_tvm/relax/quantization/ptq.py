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
  carry uint8: relax/quantization/requantize.py).
A model that arrives quantized (ONNX QuantizeLinear / DequantizeLinear pairs) keeps its own
activation scales where its quantized ops read them, and its int8 weights (quantization/qdq.py).
Grouped and depthwise convs are int8 too (UnitTensorize runs depthwise ones on a lanewise
instruction, other grouped ones on TVM's plain loop nest), so the activations around them stay
uint8. Activation x activation matmuls (attention) follow `attention`: fp32; int8 where their
int8 product stays within qbmm.MIN_COSINE of the fp32 one on the calibration inputs
(relax/cpu/qbmm.py); or bf16 (both operands rounded to bf16 in the kernel, float32 sums), which
UnitTensorize runs on a bf16 dot-product instruction. Attention long enough to outgrow the
caches becomes one fused kernel (relax/cpu/fused_attention.py), by default in int8 where the CPU
has the instruction and the kernel's rounding stays small on the calibration inputs
(relax/cpu/attention_check.py). Pooling and softmax stay fp32.

dtype="bfloat16" prepares the model for bf16 dot products (x86.vdpbf16ps): the same ops and
fused epilogues, with weights rounded to bf16 after folding, activations rounded to bf16 inside
the op and float32 accumulation; no calibration is needed. Grouped convs stay fp32 there (no
bf16 instruction here fits a depthwise window, and bf16 would only lose precision).
dtype="float32" is the same pass keeping float32 (what unit_tvm.compile runs on a float32
model): batch norms folded into float32 weights, epilogues fused, depthwise convs too where
an instruction runs them (the multiply-add's lanewise form), attention matmuls float32.
"""

import functools
import json
from typing import NamedTuple

import ml_dtypes
import numpy as np
import tvm
from tvm import relax

from ...target import as_target
from ..core import u8_values
from ..core import views
from ..core.chains import epilogue_fields, find_chains
from ..core.graph import dataflow_bindings, fold_constants
from ..core.graph import uses as count_uses
from ..core.recipe import (ATTR, CONV_KINDS, FLOAT_FORMS, QuantizedOp, Recipe, bounds_that_run,
    candidates, has_float32_instruction, implied_clamps_dropped, weight_pair_bounds)
from ..cpu import attention_check
from ..cpu import qbmm
from ..cpu.fused_attention import attention_plans, fuse_attention
from ..cpu.fused_attention import instruction as fused_instruction
from ..frontend.fixes import clamps_as_clips, frontend_fixes
from . import pair_weights
from .calibration import observe
from .emit import rewrite
from .qdq import fake_quantization
from .requantize import (requantize_edges, requantize_shared_edges, requantize_shortcuts,
    requantize_through_pools, residual_only_ends)
from .weight_scales import int8_weight_scales, on_grid

# how quantize computes matmuls between two activations (its `attention` argument)
ATTENTION = ("fp32", "int8", "bf16")


def inference_form(mod: tvm.IRModule) -> tvm.IRModule:
    """The module as quantize() looks for chains in it: batch norms decomposed into affine ops,
    constants folded, torch.export's (value, indices)[0] around pools and batch norms bound to
    the value itself; the frontends' output repaired as unit_tvm.compile does (frontend_fixes),
    so that every caller of quantize sees the same graph."""
    mod = relax.transform.DecomposeOpsForInference()(frontend_fixes(mod))
    mod = clamps_as_clips(fold_constants(mod))
    return relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(mod))


def _activation_qparams(values, method, percentile):
    if method == "minmax":
        lo, hi = float(values.min()), float(values.max())
    elif method == "percentile":
        lo, hi = (float(v) for v in np.percentile(values, [100 - percentile, percentile]))
    else:
        raise ValueError(f"calibration method must be 'minmax' or 'percentile', got {method!r}")
    q = u8_values.uint8_range(lo, hi)
    return q.scale, q.zp


def _recipe(chain, w_shape=None, **quantization):
    """The op's recipe: shapes, fused epilogue and `quantization` (x_scale and x_zp for int8,
    dtype="bfloat16" for bf16). w_shape: the weight's (default: that of chain.wq)."""
    x_shape = [int(s) for s in chain.x.ty.shape]
    out_shape = [int(s) for s in chain.end_shape]
    w_shape = chain.wq.shape if w_shape is None else w_shape
    fields = dict(kind=chain.kind, in_shape=x_shape, w_shape=[int(s) for s in w_shape],
                  out_shape=out_shape, out_channels=int(w_shape[0]), **quantization,
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
    A model that arrives quantized (QDQ pairs, quantization/qdq.py) needs none: without it, the ops
    its pairs quantize run int8 and the others stay float32, as in the model.
    Each quantized op becomes a call_tir of an int8 PrimFunc carrying its recipe (attr
    "unit_tvm.recipe"), scheduled by TVM's defaults; UnitTensorize then tensorizes them.
    dtype="bfloat16": bf16 dot products with float32 accumulation instead (no calibration).
    attention: how matmuls between two activations (attention's) are computed: "fp32";
    "int8" (int8 models only): long attention fused into one int8 kernel (per-head scales at
    run time, relax/cpu/fused_attention.py) where the kernel's arithmetic stays close to float
    attention on the calibration inputs (relax/cpu/attention_check.py), other matmuls int8 where
    their int8 product stays close to the fp32 one (relax/cpu/qbmm.py; measured no faster than
    fp32 at BERT's and ViT's sizes); "bf16": operands rounded to bf16, float32 sums, long
    attention fused. None: long attention as `default_fused_attention`, the other matmuls
    (and long attention the int8 kernel does not take) as `default_attention(target)`.
    """

    if dtype not in ("int8", *FLOAT_FORMS):
        raise ValueError(f"dtype must be 'int8', 'bfloat16' or 'float32', got {dtype!r}")
    if attention is not None and attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION} or None, got {attention!r}")
    if dtype == "float32" and attention not in (None, "fp32"):
        raise ValueError(f"a float32 model keeps float32 attention, not {attention!r}")
    target = as_target(target)
    fused = "fp32" if dtype == "float32" else attention or default_fused_attention(target, dtype)
    attention = "fp32" if dtype == "float32" else attention or default_attention(target)
    samples = list(calibration_data)
    # the passes, in order: each below says what it decides
    mod, model_scales = _graph_form(mod, params, target, dtype, fused, attention, samples)
    func = mod["main"]
    chains, float_bmms = _chains(func, dtype, attention, model_scales, samples, target)
    bmm_dtype = "bfloat16" if attention == "bf16" else "float32"
    if dtype in FLOAT_FORMS:
        return _to_float(mod, chains, float_bmms, dtype, bmm_dtype, target)
    if not chains:
        return _to_float(mod, [], float_bmms, dtype, bmm_dtype)
    shortcuts = residual_only_ends(func, chains)
    qparams = functools.partial(_activation_qparams, method=method, percentile=percentile)
    seen = _calibrate(mod, chains, shortcuts, samples, target, model_scales, qparams)
    by_end = _quantized_ops(func, chains, seen, model_scales, qparams, target)
    chains = [c for c in chains if c.end in by_end]
    pools, plan = _uint8_edges(func, chains, by_end, shortcuts, seen.shortcut_q)
    if model_scales:  # a pair's cap on a ReLU; a float model's ReLU6 keeps its recipe (and
        for op in by_end.values():  # the tuned configs its databases hold)
            op.recipe = implied_clamps_dropped(op.recipe)
    # bf16 matmuls read and write float32: decided after the uint8 edges, which they keep out of
    return rewrite(mod, chains + float_bmms,
                   {**by_end, **_float_bmm_ops(func, float_bmms, chains, bmm_dtype)}, pools, plan)


def _graph_form(mod, params, target, dtype, fused, attention, samples):
    """(module, the model's own activation quantizations): parameters bound, the inference
    form, long attention fused (int8 where the kernel's guard allows, bf16 where asked), and a
    QDQ model's pairs stripped (quantization/qdq.py)."""
    if params:
        mod = relax.transform.BindParams("main", params)(mod)
    mod = inference_form(mod)
    if fused == "int8" and dtype == "int8":  # one kernel per long attention
        mod = _int8_attention_fused(mod, target, samples)
    if "bf16" in (fused, attention):  # and the rest in bf16 where asked
        mod = fuse_attention(mod, target, "bf16")
    if dtype == "int8":
        return fake_quantization(mod)
    return mod, {}


def _chains(func, dtype, attention, model_scales, samples, target):
    """(chains to quantize, activation x activation matmuls to run in a float form): every
    chain (core/chains.py) but the bmms `attention` leaves to bf16 or float32 (float32 ones
    on the target's float32 instruction, where it has one); for a QDQ model without
    calibration inputs, only the ops its pairs quantize."""
    found = find_chains(func)
    float_bmms = [c for c in found if c.kind == "bmm" and (
        attention == "bf16" or (attention == "fp32" and has_float32_instruction(target)))]
    chains = [c for c in found if c.kind != "bmm" or (attention == "int8" and dtype == "int8")]
    if model_scales and not samples:
        # a QDQ model without calibration inputs: int8 where its pairs say, float32 elsewhere
        chains = [c for c in chains if c.kind != "bmm" and c.x in model_scales]
    return chains, float_bmms


def _quantized_ops(func, chains, seen, model_scales, qparams, target):
    """{chain end: QuantizedOp}: each chain's activation quantization (the model's own, or
    from the values it took), its int8 weights (bounded on a pre-VNNI target) and
    recipe; a bmm that fails its accuracy guard stays fp32 (left out)."""
    by_end = {}
    pair_bounds = weight_pair_bounds(target)
    for chain, vals in zip(chains, seen.x):
        x_scale, x_zp = model_scales.get(chain.x) or qparams(vals)
        chain.end_shape = [int(s) for s in _struct_shape(func, chain.end)]
        if chain.kind == "bmm":
            op = qbmm.quantized_bmm(chain, vals, seen.y[chain], float(x_scale), int(x_zp))
        else:
            moments = _channel_moments(chain, vals, second=bool(pair_bounds))
            op = _quantized_op(chain, float(x_scale), int(x_zp), moments, pair_bounds, target)
        if op is not None:
            by_end[chain.end] = op
    return by_end


def _uint8_edges(func, chains, by_end, shortcuts, shortcut_q):
    """Which edges carry uint8 (quantization/requantize.py, core/u8_values.py): between
    quantized ops, shared inputs, residual shortcuts, through max-pools, concats and pools;
    the recipes in by_end are updated. Returns (pools, the uint8 value plan)."""
    requantize_edges(func, chains, by_end)
    requantize_shared_edges(func, chains, by_end)
    known = [(c, q) for c, q in zip(shortcuts, shortcut_q) if q is not None]
    requantize_shortcuts(chains, by_end, [c for c, _ in known], [q for _, q in known])
    pools = requantize_through_pools(func, chains, by_end)
    return pools, u8_values.plan(dataflow_bindings(func), func, chains, by_end, pools)


def _int8_attention_fused(mod, target, samples):
    """`mod` with long attention fused in int8 where the kernel's arithmetic stays within
    qbmm.MIN_COSINE of float attention on the calibration inputs (attention_check.py); the
    others are left as they are. Without calibration inputs (a QDQ model can come without)
    every one is fused: the kernel takes its scales at run time."""
    plans = attention_plans(mod, target, "int8")
    if plans and samples:
        per_plan = [attention_check.observed(plan) for plan in plans]
        values = iter(observe(mod, [v for vs in per_plan for v in vs], samples, target))
        plans = [plan for plan, vs in zip(plans, per_plan)
                 if attention_check.fits_int8(plan, *[next(values) for _ in vs])]
    return fuse_attention(mod, target, "int8", plans)


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


def default_fused_attention(target, dtype="int8") -> str:
    """How long attention (the fused kernel, relax/cpu/fused_attention.py) is computed by default:
    "int8" in an int8 model where `target` has an exact u8 x s8 dot product, else as
    `default_attention(target)`. Zen 5, against the bf16 kernel: 12 x 384 x 64 (BERT at 384
    tokens) 501-512 against 661-682 us, 6 x 1500 x 64 (Whisper) 3.77 against 5.59 ms; Whisper's
    encoder, ViT-B/16 and BERT at 384 tokens within 1e-4 of its cosine to fp32
    (docs/RESULTS.md 2026-11-28); the instruction does twice bf16's products per cycle on
    every x86 server with both (Intel's with AMX too, Zen 4 and 5)."""
    if dtype == "int8" and fused_instruction(as_target(target), "int8") is not None:
        return "int8"
    return default_attention(target)


def _channel_moments(chain, values, second=False):
    """(mean, second moment or None) of each input channel (convs: axis 1; dense: the last
    axis) of the activation's calibration `values` (flattened over every input); zeros and
    ones without values. The second moments (`second`) only weigh the pre-VNNI weight form."""
    shape = [int(s) for s in chain.x.ty.shape]
    n = shape[-1] if chain.kind == "dense" else shape[1]
    if values is None:
        return np.zeros(n), np.ones(n) if second else None
    per = values.reshape(-1, n) if chain.kind == "dense" else values.reshape(-1, *shape[1:])
    axes = tuple(a for a in range(per.ndim) if a != 1)  # all but the channels
    m2 = np.square(per, dtype=np.float64).mean(axis=axes) if second else None
    return per.mean(axis=axes), m2


def _per_output_channel(values, k, groups):
    """Per-input-channel `values` [C] as [K, C per group]: the input channel each output
    channel's weights meet."""
    per_group = np.asarray(values, np.float64).reshape(groups, -1)
    if groups == 1:  # every output channel meets the same vector: a view, not K copies
        return np.broadcast_to(per_group, (k, per_group.shape[1]))
    return per_group[np.arange(k) // (k // groups)]


def _quantized_op(chain, x_scale, x_zp, x_moments, pair_bounds=(), target=None):
    """The QuantizedOp of a chain with a constant weight: per-channel int8 weights (the chain's
    scale folded in; weight_scales.py; bounded for a pre-VNNI quad or pair form where that
    costs little: pair_weights.py), the zero-point term, the dequantization multiplier and
    the bias. The bias also takes the mean of what rounding the weights loses (bias correction,
    as NNCF's and oneDNN's calibrations do): the input mean (per input channel) times the
    rounding error summed over each output channel's window, where one activation channel
    meets one weight."""
    per_channel = (-1,) + (1,) * (chain.weight.ndim - 1)  # broadcast over output channels
    w = chain.weight * chain.scale.reshape(per_channel)
    groups = int(chain.attrs.groups) if chain.kind in CONV_KINDS else 1
    means, m2 = (None if v is None else _per_output_channel(v, w.shape[0], groups)
                 for v in x_moments)
    if groups > 1 and w.shape[1] == 1:
        pair_bounds = ()  # a depthwise conv runs on a lanewise form, exact on any weights
    if pair_bounds:  # a bound's precision is spent only where its instruction would run
        probe = _recipe(chain, w_shape=w.shape, x_scale=x_scale, x_zp=x_zp)
        pair_bounds = bounds_that_run(probe, pair_bounds, target)
    scales = int8_weight_scales(w)
    choice = pair_weights.choose(w, scales, pair_bounds, m2, given=on_grid(w, scales))
    w_scale, chain.wq = choice.scales, choice.wq
    bound = choice.bound
    recipe = _recipe(chain, x_scale=x_scale, x_zp=x_zp,
                     w_pair_bound=bound.bound if bound else None,
                     w_pair_words=bound.words if bound and bound.words > 1 else None,
                     w_pair_loss=choice.loss)
    wsum = chain.wq.reshape(chain.wq.shape[0], -1).sum(axis=1, dtype=np.int64)
    # [K, C per group]: each output channel's rounding error per input channel of its group
    # (computed in place: weight-sized temporaries add up for an LLM's LM head)
    lost = chain.wq * w_scale.reshape(per_channel)
    np.subtract(w, lost, out=lost)
    lost = lost.reshape(w.shape[0], w.shape[1], -1)
    lost = lost[..., 0] if lost.shape[2] == 1 else lost.sum(axis=2)
    shift = chain.shift + np.einsum("kc,kc->k", lost, means)
    consts = [chain.wq, (x_zp * wsum).astype(np.int32),
              (x_scale * w_scale).astype(np.float32), shift.astype(np.float32)]
    return QuantizedOp(chain, recipe, consts)


def _float_form_fits(recipe, target) -> bool:
    """Whether an op takes its float form: dense layers and ungrouped convs always (without an
    instruction they keep a plain loop nest, with a warning); grouped and depthwise convs only
    where an instruction runs them (the float32 multiply-add's lanewise form runs depthwise
    windows; no bf16 instruction here does)."""
    return recipe.groups == 1 or bool(candidates(recipe, target))


def _float_bmm_ops(func, bmms, chains=(), dtype="bfloat16") -> dict:
    """{end var: QuantizedOp} of bmm chains computed in a float form (qbmm.float_bmm: bf16 for
    bf16 attention, float32 for float32 attention), with the layout ops around them folded in
    (relax/core/views.py; `chains`: the model's other quantized ops)."""
    bindings = dataflow_bindings(func)
    views.fold_bmm_layouts(bindings, count_uses(bindings, func), bmms, [*chains, *bmms])
    for chain in bmms:
        chain.end_shape = [int(s) for s in _struct_shape(func, chain.end)]
    return {chain.end: qbmm.float_bmm(chain, dtype) for chain in bmms}


def _to_float(mod, chains, bmms=(), dtype="bfloat16", bmm_dtype="bfloat16", target=None):
    """mod with every chain one op in the float form `dtype` where it fits (_float_form_fits):
    weights (per-channel scale folded in) in that dtype, the bias (shift) kept in float32;
    and every bmm chain of `bmms` one bmm in the float form `bmm_dtype`; edges between ops
    stay float32."""

    if not chains and not bmms:
        return mod
    func = mod["main"]
    by_end, taken = {}, []
    for chain in chains:
        w = chain.weight * chain.scale.reshape((-1,) + (1,) * (chain.weight.ndim - 1))
        chain.wq = w.astype(np.float32).astype(ml_dtypes.bfloat16 if dtype == "bfloat16"
                                               else np.float32)
        chain.end_shape = [int(s) for s in _struct_shape(func, chain.end)]
        recipe = _recipe(chain, dtype=dtype)
        if _float_form_fits(recipe, as_target(target)):
            taken.append(chain)
            by_end[chain.end] = QuantizedOp(chain, recipe,
                                            [chain.wq, chain.shift.astype(np.float32)])
    by_end.update(_float_bmm_ops(func, bmms, taken, bmm_dtype))
    return rewrite(mod, taken + list(bmms), by_end)


def _struct_shape(func, var):
    for b in dataflow_bindings(func):
        if b.var.same_as(var):
            return b.var.ty.shape
    raise KeyError(var)


def recipes(mod):
    """[(name, recipe as a dict: Recipe.to_dict)] of the quantized ops in a module."""
    out = []
    for gv, f in mod.functions.items():
        if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and ATTR in f.attrs:
            out.append((gv.name_hint, json.loads(str(f.attrs[ATTR]))))
    return out
