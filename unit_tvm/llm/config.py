"""The shape of a decoder LLM (Llama / Qwen2 / Mistral style), read once from a Hugging Face
model: everything the graph builder and the runtime need, validated here so that a model this
package cannot compute is refused with its reason instead of computed wrongly."""

from dataclasses import dataclass

import numpy as np

# Hugging Face model types whose decoder layer is: RMSNorm, attention (RoPE, grouped-query,
# optional q/k/v bias), RMSNorm, SwiGLU MLP; final RMSNorm and an LM head
SUPPORTED_TYPES = ("llama", "qwen2", "mistral")
ROPE_LAYOUTS = ("half", "interleaved")


@dataclass(frozen=True)
class DecoderConfig:
    """A decoder's shapes and constants."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rms_eps: float
    # RoPE: angle of position p on pair i is p * inv_freq[i]; cos / sin are multiplied by
    # rope_scale (Hugging Face's attention_scaling, 1 for the plain and llama3 rope types)
    inv_freq: tuple[float, ...]
    rope_scale: float = 1.0
    # "half": pairs (i, i + head_dim / 2) (Hugging Face's rotate_half); "interleaved": pairs
    # (2i, 2i + 1) (Meta's original checkpoints, GPT-J, GGUF's view of Llama)
    rope_layout: str = "half"
    qkv_bias: bool = False
    tied_embeddings: bool = False
    eos_token_id: tuple[int, ...] = ()
    # attention limited to this many past positions (Mistral's sliding window), None: all
    sliding_window: int | None = None

    def __post_init__(self):
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.heads} query heads do not split into {self.kv_heads} "
                             "key/value groups")
        if self.head_dim % 2 or len(self.inv_freq) != self.head_dim // 2:
            raise ValueError(f"RoPE needs head_dim / 2 = {self.head_dim // 2} frequencies, "
                             f"got {len(self.inv_freq)}")
        if self.rope_layout not in ROPE_LAYOUTS:
            raise ValueError(f"rope_layout must be one of {ROPE_LAYOUTS}, "
                             f"got {self.rope_layout!r}")

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.kv_heads

    def weight_bytes(self, bytes_per_weight: float) -> float:
        """Bytes of the matmul weights one token reads (decoder layers and LM head)."""
        per_layer = (self.hidden * self.head_dim * (self.heads * 2 + self.kv_heads * 2)
                     + 3 * self.hidden * self.ffn)
        return (self.layers * per_layer + self.vocab * self.hidden) * bytes_per_weight


def _eos(config) -> tuple[int, ...]:
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))


def from_hf(model, rope_layout: str = "half") -> DecoderConfig:
    """The DecoderConfig of a Hugging Face causal LM (LlamaForCausalLM, Qwen2ForCausalLM,
    MistralForCausalLM); ValueError naming what is not supported."""
    config = model.config
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_TYPES:
        raise ValueError(f"unit_tvm.llm: model_type {kind!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_TYPES)})")
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unit_tvm.llm: hidden_act {act!r} is not supported (SwiGLU with silu)")
    if getattr(config, "mlp_bias", False):
        raise ValueError("unit_tvm.llm: mlp_bias=True is not supported")
    window = getattr(config, "sliding_window", None)
    if not getattr(config, "use_sliding_window", kind == "mistral"):
        window = None  # Qwen2 declares a window it does not use unless told
    rotary = model.model.rotary_emb
    rope_type = getattr(rotary, "rope_type", "default")
    if rope_type == "dynamic":
        raise ValueError("unit_tvm.llm: dynamic RoPE scaling (frequencies that change with the "
                         "sequence length) is not supported")
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    attn = model.model.layers[0].self_attn
    return DecoderConfig(
        hidden=config.hidden_size, layers=config.num_hidden_layers, heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads, head_dim=head_dim,
        ffn=config.intermediate_size, vocab=config.vocab_size, rms_eps=float(config.rms_norm_eps),
        inv_freq=tuple(float(f) for f in np.asarray(rotary.inv_freq.float().cpu())),
        rope_scale=float(getattr(rotary, "attention_scaling", 1.0)), rope_layout=rope_layout,
        qkv_bias=attn.q_proj.bias is not None,
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        eos_token_id=_eos(getattr(model, "generation_config", None) or config),
        sliding_window=None if window is None else int(window))
