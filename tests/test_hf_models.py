"""Models unit-tvm was not written for: Hugging Face architectures built from small configs
(random weights, nothing downloaded), compiled whole — float32 against PyTorch to 1e-4, int8
close to it. Their graphs (ConvNeXt's depthwise 7x7 and channels-last LayerNorm, Swin's
shifted windows, GPT-2's Conv1D projections) come from transformers, not from this project."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import unit_tvm  # noqa: E402
from unit_tvm import frontends  # noqa: E402


class _Output(torch.nn.Module):
    """A model's output field `key` as a plain tensor."""

    def __init__(self, model, key):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x):
        return getattr(self.model(x), self.key)


def _convnext():
    cfg = transformers.ConvNextConfig(depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 48, 64])
    return transformers.ConvNextModel(cfg), torch.randn(1, 3, 64, 64), "pooler_output"


def _swin():
    cfg = transformers.SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[1, 2],
                                  num_heads=[2, 4], window_size=4)
    return transformers.SwinModel(cfg), torch.randn(1, 3, 64, 64), "pooler_output"


def _gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=300)
    return transformers.GPT2Model(cfg), torch.randint(0, 300, (1, 24)), "last_hidden_state"


def _case(make, seed=0):
    torch.manual_seed(seed)
    model, x, key = make()
    model = _Output(model.eval(), key).eval()
    with torch.no_grad():
        want = model(x).numpy()
    return model, x, want


def _run(ex, x):
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    return (out if hasattr(out, "numpy") else out[0]).numpy()


def _cosine(a, b):
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("make", [_convnext, _swin, _gpt2], ids=["convnext", "swin", "gpt2"])
def test_float32_matches_pytorch(make):
    model, x, want = _case(make)
    got = _run(unit_tvm.compile(frontends.from_torch(model, [x])), x).reshape(want.shape)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.parametrize("make", [_convnext, _gpt2], ids=["convnext", "gpt2"])
def test_int8_stays_close_to_pytorch(make):
    model, x, want = _case(make)
    gen = torch.Generator().manual_seed(1)
    if x.dtype == torch.float32:
        cal = [[x.numpy()]] + [[torch.randn(x.shape, generator=gen).numpy()] for _ in range(3)]
    else:
        cal = [[x.numpy()]] + [[torch.randint(0, 300, x.shape, generator=gen).numpy()]
                               for _ in range(3)]
    ex = unit_tvm.compile(frontends.from_torch(model, [x]), quantize={"calibration_data": cal})
    assert _cosine(_run(ex, x), want) > 0.99
