"""Attention written as matmul, softmax, matmul, read back as one fused kernel on CPUs
(schedules/cpu_attention.py).

The match, on the graph `quantize` sees (frontend_fixes applied, bindings canonical):

    scores = matmul(q, kt)                 q [..., M, D], kt [..., D, N]
    [scores = scores * c  or  scores / c]  a scalar constant
    [scores = scores + mask]               float32, broadcast to the scores (numpy's rules)
    [or where(cond, c, scores)]            bool cond broadcast so, c a scalar constant (torch's
                                           masked_fill; or where(cond, scores, c))
    probs  = softmax(scores, axis=-1)      or torch's safe softmax (relax/frontend/safe_softmax.py)
    out    = matmul(probs, v)              v [..., N, Dv]

with reshapes that only regroup the batch axes between them (torch.export's bmm form), the
three operands' batch axes equal, float32, static shapes, and the scores and probabilities
read by nothing else. The mask (a causal mask, a padding mask [B, 1, 1, N], a bias per head:
what torch's SDPA and Hugging Face's attention add) is an input of the kernel, read in its
own shape (through a broadcast_to before the add), whatever computes it.

Like the bf16 attention matmuls (relax/core/views.py), the kernel reads each operand where its
producer left it: back through the view ops (reshape, permute_dims, strided_slice, squeeze,
...) that cut Q, K and V out of one projection, and through multiplies by a scalar constant
(torch's SDPA scales Q and K by the square root of 1/sqrt(D) each), which join the kernel's
scale; and it writes its result through the transposes and reshapes that merge the heads back
(six copy kernels per layer fewer in Hugging Face's spelling of attention).

Applied to attention whose scores outgrow the caches (cpu_attention.worth_fusing: Whisper's,
ViT's, not BERT-base's at 128 tokens), where the target has a broadcast dot-product instruction
for the precision quantize's `attention` asks: "int8" (u8 x s8 products with per-head scales
taken at run time: schedules/cpu_attention_int8.py; quantize's default in int8 models where the
CPU has VNNI, quantize.default_fused_attention) or "bf16" (the kernel's products round their
operands to bf16 as the bf16 attention matmuls do).
"""

import math
from typing import NamedTuple

import tvm
from tvm import relax, te, tirx

from ... import intrinsics
from ...indexing import unravel
from ...schedules import cpu_attention
from ...target import is_cpu
from ..core.graph import (bound_call, const_value, dataflow_bindings, op_name, readers,
    rewrite_functions, scalar_const, static_shape, uses)
from ..core.views import StridedView, bound_view_op, composed, result_layout
from ..frontend.safe_softmax import SAFE_SOFTMAX_ATTR

KERNEL_NAME = "unit_attention"
# {"instruction", "macs", "label"} of the kernel, for `unit-tvm profile`
KERNEL_INFO_ATTR = "unit_tvm.kernel_info"


class Operand(NamedTuple):
    """An operand read from `source` (a variable that survives the rewrite) through `view`
    (its [batch, rows, cols] form), times `scale`."""

    source: relax.Var
    view: StridedView
    scale: float


class Mask(NamedTuple):
    """A mask on the scores: `source` (a Var or a Constant) of static shape `shape`, broadcast
    by numpy's rules to `scores_shape`, the scores' shape where it applies (batch axes, rows,
    keys: the batch axes flatten row-major to the kernel's head index). Added to the scores
    (float32, `fill` None), or a condition (bool) where the score is replaced by `fill`: where
    it is true (`when`, torch's masked_fill) or false (torch.where(keep, scores, fill))."""

    source: relax.Expr
    shape: tuple
    scores_shape: tuple
    fill: float | None = None
    when: bool = True


class AttentionPlan(NamedTuple):
    """One matched attention: its operands, the softmax's kind and scale, where the kernel's
    result goes (`end`, whose value it computes: the result of dims `result_dims`, [batch,
    rows, v_depth] or with the batch unflattened, with its axes in `out_axes` order) and the
    mask added to its scaled scores (None: none)."""

    q: Operand
    kt: Operand
    v: Operand
    scale: float
    safe: bool
    shape: cpu_attention.AttentionShape
    end: relax.Var
    out_axes: tuple
    result_dims: tuple
    mask: Mask | None = None


# the products' operand and accumulator types per precision of the fused kernel
PRODUCT_TYPES = {"bf16": (("bfloat16", "bfloat16"), "float32"),
                 "int8": (("uint8", "int8"), "int32")}


