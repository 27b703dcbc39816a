"""A decoder's weights as float32 numpy arrays, read once from a Hugging Face model (views of
its tensors where they are float32 already: no copy)."""

from typing import NamedTuple

import numpy as np


class Linear(NamedTuple):
    """One matmul's weight [out, in] and optional bias [out]."""

    weight: np.ndarray
    bias: np.ndarray | None = None


class LayerWeights(NamedTuple):
    """One decoder layer."""

    attn_norm: np.ndarray
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    mlp_norm: np.ndarray
    gate: Linear
    up: Linear
    down: Linear


class DecoderWeights(NamedTuple):
    """Every weight of the decoder."""

    embed: np.ndarray  # [vocab, hidden]: rows gathered by the runtime, not by the graph
    layers: tuple[LayerWeights, ...]
    final_norm: np.ndarray
    lm_head: Linear


def _np(tensor) -> np.ndarray:
    return np.ascontiguousarray(tensor.detach().float().cpu().numpy())


def _linear(module) -> Linear:
    return Linear(_np(module.weight), None if module.bias is None else _np(module.bias))


def input_names(layers: int) -> list[str]:
    """The names of the matmul inputs the int8 form quantizes (one scale each): per layer its
    q/k/v input, o_proj's, gate/up's, down_proj's; the LM head's."""
    return [f"{i}.{n}" for i in range(layers) for n in ("qkv", "o", "gate_up", "down")] + [
        "lm_head"]


def from_hf(model) -> DecoderWeights:
    """The weights of a Hugging Face Llama-style causal LM, as float32 arrays."""
    layers = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        layers.append(LayerWeights(
            _np(layer.input_layernorm.weight), _linear(attn.q_proj), _linear(attn.k_proj),
            _linear(attn.v_proj), _linear(attn.o_proj), _np(layer.post_attention_layernorm.weight),
            _linear(mlp.gate_proj), _linear(mlp.up_proj), _linear(mlp.down_proj)))
    return DecoderWeights(_np(model.model.embed_tokens.weight), tuple(layers),
                          _np(model.model.norm.weight), _linear(model.lm_head))
