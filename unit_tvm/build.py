"""unit_tvm.build: one tensor operation -> a runtime module, tensorized where an instruction fits."""

import warnings

import tvm
from tvm import te

from . import intrinsics
from .inspector import explain, inspect
from .rewriter import as_prim_func, rewrite
from .target import as_target


class FallbackWarning(UserWarning):
    """No instruction could be used; TVM's default schedule was built instead."""


def _output(tensors):
    out = tensors[-1]
    if not isinstance(out, te.Tensor):
        raise TypeError("unit_tvm.build takes te tensors: inputs..., then the te.compute output")
    return out


def choose(op, target=None, intrinsic=None):
    """(Intrinsic, Mapping) to use for `op` on `target`, or (None, reason)."""
    target = as_target(target)
    if intrinsic is not None:
        candidates = [intrinsics.require(intrinsic, target) if isinstance(intrinsic, str)
                      else intrinsic]
    else:
        candidates = intrinsics.for_target(target)
    reasons = []
    for intrin in candidates:
        usable = [m for m in inspect(op, intrin) if not m.padded
                  and all(a.contiguous for a in m.operands)]
        if usable:
            return intrin, usable[0]
        reasons.append(explain(op, intrin) if not inspect(op, intrin) else
                       f"{intrin.name} fits {op.op.name} only with operand packing or padding, "
                       "which this build does not do yet")
    if not candidates:
        reasons.append(f"no registered instruction runs on {target}")
    return None, "; ".join(reasons)


def build(tensors, target=None, *, intrinsic=None, tune=False, trials=None, database=None):
    """Compile the te.compute `tensors[-1]` (inputs in `tensors[:-1]`) for `target` (None: host).

    Returns a module callable as mod(*arrays) (inputs then output). The best applicable
    instruction is chosen by the Inspector unless `intrinsic` names one; when none applies, a
    FallbackWarning gives the reason and TVM's default schedule is built (a correct result).
    """
    if tune or trials or database:
        raise NotImplementedError("tuning arrives with the tuner (unit_tvm.tune)")
    target = as_target(target)
    out = _output(tensors)
    intrin, mapping = choose(out, target, intrinsic)
    if intrin is None:
        warnings.warn(f"unit_tvm.build: no tensorized instruction used: {mapping}", FallbackWarning,
                      stacklevel=2)
        func = te.create_prim_func(list(tensors))
        return tvm.tirx.build(func, target=target)
    sch = rewrite(out, intrin, mapping, target=target)
    if [t.op.name for t in tensors] != [t.op.name for t in out.op.input_tensors] + [out.op.name]:
        raise ValueError("pass the op's input tensors in the order the te.compute reads them, then "
                         f"the output: {[t.op.name for t in out.op.input_tensors] + [out.op.name]}")
    return tvm.tirx.build(sch.mod, target=target)
