"""Small queries and rewrites on a Relax main function shared by the quantizer and the
tensorize pass: how often each variable is used and by which bindings, and the NCHW max-pools
both passes move to uint8 and to packed channel blocks; running a rewriter over every function."""

import math

import tvm
from tvm import relax


def one_dataflow_block(func) -> bool:
    """Whether `func` is what the graph passes read: a body of one dataflow block."""
    blocks = func.body.blocks
    return len(blocks) == 1 and isinstance(blocks[0], relax.DataflowBlock)


def dataflow_bindings(func):
    """The bindings of main's one dataflow block (ValueError naming the fix otherwise)."""
    if not one_dataflow_block(func):
        raise ValueError("quantize expects a main function with one dataflow block (run "
                         "relax.transform.Normalize / the frontend's default output)")
    return list(func.body.blocks[0].bindings)


def op_name(expr) -> str:
    """The name of the Relax op `expr` calls ("relax.add"), or "" (not a call of an op: a call
    of a function, a variable, a constant, None)."""
    op = getattr(expr, "op", None)
    return op.name if isinstance(op, tvm.ir.Op) else ""


def bound_call(expr, lookup, name):
    """The call of op `name` that `expr` is, or that the variable `expr` is bound to (`lookup`:
    a mutator's lookup_binding), else None."""
    call = lookup(expr) if isinstance(expr, relax.Var) else expr
    return call if op_name(call) == name else None


def const_value(expr):
    """The numpy value of a Relax constant, or None for anything else."""
    return expr.value.numpy() if isinstance(expr, tvm.ir.expr.Constant) else None


def scalar_const(expr) -> float | None:
    """The value of a one-element constant, or None for anything else."""
    value = const_value(expr)
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def scalar_near(expr, want: float, rtol: float = 1e-6) -> bool:
    """Whether `expr` is a one-element constant within `rtol` of `want` (a float32 spelling of
    a real constant such as sqrt(2) or 1.702)."""
    value = scalar_const(expr)
    return value is not None and abs(value - want) <= rtol * abs(want)


def static_shape(expr):
    """The static shape of a tensor-typed expression as a list of ints, or None (not a tensor,
    an unknown shape, or a symbolic dimension)."""
    return type_shape(getattr(expr, "ty", None))


def type_shape(ty):
    """static_shape of a type: a TensorType's static shape as a list of ints, or None."""
    dims = getattr(ty, "shape", None) if isinstance(ty, relax.TensorType) else None
    if dims is None or not all(hasattr(d, "value") for d in dims):
        return None
    return [int(d) for d in dims]


def vars_in(expr) -> list:
    """The variables `expr` reads, in visiting order (a variable read twice is listed twice)."""
    found = []

    def visit(e):
        if isinstance(e, relax.Var):
            found.append(e)

    relax.analysis.post_order_visit(expr, visit)
    return found


def integer_range(quantize_call):
    """(qmin, qmax) of a relax.quantize call's output dtype, or None (not 8-bit)."""
    dtype = str(quantize_call.ty.dtype)
    return (0, 255) if dtype == "uint8" else (-128, 127) if dtype == "int8" else None


def uses(bindings, func):
    """{Var: number of reads} over the bindings' values and the function's result."""
    count = {}

    def visit(e):
        if isinstance(e, relax.Var):
            count[e] = count.get(e, 0) + 1

    for b in bindings:
        relax.analysis.post_order_visit(b.value, visit)
    relax.analysis.post_order_visit(func.body.body, visit)
    return count


def readers(bindings):
    """{Var: [bindings whose value reads it]} (each binding once per variable)."""
    out = {}
    for b in bindings:
        seen = set()

        def visit(e, b=b, seen=seen):
            if isinstance(e, relax.Var) and e not in seen:
                seen.add(e)
                out.setdefault(e, []).append(b)

        relax.analysis.post_order_visit(b.value, visit)
    return out


def is_nchw_max_pool(value):
    """Whether a binding's value is relax.nn.max_pool2d from NCHW to NCHW."""
    return (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "relax.nn.max_pool2d" and str(value.attrs.layout) == "NCHW"
            and str(value.attrs.out_layout) == "NCHW")


def pool_on(pool, data, layout="NCHW"):
    """The max- or average-pool call `pool` (window, strides, padding, count_include_pad as
    they are) applied to `data` in `layout` (e.g. NCHW16c), same layout out."""
    make = (relax.op.nn.max_pool2d if pool.op.name == "relax.nn.max_pool2d"
            else relax.op.nn.avg_pool2d)
    a = pool.attrs
    return make(data, a.pool_size, a.strides, a.padding, a.dilation, a.ceil_mode,
                a.count_include_pad, layout, layout)


def rewrite_functions(mod, mutator):
    """The module with every Relax function rewritten by `mutator` (a relax.PyExprMutator built
    on `mod`: functions it adds through its builder are kept)."""
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


def model_macs(mod) -> int:
    """Multiply-adds of the convolutions (2-D, any groups) and matrix products in a Relax
    module's main (the fp32 model, before quantization), read off their shapes."""
    total = 0

    def shape(e):
        return [int(v) for v in e.ty.shape]

    def visit(e):
        nonlocal total
        if not isinstance(e, relax.Call) or not isinstance(e.op, tvm.ir.Op):
            return
        if e.op.name == "relax.nn.conv2d":
            out, w = shape(e), shape(e.args[1])
            total += math.prod(out) * math.prod(w[1:])
        elif e.op.name == "relax.matmul":
            total += math.prod(shape(e)) * shape(e.args[0])[-1]

    relax.analysis.post_order_visit(mod["main"], visit)
    return total


@tvm.transform.module_pass(opt_level=0, name="FoldConstantsSafely")
def fold_constants(mod: tvm.IRModule, _ctx=None) -> tvm.IRModule:
    """TVM's FoldConstant, unless its result calls a function the module does not define
    (before legalization it half-legalizes a dynamic_strided_slice whose bounds are inputs into
    a call of a `shape_func` it never adds): then the module as it was, whose slice TVM's own
    legalization builds."""
    folded = relax.transform.FoldConstant()(mod)
    defined = set(folded.get_global_vars())
    for func in folded.functions.values():
        if isinstance(func, relax.Function) and not set(
                relax.analysis.all_global_vars(func)) <= defined:
            return mod
    return folded
