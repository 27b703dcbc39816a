"""The smooth activations a quantized op's epilogue computes: how each is spelled in Relax after
the op (what a frontend makes of torch's SiLU, hardswish, sigmoid, tanh and tanh-GELU, and of
CLIP's quick GELU, x * sigmoid(1.702 x)), and what each is as a float32 TIR expression (through
unit_tvm.fastmath, which vectorizes).

Left as ops of their own they are kernels that read and write the op's float32 result, and the
op cannot write uint8 for the next quantized op: torchvision's efficientnet_b0 spent half of its
time in SiLU's two kernels. relu, relu6 and the erf GELU are matched in chains.py (they predate
this table and keep their recipe fields, which tuning databases hold)."""

from typing import NamedTuple

import tvm
from tvm import relax, tirx

from ... import fastmath
from .graph import scalar_const, scalar_near

# a single op on the chain's value -> the activation's name in a Recipe
_SINGLE = {"relax.sigmoid": "sigmoid", "relax.tanh": "tanh", "relax.nn.gelu_tanh": "gelu_tanh"}
NAMES = ("silu", "hardswish", "quick_gelu", *_SINGLE.values())
QUICK_GELU = 1.702  # x * sigmoid(1.702 x): CLIP's (and Hugging Face's "quick_gelu") GELU


class Found(NamedTuple):
    """An activation spelled after a chain's value: its name, the variables of the ops it
    replaces (in order) and the last of them (the chain's new end)."""

    name: str
    members: tuple
    end: relax.Var


def _op(binding):
    v = binding.value
    return v.op.name if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) else None


def _bound(expr):
    v = getattr(expr, "value", None)
    v = getattr(v, "value", v)
    return float(v) if isinstance(v, (int, float)) else None


def _only_reader(var, readers, uses):
    """The one binding that reads `var`, when it is read once."""
    rs = readers.get(var, [])
    return rs[0] if uses.get(var, 0) == 1 and len(rs) == 1 else None


def _reads(binding, *vars_):
    """Whether the binding's call has exactly `vars_` as its arguments (in any order)."""
    args = list(binding.value.args)
    return len(args) == len(vars_) and all(any(a.same_as(v) for a in args) for v in vars_)


def _silu(cur, rs, readers, uses):
    """sigmoid(x) then x * sigmoid(x)."""
    sig, mul = rs
    if (_op(sig) == "relax.sigmoid" and _only_reader(sig.var, readers, uses) is mul
            and _op(mul) == "relax.multiply" and _reads(mul, cur, sig.var)):
        return Found("silu", (sig.var, mul.var), mul.var)
    return None


def _quick_gelu(cur, rs, readers, uses):
    """x * 1.702 (either operand order), its sigmoid, then x times that."""
    for scaled, mul in (rs, rs[::-1]):
        args = scaled.value.args if _op(scaled) == "relax.multiply" else ()
        if not any(a.same_as(cur) for a in args) or not any(
                scalar_near(a, QUICK_GELU) for a in args):
            continue
        sig = _only_reader(scaled.var, readers, uses)
        if (_op(sig) == "relax.sigmoid" and _only_reader(sig.var, readers, uses) is mul
                and _op(mul) == "relax.multiply" and _reads(mul, cur, sig.var)):
            return Found("quick_gelu", (scaled.var, sig.var, mul.var), mul.var)
    return None


def _sixth(binding, var):
    """Whether the binding scales `var` by 1/6 (divides by 6 or multiplies by 1/6)."""
    if binding is None or not binding.value.args[0].same_as(var):
        return False
    value = scalar_const(binding.value.args[1])
    return value is not None and (
        (_op(binding) == "relax.divide" and value == 6.0)
        or (_op(binding) == "relax.multiply" and abs(value - 1 / 6) < 1e-7))


def _hardswish(cur, rs, readers, uses):
    """x + 3, clipped to [0, 6] (one clip or two), x times that, with the 1/6 before the
    multiply (ONNX's HardSwish as TVM reads it) or after it (torch.export's)."""
    add, mul = rs
    if _op(add) != "relax.add" or not add.value.args[0].same_as(cur) \
            or scalar_const(add.value.args[1]) != 3.0:
        return None
    members, b, lo, hi = [add.var], add, None, None
    while True:
        nxt = _only_reader(b.var, readers, uses)
        if nxt is None or _op(nxt) != "relax.clip" or nxt is mul:
            break
        a, z = (_bound(x) for x in nxt.value.args[1:])
        lo = a if a is not None and a > -float("inf") else lo
        hi = z if z is not None and z < float("inf") else hi
        members.append(nxt.var)
        b = nxt
    if (lo, hi) != (0.0, 6.0):
        return None
    scaled = _sixth(_only_reader(b.var, readers, uses), b.var)
    if scaled:
        b = _only_reader(b.var, readers, uses)
        members.append(b.var)
    if _only_reader(b.var, readers, uses) is not mul or _op(mul) != "relax.multiply" \
            or not _reads(mul, cur, b.var):
        return None
    members.append(mul.var)
    if not scaled:
        div = _only_reader(mul.var, readers, uses)
        if not _sixth(div, mul.var):
            return None
        members.append(div.var)
    return Found("hardswish", tuple(members), members[-1])


def match(cur, readers, uses) -> "Found | None":
    """The activation spelled after `cur` (a chain's current end), or None. readers: {Var:
    [bindings reading it]}, uses: {Var: count}, over the whole function."""
    rs = readers.get(cur, [])
    if uses.get(cur, 0) == 1 and len(rs) == 1 and _op(rs[0]) in _SINGLE:
        return Found(_SINGLE[_op(rs[0])], (rs[0].var,), rs[0].var)
    if uses.get(cur, 0) == 2 and len(rs) == 2:
        return (_silu(cur, rs, readers, uses) or _quick_gelu(cur, rs, readers, uses)
                or _hardswish(cur, rs, readers, uses))
    return None


def _f(v):
    return tirx.const(v, "float32")


def expr(name: str, v):
    """The activation `name` (one of NAMES) of the float32 TIR expression v (bound once: the
    epilogue's v is the whole dequantization)."""
    if name not in NAMES:
        raise ValueError(f"unknown activation {name!r} (known: {', '.join(NAMES)})")
    x = tirx.Var("act_in", "float32")
    return tirx.Let(x, v, _BODIES[name](x))


def _gelu_tanh(x):
    """0.5 x (1 + tanh(t)) = x sigmoid(2t), t = sqrt(2 / pi) (x + 0.044715 x^3)."""
    c = 0.7978845608028654
    return x * fastmath.sigmoid(x * (_f(2 * c) + _f(2 * c * 0.044715) * x * x))


_BODIES = {
    "sigmoid": fastmath.sigmoid,
    "tanh": fastmath.tanh,
    "silu": lambda x: x * fastmath.sigmoid(x),
    "quick_gelu": lambda x: x * fastmath.sigmoid(x * _f(QUICK_GELU)),
    "hardswish": lambda x: x * tirx.min(tirx.max(x + _f(3.0), _f(0.0)), _f(6.0)) * _f(1 / 6),
    "gelu_tanh": _gelu_tanh,
}
