"""Run one model case (model_cases.py): quantize it (`relax.quantize`), tensorize it
(`UnitTensorize`), build it, and compare with TVM's own build of the same quantized module.
Both compute the same integer arithmetic, so they may differ only where a value lands on a
rounding tie (an approximated exp moves it by one step), which moves the result by less than
quantization itself does (`judge`).
"""

import contextlib
import time
from typing import Callable, NamedTuple

import numpy as np

from .model_cases import make_model
from .outcome import CaseResult, failed, quiet
from ..relax.cpu.fused_attention import kernel_infos
from .. import frontends
from ..compiler import build_relax
from ..relax import UnitTensorize, quantize
from ..target import host

# how much of the quantization error itself rounding ties may add (see judge)
TIE_SHARE = 0.25


class Comparison(NamedTuple):
    """What a whole-model case's tensorized build is compared with: TVM's build of the same
    quantized module (`attention` None), or of the model quantized with that `attention`;
    `name` says which in messages, `share` and `floor` go to judge, and `setting(case)` is a
    context the compilation runs in."""

    name: str = "TVM's build"
    attention: str | None = None
    share: float = TIE_SHARE
    floor: float = 1e-5
    setting: Callable = lambda case: contextlib.nullcontext()


def judge(got: list, plain: list, reference: list, baseline: str = "TVM's build",
          share: float = TIE_SHARE, floor: float = 1e-5) -> str:
    """'' when the tensorized outputs may differ from TVM's build of the quantized module by
    rounding ties alone, else what differs. Each list holds one array per model output;
    baseline names what `plain` came from in the message, share replaces TIE_SHARE, and
    floor is how far apart (relative L2) the two may always be.

    A tie moves a value by one step and everything that value reaches: little against the
    quantization error when an output reads many values, up to half of it when an output reads
    one token. So an output is wrong when it is both further from TVM's build than TIE_SHARE of
    that build's distance from the float model and further from the float model itself than
    that build by more than TIE_SHARE (a wrong layout or term is as far as the values are)."""
    for i, (g, b, r) in enumerate(zip(got, plain, reference)):
        if g.shape != b.shape:
            return f"output {i}: shape {g.shape} != {b.shape}"
        g, b, r = (a.astype(np.float64) for a in (g, b, r))
        if not np.isfinite(g).all() and np.isfinite(b).all():
            return f"output {i}: {int((~np.isfinite(g)).sum())} values not finite"
        scale = np.linalg.norm(r) + 1e-12
        quantization, apart = np.linalg.norm(b - r) / scale, np.linalg.norm(g - b) / scale
        own = np.linalg.norm(g - r) / scale
        if apart > max(share * quantization, floor) and own > (1 + share) * quantization:
            worst = np.unravel_index(np.abs(g - b).argmax(), g.shape)
            return (f"output {i}: {apart:.3g} apart from {baseline} and {own:.3g} from the "
                    f"float model (relative L2), where {baseline} is {quantization:.3g} from "
                    f"it; worst at {tuple(map(int, worst))}: {g[worst]:.6g} != {b[worst]:.6g}")
    return ""


def model_and_reference(case, params: dict, inputs: int = 2):
    """(the case's PyTorch model, its calibration inputs, its test inputs, PyTorch's outputs
    per test input): what every model kind starts from."""
    import torch

    from ..testing import zoo  # torch (optional extra)

    model, shape = make_model(params, case.seed * 7919 + case.index)
    calibration, tests = zoo.inputs(shape, 3, seed=1), zoo.inputs(shape, inputs, seed=2)
    with torch.no_grad():
        reference = [[o.numpy() for o in (out if isinstance(out, tuple) else (out,))]
                     for out in (model(torch.tensor(x)) for x in tests)]
    return model, calibration, tests, reference


def run_outputs(ex, inputs) -> list:
    """Per input, the list of a built model's outputs (numpy) on this CPU."""
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = []
    for x in inputs:
        result = vm["main"](tvm.runtime.tensor(x, tvm.cpu()))
        out.append([result.numpy()] if hasattr(result, "numpy")
                   else [t.numpy() for t in result])
    return out


def _instructions(qmod, tpass) -> list:
    """The instructions the tensorized module runs: UnitTensorize's, and the fused attention
    kernels' ("fused <name>")."""

    used = {instr for _, instr, _ in tpass.report if instr}
    used |= {"fused " + str(info["instruction"]) for info in kernel_infos(qmod).values()}
    return sorted(used)


def run_model_case(case, target=None, against: Comparison = Comparison()) -> CaseResult:
    """Quantize, tensorize and build the case's model; compare with TVM's build of the same
    quantized module (or as `against` says). Exceptions are classified, never raised."""
    import torch
    import tvm


    t0 = time.time()
    target = target or host()
    base = dict(index=case.index, kind=case.kind, description=case.describe(),
                reproduce=case.reproduce())
    params = dict(case.params)
    try:
        model, calibration, inputs, reference = model_and_reference(case, params)
        mod = frontends.from_torch(model, [torch.tensor(inputs[0])])
    except Exception as e:  # noqa: BLE001 - PyTorch or TVM's frontend fails: not unit-tvm's
        return failed(base, "invalid", e, t0)
    try:
        with quiet(), against.setting(case):
            # quantize's module must build and run with TVM's own schedules too
            qmod = quantize(mod, target=target, calibration_data=calibration)
            other = qmod if against.attention is None else quantize(
                mod, target=target, calibration_data=calibration, attention=against.attention)
            plain = run_outputs(tvm.compile(other, target=target), inputs)
            tpass = UnitTensorize(target)
            got = run_outputs(build_relax(tpass(qmod), target), inputs)
    except Exception as e:  # noqa: BLE001 - every failure of unit-tvm is a finding
        return failed(base, "crash", e, t0)
    diff = next(filter(None, (judge(g, b, r, against.name, against.share, against.floor)
                              for g, b, r in zip(got, plain, reference))), "")
    used = _instructions(qmod, tpass)
    outcome = "wrong" if diff else ("tensorized-correct" if used else "fallback-correct")
    return CaseResult(**base, outcome=outcome, intrinsic=",".join(used), detail=diff,
                      seconds=time.time() - t0)
