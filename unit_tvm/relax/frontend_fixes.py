"""Repairs of what TVM's model frontends produce, in one place, run by unit_tvm.compile.

- cumsum over booleans with no dtype: PyTorch sums booleans as int64 (GPT-2's position ids are
  `attention_mask.cumsum(-1)`), TVM's torch frontend keeps the bool dtype, and LLVM's codegen then
  stops with a bare check failure naming neither the op nor the layer. The sum is made int64.
"""

import tvm
from tvm import relax

from .graph import rewrite_functions


@relax.expr_functor.mutator
class _BoolCumsumAsInt64(relax.PyExprMutator):
    def visit_call_(self, call):  # noqa: D401 - mutator hook
        call = self.visit_expr_post_order(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.cumsum"):
            return call
        data = call.args[0]
        if str(data.ty.dtype) != "bool":
            return call
        attrs = call.attrs
        axis = None if attrs.axis is None else int(attrs.axis)
        dtype = attrs.dtype if attrs.dtype is not None and str(attrs.dtype) not in (
            "", "void", "bool") else "int64"
        return relax.op.cumsum(relax.op.astype(data, dtype), axis=axis, dtype=dtype,
                               exclusive=bool(attrs.exclusive))


@tvm.transform.module_pass(opt_level=0, name="UnitFrontendFixes")
def frontend_fixes(mod, ctx):
    """tvm.transform.Pass: the repairs above on every Relax function of the module."""
    return rewrite_functions(mod, _BoolCumsumAsInt64(mod))
