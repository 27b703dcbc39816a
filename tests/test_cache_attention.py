"""unit_tvm.llm.cache_attention: the decode step's attention over the valid cache slots only,
against float64 numpy, at the lengths where its blocks begin and end, on each x86 class this
host can run; and the decode step's use of it."""

import numpy as np
import pytest
import tvm

from unit_tvm import lowering
from unit_tvm.llm import cache_attention
from unit_tvm.target import features, host, is_host, restricted


def _reference(q, k, v, nk, nv, n):
    """softmax(q [k[:n], new_k]^T / sqrt(d)) [v[:n], new_v], in float64."""
    keys = np.concatenate([k[:, :, :n], nk], 2).astype(np.float64)
    values = np.concatenate([v[:, :n], nv], 1).astype(np.float64)
    s = np.einsum("hgd,hdj->hgj", q.astype(np.float64), keys) / np.sqrt(q.shape[2])
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("hgj,hjd->hgd", p / p.sum(-1, keepdims=True), values)


def _targets():
    """This host, and the AVX2 class where the host has more (the blocks differ)."""
    out = [("native", host())]
    avx2 = restricted("avx2")
    if is_host(avx2) and "avx512f" in features(host()):
        out.append(("avx2", avx2))
    return out


@pytest.mark.parametrize("name,target", _targets(), ids=[n for n, _ in _targets()])
@pytest.mark.parametrize("group,head_dim", [(4, 64), (3, 16)])
def test_matches_float64_at_every_block_edge(name, target, group, head_dim):
    kv_heads, context = 3, 128
    tiles = cache_attention.tiles(group, head_dim, target)
    func = cache_attention.for_step(kv_heads, group, head_dim, context, target)
    assert func is not None and tiles.lanes <= context
    lib = lowering.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                         target)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((kv_heads, group, head_dim), np.float32) * 2
    k = rng.standard_normal((kv_heads, head_dim, context), np.float32)
    v = rng.standard_normal((kv_heads, context, head_dim), np.float32)
    nk = rng.standard_normal((kv_heads, head_dim, 1), np.float32)
    nv = rng.standard_normal((kv_heads, 1, head_dim), np.float32)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in (q, k, v, nk, nv)]
    lanes = tiles.lanes
    for n in sorted({0, 1, lanes - 1, lanes, lanes + 1, context - 1, context}):
        out = tvm.runtime.tensor(np.zeros((kv_heads, group, head_dim), np.float32), dev)
        lib["main"](*args, tvm.runtime.tensor(np.array([n], np.int32), dev), out)
        np.testing.assert_allclose(out.numpy(), _reference(q, k, v, nk, nv, n), rtol=1e-5,
                                   atol=1e-5, err_msg=f"{name}: {n} valid slots")


def test_tiles_fit_the_register_file():
    avx2, native = restricted("avx2"), host()
    t = cache_attention.tiles(4, 64, avx2)
    assert t.lanes == 16 and 4 * t.value_chunk // 8 <= 8  # 8-lane ymm: at most 8 accumulators
    if cache_attention.float_lanes(native) == 16:
        t = cache_attention.tiles(4, 64, native)
        assert t.lanes == 32 and t.value_chunk == 64
    assert cache_attention.for_step(2, 4, 64, 40, native) is None  # 40 slots: no 32-slot block


def test_decode_step_reads_the_cache_through_the_kernel():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from unit_tvm.llm import config, graph, weights

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)).eval()
    cfg, w = config.from_hf(model), weights.from_hf(model)
    decode = graph.step_module(cfg, w, 1, 64, target=host())
    prefill = graph.step_module(cfg, w, 8, 64, target=host())
    odd = graph.step_module(cfg, w, 1, 40, target=host())
    names = {str(gv.name_hint) for gv in decode.functions}
    assert "cache_attention" in names
    assert "cache_attention" not in {str(gv.name_hint) for gv in prefill.functions}
    assert "cache_attention" not in {str(gv.name_hint) for gv in odd.functions}
