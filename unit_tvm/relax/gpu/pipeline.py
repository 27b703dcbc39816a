"""The GPU model path: fp16 convolutions and dense layers of a Relax model on Tensor Cores.

`to_fp16_nhwc` lays a float32 model out for the GPU (batch norms folded into elementwise ops,
convs NHWC x OHWI, fp16 values by TVM's ToMixedPrecision). `UnitTensorizeGPU` then replaces every
conv2d (groups 1), every matmul by a constant weight and every batched matmul of two fp16
activations (attention's, gpu_bmm) with the Rewriter's wmma kernel for the same te op (fp16 x
fp16 accumulated in fp32), written in the form gpu_conv chooses (a conv's output rows fused
into one GEMM where that computes less padding; dilated windows too): the Inspector maps it,
prepare gathers the window im2col-style and pads to fragment multiples, the GPU strategy
schedules it with a database or tuned config (tuning races both forms); the bias, scale, cast,
residual add and activation after it go into its write-back (gpu_epilogue), else its fp32
result is cast back to fp16 by an elementwise op that TVM fuses with what follows; layout ops
and casts before a matmul's operand go into its load (gpu_operands). Everything else — pools,
depthwise convs, softmax, layer norms — goes through TVM's own GPU pipeline (legalization,
operator fusion, dlight schedules; gpu_window's rule first). The layout passes are
gpu_layout's. This is one pass before tvm.compile, as UnitTensorize is on CPU.
"""

from typing import NamedTuple

import numpy as np
import tvm
from tvm import relax, te
from tvm.s_tir import dlight

from ... import intrinsics
from ...schedules.gpu import fragment_of
from ...target import as_target, is_gpu
from . import bmm as gpu_bmm
from . import conv as gpu_conv
from . import epilogue as gpu_epilogue
from . import int8 as gpu_int8
from . import operands as gpu_operands
from .conv import ConvGeometry
from .kernels import GpuKernel, Kernels  # noqa: F401 - GpuKernel: the report's rows
# the layout passes are the GPU path's public names too
from ..core.graph import const_value, dataflow_bindings, rewrite_functions
from .layout import to_fp16, to_fp16_nhwc, to_nhwc  # noqa: F401
from .window import WindowReduction

# the accumulator dtype of the Tensor Core kernels, per operand dtype they take
ACCUMULATE = {"float16": "float32", "int8": "int32"}
# the instruction whose fragment shapes the op's forms (gpu_conv), per operand dtype
_INSTRUCTION = {"float16": "cuda.wmma.f16f32", "int8": "cuda.wmma.s8s32"}
# the float dtypes a model's own ops run on Tensor Cores in (int8 comes from quantization)
_FLOAT = ("float16",)


def _fragment(dtype):
    return fragment_of(intrinsics.get(_INSTRUCTION[dtype]))


def dense_te(m, n, k, dtype, acc, prologue=None):
    """te A[m, k] x B[k, n] accumulated in `acc` (B: the constant weight, row-major K x N); with
    a gpu_operands.Prologue, A is read from its source through it."""
    a_in, a = gpu_operands.te_operand(prologue, (m, k), dtype, "A")
    b = te.placeholder((k, n), dtype, name="B")
    r = te.reduce_axis((0, k), name="k")
    out = te.compute((m, n), lambda i, j: te.sum(a[i, r].astype(acc) * b[r, j].astype(acc),
                                                 axis=r), name="dense")
    return [a_in, b, out]


def _shape(expr):
    return [int(s) for s in expr.ty.shape]


def _const_weight(expr):
    return const_value(expr)


def _conv_weight(call):
    """The constant OHWI weight of a conv2d the pass replaces (NHWC x OHWI, groups 1), else
    None."""
    attrs = call.attrs
    weight = _const_weight(call.args[1])
    if (weight is None or attrs.data_layout != "NHWC" or attrs.kernel_layout != "OHWI"
            or attrs.out_layout != "NHWC" or int(attrs.groups) != 1):
        return None
    return weight


