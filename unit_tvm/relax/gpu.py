"""The GPU model path: fp16 convolutions and dense layers of a Relax model on Tensor Cores.

`to_fp16_nhwc` lays a float32 model out for the GPU (batch norms folded into elementwise ops,
convs NHWC x OHWI, fp16 values by TVM's ToMixedPrecision). `UnitTensorizeGPU` then replaces every
conv2d (groups 1) and every matmul by a constant weight with the Rewriter's wmma kernel for the
same te op (fp16 x fp16 accumulated in fp32): the Inspector maps it, prepare gathers the window
im2col-style and pads to fragment multiples, the GPU strategy schedules it with a database or
tuned config, and its fp32 result is cast back to fp16 by an elementwise op that TVM fuses with
what follows (bias, batch norm, relu). Everything else — pads, pools, depthwise convs, attention
matmuls, softmax, layer norms — goes through TVM's own GPU pipeline (legalization, operator
fusion, dlight schedules). This is one pass before tvm.compile, as UnitTensorize is on CPU.
"""

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax, te
from tvm.s_tir import dlight

from ..build import alternatives, choose
from ..rewriter import schedule
from ..target import as_target, is_gpu
from ..tuner import tune_instruction
from .graph import rewrite_functions

# the accumulator dtype of the Tensor Core kernels, per activation dtype they take
ACCUMULATE = {"float16": "float32"}


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


def to_fp16_nhwc(mod: tvm.IRModule) -> tvm.IRModule:
    """A float32 Relax model as the GPU path computes it: NHWC x OHWI convs, fp16 values."""
    return tvm.transform.Sequential([
        _clip_as_min_max,
        relax.transform.DecomposeOpsForInference(),
        relax.transform.FoldConstant(),
        relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]}),
        relax.transform.ToMixedPrecision(out_dtype="float16"),
        relax.transform.FoldConstant(),
    ])(mod)


@dataclass(frozen=True)
class GpuKernel:
    """One tensorized (or not) op of the model: what the report says about it."""
    op: str  # e.g. "conv2d 1x56x56x64 -> 64 k3x3 s1"
    intrinsic: str  # "" when TVM's own schedule computes it
    reason: str = ""


