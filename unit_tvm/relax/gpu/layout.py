"""The GPU path's layout passes: a float32 Relax model laid out NHWC x OHWI (batch norms folded,
clips as a maximum and a minimum) and its values made fp16 by TVM's own passes."""

import tvm
from tvm import relax

from ..core.graph import const_value, fold_constants, op_name, rewrite_functions, static_shape


def _scalar(prim_value):
    value = prim_value.value
    return float(getattr(value, "value", value))


@relax.expr_functor.mutator
class _ClipAsMinMax(relax.PyExprMutator):
    """clip(x, lo, hi) -> minimum(maximum(x, lo), hi) with tensor constants: TVM's
    ToMixedPrecision fails on clip's scalar (PrimValue) bounds (ReLU6 in MobileNets)."""

    def visit_call_(self, call):  # noqa: D401 - mutator hook
        call = self.visit_expr_post_order(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.clip"):
            return call
        x, lo, hi = call.args
        dtype = str(x.ty.dtype)
        low = self.builder_.emit(relax.op.maximum(x, relax.const(_scalar(lo), dtype)))
        return relax.op.minimum(low, relax.const(_scalar(hi), dtype))


@tvm.transform.module_pass(opt_level=0, name="ClipAsMinMax")
def _clip_as_min_max(mod, ctx):
    return rewrite_functions(mod, _ClipAsMinMax(mod))


@relax.expr_functor.mutator
class _SqueezeAxesCounted(relax.PyExprMutator):
    def visit_call_(self, call):  # noqa: D401 - mutator hook
        call = self.visit_expr_post_order(call)
        if op_name(call) != "relax.squeeze" or call.attrs.axis is None:
            return call
        shape = static_shape(call.args[0])
        axes = [int(a) for a in call.attrs.axis]
        if shape is None or all(a >= 0 for a in axes):
            return call
        return relax.op.squeeze(call.args[0], [a % len(shape) for a in axes])


@tvm.transform.module_pass(opt_level=0, name="SqueezeAxesCounted")
def _squeeze_axes_counted(mod, ctx):
    """squeeze's negative axes counted from the front: ConvertLayout (TVM 0.27) dies with
    std::bad_alloc on squeeze(axis=[-2]), which every nn.MultiheadAttention has (its packed Q,
    K and V)."""
    return rewrite_functions(mod, _SqueezeAxesCounted(mod))


@relax.expr_functor.mutator
class _CastConstants(relax.PyExprMutator):
    """astype(constant) -> the constant in that dtype: ToMixedPrecision casts a clip's float32
    bounds so, and TVM's FoldConstant leaves the casts (of 0-d constants) as ops, which hide
    the bounds from the passes that read them (gpu_epilogue's clip)."""

    def visit_call_(self, call):  # noqa: D401 - mutator hook
        call = self.visit_expr_post_order(call)
        value = const_value(call.args[0]) if op_name(call) == "relax.astype" else None
        if value is None:
            return call
        return relax.const(value.astype(str(call.attrs.dtype)), str(call.attrs.dtype))


@tvm.transform.module_pass(opt_level=0, name="CastConstants")
def _cast_constants(mod, ctx):
    return rewrite_functions(mod, _CastConstants(mod))


@relax.expr_functor.mutator
class _KeepKernelInputs(relax.PyExprMutator):
    """A float32 value an op computes and a call_tir reads goes through a cast to float32.
    TVM 0.27's ToMixedPrecision fails on a call_tir that reads a value it makes fp16 (the int8
    path's kernels exist before it runs: a depthwise conv's result read by a conv's gather);
    it keeps an explicit cast, which FuseOps then folds into the op's kernel."""

    def visit_call_(self, call):  # noqa: D401 - mutator hook
        call = self.visit_expr_post_order(call)
        if op_name(call) != "relax.call_tir":
            return call
        args = [self._kept(a) for a in call.args[1].fields]
        return relax.Call(call.op, [call.args[0], relax.Tuple(args), *call.args[2:]],
                          call.attrs, call.ty_args)

    def _kept(self, v):
        value = self.lookup_binding(v) if isinstance(v, relax.Var) else None
        if (op_name(value) in ("", "relax.call_tir")
                or str(getattr(v.ty, "dtype", "")) != "float32"):
            return v
        return self.builder_.emit(relax.op.astype(v, "float32"))


@tvm.transform.module_pass(opt_level=0, name="KeepKernelInputs")
def _keep_kernel_inputs(mod, ctx):
    return rewrite_functions(mod, _KeepKernelInputs(mod))


def to_nhwc(mod: tvm.IRModule) -> tvm.IRModule:
    """A float32 Relax model laid out as the GPU path computes it: a batch norm after a conv
    folded into its weights and a bias (TVM's FoldBatchnormToConv2D), any other one into
    elementwise ops, clips as a maximum and a minimum, NHWC x OHWI convs (values still
    fp32)."""
    return tvm.transform.Sequential([
        # unfolded, each batch norm was its own kernel after the conv (resnet18 on an H200: 19
        # of them, ~10 us each timed alone); folded, only the bias add is left, which fuses
        # with the relu or residual add that follows
        relax.transform.FoldBatchnormToConv2D(),
        relax.transform.DecomposeOpsForInference(),
        fold_constants,
        # ConvertLayout has no rule for clip: a ReLU6 stayed NCHW between two transposes, a
        # kernel of its own after each of mobilenet_v2's convs; a maximum and a minimum follow
        # the layout and fuse with the conv's bias
        _clip_as_min_max,
        _squeeze_axes_counted,
        relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]}),
        fold_constants,  # the weights' layout transforms
    ])(mod)


def to_fp16(mod: tvm.IRModule) -> tvm.IRModule:
    """The module's float32 values in fp16 (TVM's ToMixedPrecision; int8 kernels stay). Clips
    become a maximum and a minimum first: ToMixedPrecision fails on clip's scalar bounds (the
    model's ReLU6, the int8 path's input quantization); and on kernels' float32 inputs that
    an op computes (`_KeepKernelInputs`)."""
    return tvm.transform.Sequential([
        _clip_as_min_max,
        _keep_kernel_inputs,
        relax.transform.ToMixedPrecision(out_dtype="float16"),
        fold_constants,
        _cast_constants,
        relax.transform.CanonicalizeBindings(),  # the constants in place of their variables
        relax.transform.DeadCodeElimination(),
    ])(mod)


def to_fp16_nhwc(mod: tvm.IRModule) -> tvm.IRModule:
    """A float32 Relax model as the GPU path computes it: NHWC x OHWI convs, fp16 values."""
    return to_fp16(to_nhwc(mod))