def _matmul_weight(call):
    """The constant 2-D (K, N) weight of a matmul the pass replaces, else None."""
    x, w = call.args
    weight = _const_weight(w)
    if weight is None or weight.ndim != 2 or x.ty.shape is None:
        return None
    return weight


# op -> (its replaceable weight or None, the weight's output-channel axis)
_REPLACED = {"relax.nn.conv2d": (_conv_weight, 0), "relax.matmul": (_matmul_weight, 1)}


def _chain_key(chain):
    """What a kernel's signature adds for the chain it computes (its structure; the bias is an
    argument, so layers of one shape share the kernel)."""
    if chain is None:
        return ()
    return ("epilogue", chain.bias is not None, chain.scale, chain.residual is not None,
            chain.bounds, chain.cast, chain.activation, chain.cast_last)


def tensor_core_calls(func: relax.Function) -> list:
    """The calls of `func` the pass replaces where their precision allows (conv2d NHWC x OHWI
    with groups 1, matmul by a constant 2-D weight), in program order."""
    out = []
    for binding in dataflow_bindings(func):
        call = binding.value
        if (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)
                and call.op.name in _REPLACED and isinstance(call.args[0], relax.Var)
                and _REPLACED[call.op.name][0](call) is not None):
            out.append(call)
    return out


def _batched_calls(func: relax.Function) -> list:
    """The matmuls of two fp16 activations in `func` the pass replaces (gpu_bmm)."""
    return [b.value for b in dataflow_bindings(func)
            if isinstance(b.value, relax.Call) and gpu_bmm.batched_shape(b.value) is not None
            and _activation_operands(b.value) is not None]


def _activation_operands(call):
    """_Operands of a matmul of two activations of one Tensor Core dtype, else None."""
    dtype = str(call.args[0].ty.dtype)
    if dtype not in _FLOAT or str(call.args[1].ty.dtype) != dtype:
        return None
    return _Operands(dtype, ACCUMULATE[dtype], None)


class _Operands(NamedTuple):
    """How an op's operands enter its kernel: dtype, accumulator, the weight in that dtype (the
    op's own layout) and, for int8, the input's scale and the weight's per-channel scales."""

    dtype: str
    acc: str
    weight: np.ndarray
    x_scale: float | None = None
    w_scale: np.ndarray | None = None


