"""Run one GPU model case (kind "gpu_model"): the random small models of model_cases.py through
the GPU path in fp16 (layouts, Tensor Core kernels, chains, operand loads), checked on this CPU
with each kernel its te definition (gpu_kernels.te_reference) against TVM's own fp16 build of
the same module, and built for real for sm_90 where nvcc is found (a kernel nvcc or TVM cannot
build is a crash). What runs on the GPU alone, the kernels' schedules, the GPU tests check
against the same te definitions.
"""

import time

from .model_check import judge, model_and_reference, run_outputs
from .outcome import CaseResult, failed, quiet
from .. import frontends, lowering, nvcc
from ..compiler import build_relax, compile_cuda_graph, scheduled_for_cuda, tensorized_for_cuda
from ..relax.frontend.fixes import frontend_fixes
from ..relax.gpu.pipeline import to_fp16_nhwc
from ..relax.gpu.kernels import te_reference
from ..target import host

# fp16 rounds at other points in the fused kernels than in TVM's op-by-op build (and
# accumulates in float32): half of fp16's own distance from the float model may be added
FP16_SHARE = 0.5


def run_gpu_model_case(case, target=None) -> CaseResult:
    """The case's model on the GPU path, checked as the module docstring says; exceptions are
    classified, never raised. `target` is unused (the model is built for CUDA)."""
    import torch
    import tvm


    t0 = time.time()
    base = dict(index=case.index, kind=case.kind, description=case.describe(),
                reproduce=case.reproduce())
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    try:
        model, _, inputs, reference = model_and_reference(case, dict(case.params))
        # as unit_tvm.compile hands a model to the GPU path
        mod = frontend_fixes(frontends.from_torch(model, [torch.tensor(inputs[0])]))
        with quiet():
            plain = run_outputs(lowering.compile_relax(to_fp16_nhwc(mod), host()), inputs)
    except Exception as e:  # noqa: BLE001 - PyTorch or TVM alone fails: not unit-tvm's
        return failed(base, "invalid", e, t0)
    report = []
    try:
        with quiet():
            with te_reference():
                checked = tensorized_for_cuda(mod, cuda, report=report)
            got = run_outputs(build_relax(checked, host()), inputs)
            if nvcc.find_nvcc() is not None:
                compile_cuda_graph(scheduled_for_cuda(mod, cuda), cuda)
    except Exception as e:  # noqa: BLE001 - every failure of unit-tvm is a finding
        return failed(base, "crash", e, t0)
    diff = next(filter(None, (judge(g, b, r, "TVM's fp16 build", FP16_SHARE)
                              for g, b, r in zip(got, plain, reference))), "")
    kernels = sum(1 for _, instr, _ in report if instr)  # "te": a kernel of the pass
    outcome = "wrong" if diff else ("tensorized-correct" if kernels else "fallback-correct")
    return CaseResult(**base, outcome=outcome, intrinsic="cuda.wmma.f16f32" if kernels else "",
                      detail=diff, seconds=time.time() - t0)
