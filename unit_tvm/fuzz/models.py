"""Random small models for the differential fuzzer (kind "model"): what the graph passes see
in users' networks, where op-level cases cannot reach.

A convolutional model is an expand conv, a depthwise, strided depthwise or dense 3x3 conv, its
activation and a few elementwise ops, an optional squeeze-excitation gate, and one of many
readers of the result (a conv, a residual add, a global mean and a dense layer, a pool, a
concat, the value returned as it is); channel counts include partly full blocks of 16. An
encoder model is one transformer layer: fused or separate projections, plain, causal or
PyTorch's fused attention, post-, pre- or RMS norm, a GELU, ReLU, SiLU or SwiGLU feed-forward,
the hidden states or a pooled head as output. The case is quantized
(`relax.quantize`), tensorized (`UnitTensorize`) and compared with TVM's own build of the same
quantized module: both compute the same integer arithmetic, so they may differ only where a
value lands on a rounding tie (an approximated exp moves it by one step), which moves the result
by less than quantization itself does (`judge`). Needs PyTorch (the test extra) as the model source.
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
# how much of the quantization error itself rounding ties may add (see judge)
TIE_SHARE = 0.25


FFN_ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu", "swiglu")
NORMS = ("post", "pre", "rms")
ATTENTIONS = ("explicit", "causal", "sdpa")
TOKEN_READERS = ("hidden", "mean_head", "first_head")


def model_params(rng: random.Random) -> dict:
    """The choices that make one model (plain data, so a case rebuilds it exactly): a
    convolutional block (family "cnn") or a transformer encoder layer ("encoder")."""
    if rng.random() < 0.3:
        head = rng.choice((16, 32, 64))
        return {"family": "encoder", "batch": rng.choice((1, 1, 2)),
                "tokens": rng.choice((1, 5, 16, 33, 64)), "head": head,
                "heads": rng.choice((1, 2, 3) if head == 64 else (1, 2, 4)),
                "fused_qkv": rng.randint(0, 1), "norm": rng.choice(NORMS),
                "ffn": rng.choice(FFN_ACTIVATIONS), "attention": rng.choice(ATTENTIONS),
                "reader": rng.choice(TOKEN_READERS)}
    n_ops = rng.randint(0, 3)
    return {"family": "cnn", "cin": rng.choice((3, 8, 16)), "hw": rng.choice((7, 8, 14, 15, 28)),
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

    from ..testing import zoo

    build = _encoder if params["family"] == "encoder" else _cnn
    torch.manual_seed(seed)
    model, shape = build(params)
    zoo._randomize(model, seed)
    return model.eval(), shape


def _cnn(p: dict):
    import torch
    from torch import nn
    from torch.nn import functional as F

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

    return Model(), (1, cin, p["hw"], p["hw"])


def _norm(x, layer, rms):
    return x * (x.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * layer.weight if rms else layer(x)


def _encoder(p: dict):
    import torch
    from torch import nn
    from torch.nn import functional as F

    heads, head = p["heads"], p["head"]
    hidden, ffn = heads * head, 2 * heads * head
    rms = p["norm"] == "rms"

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
            self.out, self.ln1, self.ln2 = nn.Linear(hidden, hidden), *(
                nn.LayerNorm(hidden) for _ in range(2))
            self.up = nn.Linear(hidden, ffn * (2 if p["ffn"] == "swiglu" else 1))
            self.down, self.head = nn.Linear(ffn, hidden), nn.Linear(hidden, 10)

        def attend(self, x):
            b, s, _ = x.shape
            if p["fused_qkv"]:
                q, k, v = self.qkv(x).reshape(b, s, 3, heads, head).permute(2, 0, 3, 1, 4)
            else:
                q, k, v = (f(x).reshape(b, s, heads, head).transpose(1, 2)
                           for f in (self.q, self.k, self.v))
            if p["attention"] == "sdpa":
                ctx = F.scaled_dot_product_attention(q, k, v)
            else:
                scores = q @ k.transpose(-1, -2) / head ** 0.5
                if p["attention"] == "causal":
                    scores = scores + torch.triu(torch.full((s, s), -1e4), 1)
                ctx = torch.softmax(scores, dim=-1) @ v
            return self.out(ctx.transpose(1, 2).reshape(b, s, hidden))

        def feed_forward(self, x):
            h = self.up(x)
            if p["ffn"] == "swiglu":
                gate, h = h.chunk(2, dim=-1)
                h = F.silu(gate) * h
            else:
                h = {"gelu": F.gelu, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
                     "relu": F.relu, "silu": F.silu}[p["ffn"]](h)
            return self.down(h)

        def forward(self, x):
            if p["norm"] == "post":
                x = self.ln2(x + self.feed_forward(self.ln1(x + self.attend(x))))
            else:
                x = x + self.attend(_norm(x, self.ln1, rms))
                x = x + self.feed_forward(_norm(x, self.ln2, rms))
            if p["reader"] == "mean_head":
                return self.head(x.mean(1))
            return self.head(x[:, 0]) if p["reader"] == "first_head" else x

    return Encoder(), (p["batch"], p["tokens"], hidden)


def judge(got: list, plain: list, reference: list) -> str:
    """'' when the tensorized outputs may differ from TVM's build of the quantized module by
    rounding ties alone, else what differs. Each list holds one array per model output.

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
        if apart > max(TIE_SHARE * quantization, 1e-5) and own > (1 + TIE_SHARE) * quantization:
            worst = np.unravel_index(np.abs(g - b).argmax(), g.shape)
            return (f"output {i}: {apart:.3g} apart from TVM's build and {own:.3g} from the "
                    f"float model (relative L2), where TVM's build is {quantization:.3g} from "
                    f"it; worst at {tuple(map(int, worst))}: {g[worst]:.6g} != {b[worst]:.6g}")
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
