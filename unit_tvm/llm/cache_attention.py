"""The decode step's attention over the key/value cache, reading only the cache's valid slots.

One new token's queries attend the first kv_len cache slots and the token's own key / value.
Written as a matmul over the whole cache, a masked softmax and a second matmul (graph.py's form
for prefill chunks), every step reads all `context` slots of every layer's cache whatever
kv_len is: on Llama-3.2-1B's shapes with 1024 slots, ~15% of a decode step. Here kv_len bounds
the loops (a value read at run time), so a step costs what the sequence so far holds.

One parallel iteration per key/value head, its `group` query rows together so that each key
and value vector loaded serves them all:
1. scores: blocks of `lanes` cache slots, one vector accumulator per query row, over head_dim
   (the key cache is [kv_heads, head_dim, context]: a block is one contiguous load per
   dimension); the last block's slots past kv_len are masked;
2. the softmax over those scores and the token's own score, with fastmath's vectorizable exp;
3. the weighted sum of value rows ([kv_heads, context, head_dim]: one contiguous row per slot),
   head_dim in chunks whose accumulators fit the register file.
"""

from typing import NamedTuple

import tvm
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from ..fastmath import exp as fast_exp
from ..target import as_target, float_lanes, is_cpu, vector_registers

_F32 = "float32"
_NEG = -3.0e38  # below any score; exp of (it - max) is 0


class Tiles(NamedTuple):
    """cache_attention_func's vector blocks on a target."""

    lanes: int  # cache slots per score block: 2 vectors per query row
    value_chunk: int  # head_dim columns per pass of the weighted sum


