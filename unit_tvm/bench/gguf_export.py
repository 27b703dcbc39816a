"""A Hugging Face Llama / Qwen2 decoder written as a GGUF file (the `gguf` package), so that
llama.cpp and OpenVINO GenAI run the same weights: Q8_0 / Q4_0 matmul weights and token
embeddings, float32 norms and biases. The vocabulary is a placeholder (the benchmark feeds token
ids, never text)."""

from pathlib import Path

import numpy as np

QTYPES = ("q8_0", "q4_0")


def _interleaved_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """q/k rows reordered from Hugging Face's rotate-half layout to llama.cpp's pairs (2i, 2i+1),
    as llama.cpp's own converter does for the llama architecture."""
    d = w.shape[0] // heads
    return w.reshape(heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _byte_symbols() -> list[str]:
    """The printable character that stands for each byte in a byte-level BPE vocabulary (GPT-2's
    convention, which llama.cpp and OpenVINO GenAI both decode): printable Latin-1 bytes stand
    for themselves, the others for the code points from 256 up, in byte order."""
    printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    symbols, shifted = [], 0
    for b in range(256):
        if b in printable:
            symbols.append(chr(b))
        else:
            symbols.append(chr(256 + shifted))
            shifted += 1
    return symbols


def _vocab(writer, size: int) -> None:
    """A placeholder byte-level BPE vocabulary ("gpt2", Llama 3's kind): the byte symbols and
    filler pieces up to the model's size less two, then a begin / end pair of special tokens.
    Both llama.cpp and OpenVINO GenAI read it (GenAI builds its tokenizer only from a "gpt2"
    one); the benchmark feeds token ids, so the pieces never matter. A vocabulary under 258
    drops the last bytes' symbols (ASCII, which llama.cpp tokenizes at load, stays)."""
    if size < 130:
        raise ValueError(f"a byte-level vocabulary needs >= 130 tokens, the model has {size}")
    symbols = _byte_symbols()
    pieces = symbols + [f"t{i}" for i in range(256, size - 2)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(pieces[:size - 2] + ["<|begin|>", "<|end|>"])
    writer.add_token_types([1] * (size - 2) + [3, 3])  # normal, then two control tokens
    writer.add_token_merges([f"{symbols[ord('t')]} {symbols[ord('h')]}"])
    writer.add_bos_token_id(size - 2)
    writer.add_eos_token_id(size - 1)


def _tensor(writer, gguf, name, value: np.ndarray, qtype) -> None:
    value = np.ascontiguousarray(value, np.float32)
    if qtype is None or value.ndim < 2 or value.shape[-1] % 32:
        writer.add_tensor(name, value)
    else:
        writer.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)


def write(model, path, qtype: str = "q8_0") -> Path:
    """Write `model` (LlamaForCausalLM / Qwen2ForCausalLM) to `path` with matmul weights in
    `qtype`; returns the path."""
    import gguf  # the benchmark extra

    from ..llm.config import from_hf
    from ..llm.weights import from_hf as weights_from_hf

    if qtype not in QTYPES:
        raise ValueError(f"qtype must be one of {QTYPES}, got {qtype!r}")
    cfg, w = from_hf(model), weights_from_hf(model)
    arch = "qwen2" if model.config.model_type == "qwen2" else "llama"
    q = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}[qtype]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.layers)
    writer.add_context_length(4096)
    writer.add_embedding_length(cfg.hidden)
    writer.add_feed_forward_length(cfg.ffn)
    writer.add_head_count(cfg.heads)
    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.head_dim)
    # inv_freq[i] = theta^(-2i / head_dim)
    writer.add_rope_freq_base(float(cfg.inv_freq[1] ** (-cfg.head_dim / 2)))
    writer.add_layer_norm_rms_eps(cfg.rms_eps)
    writer.add_file_type({"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                          "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[qtype])
    writer.add_vocab_size(cfg.vocab)
    _vocab(writer, cfg.vocab)
    t = gguf.TENSOR_NAMES
    _tensor(writer, gguf, t[gguf.MODEL_TENSOR.TOKEN_EMBD] + ".weight", w.embed, q)
    _tensor(writer, gguf, t[gguf.MODEL_TENSOR.OUTPUT_NORM] + ".weight", w.final_norm, None)
    if not cfg.tied_embeddings:
        _tensor(writer, gguf, t[gguf.MODEL_TENSOR.OUTPUT] + ".weight", w.lm_head.weight, q)
    for i, lw in enumerate(w.layers):
        qw, kw = lw.q.weight, lw.k.weight
        if arch == "llama":
            qw, kw = _interleaved_rows(qw, cfg.heads), _interleaved_rows(kw, cfg.kv_heads)
        names = {gguf.MODEL_TENSOR.ATTN_NORM: (lw.attn_norm, None),
                 gguf.MODEL_TENSOR.ATTN_Q: (qw, q), gguf.MODEL_TENSOR.ATTN_K: (kw, q),
                 gguf.MODEL_TENSOR.ATTN_V: (lw.v.weight, q),
                 gguf.MODEL_TENSOR.ATTN_OUT: (lw.o.weight, q),
                 gguf.MODEL_TENSOR.FFN_NORM: (lw.mlp_norm, None),
                 gguf.MODEL_TENSOR.FFN_GATE: (lw.gate.weight, q),
                 gguf.MODEL_TENSOR.FFN_UP: (lw.up.weight, q),
                 gguf.MODEL_TENSOR.FFN_DOWN: (lw.down.weight, q)}
        for kind, (value, qt) in names.items():
            _tensor(writer, gguf, t[kind].format(bid=i) + ".weight", value, qt)
        if cfg.qkv_bias:
            qb, kb = lw.q.bias, lw.k.bias
            if arch == "llama":
                qb, kb = _interleaved_rows(qb, cfg.heads), _interleaved_rows(kb, cfg.kv_heads)
            for kind, bias in ((gguf.MODEL_TENSOR.ATTN_Q, qb), (gguf.MODEL_TENSOR.ATTN_K, kb),
                               (gguf.MODEL_TENSOR.ATTN_V, lw.v.bias)):
                _tensor(writer, gguf, t[kind].format(bid=i) + ".bias", bias, None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
