"""A step's attention over the key/value cache, reading only the cache's valid slots.

T new tokens' queries attend the first kv_len cache slots and, causally, the step's own keys /
values. Written as a matmul over the whole cache, a masked softmax and a second matmul, every
step reads and multiplies all `context` slots of every layer's cache whatever kv_len is: on
Llama-3.2-1B's shapes with 1024 slots, 17% of a decode step and 26% of a 128-token prefill
chunk. Here kv_len bounds the loops (a value read at run time), and a block of query rows
stops at the last own token it may see, so a step costs what the sequence holds.

One parallel task per key/value head and block of query rows (the `group` rows of a head in a
decode step, consecutive tokens of one query head in a prefill chunk, as many as keep the
scores' accumulators within half the register file), so that each key and value vector loaded
serves every row of the block:
1. scores: blocks of `lanes` slots, one accumulator per row and vector, over head_dim (keys
   are [kv_heads, head_dim, slots]: a block is a contiguous load per dimension); slots past
   kv_len, or own tokens after the row's, are masked;
2. the softmax over the visited blocks, with fastmath's vectorizable exp;
3. the weighted sum of value rows ([kv_heads, slots, head_dim]: one contiguous row per slot),
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


class Shape(NamedTuple):
    """The attention a kernel computes: per key/value head, group x tokens query rows."""

    kv_heads: int
    group: int
    head_dim: int
    context: int  # cache slots
    tokens: int  # new tokens of the step (1: decode)


class Tiles(NamedTuple):
    """cache_attention_func's blocks on a target."""

    rows: int  # query rows per task
    lanes: int  # cache slots per score block: 2 vectors per row
    own_lanes: int  # own-token slots per score block
    value_chunk: int  # head_dim columns per pass of the weighted sum


