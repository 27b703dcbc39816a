"""The compute-heavy ops a quantized model still runs in float32, and why: what
`unit_tvm.compile(..., quantize=...)` reports and warns about, so that no conv or matmul is left
slow without the user being told."""

from collections import Counter
from typing import NamedTuple

import numpy as np
import tvm
from tvm import relax

from .chains import CONVS
from .graph import dataflow_bindings, op_name, rewrite_functions, static_shape

# ops whose cost grows with a reduction (a conv window, a matmul's inner dimension)
HEAVY = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d", "relax.nn.conv1d_transpose",
         "relax.nn.conv2d_transpose", "relax.nn.conv3d_transpose", "relax.matmul")


class Leftover(NamedTuple):
    """One compute-heavy op left in float32."""

    op: str  # the Relax op and its result shape, e.g. "relax.matmul [1, 12, 128, 128]"
    reason: str


def _reason(call: relax.Call) -> str:
    """Why the quantizer did not take this op (chains.py decides what it takes)."""
    name = call.op.name
    weight = call.args[1]
    if str(call.args[0].ty.dtype) != "float32":
        return f"input dtype {call.args[0].ty.dtype} (only float32 models are quantized)"
    if name == "relax.matmul" and not isinstance(weight, tvm.ir.expr.Constant):
        return ("activation x activation matmul: fp32 (quantize's attention='bf16' takes it "
                "where the target has a bf16 dot product, the default there; attention='int8' "
                "where its int8 product stays close to fp32 and its shapes are static)")
    if not isinstance(weight, tvm.ir.expr.Constant):
        return "its weight is not a constant (bind the parameters first)"
    if name == "relax.matmul":
        return f"a {len(weight.ty.shape)}-D constant operand (only 2-D weights are quantized)"
    if name not in CONVS:
        return f"no int8 form of {name.removeprefix('relax.nn.')}"
    _, data_layout, kernel_layout = CONVS[name]
    attrs = call.attrs
    if str(attrs.data_layout) != data_layout or str(attrs.kernel_layout) != kernel_layout:
        return (f"layout {attrs.data_layout}/{attrs.kernel_layout} (quantized: "
                f"{data_layout}/{kernel_layout})")
    if int(attrs.groups) != 1:
        return f"grouped ({int(attrs.groups)} groups): no int8 form"
    return "not matched by the quantizer"


def fp32_leftovers(mod: tvm.IRModule) -> list[Leftover]:
    """The compute-heavy ops of `mod`'s main that are still float32 Relax ops (after quantize()
    they are the ones it left), each with the reason."""
    out = []
    for b in dataflow_bindings(mod["main"]):
        call = b.value
        if (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)
                and call.op.name in HEAVY):
            shape = [int(s) for s in call.ty.shape] if hasattr(call.ty, "shape") else "?"
            out.append(Leftover(f"{call.op.name} {shape}", _reason(call)))
    return out


def summary(leftovers: list[Leftover]) -> str:
    """One line per distinct (op kind, reason), with its count."""
    counts = Counter((row.op.split(" ")[0], row.reason) for row in leftovers)
    return "; ".join(f"{n} x {op}: {reason}" for (op, reason), n in counts.items())


def _one_pixel_pointwise(call) -> bool:
    """Whether call is a float32 NCHW 1x1 conv (stride 1, no padding or groups) of one pixel."""
    if op_name(call) != "relax.nn.conv2d":
        return False
    x, w, a = call.args[0], call.args[1], call.attrs
    xs, ws = static_shape(x), static_shape(w)
    return (xs is not None and ws is not None and str(x.ty.dtype) == "float32"
            and isinstance(w, tvm.ir.expr.Constant) and xs[0] == 1 and xs[2:] == [1, 1]
            and ws[2:] == [1, 1] and int(a.groups) == 1 and str(a.data_layout) == "NCHW"
            and str(a.kernel_layout) == "OIHW" and str(a.out_layout) == "NCHW"
            and all(int(v) == 1 for v in (*a.strides, *a.dilation))
            and all(int(v) == 0 for v in a.padding))


@relax.expr_functor.mutator
class _PixelConvsAsMatmuls(relax.PyExprMutator):
    def visit_call_(self, call):  # noqa: D401 - mutator hook
        call = self.visit_expr_post_order(call)
        if not _one_pixel_pointwise(call):
            return call
        x, w = call.args[0], call.args[1].value.numpy()
        k, c = w.shape[:2]
        flat = self.builder_.emit(relax.op.reshape(x, [1, c]))
        product = self.builder_.emit(relax.op.matmul(flat, relax.const(
            np.ascontiguousarray(w.reshape(k, c).T))))
        return relax.op.reshape(product, [1, k, 1, 1])


def pixel_convs_as_matmuls(mod: tvm.IRModule) -> tvm.IRModule:
    """The float32 1x1 convs of one pixel (a squeeze-excitation's, where a model leaves them in
    float32: NNCF's QDQ files do) as matmuls: TVM's loop nest for the conv ran serially (four of
    EfficientNet-B0's took 48 us each), the default CPU schedule tiles a matmul's."""
    return rewrite_functions(mod, _PixelConvsAsMatmuls(mod))
