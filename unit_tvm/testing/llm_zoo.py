"""Decoder LLM shapes for benchmarks and tests: Hugging Face models built from a config with
fixed-seed random weights (nothing is downloaded)."""

from typing import NamedTuple


class LlmShape(NamedTuple):
    """A decoder's configuration, as Hugging Face names its fields."""

    kind: str  # "llama" or "qwen2"
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied: bool
    rope_theta: float = 500000.0


MODELS = {
    # Llama-3.2-1B's shapes (1.24 B parameters, tied embeddings)
    "llama-3.2-1b": LlmShape("llama", 2048, 16, 32, 8, 8192, 128256, True),
    # the Qwen2-shaped 1.04 B model of issue 63's llama.cpp measurements
    "qwen2-1b": LlmShape("qwen2", 2048, 16, 32, 8, 8192, 32000, True, 1000000.0),
    # seconds to compile: for tests and smoke runs
    "tiny-llama": LlmShape("llama", 128, 2, 4, 2, 256, 512, False),
}


def get(name: str, seed: int = 0):
    """The Hugging Face causal LM of shape `name` (MODELS), random weights from `seed`."""
    import torch  # the test / bench extras
    import transformers

    if name not in MODELS:
        raise ValueError(f"unknown LLM {name!r}; known: {', '.join(MODELS)}")
    s = MODELS[name]
    common = dict(hidden_size=s.hidden, intermediate_size=s.ffn, num_hidden_layers=s.layers,
                  num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                  vocab_size=s.vocab, tie_word_embeddings=s.tied, rope_theta=s.rope_theta,
                  max_position_embeddings=4096)
    torch.manual_seed(seed)
    if s.kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common)).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()
