"""unit_tvm.llm: Hugging Face decoders with a key/value cache, checked against the Hugging Face
model itself (random weights from a small config: nothing is downloaded)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from unit_tvm import llm  # noqa: E402

VOCAB = 256


def _model(kind="llama", layers=2, tied=False, seed=0):
    torch.manual_seed(seed)
    common = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                  max_position_embeddings=128, tie_word_embeddings=tied)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(**common, rope_theta=500000.0)
        model = transformers.LlamaForCausalLM(cfg)
    return model.eval()


def _hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(ids)[None])).logits[0].numpy()


def _rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def _cosine(a, b):
    return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))


IDS = np.random.default_rng(7).integers(0, VOCAB, 21)


@pytest.fixture(scope="module")
def llama():
    return _model()


@pytest.fixture(scope="module")
def llama_fp32(llama):
    return llm.compile(llama, context=32, prefill_lengths=(8,))


def _teacher_forced(lm, ids, first):
    """Logits after each position: a prefill of ids[:first], then one decode step per token."""
    lm.reset()
    rows = [lm.prefill(ids[:first]).logits]
    rows += [lm.decode(int(t)).logits for t in ids[first:]]
    return np.stack(rows)


def test_fp32_matches_hugging_face_within_1e4(llama, llama_fp32):
    # a 13-token prompt takes two prefill chunks (8 + 5 padded to 8), then decode steps
    want = _hf_logits(llama, IDS)[12:]
    got = _teacher_forced(llama_fp32, IDS, 13)
    assert _rel(got, want) < 1e-4


def test_decode_with_the_cache_equals_recomputing_the_sequence(llama_fp32):
    steps = _teacher_forced(llama_fp32, IDS[:12], 3)
    for i in range(3, 12):
        llama_fp32.reset()
        again = llama_fp32.prefill(IDS[:i + 1]).logits
        np.testing.assert_allclose(steps[i - 2], again, rtol=0, atol=1e-5 * np.abs(again).max())


def test_generate_is_hugging_face_greedy_generate(llama, llama_fp32):
    prompt = torch.as_tensor(IDS[None, :6])
    got = llama_fp32.generate(prompt, max_new_tokens=12)
    with torch.no_grad():
        want = llama.generate(prompt, max_new_tokens=12, do_sample=False)
    assert isinstance(got, torch.Tensor) and got.shape == want.shape
    assert torch.equal(got, want)
    as_numpy = llama_fp32.generate(IDS[:6], max_new_tokens=3)
    assert isinstance(as_numpy, np.ndarray) and as_numpy.shape == (1, 9)


@pytest.mark.parametrize("activations", ["per_token", "per_tensor"])
def test_int8_stays_close_to_hugging_face_fp32(llama, activations):
    report = []
    lm = llm.compile(llama, {"activations": activations}, context=32, prefill_lengths=(8,),
                     report=report)
    dense = [r for r in report if r[0].startswith("dense")]
    assert dense and all(r[1] for r in dense), dense  # every matmul with a weight tensorized
    want = _hf_logits(llama, IDS)[4:]
    got = _teacher_forced(lm, IDS, 5)
    cosines = [_cosine(g, w) for g, w in zip(got, want)]
    # measured: per token 0.99992-0.99995, per tensor 0.9998-0.9999
    assert min(cosines) > (0.9998 if activations == "per_token" else 0.999), cosines
    # greedy tokens agree wherever Hugging Face's top two logits are not a near-tie
    top2 = np.sort(want, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 0.02 * np.abs(want).max(axis=1)
    assert clear.any()
    assert (got.argmax(1) == want.argmax(1))[clear].all()


def test_qwen2_with_biases_and_tied_embeddings_matches(llama):
    model = _model("qwen2", layers=1, tied=True, seed=1)
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    lm = llm.compile(model, context=16, prefill_lengths=(4,))
    assert lm.config.qkv_bias and lm.config.tied_embeddings
    ids = IDS[:9]
    assert _rel(_teacher_forced(lm, ids, 6), _hf_logits(model, ids)[5:]) < 1e-4


def test_interleaved_rope_weights_give_the_same_logits():
    # the same model with q/k rows permuted to pairs (2i, 2i+1), as Meta's checkpoints hold them
    model = _model(layers=1, seed=2)
    want = _hf_logits(model, IDS[:7])
    d = 16  # head_dim
    order = np.stack([np.arange(d // 2), np.arange(d // 2) + d // 2], axis=1).reshape(-1)
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        for proj in (attn.q_proj, attn.k_proj):
            w = proj.weight.view(-1, d, proj.weight.shape[1])
            proj.weight.copy_(w[:, torch.as_tensor(order)].reshape(proj.weight.shape))
    lm = llm.compile(model, context=16, prefill_lengths=(4,), rope_layout="interleaved")
    assert _rel(_teacher_forced(lm, IDS[:7], 4), want[3:]) < 1e-4


def test_refusals_are_clear(llama, llama_fp32):
    with pytest.raises(TypeError, match="unknown quantize keys"):
        llm.compile(llama, {"bits": 4})
    with pytest.raises(ValueError, match="activations must be one of"):
        llm.compile(llama, {"activations": "per_block"})
    with pytest.raises(ValueError, match="rope_layout"):
        llm.compile(llama, rope_layout="spiral", context=8, prefill_lengths=())
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        llm.compile(gpt2)
    mistral = transformers.MistralForCausalLM(transformers.MistralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=VOCAB, sliding_window=8))
    with pytest.raises(ValueError, match="sliding window of 8"):
        llm.compile(mistral, context=16)
    llama_fp32.reset()
    with pytest.raises(ValueError, match="exceed the context"):
        llama_fp32.prefill(np.zeros(33, np.int64))
    with pytest.raises(ValueError, match="token ids"):
        llama_fp32.prefill([VOCAB])
    with pytest.raises(ValueError, match="batch 1"):
        llama_fp32.generate(np.zeros((2, 3), np.int64), 2)


def test_decode_profile_accounts_for_the_step(llama_fp32):
    from unit_tvm.llm.profile import decode_profile, table

    costs = decode_profile(llama_fp32, bandwidth_gbs=10.0, depth=4, steps=2)
    assert costs and abs(sum(c.share for c in costs) - 1.0) < 1e-6
    assert costs == sorted(costs, key=lambda c: -c.us)
    assert all(c.us > 0 and c.gbs > 0 and c.calls >= 1 for c in costs)
    assert costs[0].name in table(costs)
    # the decode step attends the cache through its own kernel (cache_attention.py)
    assert any("cache_attention" in c.name for c in costs)
    assert any(c.name.startswith("lm_head/") for c in costs)  # the head's kernels with it


def test_only_a_prompts_last_chunk_runs_the_head(llama_fp32):
    calls = []

    def count(func, symbol, before_run, ret_value, *args):
        if before_run and not symbol.startswith("vm."):
            calls.append(symbol)
        return 0

    head = llama_fp32.head_vm()
    head.set_instrument(count)
    try:
        llama_fp32.reset()
        llama_fp32.prefill(IDS[:5])  # one chunk
        once = len(calls)
        llama_fp32.reset()
        llama_fp32.prefill(IDS[:21])  # three chunks of 8
    finally:
        head.set_instrument(None)
    assert once > 0 and len(calls) == 2 * once


def test_prefill_chunk_profile_accounts_for_the_chunk(llama_fp32):
    from unit_tvm.llm.profile import step_profile

    costs = step_profile(llama_fp32, 8, bandwidth_gbs=10.0, depth=4, steps=2)
    assert costs and abs(sum(c.share for c in costs) - 1.0) < 1e-6
    assert any("cache_attention" in c.name for c in costs)  # a chunk's attention too
    assert any(c.name.startswith("unit_") for c in costs)  # its matmuls, tensorized
    with pytest.raises(ValueError, match="no step of 5 tokens"):
        step_profile(llama_fp32, 5, bandwidth_gbs=10.0)


def test_llama_cpp_runs_the_same_weights(tmp_path, llama):
    # bench-llm's baseline is only fair if the GGUF file holds this model: llama.cpp's logits
    # on it (Q8_0) stay close to Hugging Face's (skipped without the benchmark extra)
    pytest.importorskip("gguf")
    llama_cpp = pytest.importorskip("llama_cpp")
    from unit_tvm.bench import gguf_export

    path = gguf_export.write(llama, tmp_path / "m.gguf", "q8_0")
    engine = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_threads=2, logits_all=True,
                             verbose=False)
    ids = [int(t) for t in IDS[:9]]
    engine.eval(ids)
    got = np.asarray(engine.scores[:len(ids)], np.float32)
    want = _hf_logits(llama, IDS[:9])
    assert min(_cosine(g, w) for g, w in zip(got, want)) > 0.99


def test_openvino_genai_runs_the_same_weights(tmp_path, llama):
    # bench-llm's OpenVINO GenAI baseline reads the same GGUF file: each token it generates
    # greedily is the Hugging Face model's choice there, within Q8_0's rounding of the logits
    # (skipped without the benchmark extra)
    pytest.importorskip("gguf")
    pytest.importorskip("openvino_genai")
    from unit_tvm.bench import gguf_export
    from unit_tvm.bench.llm import OpenVinoGenAiEngine

    path = gguf_export.write(llama, tmp_path / "m.gguf", "q8_0")
    engine = OpenVinoGenAiEngine("OpenVINO GenAI Q8_0", path, threads=2, weight_bytes=1.0)
    prompt = IDS[:9]
    result, _ = engine.generate(prompt, 8)
    new = [int(t) for t in result.tokens[0]]
    assert len(new) == 8
    logits = _hf_logits(llama, np.concatenate([prompt, new]))[len(prompt) - 1:-1]
    for row, token in zip(logits, new):
        spread = row.max() - row.min()
        assert row[token] >= row.max() - 0.02 * spread, (token, int(row.argmax()))


def test_genai_is_left_out_where_the_isa_is_held(monkeypatch, llama, capsys):
    # OpenVINO GenAI finds no primitive for its int8-weight matmuls under ONEDNN_MAX_CPU_ISA
    # below the CPU's: bench-llm leaves it out with the reason rather than crash mid-run
    from unit_tvm.bench import llama_isa
    from unit_tvm.bench.llm import gguf_engines

    monkeypatch.setenv("UNIT_TVM_ISA", "avx2")
    if not llama_isa.is_held("avx2"):
        pytest.skip("this CPU is at most AVX2: the level holds nothing back")
    assert gguf_engines(llama, (), threads=2, context=64, genai=("q8_0",)) == []
    assert "OpenVINO GenAI left out at ISA level avx2" in capsys.readouterr().err
