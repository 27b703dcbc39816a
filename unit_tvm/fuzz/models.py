"""Random small models for the differential fuzzer (kind "model"): what the graph passes see
in users' networks, where op-level cases cannot reach.

A model is an expand conv, a depthwise, strided depthwise or dense 3x3 conv, its activation and
a few elementwise ops, an optional squeeze-excitation gate, and one of many readers of the
result (a conv, a residual add, a global mean and a dense layer, a pool, a concat, the value
returned as it is). Channel counts include partly full blocks of 16. The case is quantized
(`relax.quantize`), tensorized (`UnitTensorize`) and compared with TVM's own build of the same
quantized module: both compute the same integer arithmetic, so they may differ only where a
value lands on a rounding tie (an approximated exp moves it by one step), which moves the result
by far less than quantization itself does. Needs PyTorch (the test extra) as the model source.
"""

import random
import time
import warnings

import numpy as np

from .check import CaseResult, _first_line

KIND = "model"
ACTIVATIONS = ("relu", "relu6", "silu", "hardswish", "sigmoid", "tanh", "gelu", "leaky", "none")
OPS = ("scale", "bias", "clamp", "act", "self_gate", "div_scalar", "div_channel", "add_channel",
       "max_zero")
READERS = ("conv", "residual", "mean_dense", "returned", "avg_pool", "max_pool", "concat",
           "two_outputs", "dense_and_conv")
# the tensorized build may differ from TVM's by this share of the quantization error itself
TIE_SHARE = 0.25


def model_params(rng: random.Random) -> dict:
    """The choices that make one model (plain data, so a case rebuilds it exactly)."""
    n_ops = rng.randint(0, 3)
    return {"cin": rng.choice((3, 8, 16)), "hw": rng.choice((7, 8, 14, 15, 28)),
            "channels": rng.choice((8, 16, 20, 24, 32, 40, 48, 72, 120)),
            "main": rng.choice(("depthwise", "depthwise", "depthwise_s2", "conv")),
            "act": rng.choice(ACTIVATIONS),
            "ops": ",".join(f"{rng.choice(OPS)}:{rng.choice(ACTIVATIONS)}" for _ in range(n_ops)),
            "gate": rng.choice(("sigmoid", "hardsigmoid", "")),
            "reader": rng.choice(READERS)}


def _activation(name, x):
    import torch
    from torch.nn import functional as F

    table = {"relu": F.relu, "relu6": F.relu6, "silu": F.silu, "hardswish": F.hardswish,
             "sigmoid": torch.sigmoid, "tanh": torch.tanh, "gelu": F.gelu,
             "leaky": lambda v: F.leaky_relu(v, 0.1), "none": lambda v: v}
    return table[name](x)


def _elementwise(op, act, y, per_channel):
    import torch

    if op == "scale":
        return y * 0.5
    if op == "bias":
        return y + 0.25
    if op == "clamp":
        return y.clamp(-1.0, 3.0)
    if op == "act":
        return _activation(act, y)
    if op == "self_gate":
        return y * torch.sigmoid(y)
    if op == "div_scalar":
        return y / 3.0
    if op == "div_channel":
        return y / per_channel
    if op == "add_channel":
        return y + per_channel
    return torch.maximum(y, torch.zeros_like(y))  # max_zero


