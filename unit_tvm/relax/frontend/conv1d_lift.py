"""1-D convolutions as 2-D ones of height 1, with the elementwise ops around them.

Speech and sequence models convolve over time: Whisper's two front-end convs, wav2vec2's and
HuBERT's feature encoders (seven convs over the raw waveform), Conformer's depthwise convs,
TDNN / ECAPA speaker models. TVM's frontends keep them as relax.nn.conv1d, which the quantizer
has no int8 form of: each stayed a float32 conv in TVM's loop nest. A conv1d over NCW is
exactly a conv2d over NC1W with a 1 x S window (stride, padding and dilation 1 / 0 in height),
so every 2-D path applies as it is: int8 on the instruction, channel blocks between convs,
bias, activation and residual adds in the write-back.

The rewrite keeps the 4-D form across what follows a conv1d elementwise (bias adds, GELU,
ReLU, a batch norm's arithmetic, residual adds between two such values), so consecutive convs
meet as 2-D convs with nothing between them, and squeezes back to 3-D only where another op
reads the value (a transpose into a transformer, a pooling over time). Operands of a binary op
that are not lifted gain the height axis where numpy broadcasting puts it: just before their
last axis (a rank-2 or rank-3 operand), none for a scalar or a row over time.
"""

import tvm
from tvm import relax

from ..core.graph import bound_call, op_name, rewrite_functions

HEIGHT = 2  # the axis a lifted NCW value gains: NC1W

# elementwise ops that keep a lifted value lifted: one tensor operand (the rest attributes or
# prim values), or two broadcast against each other
_UNARY = frozenset(f"relax.{n}" for n in (
    "nn.relu", "nn.gelu", "nn.gelu_tanh", "nn.silu", "nn.leakyrelu", "sigmoid", "tanh",
    "clip", "erf", "exp", "negative", "sqrt", "rsqrt", "abs", "square", "astype"))
_BINARY = frozenset(f"relax.{n}" for n in (
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power"))


def _rank(expr):
    ty = getattr(expr, "ty", None)
    return int(ty.ndim) if isinstance(ty, relax.TensorType) and ty.ndim >= 0 else None


@relax.expr_functor.mutator
class Conv1dAsConv2d(relax.PyExprMutator):
    """The mutator of the module docstring: each lifted value is emitted in its 4-D form and
    bound, under the original variable, to the squeeze of that form (dead where nothing but
    lifted ops read it)."""

    def __init__(self, mod):
        super().__init__(mod)
        self.lifted = set()  # the 4-D variables this mutator emitted

    def visit_call_(self, call):  # noqa: D401 - mutator hook
        call = self.visit_expr_post_order(call)
        four = self._four(call)
        if four is None:
            return call
        var = self.builder_.emit(four)
        self.lifted.add(var)
        return relax.op.squeeze(var, [HEIGHT])

    def _lifted_form(self, expr):
        """The 4-D variable a 3-D value is the squeeze of, or None."""
        bound = bound_call(expr, self.lookup_binding, "relax.squeeze")
        if bound is not None and isinstance(expr, relax.Var) and bound.args[0] in self.lifted:
            return bound.args[0]
        return None

    def _four(self, call):
        """The 4-D call computing what `call` does on NC1W values, or None."""
        name = op_name(call)
        if name == "relax.nn.conv1d":
            return _conv2d_of(call, self._lifted_form(call.args[0]))
        if name in _UNARY and call.args:
            x = self._lifted_form(call.args[0])
            return None if x is None else relax.Call(call.op, [x, *call.args[1:]], call.attrs,
                                                     call.ty_args)
        if name in _BINARY and len(call.args) == 2:
            return self._binary(call)
        return None

    def _binary(self, call):
        forms = [self._lifted_form(a) for a in call.args]
        ranks = [_rank(a) for a in call.args]
        if all(f is None for f in forms) or None in ranks or max(ranks) != 3:
            return None  # a 3-D result only: a rank-4 operand would broadcast the squeeze away
        args = []
        for arg, form, rank in zip(call.args, forms, ranks):
            if form is not None:
                args.append(form)
            elif rank >= 2:
                args.append(relax.op.expand_dims(arg, [rank - 1]))  # (.., C, W) -> (.., C, 1, W)
            else:
                args.append(arg)  # a scalar, or a row over time: broadcasts as it did
        return relax.Call(call.op, args, call.attrs, call.ty_args)


def _conv2d_of(call, lifted_input):
    """conv2d over NC1W with a 1 x S window computing the conv1d `call` (NCW, OIW), or None
    for another layout."""
    a = call.attrs
    if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) != ("NCW", "OIW", "NCW"):
        return None
    data, weight = call.args
    x = lifted_input if lifted_input is not None else relax.op.expand_dims(data, [HEIGHT])
    left, right = (int(p) for p in a.padding)
    return relax.op.nn.conv2d(
        x, relax.op.expand_dims(weight, [HEIGHT]), strides=(1, int(a.strides[0])),
        padding=(0, left, 0, right), dilation=(1, int(a.dilation[0])), groups=int(a.groups),
        data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW",
        out_dtype=a.out_dtype if str(a.out_dtype) not in ("", "void") else "")


def _has_conv1d(mod):
    found = []

    def visit(e):
        if op_name(e) == "relax.nn.conv1d":
            found.append(e)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


def conv1d_as_conv2d(mod: tvm.IRModule) -> tvm.IRModule:
    """Every NCW conv1d of the module's Relax functions as a conv2d of height 1, the
    elementwise ops after it kept 4-D (module docstring); the squeezes nothing reads removed."""
    if not _has_conv1d(mod):
        return mod
    # a batch norm after a conv1d (TDNN, ECAPA) as the arithmetic the lift carries through
    # (its result is field 0 of a tuple: CanonicalizeBindings reads such fields back as values)
    mod = relax.transform.CanonicalizeBindings()(relax.transform.DecomposeOpsForInference()(mod))
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, Conv1dAsConv2d(mod)))
