"""TVM engines: unit-tvm int8 / bf16 (quantize + UnitTensorize, tuned configs from the
database) and TVM's own int8 / fp32 builds of the same Relax model (no tensorize)."""

import tvm
from tvm import relax

from .. import frontends
from ..compiler import build_relax
from ..relax import UnitTensorize, quantize
from ..relax.quantization.qdq import arrives_quantized, pair_dtypes
from ..target import host
from ..tuner import Database, default_path
from .engines import Engine, ModelCase, Stopwatch, first_output
from ..sources import model_source


def relax_module(case: ModelCase):
    """The model as a Relax module (made once per case)."""
    if "relax" not in case.options and case.onnx_path:

        case.options["relax"] = model_source(case.onnx_path).mod
    if "relax" not in case.options:
        import torch

        case.options["relax"] = frontends.from_torch(case.model, [torch.tensor(case.inputs[0])])
    return case.options["relax"]


def _vm_engine(name, precision, ex, case, watch, variant="", extra=None):
    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    x = tvm.runtime.tensor(case.inputs[0], dev)
    vm["main"](x)  # the thread pool starts on the first parallel call
    threads = str(tvm.get_global_func("runtime.NumThreads")())

    def infer(inp):
        return first_output(vm["main"](tvm.runtime.tensor(inp, dev)))

    return Engine(name, precision, lambda: vm["main"](x), infer, threads=threads,
                  compile_s=watch(), variant=variant, extra=extra or {})


def _target(case):
    return case.options.get("target") or host()


def calibration(case: ModelCase, mod: tvm.IRModule):
    """What quantize() calibrates `mod` (the case's Relax module) on: nothing for a file whose
    8-bit pairs make it arrive quantized (it runs the file's own quantization, as the other
    engines then do); the calibration inputs otherwise (a float model, or a file with 16-bit
    pairs, which quantize() computes around as float32 ops)."""
    return () if arrives_quantized(pair_dtypes(mod)) else case.calibration


def unit_tvm_int8(case: ModelCase) -> Engine:
    """int8 post-training quantization + tensorized kernels (tuned when case.options['tune'])."""
    watch = Stopwatch()
    target = _target(case)
    mod = relax_module(case)
    qmod = quantize(mod, calibration_data=calibration(case, mod), target=target,
                    attention=case.options.get("attention"))
    return _unit_tvm(case, qmod, "unit-tvm int8", "int8", watch)


def unit_tvm_bf16(case: ModelCase) -> Engine:
    """bf16 weights and activations, f32 accumulation, on bf16 dot-product instructions."""
    watch = Stopwatch()
    qmod = quantize(relax_module(case), dtype="bfloat16", target=_target(case))
    return _unit_tvm(case, qmod, "unit-tvm bf16", "bf16", watch)


def unit_tvm_fp32(case: ModelCase) -> Engine:
    """The float32 model as unit_tvm.compile builds it without quantize: convs, dense layers
    and attention on the target's float32 multiply-add, epilogues fused."""
    watch = Stopwatch()
    qmod = quantize(relax_module(case), dtype="float32", target=_target(case))
    return _unit_tvm(case, qmod, "unit-tvm fp32", "fp32", watch)


def _unit_tvm(case, qmod, name, precision, watch):
    opts, target = case.options, _target(case)
    database = Database(opts.get("database") or default_path())
    pass_ = UnitTensorize(target, database=database, tune=opts.get("tune", True),
                          trials=opts.get("trials"))
    ex = build_relax(pass_(qmod), target)
    report = [{"op": op, "instruction": i, "reason": r} for op, i, r in pass_.report]
    used = sorted({r["instruction"] for r in report if r["instruction"]})
    return _vm_engine(name, precision, ex, case, watch, ", ".join(used),
                      {"ops": report, "target": str(target)})


def tvm_int8(case: ModelCase) -> Engine:
    """The same quantized model with TVM's default schedules."""
    watch = Stopwatch()
    target = _target(case)
    mod = relax_module(case)
    qmod = quantize(mod, calibration_data=calibration(case, mod), target=target)
    return _vm_engine("TVM int8", "int8", tvm.compile(qmod, target=target), case, watch,
                      "default schedules")


def tvm_fp32(case: ModelCase) -> Engine:
    """The fp32 model through tvm.compile."""
    watch = Stopwatch()
    ex = tvm.compile(relax_module(case), target=_target(case))
    return _vm_engine("TVM fp32", "fp32", ex, case, watch, "default schedules")
