"""The quantizer's bias correction: the mean of what rounding the weights to int8 loses, taken
back in each output channel's bias (on the calibration inputs' channel means)."""

import importlib

import numpy as np
import torch
import tvm
from torch import nn
from tvm import relax

import unit_tvm
from unit_tvm import frontends
from unit_tvm.relax import quantize

quantize_module = importlib.import_module("unit_tvm.relax.quantization.ptq")


class _DepthwiseBlock(nn.Module):
    """MobileNet's pattern, where rounding errors do not average out: a depthwise 3x3 conv
    (9 weights per channel), a pointwise conv and a dense layer, on inputs of nonzero mean."""

    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = nn.Conv2d(8, 16, 1)
        self.fc = nn.Linear(16 * 6 * 6, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.pw(torch.relu(self.dw(x)))).flatten(1))


def _outputs(qmod, xs):
    vm = relax.VirtualMachine(tvm.compile(qmod, target=unit_tvm.target.host()), tvm.cpu())
    outs = [vm["main"](tvm.runtime.tensor(x)) for x in xs]
    return np.stack([(o if hasattr(o, "numpy") else o[0]).numpy() for o in outs])


def test_bias_correction_removes_the_mean_error_of_int8_weights(monkeypatch):
    torch.manual_seed(3)
    model = _DepthwiseBlock().eval()
    with torch.no_grad():  # coarse weights: their int8 rounding shifts every channel's mean
        for p in model.parameters():
            p.mul_(3.0)
    rng = np.random.default_rng(0)
    cal = [(rng.standard_normal((1, 8, 6, 6)) + 2.0).astype(np.float32) for _ in range(8)]
    with torch.no_grad():
        want = np.stack([model(torch.tensor(x)).numpy() for x in cal])
    mod = frontends.from_torch(model, [torch.tensor(cal[0])])
    corrected = _outputs(quantize(mod, calibration_data=cal), cal)
    # without the means (the second moments kept: they only weigh the pre-VNNI weight form)
    moments = quantize_module._channel_moments
    monkeypatch.setattr(quantize_module, "_channel_moments",
                        lambda chain, values, **kw: (np.zeros_like(moments(chain, values)[0]),
                                                     moments(chain, values, **kw)[1]))
    plain = _outputs(quantize(mod, calibration_data=cal), cal)
    bias_plain = np.abs((plain - want).mean(axis=(0, 1))).mean()
    bias_corrected = np.abs((corrected - want).mean(axis=(0, 1))).mean()
    assert bias_corrected < 0.5 * bias_plain, (bias_corrected, bias_plain)
    err = [np.abs(out - want).mean() for out in (corrected, plain)]
    assert err[0] < err[1], err