def tiles(shape: Shape, target) -> Tiles:
    """Blocks whose accumulators take at most half the register file: a task's rows x 2
    vectors of scores (two independent chains per row hide the multiply-add's latency), its
    rows x the widest divisor of head_dim that fits in the weighted sum. A prefill task takes
    as many rows as that allows (8 with 32 registers, 4 with 16): each key vector loaded
    serves every row (on Zen 5, 8 rows ran a 128-token chunk's attention 23% faster than 4)."""
    lanes = float_lanes(target)
    half = vector_registers(target) // 2
    rows = shape.group if shape.tokens == 1 else largest_divisor(shape.tokens, half // 2)
    budget = max(half // rows, 1) * lanes
    own = 2 * lanes if shape.tokens % (2 * lanes) == 0 else shape.tokens
    return Tiles(rows, 2 * lanes, own, largest_divisor(shape.head_dim, budget))


def largest_divisor(n: int, limit: int) -> int:
    """The largest divisor of n that is at most limit (1 at least)."""
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def supported(shape: Shape, t: Tiles) -> bool:
    """Whether cache_attention_func takes `shape` in blocks `t`: whole score blocks of cache
    slots, and own tokens in whole blocks or one block of at most `lanes`."""
    return (shape.context % t.lanes == 0 and shape.tokens % t.own_lanes == 0
            and t.own_lanes <= t.lanes)


def for_step(shape: Shape, target) -> tvm.tirx.PrimFunc | None:
    """The step's kernel on `target`, or None where its shape does not divide into the
    blocks (the step then attends the whole cache through matmuls)."""
    target = as_target(target)
    if not is_cpu(target):
        return None
    t = tiles(shape, target)
    return cache_attention_func(shape, t) if supported(shape, t) else None


def cache_attention_func(shape: Shape, t: Tiles) -> tvm.tirx.PrimFunc:
    """PrimFunc(q [kv_heads, group * tokens, head_dim] (row g * tokens + token), k_cache
    [kv_heads, head_dim, context], v_cache [kv_heads, context, head_dim], new_k [kv_heads,
    head_dim, tokens], new_v [kv_heads, tokens, head_dim], kv_len [1] int32, out like q):
    softmax(q k^T / sqrt(head_dim)) v over the first kv_len cache slots and the new tokens up
    to each row's own."""
    if not supported(shape, t):
        raise ValueError(f"cache_attention_func: {shape} does not divide into {t}")
    h_, g_, d_, c_, n_t = shape
    rows = g_ * n_t
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("cache_attention")
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
            q = T.arg("q", T.buffer((h_, rows, d_), _F32))
            k = T.arg("k_cache", T.buffer((h_, d_, c_), _F32))
            v = T.arg("v_cache", T.buffer((h_, c_, d_), _F32))
            nk = T.arg("new_k", T.buffer((h_, d_, n_t), _F32))
            nv = T.arg("new_v", T.buffer((h_, n_t, d_), _F32))
            kv_len = T.arg("kv_len", T.buffer((1,), "int32"))
            out = T.arg("out", T.buffer((h_, rows, d_), _F32))
            with T.sblock("root"):
                with T.parallel(0, h_ * (rows // t.rows)) as task:
                    task_of = _Task(task // (rows // t.rows), task % (rows // t.rows) * t.rows,
                                    tirx.max(tirx.min(kv_len[0], c_), 0), shape, t)
                    scores = T.alloc_buffer((t.rows, c_ + n_t), _F32, scope="global")
                    acc = T.alloc_buffer((t.rows, max(t.lanes, t.value_chunk)), _F32,
                                         scope="local")
                    stats = T.alloc_buffer((t.rows, 2), _F32, scope="local")  # max, sum
                    _scores(task_of, q, k, nk, scores, acc)
                    _softmax(task_of, scores, stats, acc)
                    _weighted_sum(task_of, v, nv, out, scores, stats, acc)
    return ib.get()


class _Task(NamedTuple):
    """One parallel task: key/value head `head`, query rows [row, row + tiles.rows), the
    cache's valid slots `n` (an expression of kv_len)."""

    head: tvm.ir.Expr
    row: tvm.ir.Expr
    n: tvm.ir.Expr
    shape: Shape
    tiles: Tiles

    def token(self, r) -> tvm.ir.Expr:
        """The new token whose query is the task's row r (0 in a decode step)."""
        return (self.row + r) % self.shape.tokens

    def own_blocks(self) -> tvm.ir.Expr:
        """Own-token score blocks the task's rows see: up to its last row's token."""
        return self.token(self.tiles.rows - 1) // self.tiles.own_lanes + 1

    def cache_blocks(self) -> tvm.ir.Expr:
        return (self.n + self.tiles.lanes - 1) // self.tiles.lanes


def _score_block(task, q, keys, at, slot_of, visible, scores, acc, lanes):
    """scores[r, slot_of(lane)] = q[row r] . keys[head, :, at(lane)] / sqrt(head_dim) where
    visible(r, lane), else _NEG: one accumulator vector per row over head_dim."""
    tr, d_ = task.tiles.rows, task.shape.head_dim
    with T.unroll(0, tr) as r:
        with T.vectorized(0, lanes) as lane:
            T.buffer_store(acc, tirx.const(0.0, _F32), [r, lane])
    with T.serial(0, d_) as d:
        with T.unroll(0, tr) as r:
            with T.vectorized(0, lanes) as lane:
                T.buffer_store(acc, acc[r, lane] + q[task.head, task.row + r, d]
                               * keys[task.head, d, at(lane)], [r, lane])
    scale = tirx.const(d_ ** -0.5, _F32)
    with T.unroll(0, tr) as r:
        with T.vectorized(0, lanes) as lane:
            T.buffer_store(scores, tirx.Select(visible(r, lane), acc[r, lane] * scale,
                                               tirx.const(_NEG, _F32)), [r, slot_of(lane)])


def _scores(task, q, k, nk, scores, acc):
    """The task's scores over the valid cache slots' blocks (slots past n masked) and over
    the own tokens' blocks it sees (tokens after each row's masked), at slot context + i."""
    t, c_ = task.tiles, task.shape.context
    with T.serial(0, task.cache_blocks()) as block:
        base = block * t.lanes
        _score_block(task, q, k, lambda lane: base + lane, lambda lane: base + lane,
                     lambda r, lane: base + lane < task.n, scores, acc, t.lanes)
    with T.serial(0, task.own_blocks()) as block:
        base = block * t.own_lanes
        _score_block(task, q, nk, lambda lane: base + lane, lambda lane: c_ + base + lane,
                     lambda r, lane: base + lane <= task.token(r), scores, acc, t.own_lanes)


def _over_blocks(task, body):
    """body(slot, lanes, lane) over every slot of the visited blocks, vectorized."""
    t, c_ = task.tiles, task.shape.context
    with T.serial(0, task.cache_blocks()) as block:
        with T.vectorized(0, t.lanes) as lane:
            body(block * t.lanes + lane, lane)
    with T.serial(0, task.own_blocks()) as block:
        with T.vectorized(0, t.own_lanes) as lane:
            body(c_ + block * t.own_lanes + lane, lane)


def _softmax(task, scores, stats, acc):
    """Per row: stats = (max, sum of exp(s - max)) and scores = exp(s - max) over the visited
    blocks, as vectors of lanes reduced at the end (masked slots' exps are 0: fastmath's exp
    flushes below)."""
    t = task.tiles
    with T.serial(0, t.rows) as r:
        with T.vectorized(0, t.lanes) as lane:
            T.buffer_store(acc, tirx.const(_NEG, _F32), [r, lane])
        _over_blocks(task, lambda slot, lane: T.buffer_store(
            acc, tirx.max(acc[r, lane], scores[r, slot]), [r, lane]))
        T.buffer_store(stats, acc[r, 0], [r, 0])
        with T.serial(1, t.lanes) as lane:
            T.buffer_store(stats, tirx.max(stats[r, 0], acc[r, lane]), [r, 0])
        with T.vectorized(0, t.lanes) as lane:
            T.buffer_store(acc, tirx.const(0.0, _F32), [r, lane])

        def exp_and_sum(slot, lane):
            # an expression, not a value: store it once, then read the store back
            T.buffer_store(scores, fast_exp(scores[r, slot] - stats[r, 0]), [r, slot])
            T.buffer_store(acc, acc[r, lane] + scores[r, slot], [r, lane])

        _over_blocks(task, exp_and_sum)
        T.buffer_store(stats, tirx.const(0.0, _F32), [r, 1])
        with T.serial(0, t.lanes) as lane:
            T.buffer_store(stats, stats[r, 1] + acc[r, lane], [r, 1])


def _weighted_sum(task, v, nv, out, scores, stats, acc):
    """out[row r] = (sum over valid slots and seen own tokens of p[r, slot] v[slot]) / sum,
    head_dim in chunks (own tokens after a row's have p = 0)."""
    t, c_ = task.tiles, task.shape.context
    chunk = t.value_chunk
    with T.serial(0, task.shape.head_dim // chunk) as part:
        col = part * chunk
        with T.unroll(0, t.rows) as r:
            with T.vectorized(0, chunk) as lane:
                T.buffer_store(acc, tirx.const(0.0, _F32), [r, lane])
        for values, count, offset in ((v, task.n, 0), (nv, task.token(t.rows - 1) + 1, c_)):
            with T.serial(0, count) as j:
                with T.unroll(0, t.rows) as r:
                    with T.vectorized(0, chunk) as lane:
                        T.buffer_store(acc, acc[r, lane] + scores[r, offset + j]
                                       * values[task.head, j, col + lane], [r, lane])
        with T.unroll(0, t.rows) as r:
            with T.vectorized(0, chunk) as lane:
                T.buffer_store(out, acc[r, lane] / stats[r, 1],
                               [task.head, task.row + r, col + lane])
