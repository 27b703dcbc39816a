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


# the matmul inputs of one layer the int8 form quantizes (one scale each): q/k/v's, o_proj's,
# gate/up's, down_proj's; and the LM head's
LAYER_INPUTS = ("qkv", "o", "gate_up", "down")
LM_HEAD_INPUT = "lm_head"


def input_name(layer: int, role: str) -> str:
    """The name of layer `layer`'s matmul input `role` (one of LAYER_INPUTS)."""
    return f"{layer}.{role}"


def input_names(layers: int) -> list[str]:
    """Every quantized matmul input's name, layer by layer, then the LM head's."""
    return [input_name(i, r) for i in range(layers) for r in LAYER_INPUTS] + [LM_HEAD_INPUT]


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
