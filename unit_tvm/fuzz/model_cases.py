"""Random small models for the differential fuzzer (kind "model"): what the graph passes see
in users' networks, where op-level cases cannot reach. Plain-data choices (`model_params`) and
the PyTorch modules they make (`make_model`); model_check.py runs them.

A convolutional model ("cnn") is an expand conv, a depthwise, strided depthwise or dense 3x3
conv, its activation and a few elementwise ops, an optional squeeze-excitation gate, and one of
many readers of the result (a conv, a residual add, a global mean and a dense layer, a pool, a
concat, the value returned as it is); channel counts include partly full blocks of 16. An
encoder model is one transformer layer: fused or separate projections, plain, causal or
PyTorch's fused attention, post-, pre- or RMS norm, a GELU (either form, as one op or written
out, or CLIP's quick GELU), ReLU, SiLU or SwiGLU feed-forward, the hidden states or a pooled
head as output. A residual model is a stem conv (1x1 to 7x7, stride 1 or 2, a pool after it or
not) and one to three ResNet basic, bottleneck or Inception blocks (a grid reduction at stride
2) with batch norms, then a pooled or flattened dense head or a 1x1 conv. A speech model is one
to three conv1d over time (width 1 to 7, stride, dilation, grouped or depthwise, a batch norm,
a per-channel group norm or none, an activation), then torch's own nn.TransformerEncoderLayer
(nn.MultiheadAttention inside), a mean and a dense layer, or the value as it is: a kind of its
own ("speech"), so that the other kinds' seeds keep their cases. Needs PyTorch (the test
extra).
"""

import random
from ..testing.attention import Spelling, drawn_heads

ACTIVATIONS = ("relu", "relu6", "silu", "hardswish", "sigmoid", "tanh", "gelu", "quick_gelu",
               "leaky", "none")
OPS = ("scale", "bias", "clamp", "act", "self_gate", "div_scalar", "div_channel", "add_channel",
       "max_zero")
READERS = ("conv", "residual", "mean_dense", "returned", "avg_pool", "max_pool", "concat",
           "two_outputs", "dense_and_conv")
# "gelu_erf_ops" / "gelu_tanh_ops": the two GELUs written out op by op, as Hugging Face's
# models and ONNX exports spell them (relax/frontend/spelled_gelu.py reads them back as one op)
FFN_ACTIVATIONS = ("gelu", "gelu_tanh", "gelu_erf_ops", "gelu_tanh_ops", "quick_gelu", "relu",
                   "silu", "swiglu")
NORMS = ("post", "pre", "rms")
ATTENTIONS = ("explicit", "causal", "sdpa")
TOKEN_READERS = ("hidden", "mean_head", "first_head")
BLOCKS = ("basic", "bottleneck", "inception")
HEADS = ("mean_fc", "flatten_fc", "conv")


def model_params(rng: random.Random) -> dict:
    """The choices that make one model (plain data, so a case rebuilds it exactly): a
    convolutional block (family "cnn"), a transformer encoder layer ("encoder") or a stem and
    residual or inception blocks ("residual")."""
    family = rng.choices(("cnn", "encoder", "residual"), weights=(4, 3, 3))[0]
    if family == "residual":
        n_blocks = rng.randint(1, 3)
        return {"family": family, "cin": rng.choice((3, 4, 8)), "hw": rng.choice((15, 16, 28, 32)),
                "stem": rng.choice((1, 3, 5, 7)), "stem_stride": rng.choice((1, 2)),
                "stem_pool": rng.choice(("max", "avg", "")),
                "blocks": ",".join(f"{rng.choice(BLOCKS)}:{rng.choice((16, 24, 32, 48, 64, 80))}"
                                   f":{rng.choice((1, 1, 2))}" for _ in range(n_blocks)),
                "head": rng.choice(HEADS)}
    if family == "encoder":
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


