"""unit_tvm.llm.cache_attention: the decode step's attention over the valid cache slots only,
against float64 numpy, at the lengths where its blocks begin and end, on each x86 class this
host can run; and the decode step's use of it."""

import numpy as np
import pytest
import tvm

from unit_tvm import lowering
from unit_tvm.llm import cache_attention
from unit_tvm.target import host, restricted

from .conftest import tiny_decoder, x86_classes


def _reference(q, k, v, nk, nv, n):
    """Row g * T + t: softmax(q [k[:n], new_k[:t + 1]]^T / sqrt(d)) [v[:n], new_v[:t + 1]], in
    float64."""
    tokens = nk.shape[2]
    out = np.zeros(q.shape)
    for row in range(q.shape[1]):
        t = row % tokens
        keys = np.concatenate([k[:, :, :n], nk[:, :, :t + 1]], 2).astype(np.float64)
        values = np.concatenate([v[:, :n], nv[:, :t + 1]], 1).astype(np.float64)
        s = np.einsum("hd,hdj->hj", q[:, row].astype(np.float64), keys) / np.sqrt(q.shape[2])
        p = np.exp(s - s.max(-1, keepdims=True))
        out[:, row] = np.einsum("hj,hjd->hd", p / p.sum(-1, keepdims=True), values)
    return out


@pytest.mark.parametrize("name,target", x86_classes(),
                         ids=[n for n, _ in x86_classes()])
@pytest.mark.parametrize("group,head_dim,tokens", [(4, 64, 1), (3, 16, 1), (2, 64, 8),
                                                   (4, 32, 64), (1, 128, 1), (7, 80, 1),
                                                   (1, 80, 64)])
def test_matches_float64_at_every_block_edge(name, target, group, head_dim, tokens):
    # decode (one token) and prefill chunks (own tokens causal, in one block or several);
    # grouped and plain multi-head attention, head_dim not a power of two
    kv_heads, context = 3, 128
    shape = cache_attention.Shape(kv_heads, group, head_dim, context, tokens)
    tiles = cache_attention.tiles(shape, target)
    func = cache_attention.for_step(shape, target)
    assert func is not None and tiles.lanes <= context
    lib = lowering.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                         target)
    rng = np.random.default_rng(3)
    rows = group * tokens
    q = rng.standard_normal((kv_heads, rows, head_dim), np.float32) * 2
    k = rng.standard_normal((kv_heads, head_dim, context), np.float32)
    v = rng.standard_normal((kv_heads, context, head_dim), np.float32)
    nk = rng.standard_normal((kv_heads, head_dim, tokens), np.float32)
    nv = rng.standard_normal((kv_heads, tokens, head_dim), np.float32)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in (q, k, v, nk, nv)]
    lanes = tiles.lanes
    for n in sorted({0, 1, lanes - 1, lanes, lanes + 1, context - tokens}):
        out = tvm.runtime.tensor(np.zeros((kv_heads, rows, head_dim), np.float32), dev)
        lib["main"](*args, tvm.runtime.tensor(np.array([n], np.int32), dev), out)
        np.testing.assert_allclose(out.numpy(), _reference(q, k, v, nk, nv, n), rtol=1e-5,
                                   atol=1e-5, err_msg=f"{name}: {n} valid slots")


def test_tiles_fit_the_register_file():
    avx2, native = restricted("avx2"), host()
    decode = cache_attention.Shape(8, 4, 64, 1024, 1)
    t = cache_attention.tiles(decode, avx2)
    assert t.rows == 4 and t.lanes == 16 and 4 * t.value_chunk // 8 <= 8  # <= 8 ymm
    chunk = cache_attention.tiles(decode._replace(tokens=128), avx2)
    assert chunk.rows == 4 and chunk.own_lanes == 16  # 4 rows x 2 ymm: half of 16
    if cache_attention.float_lanes(native) == 16:
        t = cache_attention.tiles(decode, native)
        assert t.lanes == 32 and t.value_chunk == 64
        chunk = cache_attention.tiles(decode._replace(tokens=128), native)
        assert chunk.rows == 8 and chunk.value_chunk == 32  # 8 rows x 2 zmm: half of 32
    # 40 slots: no whole 32-slot blocks; 40 own tokens: neither whole blocks nor one
    assert cache_attention.for_step(decode._replace(context=40), native) is None
    assert cache_attention.for_step(decode._replace(tokens=40), native) is None


def test_decode_step_reads_the_cache_through_the_kernel():
    from unit_tvm.llm import graph

    cfg, w = tiny_decoder(layers=1, vocab=256)
    decode = graph.step_module(cfg, w, 1, 64, target=host())
    prefill = graph.step_module(cfg, w, 8, 64, target=host())
    odd = graph.step_module(cfg, w, 1, 40, target=host())

    def kernels(mod):
        return {str(gv.name_hint) for gv in mod.functions} & {"cache_attention"}

    assert kernels(decode) == kernels(prefill) == {"cache_attention"}
    assert not kernels(odd)  # the matmul form
