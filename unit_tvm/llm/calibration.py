"""Activation ranges of a decoder's matmul inputs, observed by running the Hugging Face model
itself (PyTorch, float32) on calibration prompts: the int8 form's per-tensor uint8 scales."""

import numpy as np

from ..relax.core.u8_values import uint8_range
from .graph import ActivationQuantization
from .weights import LAYER_INPUTS, LM_HEAD_INPUT, input_name


def _hooked_modules(model) -> dict:
    """input name (weights.input_names) -> the nn.Linear reading that input."""
    modules = {LM_HEAD_INPUT: model.lm_head}
    for i, layer in enumerate(model.model.layers):
        readers = (layer.self_attn.q_proj, layer.self_attn.o_proj, layer.mlp.gate_proj,
                   layer.mlp.down_proj)
        modules.update({input_name(i, r): m for r, m in zip(LAYER_INPUTS, readers)})
    return modules


def observe(model, prompts) -> dict[str, tuple[float, float]]:
    """{input name: (min, max)} over every prompt (1-D token ids each)."""
    import torch  # the Hugging Face model is a torch module: torch is loaded already

    ranges: dict[str, tuple[float, float]] = {}

    def hook(name):
        def record(_module, args):
            x = args[0].detach()
            lo, hi = float(x.min()), float(x.max())
            old = ranges.get(name, (lo, hi))
            ranges[name] = (min(old[0], lo), max(old[1], hi))
        return record

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in _hooked_modules(model).items()]
    try:
        with torch.no_grad():
            for ids in prompts:
                model(torch.as_tensor(np.asarray(ids, np.int64).reshape(1, -1)))
    finally:
        for h in handles:
            h.remove()
    return ranges


def uint8_quantization(lo: float, hi: float) -> ActivationQuantization:
    """The uint8 scale and zero point covering [lo, hi] (0 always inside, exactly
    representable)."""
    q = uint8_range(lo, hi)
    return ActivationQuantization(float(np.float32(q.scale)), q.zp)


def default_prompts(vocab: int, length: int, count: int = 4, seed: int = 0) -> list[np.ndarray]:
    """Random token prompts (fixed seed): the calibration when the caller gives none."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, length) for _ in range(count)]


def activation_quantization(model, prompts) -> dict[str, ActivationQuantization]:
    """{input name: ActivationQuantization} from the model's own ranges on `prompts`."""
    return {name: uint8_quantization(*r) for name, r in observe(model, prompts).items()}
