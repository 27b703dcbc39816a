"""Calibration's observation: the float32 model run by TVM on this CPU, and the values chosen
intermediate results take on the calibration inputs. quantize() observes each quantized op's
input; the GPU path's int8 calibration (gpu/int8.py) uses the same run."""

import json

import numpy as np
import tvm
from tvm import relax

from ... import intrinsics
from ...runner import prepare_host
from ...target import host, is_host
from ..core.graph import dataflow_bindings
from ..cpu.build import build_relax
from ..cpu.fused_attention import kernel_infos
from .emit import TMP, as_main


def observe(mod, outputs, calibration_data, target):
    """Run the fp32 model (TVM, on this CPU) on the calibration inputs; the values `outputs`
    (vars of main) take, each flattened over all inputs. target: the model's target (its own
    build is used where it runs here)."""
    func = mod["main"]
    bindings = dataflow_bindings(func)
    bb = relax.BlockBuilder(mod)  # the module's other functions stay callable
    params = list(func.params)
    with bb.function(TMP, params):
        with bb.dataflow():
            for b in bindings:
                bb.emit_normalized(b)
            out = bb.emit_output(relax.Tuple(outputs))
        bb.emit_func_output(out)
    # what the observed values do not need goes first: an op TVM cannot build for
    # calibration (a slice whose bounds are inputs, after the quantized ops) is not run
    cal = relax.transform.DeadCodeElimination()(as_main(bb.get()))
    # Calibration runs here: a model compiled for another machine (aarch64, a wider x86) is
    # observed in fp32 on this one, so both builds of one model get the same quantization.
    run_on = target if is_host(target) else host()
    check_runs_here(cal, run_on)
    ex = build_relax(cal, run_on)  # the fp32 model with the default CPU schedule: faster
    # calibration's kernels are this thread's first parallel ones: TVM sizes its pool for
    # good on the first (half the CPUs unless told), and the model's inferences share it
    prepare_host()
    vm = relax.VirtualMachine(ex, tvm.cpu())
    seen = [[] for _ in outputs]
    for sample in calibration_data:
        sample = sample if isinstance(sample, (list, tuple)) else [sample]
        res = vm["main"](*[tvm.runtime.tensor(np.asarray(s), tvm.cpu()) for s in sample])
        for i in range(len(outputs)):
            seen[i].append(res[i].numpy().reshape(-1))
    return [np.concatenate(s) for s in seen]


def check_runs_here(mod, target):
    """ValueError instead of LLVM aborting the process: calibration runs `mod` on this CPU, and
    a fused attention kernel already scheduled for an instruction this CPU lacks (quantizing on
    an AVX2 host for a VNNI target) cannot be built for it."""
    for name, info in kernel_infos(mod).items():
        intrin = json.loads(str(info)).get("instruction")
        if intrin and not intrinsics.get(intrin).supported(target):
            raise ValueError(f"quantize: calibration runs the model on this CPU, whose target "
                             f"{target} cannot run {intrin} (fused attention kernel {name}, "
                             "scheduled for the requested target); quantize on a CPU of the "
                             "target's class, or pass attention='fp32' or 'bf16'")