def conv2d_nhwc_te(n, h, w, c, k, kh, kw, stride, dtype, acc):
    """te conv2d over an already padded NHWC input and an HWIO kernel, accumulated in `acc`."""
    data = te.placeholder((n, h, w, c), dtype, name="data")
    kern = te.placeholder((kh, kw, c, k), dtype, name="kernel")
    rc = te.reduce_axis((0, c), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    oh, ow = (h - kh) // stride[0] + 1, (w - kw) // stride[1] + 1
    out = te.compute((n, oh, ow, k), lambda b, y, x, f: te.sum(
        data[b, y * stride[0] + ry, x * stride[1] + rx, rc].astype(acc)
        * kern[ry, rx, rc, f].astype(acc), axis=[rc, ry, rx]), name="conv2d_nhwc")
    return [data, kern, out]


def dense_te(m, n, k, dtype, acc):
    """te A[m, k] x B[k, n] accumulated in `acc` (B: the constant weight, row-major K x N)."""
    a = te.placeholder((m, k), dtype, name="A")
    b = te.placeholder((k, n), dtype, name="B")
    r = te.reduce_axis((0, k), name="k")
    out = te.compute((m, n), lambda i, j: te.sum(a[i, r].astype(acc) * b[r, j].astype(acc),
                                                 axis=r), name="dense")
    return [a, b, out]


def _shape(expr):
    return [int(s) for s in expr.ty.shape]


def _const_weight(expr):
    return expr.value.numpy() if isinstance(expr, tvm.ir.expr.Constant) else None


@dataclass
class _Kernels:
    """Tensorized PrimFuncs built so far, one per distinct te op (layers of equal shape share)."""
    target: object
    database: object
    tune: bool
    trials: object
    funcs: dict = field(default_factory=dict)  # te signature -> (PrimFunc, instruction) or None
    report: list = field(default_factory=list)

    def get(self, signature, tensors, label):
        """(PrimFunc, instruction name) computing tensors[-1], or None when nothing fits."""
        if signature not in self.funcs:
            self.funcs[signature] = self._make(tensors, label)
        made = self.funcs[signature]
        self.report.append(GpuKernel(label, made[1] if made else "",
                                     "" if made else "no Tensor Core instruction fits"))
        return made

    def _make(self, tensors, label):
        inputs, out = tensors[:-1], tensors[-1]
        intrin, prepared, sch = choose(out, self.target, params=inputs)
        if intrin is None:
            return None
        if self.tune or self.database is not None:
            alts = alternatives(out, self.target, params=inputs, first=intrin) or [
                (intrin, prepared)]
            index, result = tune_instruction(alts, self.target, trials=self.trials,
                                             database=self.database, measure=self.tune)
            intrin, prepared = alts[index]
            sch = schedule(prepared, intrin, result.config, self.target)
        return sch.mod["main"], intrin.name


@relax.expr_functor.mutator
class _Rewrite(relax.PyExprMutator):
    """Replaces conv2d / constant-weight matmul calls by call_tir of tensorized kernels."""
    def __init__(self, mod, kernels):
        super().__init__(mod)
        self.kernels = kernels
        self.added = {}  # te signature -> GlobalVar of its kernel in the module

    def visit_call_(self, call):  # noqa: D401 - mutator hook
        call = self.visit_expr_post_order(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        rewrite = {"relax.nn.conv2d": self._conv2d, "relax.matmul": self._matmul}.get(call.op.name)
        new = rewrite(call) if rewrite is not None else None
        return call if new is None else new

    def _emit_kernel(self, made, sig, args, shape, acc, dtype):
        if sig not in self.added:
            func, _ = made
            name = f"unit_gpu_{sig[0]}_{len(self.added)}"
            # scheduled already (dlight leaves it), and opaque: operator fusion must not merge
            # the tensorized loop nest with its neighbours (they fuse among themselves)
            func = func.with_attrs({"global_symbol": name, "tir.is_scheduled": True,
                                    "op_pattern": 8})
            self.added[sig] = self.builder_.add_func(func, name)
        gv = self.added[sig]
        out = self.builder_.emit(relax.call_tir(gv, args, relax.TensorType(shape, acc)))
        return relax.op.astype(out, dtype)

    def _conv2d(self, call):
        attrs = call.attrs
        x, w = call.args
        weight = _const_weight(w)
        dtype = str(x.ty.dtype)
        if (weight is None or dtype not in ACCUMULATE or str(w.ty.dtype) != dtype
                or attrs.data_layout != "NHWC" or attrs.kernel_layout != "OHWI"
                or attrs.out_layout != "NHWC" or int(attrs.groups) != 1
                or any(int(d) != 1 for d in attrs.dilation)):
            return None
        n, h, wd, c = _shape(x)
        k, kh, kw, _ = weight.shape
        top, left, bottom, right = (int(p) for p in attrs.padding)
        stride = tuple(int(s) for s in attrs.strides)
        acc = ACCUMULATE[dtype]
        ph, pw = h + top + bottom, wd + left + right
        sig = ("conv2d", n, ph, pw, c, k, kh, kw, stride, dtype)
        label = f"conv2d {n}x{h}x{wd}x{c} -> {k} k{kh}x{kw} s{stride[0]}"
        made = self.kernels.get(sig, conv2d_nhwc_te(n, ph, pw, c, k, kh, kw, stride, dtype, acc),
                                label)
        if made is None:
            return None
        if top or left or bottom or right:
            x = self.builder_.emit(relax.op.nn.pad(x, [0, 0, top, bottom, left, right, 0, 0]))
        hwio = relax.const(np.ascontiguousarray(weight.transpose(1, 2, 3, 0)))
        shape = [n, (ph - kh) // stride[0] + 1, (pw - kw) // stride[1] + 1, k]
        return self._emit_kernel(made, sig, [x, hwio], shape, acc, str(call.ty.dtype))

    def _matmul(self, call):
        x, w = call.args
        weight = _const_weight(w)
        dtype = str(x.ty.dtype)
        if weight is None or weight.ndim != 2 or dtype not in ACCUMULATE \
                or str(w.ty.dtype) != dtype or x.ty.shape is None:
            return None
        lead = _shape(x)[:-1]
        m, (k, n) = int(np.prod(lead)) if lead else 1, weight.shape
        acc = ACCUMULATE[dtype]
        sig = ("dense", m, n, k, dtype)
        made = self.kernels.get(sig, dense_te(m, n, k, dtype, acc), f"dense {m}x{k} -> {n}")
        if made is None:
            return None
        flat = self.builder_.emit(relax.op.reshape(x, [m, k]))
        out = self._emit_kernel(made, sig, [flat, relax.const(weight)], [m, n], acc,
                                str(call.ty.dtype))
        return relax.op.reshape(self.builder_.emit(out), lead + [n])


@tvm.transform.module_pass(opt_level=0, name="UnitTensorizeGPU")
class UnitTensorizeGPU:
    """tvm.transform.Pass: Tensor Core kernels for the fp16 convs and dense layers of `main`.

    database / tune / trials as for UnitTensorize; `report` lists every candidate op with the
    instruction that computes it ("" when TVM's own schedule does, and why).
    """

    def __init__(self, target, database=None, tune=False, trials=None):
        self.target = as_target(target)
        if not is_gpu(self.target):
            raise ValueError(f"UnitTensorizeGPU is the CUDA path; {self.target} is not a CUDA "
                             f"target (use UnitTensorize)")
        self.kernels = _Kernels(self.target, database, tune, trials)

    @property
    def report(self):
        """GpuKernel per conv2d / dense call met, in program order."""
        return self.kernels.report

    def transform_module(self, mod, ctx):  # noqa: D401 - tvm pass hook
        return relax.transform.DeadCodeElimination()(
            rewrite_functions(mod, _Rewrite(mod, self.kernels)))


def default_gpu_schedule(mod: tvm.IRModule, target) -> tvm.IRModule:
    """TVM's own GPU pipeline for what the pass left: legalize, fuse, dlight schedules."""
    mod = relax.transform.LegalizeOps()(mod)
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    mod = relax.transform.FoldConstant()(mod)
    mod = relax.transform.FuseOps()(mod)
    mod = relax.transform.FuseTIR()(mod)
    with as_target(target):
        mod = dlight.ApplyDefaultSchedule(dlight.gpu.Matmul(), dlight.gpu.GEMV(),
                                          dlight.gpu.Reduction(), dlight.gpu.GeneralReduction(),
                                          dlight.gpu.Fallback())(mod)
    return mod
