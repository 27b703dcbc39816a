"""Argument checks of the public entry points: a TypeError that names what was expected,
before a wrong argument reaches TVM's C++ (where it would fail with an unrelated message)."""

import tvm
from tvm import te

from . import intrinsics


def _show(value):
    text = repr(value)
    return f"{type(value).__name__} ({text[:60]}{'...' if len(text) > 60 else ''})"


def te_op(value, fn):
    """The te.Tensor (or ComputeOp) `value`, checked to come from te.compute."""
    op = value.op if isinstance(value, te.Tensor) else value
    if not isinstance(op, te.ComputeOp):
        raise TypeError(f"{fn} takes a te.Tensor made by te.compute (or its ComputeOp), got "
                        f"{_show(value)}")
    return value


def intrinsic(value, fn, optional=False):
    """The Intrinsic named or given (None too when optional); KeyError for an unknown name."""
    if value is None and optional:
        return None
    if isinstance(value, str):
        return intrinsics.get(value)
    if isinstance(value, intrinsics.Intrinsic):
        return value
    raise TypeError(f"{fn}: intrinsic must be an instruction name (str) or a "
                    f"unit_tvm.intrinsics.Intrinsic{' or None' if optional else ''}, got "
                    f"{_show(value)}; known names: {', '.join(intrinsics.names())}")


def flag(value, name, fn):
    """A bool argument."""
    if not isinstance(value, bool):
        raise TypeError(f"{fn}: {name} must be True or False, got {_show(value)}")
    return value


def count(value, name, fn):
    """A positive int or None."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise TypeError(f"{fn}: {name} must be a positive int or None, got {_show(value)}")
    return value


def ir_module(value, fn):
    """A tvm.IRModule (a Relax model)."""
    if not isinstance(value, tvm.IRModule):
        raise TypeError(f"{fn} takes a tvm.IRModule (a Relax model, e.g. from "
                        f"unit_tvm.frontends or tvm.relax.frontend), got {_show(value)}")
    return value