def instruction(target, precision="bf16"):
    """The Intrinsic the fused kernel runs on `target` in `precision` ("bf16": a vector dot
    product of bf16 pairs into float32 lanes; "int8": of u8 x s8 words into int32 lanes; one
    operand broadcast), or None."""
    if target is None or not is_cpu(target):
        return None
    inputs, output = PRODUCT_TYPES[precision]
    for intrin in intrinsics.for_target(target):
        # the layout cpu_attention packs: the first operand a broadcast word of `width`, the
        # second [lanes, width] (UNIT's Fig. 4a, as dot_semantics writes it)
        # ... and exact on every value of its operand types (vpmaddubsw saturates u8 >= 128)
        shape = [(kind, ext) for _, ext, kind in intrin.loops]
        if (intrin.input_dtypes == inputs and intrin.output_dtype == output
                and not intrin.operand_ranges
                and intrin.broadcast_operand == intrin.operands[0]
                and shape == [("S", intrin.lanes), ("R", intrin.reduction_width)]):
            return intrin
    return None


class _Graph(NamedTuple):
    by_var: dict  # Var -> its binding
    uses: dict  # Var -> number of reads
    users: dict  # Var -> its first reader's binding

    def lookup(self, var):
        """The value `var` is bound to, or None."""
        b = self.by_var.get(var) if isinstance(var, relax.Var) else None
        return b.value if b is not None else None

    def call(self, expr, name=None):
        """The call `expr` is bound to (of op `name` if given: graph.bound_call), or None."""
        if name:
            return bound_call(expr, self.lookup, name) if isinstance(expr, relax.Var) else None
        value = self.lookup(expr)
        return value if isinstance(value, relax.Call) else None


def _under_batch_reshapes(g, expr):
    """`expr` past reshapes that keep its last two axes (regrouping the batch axes only)."""
    while (call := g.call(expr, "relax.reshape")) is not None:
        inner, outer = static_shape(call.args[0]), static_shape(call)
        if inner is None or outer is None or len(inner) < 2 or inner[-2:] != outer[-2:]:
            break
        expr = call.args[0]
    return expr


def _scalar_factor(call):
    """(x, c) for x * c, c * x or x / c with a scalar constant c that keeps x's shape (a
    constant of shape [1, 1, 1, 1] would add axes the views after it count), else None."""
    name = op_name(call)
    if name not in ("relax.multiply", "relax.divide") or len(call.args) != 2:
        return None
    a, b = call.args
    c = scalar_const(b)
    if c is not None and (name == "relax.multiply" or c != 0):
        found = a, c if name == "relax.multiply" else 1.0 / c
    elif name == "relax.multiply" and scalar_const(a) is not None:
        found = b, scalar_const(a)
    else:
        return None
    shape = static_shape(found[0])
    return found if shape is not None and shape == static_shape(call) else None


def _softmax_input(g, expr, mod):
    """(scores, safe) when `expr` is a softmax over its last axis, plain or safe, else None."""
    call = g.call(expr)
    if op_name(call) == "relax.nn.softmax":
        ndim = len(static_shape(call) or [])
        if ndim and int(call.attrs.axis) % ndim == ndim - 1:
            return call.args[0], False
        return None
    if op_name(call) == "relax.call_tir":
        try:
            attrs = mod[call.args[0]].attrs
        except (KeyError, ValueError, tvm.error.TVMError):
            return None
        if attrs is not None and SAFE_SOFTMAX_ATTR in attrs and len(call.args[1].fields) == 1:
            return call.args[1].fields[0], True
    return None


def _broadcast(shape, to) -> StridedView | None:
    """A row-major tensor of `shape` broadcast to `to` by numpy's rules, or None."""
    return StridedView.contiguous(shape).broadcast(to)


def _mask_source(g, expr):
    """`expr` before the broadcast_to ops that widen it: the mask the kernel reads, broadcast
    by its reader instead of materialised (the broadcast stays for any other reader)."""
    while (call := g.call(expr, "relax.broadcast_to")) is not None:
        inner = static_shape(call.args[0])
        if inner is None or _broadcast(inner, static_shape(expr)) is None:
            break
        expr = call.args[0]
    return expr


def _mask_of(g, side, source, full, dtype, **fill) -> Mask | None:
    """The Mask of `source` on scores `side` of shape `full`, where `source` is a `dtype`
    tensor of static shape that broadcasts to them and `side` has their shape, else None."""
    shape = static_shape(source)
    if (static_shape(side) != full or shape is None or _broadcast(shape, full) is None
            or str(source.ty.dtype) != dtype):
        return None
    source = _mask_source(g, source)
    return Mask(source, tuple(static_shape(source)), tuple(full), **fill)