def speech_params(rng: random.Random) -> dict:
    """The choices that make one speech model (family "speech", fuzz kind "speech"): conv1d
    layers over time, then a reader (module docstring)."""
    convs = rng.randint(1, 3)
    return {"family": "speech", "cin": rng.choice((1, 8, 20)), "frames": rng.choice((16, 37, 64)),
            "convs": ",".join(f"{rng.randint(1, 7)}:{rng.choice((1, 1, 2))}:"
                              f"{rng.choice((1, 1, 2))}:{rng.choice(('1', '1', '2', 'dw'))}"
                              for _ in range(convs)),
            "channels": rng.choice((16, 24, 32, 48)),
            "norm": rng.choice(("batch", "group", "")),
            "act": rng.choice(("gelu", "relu", "silu")),
            "reader": rng.choice(("transformer", "transformer", "mean_dense", "returned"))}


def attention_params(rng: random.Random) -> dict:
    """The choices that make one attention layer (family "attention", fuzz kind "attention"):
    a spelling (unit_tvm.testing.attention.Spelling), heads, head depth and tokens, and
    whether the fused kernel's size policy is lifted (fuse_any_size: two cases in three)."""
    heads = rng.choice((1, 2, 3, 4, 6, 8))
    return {"family": "attention", "batch": rng.choice((1, 1, 2)), "heads": heads,
            "depth": rng.choice((8, 16, 24, 32, 48, 64)),
            "tokens": rng.choice((64, 100, 197, 256, 300, 384, 512)),
            "fused": rng.randint(0, 1), "order": rng.choice(("3hd", "h3d")),
            "kt": rng.choice(("transpose", "permute")), "scale": rng.choice(("after", "q", "none")),
            "merge": rng.choice(("transpose", "flatten", "interleave", "sum")),
            "stride": rng.choice((1, 1, 2)), "sharpness": rng.choice((1.0, 1.0, 3.0, 6.0)),
            "fuse_any_size": rng.choice((0, 1, 1)),
            "cut": rng.choice(("unpack", "chunk", "split")),
            "mask": rng.choice(("none", "causal", "padding", "fill"))}


