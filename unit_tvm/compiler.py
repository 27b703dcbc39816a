"""unit_tvm.compile: a Relax model -> a VM executable, quantized and tensorized on the way."""

import os
import warnings

import tvm
from tvm import relax

from . import checks, lowering
from .relax import UnitTensorize
from .relax import quantize as quantize_fn
# build_relax, KernelBuildError: the CPU build, public here as before
from .relax.core.graph import one_dataflow_block
from .relax.core.leftovers import fp32_leftovers, summary
from .relax.core.recipe import has_float32_instruction
from .relax.cpu.build import KernelBuildError, build_relax  # noqa: F401
from .relax.frontend.fixes import frontend_fixes
from .relax.gpu.int8 import calibration_from
from .relax.gpu.pipeline import (UnitTensorizeGPU, default_gpu_schedule, to_fp16, to_fp16_nhwc,
    to_nhwc)
from .relax.quantization.qdq import arrives_quantized, pair_dtypes
from .runner import prepare_host, target_for
from .target import is_gpu
from .tuner import Database


def compile(mod: tvm.IRModule, target=None, *, quantize: dict | None = None,  # noqa: A001
            tune: bool = False, database=None, trials: int | None = None,
            report: list | None = None, runner=None) -> relax.VMExecutable:
    """Compile a Relax IRModule for `target` (None: this host); returns a relax Executable.

    quantize: None keeps the model's precision (a model that arrives quantized, with ONNX
    QuantizeLinear / DequantizeLinear pairs, runs int8 where they say, with their scales); a
    dict of unit_tvm.relax.quantize keyword arguments (at least calibration_data) quantizes it
    to int8 first. The UnitTensorize pass
    then tensorizes every quantized op, using tuned configs from `database` (a path or
    Database) and tuning missing ones when tune=True; the rest is TVM's own pipeline.
    Run with relax.VirtualMachine(ex, tvm.cpu()).

    On a CUDA target the model runs in fp16 (convs NHWC): convs and dense layers with constant
    weights on Tensor Cores (wmma, fp32 accumulation), the rest on TVM's GPU schedules; run with
    relax.VirtualMachine(ex, tvm.cuda()). With quantize (calibration_data, method, percentile)
    those convs and dense layers run int8 instead (s8 x s8 wmma, symmetric scales:
    unit_tvm.relax.gpu.int8).

    report: a list to which one (op, instruction or None, reason) per candidate op is
    appended: what was tensorized, and why the rest was not; with quantize, also the
    compute-heavy ops left in float32 and why (warned about once per compile as well).
    runner: where tuning measures (default: this machine; a unit_tvm.fleet.RpcRunner, whose
    servers' target is the default target).
    """

    checks.ir_module(mod, "unit_tvm.compile")
    prepare_host()
    checks.flag(tune, "tune", "unit_tvm.compile")
    checks.count(trials, "trials", "unit_tvm.compile")
    if quantize is not None and not isinstance(quantize, dict):
        raise TypeError(f"unit_tvm.compile: quantize must be None or a dict of "
                        f"unit_tvm.relax.quantize arguments (e.g. {{'calibration_data': [...]}}), "
                        f"got {type(quantize).__name__}")
    if database is not None and not isinstance(database, (str, os.PathLike, Database)):
        raise TypeError(f"unit_tvm.compile: database must be a path or a Database, got "
                        f"{type(database).__name__}")
    target = target_for(target, runner)
    if isinstance(database, (str, os.PathLike)):
        database = Database(database)
    if report is not None and not isinstance(report, list):
        raise TypeError(f"unit_tvm.compile: report must be a list, got {type(report).__name__}")
    if is_gpu(target):
        return _compile_cuda(frontend_fixes(mod), target, quantize, database, tune, trials,
                             report)
    pairs = pair_dtypes(mod) if quantize is None else set()
    if arrives_quantized(pairs):
        quantize = {}  # a QDQ model: int8 where its own pairs say (relax/quantization/qdq.py)
    elif pairs:
        warnings.warn(f"the model's quantize / dequantize pairs are {sorted(pairs)}, not "
                      "8-bit: they run as float32 rounding ops and the model as float32 "
                      "(unit-tvm computes 8-bit pairs in int8)", stacklevel=2)
    if quantize is not None:
        # quantize repairs the frontends' output itself (inference_form), as for any caller
        mod = quantize_fn(mod, target=target, **quantize)
        _report_leftovers(mod, report)
    elif has_float32_instruction(target) and one_dataflow_block(mod["main"]):
        # a float32 model: its convs, matmuls and attention as float32 ops on the target's
        # multiply-add instruction (vfmadd231ps, fmla), epilogues fused as in the int8 form;
        # a main the graph passes cannot read is left to TVM as it is
        mod = quantize_fn(mod, target=target, dtype="float32")
    else:
        mod = frontend_fixes(mod)
    tensorize = UnitTensorize(target, database=database, tune=tune, trials=trials, runner=runner)
    mod = tensorize(mod)
    if report is not None:
        report.extend(tuple(row) for row in tensorize.report)
    return build_relax(mod, target)


