"""Run one attention case (model_cases.attention_params): the layer quantized with quantize's
default attention (long attention one fused kernel, int8 where relax/attention_check.py
allows, else bf16; shorter attention as separate kernels), tensorized and built, against the
same layer quantized with float32 attention and built by TVM.

Both quantize the projections alike; the fused kernels' rounding adds to that (the int8
kernel's stays within the guard's cosine of 0.999 on the calibration inputs), while an operand
read through a wrong view, a head or a token out of place, is as far off as the values are.
`judge` (model_check.py) decides with ATTENTION_SHARE in place of the tie share.
"""

import contextlib
import time

from .check import CaseResult, failed, quiet
from .model_check import judge, model_and_reference, run_outputs

# how far the default attention may move the layer from the one with float32 attention
# (relative L2): as far as quantizing the projections moved it, and at least 0.1 (the int8
# kernel's guard allows 0.045 on the attention's own output). Over the first 60 cases of seed
# 0 on Zen 5: at most 1.34 times that and 0.047; a head or token out of place is ~1.
ATTENTION_SHARE = 1.0
ATTENTION_FLOOR = 0.1


def _instructions(qmod, tpass) -> list:
    """The instructions the tensorized module runs: UnitTensorize's, and the fused kernels'
    ("fused <name>")."""
    from ..relax.fused_attention import KERNEL_INFO_ATTR

    used = {instr for _, instr, _ in tpass.report if instr}
    for func in qmod.functions.values():
        attrs = getattr(func, "attrs", None)
        if attrs is not None and KERNEL_INFO_ATTR in attrs:
            used.add("fused " + str(attrs[KERNEL_INFO_ATTR]["instruction"]))
    return sorted(used)


@contextlib.contextmanager
def _size_policy(lifted: bool):
    """cpu_attention.MIN_SCORES_BYTES at 0 inside when `lifted`: the policy is about speed,
    and most drawn sizes are below it."""
    from ..schedules import cpu_attention

    kept = cpu_attention.MIN_SCORES_BYTES
    cpu_attention.MIN_SCORES_BYTES = 0 if lifted else kept
    try:
        yield
    finally:
        cpu_attention.MIN_SCORES_BYTES = kept


def run_attention_case(case, target=None) -> CaseResult:
    """Quantize, tensorize and build the case's layer with the default attention and compare
    it with TVM's build of the layer with float32 attention. Exceptions are classified, never
    raised."""
    import torch
    import tvm

    from .. import frontends
    from ..compiler import build_relax
    from ..relax import UnitTensorize, quantize
    from ..target import host

    t0 = time.time()
    target = target or host()
    base = dict(index=case.index, kind=case.kind, description=case.describe(),
                reproduce=case.reproduce())
    try:
        model, calibration, inputs, reference = model_and_reference(case, dict(case.params))
        mod = frontends.from_torch(model, [torch.tensor(inputs[0])])
    except Exception as e:  # noqa: BLE001 - PyTorch or TVM's frontend fails: not unit-tvm's
        return failed(base, "invalid", e, t0)
    try:
        with quiet(), _size_policy(bool(case.param("fuse_any_size"))):
            qmod = quantize(mod, target=target, calibration_data=calibration)
            fp32 = quantize(mod, target=target, calibration_data=calibration,
                            attention="fp32")
            plain = run_outputs(tvm.compile(fp32, target=target), inputs)
            tpass = UnitTensorize(target)
            got = run_outputs(build_relax(tpass(qmod), target), inputs)
    except Exception as e:  # noqa: BLE001 - every failure of unit-tvm is a finding
        return failed(base, "crash", e, t0)
    diff = next(filter(None, (judge(g, b, r, "float32 attention", ATTENTION_SHARE,
                                    ATTENTION_FLOOR)
                              for g, b, r in zip(got, plain, reference))), "")
    used = _instructions(qmod, tpass)
    outcome = "wrong" if diff else ("tensorized-correct" if used else "fallback-correct")
    return CaseResult(**base, outcome=outcome, intrinsic=",".join(used), detail=diff,
                      seconds=time.time() - t0)