def _activation(name, x):
    import torch
    from torch.nn import functional as F

    table = {"relu": F.relu, "relu6": F.relu6, "silu": F.silu, "hardswish": F.hardswish,
             "sigmoid": torch.sigmoid, "tanh": torch.tanh, "gelu": F.gelu,
             "quick_gelu": lambda v: v * torch.sigmoid(1.702 * v),
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

    from ..testing import zoo  # torch (optional extra)

    build = {"cnn": _cnn, "encoder": _encoder, "residual": _residual,
             "speech": _speech, "attention": _attention}[params["family"]]
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


def _gelu_erf_ops(x):
    import torch

    return x * 0.5 * (1.0 + torch.erf(x / 2.0 ** 0.5))


def _gelu_tanh_ops(x):
    import torch

    return 0.5 * x * (1.0 + torch.tanh((2.0 / torch.pi) ** 0.5 * (x + 0.044715 * x.pow(3.0))))


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
                     "gelu_erf_ops": _gelu_erf_ops, "gelu_tanh_ops": _gelu_tanh_ops,
                     "quick_gelu": lambda v: v * torch.sigmoid(1.702 * v),
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


def _block(kind, cin, cout, stride):
    """A ResNet basic or bottleneck block (projection shortcut where the shape changes) or an
    Inception block (four branches concatenated; at stride 2 a grid reduction with a max-pool
    branch)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    def conv(a, b, k, s=1):
        pad = (k[0] // 2, k[1] // 2) if isinstance(k, tuple) else k // 2
        return nn.Sequential(nn.Conv2d(a, b, k, s, pad, bias=False), nn.BatchNorm2d(b), nn.ReLU())

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            if kind == "inception":
                quarter = max(4, cout // 4)
                self.branches = nn.ModuleList([
                    conv(cin, quarter, 1, stride),
                    nn.Sequential(conv(cin, quarter, 1), conv(quarter, quarter, 3, stride)),
                    nn.Sequential(conv(cin, quarter, 1), conv(quarter, quarter, (1, 3)),
                                  conv(quarter, quarter, (3, 1), stride))])
                self.pool = conv(cin, quarter, 1)
                return
            mid = cout // 4 if kind == "bottleneck" else cout
            body = ([conv(cin, mid, 1), conv(mid, mid, 3, stride)] if kind == "bottleneck"
                    else [conv(cin, mid, 3, stride)])
            self.body = nn.Sequential(*body, nn.Conv2d(mid, cout, 1 if kind == "bottleneck"
                                                       else 3, 1, 0 if kind == "bottleneck"
                                                       else 1, bias=False), nn.BatchNorm2d(cout))
            self.short = (nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

        def forward(self, x):
            if kind != "inception":
                return F.relu(self.body(x) + self.short(x))
            parts = [b(x) for b in self.branches]
            pooled = (F.max_pool2d(x, 3, stride, 1) if stride == 2
                      else self.pool(F.avg_pool2d(x, 3, 1, 1)))
            return torch.cat([*parts, pooled], 1)

        def width(self):
            return 3 * max(4, cout // 4) + (cin if stride == 2 else max(4, cout // 4))

    block = Block()
    return block, (block.width() if kind == "inception" else cout)


def _residual(p: dict):
    import torch
    from torch import nn
    from torch.nn import functional as F

    shape = (1, p["cin"], p["hw"], p["hw"])

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            width = 16
            self.stem = nn.Sequential(nn.Conv2d(p["cin"], width, p["stem"], p["stem_stride"],
                                                p["stem"] // 2), nn.BatchNorm2d(width), nn.ReLU())
            blocks = []
            for spec in p["blocks"].split(","):
                kind, cout, stride = spec.split(":")
                block, width = _block(kind, width, int(cout), int(stride))
                blocks.append(block)
            self.blocks = nn.Sequential(*blocks)
            with torch.no_grad():
                features = self.eval().features(torch.zeros(shape))
            flat = features.shape[1] * (1 if p["head"] == "mean_fc" else features[0, 0].numel())
            self.fc, self.conv = nn.Linear(flat, 10), nn.Conv2d(width, 10, 1)

        def features(self, x):
            x = self.stem(x)
            if p["stem_pool"]:
                pool = F.max_pool2d if p["stem_pool"] == "max" else F.avg_pool2d
                x = pool(x, 3, 2, 1)
            return self.blocks(x)

        def forward(self, x):
            x = self.features(x)
            if p["head"] == "conv":
                return self.conv(x)
            return self.fc(x.mean((2, 3)) if p["head"] == "mean_fc" else x.flatten(1))

    return Residual(), shape


def _speech(p: dict):
    from torch import nn

    c = p["channels"]
    layers, cin = [], p["cin"]
    for spec in p["convs"].split(","):
        width, stride, dilation, groups = spec.split(":")
        if groups == "dw":
            groups = c if cin == c else 1
        else:
            groups = int(groups) if cin % int(groups) == 0 else 1
        layers.append(nn.Conv1d(cin, c, int(width), int(stride), padding=int(width) // 2,
                                dilation=int(dilation), groups=groups))
        if p["norm"]:
            layers.append(nn.BatchNorm1d(c) if p["norm"] == "batch" else nn.GroupNorm(c, c))
        layers.append({"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU}[p["act"]]())
        cin = c

    class Speech(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.Sequential(*layers)
            self.layer = nn.TransformerEncoderLayer(c, 4 if c % 4 == 0 else 2, 2 * c,
                                                    dropout=0.0, activation="gelu",
                                                    batch_first=True)
            self.head = nn.Linear(c, 10)

        def forward(self, x):
            y = self.convs(x)
            if p["reader"] == "transformer":
                return self.layer(y.transpose(1, 2))
            return self.head(y.mean(-1)) if p["reader"] == "mean_dense" else y

    return Speech(), (1, p["cin"], p["frames"])


def _attention(p: dict):

    spelling = Spelling(bool(p["fused"]), p["order"], p["kt"], p["scale"], p["merge"],
                        p["stride"], p["sharpness"], p.get("cut", "unpack"),
                        p.get("mask", "none"))
    return (drawn_heads(spelling, p["heads"] * p["depth"], p["heads"]),
            (p["batch"], p["tokens"], p["heads"] * p["depth"]))