def make_model(params: dict, seed: int):
    """(torch module in eval mode with seeded random weights, input shape) for `params`."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    from ..testing import zoo

    p = params
    c, cin = p["channels"], p["cin"]
    stride = 2 if p["main"] == "depthwise_s2" else 1

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.expand = nn.Conv2d(cin, c, 1)
            groups = 1 if p["main"] == "conv" else c
            self.main = nn.Conv2d(c, c, 3, stride=stride, padding=1, groups=groups)
            self.per_channel = nn.Parameter(torch.rand(1, c, 1, 1) + 0.5, requires_grad=False)
            self.se1, self.se2 = nn.Conv2d(c, 8, 1), nn.Conv2d(8, c, 1)
            self.side = nn.Conv2d(cin, c, 1, stride=stride)
            self.project = nn.Conv2d(c * (2 if p["reader"] == "concat" else 1), 16, 1)
            self.fc = nn.Linear(c, 10)

        def forward(self, x):
            y = _activation(p["act"], self.main(F.relu(self.expand(x))))
            for op in filter(None, p["ops"].split(",")):
                name, act = op.split(":")
                y = _elementwise(name, act, y, self.per_channel)
            if p["gate"]:
                g = self.se2(F.relu(self.se1(y.mean((2, 3), keepdim=True))))
                y = y * (torch.sigmoid(g) if p["gate"] == "sigmoid" else F.hardsigmoid(g))
            return self.read(x, y)

        def read(self, x, y):
            r = p["reader"]
            if r == "conv":
                return self.project(y)
            if r == "residual":
                return self.project(y + self.side(x))
            if r == "mean_dense":
                return self.fc(y.mean((2, 3)))
            if r == "returned":
                return self.project(y), y
            if r in ("avg_pool", "max_pool"):
                pool = F.avg_pool2d if r == "avg_pool" else F.max_pool2d
                return self.project(pool(y, 2))
            if r == "concat":
                return self.project(torch.cat([y, self.side(x)], 1))
            if r == "two_outputs":
                return self.project(y) + 1.0, y * 2.0
            return self.fc(y.mean((2, 3))), self.project(y)  # dense_and_conv

    torch.manual_seed(seed)
    model = Model()
    zoo._randomize(model, seed)
    return model.eval(), (1, cin, p["hw"], p["hw"])


def judge(got: list, plain: list, reference: list) -> str:
    """'' when the tensorized outputs differ from TVM's build of the quantized module by at most
    TIE_SHARE of that build's own distance from the float model (rounding ties), else what
    differs. Each list holds one array per model output."""
    for i, (g, b, r) in enumerate(zip(got, plain, reference)):
        if g.shape != b.shape:
            return f"output {i}: shape {g.shape} != {b.shape}"
        g, b, r = (a.astype(np.float64) for a in (g, b, r))
        if not np.isfinite(g).all() and np.isfinite(b).all():
            return f"output {i}: {int((~np.isfinite(g)).sum())} values not finite"
        scale = np.linalg.norm(r) + 1e-12
        quantization, apart = np.linalg.norm(b - r) / scale, np.linalg.norm(g - b) / scale
        if apart > max(TIE_SHARE * quantization, 1e-5):
            worst = np.unravel_index(np.abs(g - b).argmax(), g.shape)
            return (f"output {i}: {apart:.3g} apart from TVM's build (relative L2), its own "
                    f"quantization error {quantization:.3g}; worst at {tuple(map(int, worst))}: "
                    f"{g[worst]:.6g} != {b[worst]:.6g}")
    return ""


def _run(ex, inputs):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = []
    for x in inputs:
        result = vm["main"](tvm.runtime.tensor(x, tvm.cpu()))
        out.append([result.numpy()] if hasattr(result, "numpy")
                   else [t.numpy() for t in result])
    return out


def run_model_case(case, target=None) -> CaseResult:
    """Quantize, tensorize and build the case's model; compare with TVM's build of the same
    quantized module. Exceptions are classified, never raised."""
    import torch
    import tvm

    from .. import frontends
    from ..compiler import build_relax
    from ..relax import UnitTensorize, quantize
    from ..target import host
    from ..testing import zoo

    t0 = time.time()
    target = target or host()
    base = dict(index=case.index, kind=case.kind, description=case.describe(),
                reproduce=case.reproduce())
    params = dict(case.params)
    try:
        model, shape = make_model(params, case.seed * 7919 + case.index)
        calibration, inputs = zoo.inputs(shape, 3, seed=1), zoo.inputs(shape, 2, seed=2)
        with torch.no_grad():
            reference = [[o.numpy() for o in (out if isinstance(out, tuple) else (out,))]
                         for out in (model(torch.tensor(x)) for x in inputs)]
        qmod = quantize(frontends.from_torch(model, [torch.tensor(inputs[0])]),
                        target=target, calibration_data=calibration)
        plain = _run(tvm.compile(qmod, target=target), inputs)
    except Exception as e:  # noqa: BLE001 - the model or TVM's own build fails: not the case
        return CaseResult(**base, outcome="invalid", detail=_first_line(e),
                          seconds=time.time() - t0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tpass = UnitTensorize(target)
            got = _run(build_relax(tpass(qmod), target), inputs)
    except Exception as e:  # noqa: BLE001 - every failure of unit-tvm is a finding
        return CaseResult(**base, outcome="crash", detail=_first_line(e),
                          seconds=time.time() - t0)
    diff = next(filter(None, (judge(g, b, r) for g, b, r in zip(got, plain, reference))), "")
    used = sorted({instr for _, instr, _ in tpass.report if instr})
    outcome = "wrong" if diff else ("tensorized-correct" if used else "fallback-correct")
    return CaseResult(**base, outcome=outcome, intrinsic=",".join(used), detail=diff,
                      seconds=time.time() - t0)