def _report_leftovers(mod, report):
    """Report and warn about the convs and matmuls quantize() left in float32."""
    left = fp32_leftovers(mod)
    if report is not None:
        report.extend((row.op, None, row.reason) for row in left)
    if left:
        warnings.warn(f"unit_tvm.compile: {len(left)} compute-heavy ops stay float32: "
                      f"{summary(left)}", stacklevel=3)


def _compile_cuda(mod, target, quantize, database, tune, trials, report):
    """The GPU path: fp16 NHWC, Tensor Core kernels (fp16, or int8 with quantize) for convs and
    dense layers, TVM's GPU pipeline for the rest (unit_tvm.relax.gpu.pipeline)."""
    mod = scheduled_for_cuda(mod, target, quantize=quantize, database=database, tune=tune,
                             trials=trials, report=report)
    return compile_cuda_graph(mod, target)


def scheduled_for_cuda(mod: tvm.IRModule, target, *, quantize: dict | None = None,
                       database=None, tune: bool = False, trials: int | None = None,
                       report: list | None = None) -> tvm.IRModule:
    """The GPU path up to tvm.compile: every kernel scheduled (the profiler builds this without
    CUDA graphs, to time each kernel)."""
    mod = tensorized_for_cuda(mod, target, quantize=quantize, database=database, tune=tune,
                              trials=trials, report=report)
    return default_gpu_schedule(mod, target)


def tensorized_for_cuda(mod: tvm.IRModule, target, *, quantize: dict | None = None,
                        database=None, tune: bool = False, trials: int | None = None,
                        report: list | None = None) -> tvm.IRModule:
    """The GPU path's graph: fp16 NHWC with the Tensor Core kernels in (int8 ones with
    `quantize`), before TVM's schedules for the rest."""
    passes = [UnitTensorizeGPU(target, database=database, tune=tune, trials=trials)]
    if quantize is None:
        mod = passes[0](to_fp16_nhwc(mod))
    else:
        # quantized while the model is still fp32, so calibration sees its own values; the
        # rest of the model (and the dequantized results) then runs in fp16, and what stays
        # fp16 goes on Tensor Cores too: attention's matmuls of two activations (not
        # quantized), their layouts and epilogues folded as in the fp16 path
        passes.insert(0, UnitTensorizeGPU(target, database=database, tune=tune, trials=trials,
                                          int8=calibration_from(quantize)))
        mod = passes[1](to_fp16(passes[0](to_nhwc(mod))))
    if report is not None:
        report.extend((k.op, k.intrinsic or None, k.reason) for p in passes for k in p.report)
    return mod


def compile_cuda_graph(mod, target):
    """tvm.compile for CUDA with the model's static regions captured as CUDA graphs (one launch
    per region instead of one per kernel: at batch 1 the launches cost more than the math)."""
    with tvm.transform.PassContext(opt_level=3, config={"relax.backend.use_cuda_graph": True}):
        return lowering.compile_relax(mod, target)  # adds what the GPU build needs