def _score_terms(g, scores):
    """[(product side, Mask or None)]: the ways `scores` reads as the product's scaled scores
    with a mask (read once: an add of a float32 tensor that broadcasts to them, or a where of
    a bool one and a scalar constant), or as those scores alone."""
    full = static_shape(scores)
    call = g.call(scores)
    if op_name(call) not in ("relax.add", "relax.where") or g.uses.get(scores, 0) != 1:
        return [(scores, None)]
    if op_name(call) == "relax.add":
        found = [(side, _mask_of(g, side, other, full, "float32"))
                 for side, other in (call.args, reversed(call.args))]
    else:
        cond, a, b = call.args
        found = [(side, _mask_of(g, side, cond, full, "bool", fill=f, when=when))
                 for side, fill, when in ((b, a, True), (a, b, False))
                 if (f := scalar_const(fill)) is not None]
    return [(side, mask) for side, mask in found if mask is not None]


def _scaled_product(g, scores):
    """(the matmul, scale) where `scores` is matmul(q, kt), times a scalar or not, each read
    once (reshapes that regroup the batch axes between them), else None."""
    scores = _under_batch_reshapes(g, scores)
    scale = 1.0
    factor = _scalar_factor(g.call(scores)) if g.call(scores) is not None else None
    if factor is not None and g.uses.get(scores, 0) == 1:
        scores, scale = _under_batch_reshapes(g, factor[0]), factor[1]
    product = g.call(scores, "relax.matmul")
    if product is None or g.uses.get(scores, 0) != 1:
        return None
    return product, scale


def _mask_fits(mask, shape) -> bool:
    """Whether the mask's scores are the kernel's: [..., rows, keys] over `shape.batch` heads."""
    dims = mask.scores_shape
    return (len(dims) >= 2 and tuple(dims[-2:]) == (shape.rows, shape.keys)
            and math.prod(dims[:-2]) == shape.batch)


def _operand(g, var, logical) -> Operand:
    """How the kernel reads the operand `var` (logical: its [batch, rows, cols] shape): back
    through view ops and scalar multiplies as far as the views compose, else `var` itself.
    The view is [batch, rows, cols] where the batch axes merge into one stride, else in
    var's own shape (batch 2 of heads cut from the hidden axis: the batch and head strides
    differ), the kernel's batch index unravelled over its batch axes (_reader)."""
    ops, scale, cur = [], 1.0, var
    best = Operand(var, StridedView.contiguous(logical), 1.0)
    while (value := g.lookup(cur)) is not None:
        factor = _scalar_factor(value) if isinstance(value, relax.Call) else None
        if factor is not None:
            cur, c = factor
            scale *= c
        elif (call := bound_view_op(value, g.lookup)) is not None:
            ops.append(call)
            cur = call.args[0]
        else:
            break
        if not isinstance(cur, relax.Var) or static_shape(cur) is None:
            break
        view = composed(static_shape(cur), ops)
        if view is not None:
            best = Operand(cur, view.reshape(logical) or view, scale)
    return best


def _shape_of(q, kt, v):
    shapes = [static_shape(x) for x in (q, kt, v)]
    if any(s is None or len(s) < 3 for s in shapes) or any(
            str(x.ty.dtype) != "float32" for x in (q, kt, v)):
        return None
    (*bq, m, d), (*bk, d2, n), (*bv, n2, dv) = shapes
    if not (bq == bk == bv and d == d2 and n == n2):
        return None
    return cpu_attention.AttentionShape(math.prod(bq), m, d, n, dv)


def _over_batch_reshapes(g, var):
    """`var` past the single-use reshapes after it that keep its last two axes."""
    while g.uses.get(var, 0) == 1 and var in g.users:
        after = g.users[var]
        if op_name(after.value) != "relax.reshape" or not after.value.args[0].same_as(var):
            break
        inner, outer = static_shape(var), static_shape(after.var)
        if inner is None or outer is None or len(outer) < 2 or inner[-2:] != outer[-2:]:
            break
        var = after.var
    return var