@relax.expr_functor.mutator
class _Rewrite(relax.PyExprMutator):
    """Replaces conv2d / constant-weight matmul calls by call_tir of tensorized kernels: fp16
    ones as they are, and those `scales` names (call -> input scale) quantized to int8."""
    def __init__(self, mod, kernels, scales=None, chains=None):
        super().__init__(mod)
        self.kernels = kernels
        self.scales = scales or {}
        self.chains = chains or {}  # original call -> gpu_epilogue.Chain its kernel computes
        self.pending = {}  # a chain's last call -> (emit(residual), the residual Var or None)
        self.added = {}  # te signature -> GlobalVar of its kernel in the module

    def visit_call_(self, call):  # noqa: D401 - mutator hook
        original = call
        if original in self.pending:  # the end of a chain: its kernel, every operand defined
            emit, residual = self.pending.pop(original)
            return emit(None if residual is None else self.visit_expr(residual))
        call = self.visit_expr_post_order(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name not in _REPLACED:
            return call
        weight_of, axis = _REPLACED[call.op.name]
        weight = weight_of(call)
        if weight is None and gpu_bmm.batched_shape(call) is not None:
            operands, rewrite = _activation_operands(call), self._batch_matmul
        else:
            operands = None if weight is None else self._operands(original, call, weight, axis)
            rewrite = self._conv2d if call.op.name == "relax.nn.conv2d" else self._matmul
        if operands is None:
            return call
        chain = self.chains.get(original)
        if chain is not None:
            emit = rewrite(call, operands, chain)
            if emit is not None:
                # emitted at the chain's end (a residual may be defined after this call); this
                # call and the chain's ops before the end are then read by nothing
                self.pending[chain.end] = (emit, chain.residual)
                return call
        emit = rewrite(call, operands)
        return call if emit is None else emit(None)

    def _operands(self, original, call, weight, axis):
        """_Operands of a replaceable call, or None when its precision has no kernel here."""
        dtype = str(call.args[0].ty.dtype)
        if original in self.scales and dtype in ("float32", "float16"):
            q, w_scale = gpu_int8.weight_s8(weight, axis)
            return _Operands("int8", ACCUMULATE["int8"], q, self.scales[original], w_scale)
        if dtype in _FLOAT and str(weight.dtype) == dtype:
            return _Operands(dtype, ACCUMULATE[dtype], weight)
        return None

    def _input(self, x, operands):
        if operands.x_scale is None:
            return x
        return self.builder_.emit(gpu_int8.quantized_input(x, operands.x_scale))

    def _with_chain(self, tensors, chain, operands, dtype):
        """A form's te tensors with the chain's stages after its accumulator, in the model's
        `dtype` (an int8 kernel's accumulator dequantized first)."""
        if chain is None:
            return tensors
        inputs, out = gpu_epilogue.stages(tensors[-1], chain, dtype,
                                          dequantize=operands.x_scale is not None)
        return [*tensors[:-1], *inputs, out]

    def _chain_args(self, chain, residual, shape, dtype, operands):
        """The chain's operands in the kernel's argument order: an int8 kernel's per-channel
        dequantization scale, the bias, then the residual laid out as the kernel's result (a
        reshape, which the build makes a view)."""
        if chain is None:
            return []
        args = []
        if operands.x_scale is not None:
            args.append(relax.const((operands.x_scale * operands.w_scale).astype("float32")))
        if chain.bias is not None:
            args.append(relax.const(chain.bias.astype(dtype)))
        if residual is not None:
            args.append(self.builder_.emit(relax.op.reshape(residual, shape)))
        return args

    def _prologue(self, x, shape, operands):
        """The gpu_operands.Prologue the kernel reads fp16 operand `x` through (its layout ops
        and cast from a layer norm's or softmax's float32 result, each a kernel of its own
        otherwise), or None."""
        if operands.x_scale is not None or operands.dtype != "float16":
            return None
        return gpu_operands.find(x, self.lookup_binding, shape, operands.dtype)

    def _emit_kernel(self, made, sig, args, shape, operands, dtype, chain=None):
        if sig not in self.added:
            name = f"unit_gpu_{sig[0]}_{len(self.added)}"
            # scheduled already (dlight leaves it), and opaque: operator fusion must not merge
            # the tensorized loop nest with its neighbours (they fuse among themselves)
            func = made.func.with_attrs({"global_symbol": name, "tir.is_scheduled": True,
                                         "op_pattern": 8})
            self.added[sig] = self.builder_.add_func(func, name)
        written = operands.acc if chain is None else gpu_epilogue.out_dtype(chain, dtype)
        out = self.builder_.emit(relax.call_tir(self.added[sig], args,
                                                relax.TensorType(shape, written)))
        if chain is not None:  # the kernel wrote the chain's result
            return out
        if operands.x_scale is None:
            return relax.op.astype(out, dtype)
        return gpu_int8.dequantized(out, operands.x_scale, operands.w_scale, dtype)

    def _conv2d(self, call, operands, chain=None):
        """emit(residual) -> the conv's replacement (with `chain`: the chain's result), or None
        when no kernel computes it."""
        attrs, x = call.attrs, call.args[0]
        n, h, wd, c = _shape(x)
        k, kh, kw, _ = operands.weight.shape
        top, left, bottom, right = (int(p) for p in attrs.padding)
        dtype, frag = operands.dtype, _fragment(operands.dtype)
        g = ConvGeometry(n, h + top + bottom, wd + left + right, c, k, kh, kw,
                         tuple(int(s) for s in attrs.strides),
                         tuple(int(d) for d in attrs.dilation), (top, left, bottom, right))
        # int8: the gemm form's gather quantizes the input as it reads it (no quantization
        # pass before the kernel); the direct form reads it quantized
        source = str(x.ty.dtype) if operands.x_scale is not None else None
        sig = ("conv2d", g, dtype, source) + _chain_key(chain)
        label = (f"conv2d {n}x{h}x{wd}x{c} -> {k} k{kh}x{kw} s{g.stride[0]}"
                 + (f" d{g.dilation[0]}" if g.dilation != (1, 1) else "") + f" {dtype}")
        # the gemm form's gather supplies the padding (no pad pass: on an H200 resnet18 ran
        # eight pads as kernels of their own); the direct form reads a padded input
        out_dtype = str(call.ty.dtype)
        forms = {f: self._with_chain(gpu_conv.te_for_form(
                     g if f == "gemm" else g.without_padding(), f, dtype, operands.acc, frag,
                     source if f == "gemm" else None), chain, operands, out_dtype)
                 for f in gpu_conv.forms_in_order(g, frag)}
        made = self.kernels.get(sig, forms, label)
        if made is None:
            return None
        hwio = np.ascontiguousarray(operands.weight.transpose(1, 2, 3, 0))
        direct = made.form == "direct"
        shape = [n, g.out_h, g.out_w, k] if direct else [g.pixels, k]
        weight = relax.const(hwio if direct else gpu_conv.gemm_weight(hwio, frag))

        def emit(residual):
            if source is not None and not direct:
                args = [x, weight,
                        relax.const(np.array([1.0 / operands.x_scale], source))]
            else:
                data = self._input(x, operands)
                if direct and (top or left or bottom or right):
                    data = self.builder_.emit(
                        relax.op.nn.pad(data, [0, 0, top, bottom, left, right, 0, 0]))
                args = [data, weight]
            args += self._chain_args(chain, residual, shape, out_dtype, operands)
            out = self._emit_kernel(made, sig, args, shape, operands, out_dtype, chain)
            final = list(chain.shape) if chain is not None else [n, g.out_h, g.out_w, k]
            return out if shape == final else relax.op.reshape(self.builder_.emit(out), final)

        return emit

    def _matmul(self, call, operands, chain=None):
        """emit(residual) -> the matmul's replacement, as `_conv2d`."""
        x = call.args[0]
        lead = _shape(x)[:-1]
        m, (k, n) = int(np.prod(lead)) if lead else 1, operands.weight.shape
        pro = self._prologue(x, [m, k], operands)
        sig = ("dense", m, n, k, operands.dtype, pro and pro.key) + _chain_key(chain)
        out_dtype = str(call.ty.dtype)
        made = self.kernels.get(
            sig, {"dense": self._with_chain(dense_te(m, n, k, operands.dtype, operands.acc, pro),
                                            chain, operands, out_dtype)},
            f"dense {m}x{k} -> {n} {operands.dtype}" + gpu_operands.describe_ops(pro))
        if made is None:
            return None

        def emit(residual):
            flat = (self.builder_.emit(relax.op.reshape(self._input(x, operands), [m, k]))
                    if pro is None else gpu_operands.argument(self.builder_, pro))
            args = [flat, relax.const(operands.weight),
                    *self._chain_args(chain, residual, [m, n], out_dtype, operands)]
            out = self._emit_kernel(made, sig, args, [m, n], operands, out_dtype, chain)
            final = list(chain.shape) if chain is not None else lead + [n]
            return relax.op.reshape(self.builder_.emit(out), final)

        return emit

    def _batch_matmul(self, call, operands, chain=None):
        """emit(residual) -> the replacement of a matmul of two fp16 activations (gpu_bmm), as
        `_conv2d`."""
        shape, dtype = gpu_bmm.batched_shape(call), operands.dtype
        b = int(np.prod(shape.batch))
        pros = (self._prologue(call.args[0], [b, shape.m, shape.k], operands),
                self._prologue(call.args[1], [b, shape.k, shape.n], operands))
        sig = ("bmm", shape, dtype, *(p and p.key for p in pros)) + _chain_key(chain)
        out_dtype = str(call.ty.dtype)
        made = self.kernels.get(
            sig, {"bmm": self._with_chain(gpu_bmm.batch_matmul_te(shape, dtype, operands.acc,
                                                                  pros), chain, operands,
                                          out_dtype)},
            f"matmul {'x'.join(map(str, shape.batch))} x {shape.m}x{shape.k} x {shape.k}x"
            f"{shape.n} {dtype}" + "".join(gpu_operands.describe_ops(p) for p in pros))
        if made is None:
            return None
        kernel_shape = [b, shape.m, shape.n]

        def emit(residual):
            x, y = (self.builder_.emit(relax.op.reshape(v, [b, *_shape(v)[-2:]])) if p is None
                    else gpu_operands.argument(self.builder_, p) for v, p in zip(call.args, pros))
            args = [x, y, *self._chain_args(chain, residual, kernel_shape, out_dtype, operands)]
            out = self._emit_kernel(made, sig, args, kernel_shape, operands, out_dtype, chain)
            final = list(chain.shape) if chain is not None else [*shape.batch, shape.m, shape.n]
            return relax.op.reshape(self.builder_.emit(out), final)

        return emit


@tvm.transform.module_pass(opt_level=0, name="UnitTensorizeGPU")
class UnitTensorizeGPU:
    """tvm.transform.Pass: Tensor Core kernels for the fp16 convs and dense layers of `main`,
    or with `int8` (a gpu_int8.Int8Calibration; the module still fp32, laid out by `to_nhwc`)
    for all of them quantized to int8 (s8 x s8 -> s32 wmma, dequantized per channel).

    database / tune / trials as for UnitTensorize; `report` lists every candidate op with the
    instruction that computes it ("" when TVM's own schedule does, and why).
    """

    def __init__(self, target, database=None, tune=False, trials=None,
                 int8: gpu_int8.Int8Calibration | None = None):
        self.target = as_target(target)
        if not is_gpu(self.target):
            raise ValueError(f"UnitTensorizeGPU is the CUDA path; {self.target} is not a CUDA "
                             f"target (use UnitTensorize)")
        self.kernels = Kernels(self.target, database, tune, trials)
        self.int8 = int8

    @property
    def report(self):
        """GpuKernel per conv2d / dense call met, in program order."""
        return self.kernels.report

    def transform_module(self, mod, ctx):  # noqa: D401 - tvm pass hook
        calls, scales = tensor_core_calls(mod["main"]), None
        if self.int8 is not None:
            scales = gpu_int8.calibrate(mod, calls, self.int8)
        # the bias, residual and activation after each kernel go into its write-back (int8:
        # after the dequantization, in the float32 the model still has here)
        chains = gpu_epilogue.find_chains(mod["main"], calls + _batched_calls(mod["main"]))
        return relax.transform.DeadCodeElimination()(
            rewrite_functions(mod, _Rewrite(mod, self.kernels, scales, chains)))


def default_gpu_schedule(mod: tvm.IRModule, target) -> tvm.IRModule:
    """TVM's own GPU pipeline for what the pass left: legalize, fuse, dlight schedules (with
    one rule of ours before TVM's reductions: windows of a few values per output, as depthwise
    convs and pooling have, one thread per output)."""
    mod = relax.transform.LegalizeOps()(mod)
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    mod = relax.transform.FoldConstant()(mod)
    mod = relax.transform.FuseOps()(mod)
    mod = relax.transform.FuseTIR()(mod)
    with as_target(target):
        mod = dlight.ApplyDefaultSchedule(dlight.gpu.Matmul(), dlight.gpu.GEMV(),
                                          WindowReduction(), dlight.gpu.Reduction(),
                                          dlight.gpu.GeneralReduction(),
                                          dlight.gpu.Fallback())(mod)
    return mod
