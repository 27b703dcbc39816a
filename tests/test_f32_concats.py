"""Float32 concats and pools in channel blocks (relax/cpu/edge_layouts.py, EdgeDtype F32): in a
float32 model, convs whose results only a channel concat reads write NCHW[y]c, the concat joins
the blocks, and the convs, average pools and max-pools reading it read the blocks; a stem's
max-pool read by convs and an average pool runs on the blocks too (Inception's blocks). The
outputs equal PyTorch fp32, and a reader that cannot read blocks keeps the concat NCHW."""

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

import unit_tvm
from unit_tvm import frontends
from unit_tvm.relax import UnitTensorize, quantize
from unit_tvm.target import host, restricted

from .conftest import require_host

F = nn.functional


def _conv(i, o, k, stride=1, pad=0):
    return nn.Sequential(nn.Conv2d(i, o, k, stride, pad, bias=False), nn.BatchNorm2d(o),
                         nn.ReLU())


class MiniInception(nn.Module):
    """A stem conv and max-pool, an Inception-A block (1x1, 1x1 -> 3x3, average pool -> 1x1),
    a grid reduction (a strided conv and a max-pool of the block), an Inception-E block with an
    inner concat, then a mean and a linear layer. `variant`: "returned" (the first concat is an
    output as well), "flatten" (a reshape reads the grid reduction's concat)."""

    def __init__(self, variant=""):
        super().__init__()
        self.variant = variant
        self.stem = _conv(3, 32, 3, 2)
        self.a1, self.a2, self.a3 = _conv(32, 16, 1), _conv(32, 16, 1), _conv(16, 32, 3, 1, 1)
        self.apool = _conv(32, 16, 1)
        self.reduce = _conv(64, 32, 3, 2)
        self.e1, self.e2 = _conv(96, 16, 1), _conv(96, 16, 1)
        self.e3, self.e4 = _conv(16, 16, (1, 3), 1, (0, 1)), _conv(16, 16, (3, 1), 1, (1, 0))
        self.fc = nn.Linear(48, 10)

    def forward(self, x):
        x = F.max_pool2d(self.stem(x), 3, 2)
        a = torch.cat([self.a1(x), self.a3(self.a2(x)), self.apool(F.avg_pool2d(x, 3, 1, 1))], 1)
        r = torch.cat([self.reduce(a), F.max_pool2d(a, 3, 2)], 1)
        t = self.e2(r)
        e = torch.cat([self.e1(r), torch.cat([self.e3(t), self.e4(t)], 1)], 1)
        out = self.fc(e.mean((2, 3)))
        if self.variant == "returned":
            return out, a
        if self.variant == "flatten":
            return out, r.flatten(1)[:, :7]
        return out


def _model(variant):
    torch.manual_seed(0)
    model = MiniInception(variant).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    return model


def _blocked(tmod):
    """{op name: how many of its calls in main give a 5-D (channel-blocked) result}."""
    found = {}
    for block in tmod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)
                    and getattr(b.var.ty, "ndim", 0) == 5):
                found[v.op.name] = found.get(v.op.name, 0) + 1
    return found


def _outputs(out):
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


@pytest.mark.parametrize("level,variant", [(None, ""), ("avx2", ""), (None, "returned"),
                                           (None, "flatten")])
def test_float32_concats_and_pools_run_in_blocks(level, variant):
    """Every concat a conv or pool reads is 5-D; the pools run on blocks; outputs within 1e-4
    relative of PyTorch fp32. A concat that is returned (or reshaped) stays NCHW, and so do the
    concats built from it, while the others stay blocked."""
    require_host("x86.vfmadd231ps")
    target = host() if level is None else restricted(level)
    model = _model(variant)
    x = np.random.default_rng(0).standard_normal((1, 3, 47, 47)).astype("float32")
    mod = frontends.from_torch(model, [torch.tensor(x)])
    blocked = _blocked(UnitTensorize(target)(quantize(mod, target=target, dtype="float32")))
    # the stem's max-pool and the average pool of its result, always; the grid reduction's
    # max-pool where the A block's concat is blocked ("flatten": pooled in blocks, then NCHW)
    assert blocked.get("relax.nn.max_pool2d", 0) == (1 if variant == "returned" else 2), blocked
    assert blocked.get("relax.nn.avg_pool2d", 0) == 1, blocked
    # the A block's and the reduction's concats (the E block's feed a mean: NCHW); a returned
    # A concat is NCHW, and so is the reduction's, which pools it
    want_concats = {"": 2, "returned": 0, "flatten": 1}[variant]
    assert blocked.get("relax.concat", 0) == want_concats, blocked
    vm = relax.VirtualMachine(unit_tvm.compile(mod, target), tvm.cpu())
    got = _outputs(vm["main"](tvm.runtime.tensor(x)))
    with torch.no_grad():
        want = model(torch.tensor(x))
    for g, w in zip(got, [want] if isinstance(want, torch.Tensor) else want):
        w = w.numpy()
        assert np.abs(g - w).max() <= 1e-4 * np.abs(w).max()