def attention_plan(g, binding, mod) -> AttentionPlan | None:
    """The AttentionPlan of `binding` when its value is the last matmul of the pattern in the
    module note, else None."""
    call = binding.value
    if op_name(call) != "relax.matmul" or len(call.args) != 2:
        return None
    probs, v = call.args
    probs = _under_batch_reshapes(g, probs)
    found = _softmax_input(g, probs, mod) if g.uses.get(probs, 0) == 1 else None
    if found is None:
        return None
    scores, safe = found
    terms = [(p, mask) for side, mask in _score_terms(g, _under_batch_reshapes(g, scores))
             if (p := _scaled_product(g, side)) is not None]
    if not terms:
        return None
    (product, scale), mask = terms[0]
    q, kt = product.args
    shape = _shape_of(q, kt, v)
    if shape is None or (mask is not None and not _mask_fits(mask, shape)):
        return None
    b, m, d, n, dv = shape
    # each operand from before the reshapes that regroup its batch axes (torch's bmm form:
    # [2, 3, ...] heads flattened to [6, ...]), which need not merge into one stride
    ops = [_operand(g, _under_batch_reshapes(g, x), logical) for x, logical in (
        (q, (b, m, d)), (kt, (b, d, n)), (v, (b, n, dv)))]
    dims = (b, m, dv)
    layout = result_layout(binding.var, dims, g.users, g.uses)
    start = _over_batch_reshapes(g, binding.var)
    if layout is None and len(static_shape(start)) > 3:  # heads merged across a batch of 2+
        dims = (*static_shape(start)[:-2], m, dv)
        layout = result_layout(start, dims, g.users, g.uses)
    if layout is None:
        dims = (b, m, dv)
    end, axes = (layout.end, layout.axes) if layout is not None else (binding.var, (0, 1, 2))
    return AttentionPlan(*ops, scale * ops[0].scale * ops[1].scale, safe, shape, end, axes,
                         dims, mask)


def kernel_infos(mod: tvm.IRModule) -> dict:
    """{function name: its KERNEL_INFO_ATTR} of the kernels in `mod` scheduled by unit-tvm's
    graph passes (the fused attention's)."""
    return {gv.name_hint: f.attrs[KERNEL_INFO_ATTR] for gv, f in mod.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None
            and KERNEL_INFO_ATTR in f.attrs}


def _reader(src, view, factor):
    """A function of an operand's (batch, row, column) index to its float32 value in the flat
    `src` (the batch index unravelled where the view keeps the batch axes apart)."""
    def at(h, i, j):
        batch = unravel(h, view.shape[:-2]) if len(view.shape) > 3 else [h]
        return src[view.flat_index((*batch, i, j))]

    if factor == 1.0:
        return at
    return lambda *idx: at(*idx) * tirx.const(factor, "float32")


def _mask_reader(src, mask: Mask):
    """cpu_attention.Operands.mask of `mask` read from the flat float32 `src` (a condition as
    0 or 1): the head unravelled over the scores' batch axes, numpy's broadcast on the rest."""
    dims, view = mask.scores_shape, _broadcast(mask.shape, mask.scores_shape)

    def at(h, i, j):
        return src[view.flat_index((*unravel(h, dims[:-2]), i, j))]

    if mask.fill is None:
        return lambda score, h, i, j: score + at(h, i, j)
    zero, fill = tirx.const(0.0, "float32"), tirx.const(mask.fill, "float32")
    return lambda score, h, i, j: tirx.Select(
        at(h, i, j) != zero if mask.when else at(h, i, j) == zero, fill, score)


def sources(plan: AttentionPlan) -> list:
    """The kernel's inputs, flattened: q's, kt's and v's sources, and the mask's if any."""
    found = [op.source for op in (plan.q, plan.kt, plan.v)]
    return found + ([plan.mask.source] if plan.mask is not None else [])