def tiles(group: int, head_dim: int, target) -> Tiles:
    """Blocks whose accumulators take at most half the register file: the scores' `group` x 2
    vectors (two independent chains per row hide the multiply-add's latency), the weighted
    sum's `group` rows x the widest divisor of head_dim that fits."""
    lanes = float_lanes(target)
    budget = max(vector_registers(target) // 2 // group, 1) * lanes
    chunk = max((d for d in range(1, head_dim + 1) if head_dim % d == 0 and d <= budget))
    return Tiles(2 * lanes, chunk)


def supported(context: int, lanes: int) -> bool:
    """Whether cache_attention_func takes a cache of `context` slots in blocks of `lanes`."""
    return context % lanes == 0


def for_step(kv_heads: int, group: int, head_dim: int, context: int,
             target) -> tvm.tirx.PrimFunc | None:
    """The decode step's kernel on `target`, or None where a cache of `context` slots does not
    divide into its blocks (the step then attends the whole cache through matmuls)."""
    target = as_target(target)
    t = tiles(group, head_dim, target)
    if not is_cpu(target) or not supported(context, t.lanes):
        return None
    return cache_attention_func(kv_heads, group, head_dim, context, t.lanes, t.value_chunk)


def cache_attention_func(kv_heads: int, group: int, head_dim: int, context: int,
                         lanes: int, value_chunk: int) -> tvm.tirx.PrimFunc:
    """PrimFunc(q [kv_heads, group, head_dim], k_cache [kv_heads, head_dim, context],
    v_cache [kv_heads, context, head_dim], new_k [kv_heads, head_dim, 1], new_v [kv_heads, 1,
    head_dim], kv_len [1] int32, out [kv_heads, group, head_dim]): softmax(q k^T / sqrt(head_dim))
    v over the first kv_len cache slots and the new key / value. lanes: cache slots per score
    block (a multiple of the vector width: context must be a multiple of it); value_chunk:
    head_dim columns accumulated at once in the weighted sum (a divisor of head_dim)."""
    if not supported(context, lanes) or head_dim % value_chunk:
        raise ValueError(f"cache_attention_func: context {context} must be a multiple of "
                         f"lanes {lanes}, head_dim {head_dim} of value_chunk {value_chunk}")
    h_, g_, d_, c_ = kv_heads, group, head_dim, context
    scale = tirx.const(head_dim ** -0.5, _F32)
    zero = tirx.const(0.0, _F32)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("cache_attention")
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
            q = T.arg("q", T.buffer((h_, g_, d_), _F32))
            k = T.arg("k_cache", T.buffer((h_, d_, c_), _F32))
            v = T.arg("v_cache", T.buffer((h_, c_, d_), _F32))
            nk = T.arg("new_k", T.buffer((h_, d_, 1), _F32))
            nv = T.arg("new_v", T.buffer((h_, 1, d_), _F32))
            kv_len = T.arg("kv_len", T.buffer((1,), "int32"))
            out = T.arg("out", T.buffer((h_, g_, d_), _F32))
            with T.sblock("root"):
                with T.parallel(0, h_) as h:
                    n = tirx.max(tirx.min(kv_len[0], c_), 0)
                    scores = T.alloc_buffer((g_, c_ + 1), _F32, scope="global")
                    acc = T.alloc_buffer((g_, max(lanes, value_chunk)), _F32, scope="local")
                    stats = T.alloc_buffer((g_, 2), _F32, scope="local")  # max, sum
                    _scores(q, k, nk, h, n, scores, acc, lanes, scale, zero)
                    _softmax(scores, stats, acc, h, n, lanes)
                    _weighted_sum(v, nv, out, h, n, scores, stats, acc, value_chunk, zero)
    return ib.get()


def _scores(q, k, nk, h, n, scores, acc, lanes, scale, zero):
    """scores[g, j] = q[h, g] . k[h, :, j] * scale for j < n (blocks of `lanes` slots, the last
    one's slots past n set to _NEG), and scores[g, context] = the new key's."""
    g_, d_ = q.shape[1], q.shape[2]
    c_ = k.shape[2]
    with T.serial(0, (n + lanes - 1) // lanes) as block:
        with T.unroll(0, g_) as g:
            with T.vectorized(0, lanes) as lane:
                T.buffer_store(acc, zero, [g, lane])
        with T.serial(0, d_) as d:
            with T.unroll(0, g_) as g:
                with T.vectorized(0, lanes) as lane:
                    T.buffer_store(acc, acc[g, lane] + q[h, g, d] * k[h, d, block * lanes + lane],
                                   [g, lane])
        with T.unroll(0, g_) as g:
            with T.vectorized(0, lanes) as lane:
                slot = block * lanes + lane
                T.buffer_store(scores, tirx.Select(slot < n, acc[g, lane] * scale,
                                                   tirx.const(_NEG, _F32)), [g, slot])
    with T.serial(0, g_) as g:
        T.buffer_store(acc, zero, [g, 0])
        with T.serial(0, d_) as d:
            T.buffer_store(acc, acc[g, 0] + q[h, g, d] * nk[h, d, 0], [g, 0])
        T.buffer_store(scores, acc[g, 0] * scale, [g, c_])


def _softmax(scores, stats, acc, h, n, lanes):
    """Per query row: stats = (max, sum of exp(s - max)) and scores[g, j] = exp(s - max) over
    the valid slots' blocks and the new key's (slot context). Vectors of `lanes` slots, reduced
    across lanes at the end; the masked tail's exps are 0 (fastmath's exp flushes below)."""
    g_, c_ = scores.shape[0], scores.shape[1] - 1
    blocks = (n + lanes - 1) // lanes
    with T.serial(0, g_) as g:
        with T.vectorized(0, lanes) as lane:
            T.buffer_store(acc, scores[g, c_], [g, lane])
        with T.serial(0, blocks) as block:
            with T.vectorized(0, lanes) as lane:
                T.buffer_store(acc, tirx.max(acc[g, lane], scores[g, block * lanes + lane]),
                               [g, lane])
        T.buffer_store(stats, acc[g, 0], [g, 0])
        with T.serial(1, lanes) as lane:
            T.buffer_store(stats, tirx.max(stats[g, 0], acc[g, lane]), [g, 0])
        with T.vectorized(0, lanes) as lane:
            T.buffer_store(acc, tirx.const(0.0, _F32), [g, lane])
        with T.serial(0, blocks) as block:
            with T.vectorized(0, lanes) as lane:
                slot = block * lanes + lane
                # an expression, not a value: store it once, then read the store back
                T.buffer_store(scores, fast_exp(scores[g, slot] - stats[g, 0]), [g, slot])
                T.buffer_store(acc, acc[g, lane] + scores[g, slot], [g, lane])
        T.buffer_store(scores, fast_exp(scores[g, c_] - stats[g, 0]), [g, c_])
        T.buffer_store(stats, scores[g, c_], [g, 1])
        with T.serial(0, lanes) as lane:
            T.buffer_store(stats, stats[g, 1] + acc[g, lane], [g, 1])


def _weighted_sum(v, nv, out, h, n, scores, stats, acc, chunk, zero):
    """out[h, g] = (sum_j p[g, j] v[h, j] + p[g, own] new_v[h]) / sum, head_dim in chunks."""
    g_, d_ = out.shape[1], out.shape[2]
    c_ = v.shape[1]
    with T.serial(0, d_ // chunk) as part:
        with T.unroll(0, g_) as g:
            with T.vectorized(0, chunk) as lane:
                T.buffer_store(acc, scores[g, c_] * nv[h, 0, part * chunk + lane], [g, lane])
        with T.serial(0, n) as j:
            with T.unroll(0, g_) as g:
                with T.vectorized(0, chunk) as lane:
                    T.buffer_store(acc, acc[g, lane] + scores[g, j] * v[h, j, part * chunk + lane],
                                   [g, lane])
        with T.unroll(0, g_) as g:
            with T.vectorized(0, chunk) as lane:
                T.buffer_store(out, acc[g, lane] / stats[g, 1], [h, g, part * chunk + lane])
