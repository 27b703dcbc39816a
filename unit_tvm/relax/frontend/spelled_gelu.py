"""GELUs as models and exporters spell them, read back as one relax.nn.gelu / gelu_tanh.

ONNX before opset 20 has no Gelu: torch.onnx.export writes torch's GELU (and a model's own
`x * 0.5 * (1 + erf(x / sqrt(2)))`) as Div, Erf, Add, Mul, Mul, and TVM's importer keeps those
five ops. Hugging Face's "gelu_new" (GPT-2, ALBERT) is written out in Python as
`0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))`, so torch.export and ONNX both
keep its seven ops. No quantized op takes such a chain into its epilogue, so the feed-forward
dense wrote float32 for a kernel of its own (an ONNX export of BERT-base at 384 tokens: 2.9% of
the time in that kernel alone) and the next dense quantized the result again. As relax.nn.gelu
/ gelu_tanh the chain matcher (chains.py, activations.py) fuses them like torch's own GELUs:
the dense computes the activation and writes int8.

The match is on values, not on how often an intermediate is read: every spelling below equals
the GELU whatever else reads its intermediates (those stay for their other readers). Spellings:
the factors 0.5, x and (1 + erf(x / c)) multiplied in any grouping and order, c = sqrt(2)
(divide) or 1 / sqrt(2) (multiply); or (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))) in its
place, x^3 as power(x, 3) or x * x * x; scalar constants on either side of each op."""

import math

import tvm_ffi
from tvm import relax

from ..core.graph import bound_call, op_name, scalar_const, scalar_near

SQRT2 = math.sqrt(2.0)
TANH_SCALE = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715


def _scaled(expr, lookup, op, want):
    """y when `expr` is op(y, c) (either order for a multiply) with c near `want`."""
    call = bound_call(expr, lookup, op)
    if call is None:
        return None
    a, b = call.args
    if scalar_near(b, want):
        return a
    if op == "relax.multiply" and scalar_near(a, want):
        return b
    return None


def _groupings(call, lookup):
    """(a, b) for each way the product `call` reads as 0.5 * a * b: (0.5 * a) * b or
    0.5 * (a * b), operands in either order."""
    pair = tuple(call.args)
    for this, other in (pair, pair[::-1]):
        inner = bound_call(other, lookup, "relax.multiply")
        if inner is None:
            continue
        if scalar_near(this, 0.5):
            yield tuple(inner.args)
        for half, rest in (tuple(inner.args), tuple(inner.args)[::-1]):
            if scalar_near(half, 0.5):
                yield rest, this


def _plus_one(expr, lookup):
    """y when `expr` is 1 + y (the 1 on either side)."""
    add = bound_call(expr, lookup, "relax.add")
    if add is None:
        return None
    a, b = add.args
    return b if scalar_const(a) == 1.0 else (a if scalar_const(b) == 1.0 else None)


def _erf_argument(expr, lookup):
    """x when `expr` is 1 + erf(x / sqrt(2)) or 1 + erf(x * (1 / sqrt(2)))."""
    erf = bound_call(_plus_one(expr, lookup), lookup, "relax.erf")
    if erf is None:
        return None
    x = _scaled(erf.args[0], lookup, "relax.divide", SQRT2)
    return x if x is not None else _scaled(erf.args[0], lookup, "relax.multiply", 1 / SQRT2)


def _is_cube_of(expr, x, lookup) -> bool:
    """Whether `expr` is power(x, 3) or x * x * x (any grouping)."""
    power = bound_call(expr, lookup, "relax.power")
    if power is not None:
        return power.args[0].same_as(x) and scalar_const(power.args[1]) == 3.0
    outer = bound_call(expr, lookup, "relax.multiply")
    if outer is None:
        return False
    for square, single in (tuple(outer.args), tuple(outer.args)[::-1]):
        inner = bound_call(square, lookup, "relax.multiply")
        if single.same_as(x) and inner is not None and all(a.same_as(x) for a in inner.args):
            return True
    return False


def _tanh_argument(expr, lookup):
    """x when `expr` is 1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))."""
    tanh = bound_call(_plus_one(expr, lookup), lookup, "relax.tanh")
    if tanh is None:
        return None
    scaled = _scaled(tanh.args[0], lookup, "relax.multiply", TANH_SCALE)
    add = bound_call(scaled, lookup, "relax.add")
    if add is None:
        return None
    for x, term in (tuple(add.args), tuple(add.args)[::-1]):
        cube = _scaled(term, lookup, "relax.multiply", CUBIC)
        if cube is not None and _is_cube_of(cube, x, lookup):
            return x
    return None


# what each spelled sum (1 + erf / 1 + tanh) reads, and the op the product becomes
_FORMS = ((_erf_argument, relax.op.nn.gelu), (_tanh_argument, relax.op.nn.gelu_tanh))


def spelled_gelu(call, lookup):
    """relax.nn.gelu(x) or gelu_tanh(x) when the multiply `call` computes that GELU as spelled
    above, else None. `lookup` maps a variable to the value bound to it (None when it has
    none)."""
    if op_name(call) != "relax.multiply":
        return None
    for a, b in _groupings(call, lookup):
        for sum_, x in ((a, b), (b, a)):
            for argument, gelu in _FORMS:
                arg = argument(sum_, lookup)
                if arg is not None and arg.same_as(x) and _same_type(x, call):
                    return gelu(x)
    return None


def _same_type(x, call) -> bool:
    """Whether x has the product's type (the scalars broadcast to it, nothing else does)."""
    return hasattr(x, "ty") and tvm_ffi.structural_equal(x.ty, call.ty)


@relax.expr_functor.mutator
class SpelledGelus(relax.PyExprMutator):
    """Mutator: each product that spells a GELU becomes relax.nn.gelu / gelu_tanh of its
    input."""

    def visit_call_(self, call):  # noqa: D401 - mutator hook
        call = self.visit_expr_post_order(call)
        gelu = spelled_gelu(call, self.lookup_binding)
        return call if gelu is None else gelu