def kernel(plan: AttentionPlan, intrin) -> tvm.tirx.PrimFunc:
    """The scheduled PrimFunc of a plan: (flat q, kt and v sources, the mask's if any, the
    result)."""
    shape, lanes = plan.shape, intrin.lanes
    tiles = cpu_attention.tiles_for(shape, lanes)
    inputs = [te.placeholder((math.prod(static_shape(src)),), "float32", name)
              for src, name in zip(sources(plan), ("q", "kt", "v", "mask"))]
    mask = _mask_reader(inputs[3], plan.mask) if plan.mask is not None else None
    read = cpu_attention.Operands(
        _reader(inputs[0], plan.q.view, 1.0), _reader(inputs[1], plan.kt.view, 1.0),
        _reader(inputs[2], plan.v.view, plan.v.scale),  # q's and k's factors are in the scale
        mask)
    out = cpu_attention.attention_te(read, shape, tiles, plan.scale, plan.safe, lanes,
                                     intrin.reduction_width, intrin.input_dtypes[0],
                                     plan.out_axes, plan.result_dims)
    func = cpu_attention.schedule(te.create_prim_func([*inputs, out]), tiles, intrin, lanes)
    macs = shape.batch * shape.rows * shape.keys * (shape.depth + shape.v_depth)
    label = (f"fused attention {shape.batch} x [{shape.rows}, {shape.depth}] x "
             f"[{shape.depth}, {shape.keys}] x [{shape.keys}, {shape.v_depth}]"
             f"{'' if plan.mask is None else ', masked'}; rows "
             f"{tiles.task_rows} per task, tiles {tiles.row_tile}x{tiles.key_blocks} and "
             f"{tiles.row_tile}x{tiles.out_blocks}")
    return func.with_attr(KERNEL_INFO_ATTR, {"instruction": intrin.name, "macs": macs,
                                              "label": label})


@relax.expr_functor.mutator
class _FuseAttention(relax.PyExprMutator):
    def __init__(self, mod, intrin, plans):
        super().__init__(mod)
        self.intrin = intrin
        self.plans = {plan.end: plan for plan in plans}
        self.added = {}  # the kernel's signature -> GlobalVar: one kernel for equal layers

    def visit_var_binding_(self, binding):  # noqa: D401 - mutator hook
        plan = self.plans.get(binding.var)
        if plan is None:
            super().visit_var_binding_(binding)
            return
        mask = plan.mask
        sig = (plan.shape, plan.scale, plan.safe, plan.out_axes, plan.result_dims,
               *[(tuple(static_shape(op.source)), op.view, op.scale)
                 for op in (plan.q, plan.kt, plan.v)],
               None if mask is None else mask._replace(source=None))
        if sig not in self.added:
            name = f"{KERNEL_NAME}_{len(self.added)}"
            # opaque: operator fusion must not merge the scheduled loop nest with neighbours
            func = kernel(plan, self.intrin).with_attrs({"global_symbol": name, "op_pattern": 8})
            self.added[sig] = self.builder_.add_func(func, name)
        args = [self.builder_.emit(relax.op.reshape(self._float32(src),
                                                    [math.prod(static_shape(src))]))
                for src in sources(plan)]
        out = self.builder_.emit(relax.call_tir(
            self.added[sig], args,
            relax.TensorType([plan.result_dims[a] for a in plan.out_axes], "float32")))
        value = self.builder_.normalize(relax.op.reshape(out, static_shape(binding.var)))
        self.set_var_remap(binding.var, self.builder_.emit(value))

    def _float32(self, src):
        """`src` as the kernel reads it: float32 (a bool mask as 0 and 1; a constant one
        converted here)."""
        if str(src.ty.dtype) == "float32":
            return self.visit_expr(src)
        value = const_value(src)
        if value is not None:
            return relax.const(value.astype("float32"))
        return self.builder_.emit(relax.op.astype(self.visit_expr(src), "float32"))


def attention_plans(mod: tvm.IRModule, target, precision="bf16") -> list[AttentionPlan]:
    """The attentions of the module note in `mod`'s main that the fused kernel takes in
    `precision` on `target` (none where the target has no instruction for it)."""
    intrin = instruction(target, precision)
    if intrin is None:
        return []
    main = mod["main"]
    bindings = dataflow_bindings(main)
    g = _Graph({b.var: b for b in bindings}, uses(bindings, main),
               {v: bs[0] for v, bs in readers(bindings).items()})
    return [plan for b in bindings if (plan := attention_plan(g, b, mod)) is not None
            and cpu_attention.fits(plan.shape, intrin.lanes, intrin.reduction_width)
            and cpu_attention.worth_fusing(plan.shape)]


def fuse_attention(mod: tvm.IRModule, target, precision="bf16", plans=None) -> tvm.IRModule:
    """`mod` with every attention of the module note (or those of `plans`, attention_plans'
    of `mod`) one fused kernel computing its products in `precision` ("bf16" or "int8"),
    where `target` has the instruction for it (else `mod` unchanged)."""
    intrin = instruction(target, precision)
    if plans is None:
        plans = attention_plans(mod, target, precision)
    if intrin is None or not plans:
        return mod
    fused = rewrite_functions(mod, _FuseAttention(mod, intrin, plans))
    return relax.transform.DeadCodeElimination()(fused)
