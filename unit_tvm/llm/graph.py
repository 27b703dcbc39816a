"""One step of a decoder as a Relax function: T new tokens at positions pos[0..T), attending the
key/value cache's first kv_len slots and themselves (causally).

The same function serves prefill (T = a prompt chunk, padded) and decode (T = 1): shapes are
fixed per T, so each T is compiled once. On a CPU a step attends the cache through
cache_attention.py's kernel, which reads only the first kv_len slots; elsewhere (or where its
blocks do not divide the shapes) through matmuls over the whole cache and a masked softmax.
Inputs, in order: the tokens' embeddings [T, hidden], their positions [T] (int32), kv_len [1]
(int32: valid cache slots), last [1] (int32: the row whose hidden state is returned), then every
layer's key cache ([kv_heads, head_dim, context]: the scores' right operand as it lies), then
every layer's value cache ([kv_heads, context, head_dim]). Output: (the hidden state of row
`last` [1, hidden], new keys [layers, kv_heads, head_dim, T], new values [layers, kv_heads, T,
head_dim]); the runtime writes them into the cache (runtime.py), so the cache is never copied by
the step. The final norm and the LM head are a module of their own (head_module), compiled
once for every step and run only where logits are wanted: a prompt's chunks before its last do
without (on Llama-3.2-1B's shapes the head reads 262 MB of int8 weights per call).

Matmuls with weights are `matmul(x, W^T)` on float32 constants — the form unit_tvm.compile
tensorizes; with `ActivationQuantization` each one reads its input through a uint8 quantize /
dequantize pair: the QDQ form relax/quantization/qdq.py computes in int8 with exactly that
activation scale, the weights quantized per output channel by the quantizer's own policy (the
host's instruction decides their form, as for any model).
"""

from typing import NamedTuple

import numpy as np
import tvm
from tvm import relax

from . import cache_attention, row_scale
from .config import DecoderConfig
from .weights import LM_HEAD_INPUT, DecoderWeights, Linear, input_name

_NEG = -1e30  # additive mask: exp underflows to 0, and no row is ever fully masked


class ActivationQuantization(NamedTuple):
    """uint8 quantization of one matmul input (scale, zero point), per tensor."""

    scale: float
    zero_point: int


class MatmulInput(NamedTuple):
    """An input as the matmuls with weights read it."""

    x: relax.Expr  # float32; through a uint8 quantize / dequantize pair in the int8 form
    rows: relax.Expr | None  # per-token row scales [rows, 1] the product is multiplied by


# an input quantized per token at run time (its scale is the row's largest magnitude / 127)
PER_TOKEN = ActivationQuantization(0.0, 128)


def _const(value, dtype="float32") -> relax.Expr:
    return relax.const(np.ascontiguousarray(np.asarray(value, dtype)), dtype)


class _Builder:
    """Emits one step's bindings into a BlockBuilder."""

    def __init__(self, bb, config: DecoderConfig, weights: DecoderWeights, tokens: int,
                 context: int, act_q: dict | None, cache_kernel=None, target=None):
        self.bb, self.c, self.w, self.t, self.ctx = bb, config, weights, tokens, context
        # GlobalVar of cache_attention's kernel (a step on a CPU), or None (masked matmuls)
        self.cache_kernel = cache_kernel
        # input name -> ActivationQuantization, or PER_TOKEN; None: float32 matmuls
        self.act_q = act_q
        self.target = target  # where the step runs: row_scale's kernel on a CPU
        self._inputs: dict = {}  # input name -> MatmulInput (q / k / v, gate / up share one)
        self._row_kernels: dict = {}  # row_scale.RowScale -> GlobalVar, or None (Relax ops)

    def emit(self, expr):
        return self.bb.emit(expr)

    def matmul_input(self, x, name: str, norm=None) -> MatmulInput:
        """x (after the RMSNorm of weight `norm`, when given) as the matmuls of input `name`
        read it: float32, through a uint8 quantize / dequantize pair per tensor, or quantized
        per token (per_token). Computed once per input name."""
        if name not in self._inputs:
            q = None if self.act_q is None else self.act_q[name]
            if q is PER_TOKEN:
                self._inputs[name] = self.per_token(x, norm)
            else:
                x = x if norm is None else self.norm(x, norm)
                if q is not None:
                    op = relax.op
                    scale, zero_point = _const(q.scale), _const(q.zero_point, "int32")
                    x = self.emit(op.quantize(x, scale, zero_point, -1, "uint8"))
                    x = self.emit(op.dequantize(x, scale, zero_point, -1, "float32"))
                self._inputs[name] = MatmulInput(x, None)
        return self._inputs[name]

    def linear(self, inp: MatmulInput, lin: Linear):
        """inp @ W^T (+ bias), the weight a float32 constant."""
        op = relax.op
        y = self.emit(op.matmul(inp.x, _const(lin.weight.T)))
        if inp.rows is not None:
            y = self.emit(op.multiply(y, inp.rows))
        if lin.bias is not None:
            y = self.emit(op.add(y, _const(lin.bias)))
        return y

    def per_token(self, x, norm=None) -> MatmulInput:
        """x (normed by `norm` when given) divided by its rows' scales, through an exact
        uint8 pair, and the row scales [rows, 1]: each token quantized symmetrically to
        [-127, 127] at run time (as llama.cpp quantizes its activations) — the pair's scale 1
        and zero point 128 are constants, so the int8 kernel takes it as any QDQ input; the
        matmul's result is multiplied back per row. On a CPU row_scale's one kernel computes
        the norm, the scales and the division; elsewhere Relax ops do."""
        op = relax.op
        rows, width = (int(d) for d in x.ty.shape)
        eps = None if norm is None else self.c.rms_eps
        kernel = self._row_kernel(row_scale.RowScale(rows, width, eps))
        if kernel is not None:
            args = [x] if norm is None else [x, _const(norm)]
            types = [relax.TensorType(s, "float32") for s in ((rows, width), (rows, 1))]
            both = self.emit(relax.call_tir(kernel, args, types))
            scaled = self.emit(relax.TupleGetItem(both, 0))
            scales = self.emit(relax.TupleGetItem(both, 1))
        else:
            x = x if norm is None else self.norm(x, norm)
            peak = op.max(op.abs(x), axis=[-1], keepdims=True)
            scales = self.emit(op.divide(op.maximum(peak, _const(row_scale.TINY)),
                                         _const(row_scale.LEVELS)))
            scaled = op.divide(x, scales)
        one, mid = _const(1.0), _const(128, "int32")
        q = self.emit(op.quantize(scaled, one, mid, -1, "uint8"))
        return MatmulInput(self.emit(op.dequantize(q, one, mid, -1, "float32")), scales)

    def _row_kernel(self, shape: row_scale.RowScale):
        """row_scale's kernel of `shape` in the module (added once), or None off a CPU."""
        if shape not in self._row_kernels:
            func = row_scale.for_target(shape, self.target)
            self._row_kernels[shape] = None if func is None else self.bb.add_func(
                func, str(func.attrs["global_symbol"]))
        return self._row_kernels[shape]

    def rope_tables(self, pos):
        """cos, sin [T, 1, head_dim / 2] of the positions (Hugging Face's float32 math)."""
        op = relax.op
        angles = self.emit(op.multiply(
            op.expand_dims(op.astype(pos, "float32"), 1),
            _const(np.asarray(self.c.inv_freq, np.float32)[None, :])))
        cos, sin = self.emit(op.cos(angles)), self.emit(op.sin(angles))
        if self.c.rope_scale != 1.0:
            cos = self.emit(op.multiply(cos, _const(self.c.rope_scale)))
            sin = self.emit(op.multiply(sin, _const(self.c.rope_scale)))
        return (self.emit(op.expand_dims(cos, 1)), self.emit(op.expand_dims(sin, 1)))

    def rope(self, x, heads, cos, sin):
        """x [T, heads * head_dim] rotated, as [T, heads, head_dim]."""
        op, t, d = relax.op, self.t, self.c.head_dim
        if self.c.rope_layout == "half":
            x = self.emit(op.reshape(x, (t, heads, d)))
            parts = self.emit(op.split(x, 2, axis=2))
            x1, x2 = (self.emit(relax.TupleGetItem(parts, i)) for i in (0, 1))
            first = op.subtract(op.multiply(x1, cos), op.multiply(x2, sin))
            second = op.add(op.multiply(x2, cos), op.multiply(x1, sin))
            return self.emit(op.concat([first, second], axis=2))
        x = self.emit(op.reshape(x, (t, heads, d // 2, 2)))
        parts = self.emit(op.split(x, 2, axis=3))
        x1 = self.emit(op.squeeze(relax.TupleGetItem(parts, 0), [3]))
        x2 = self.emit(op.squeeze(relax.TupleGetItem(parts, 1), [3]))
        first = op.expand_dims(op.subtract(op.multiply(x1, cos), op.multiply(x2, sin)), 3)
        second = op.expand_dims(op.add(op.multiply(x2, cos), op.multiply(x1, sin)), 3)
        return self.emit(op.reshape(op.concat([first, second], axis=3), (t, heads, d)))

    def masks(self, kv_len):
        """Additive masks: cache slots [context] (< kv_len visible) and the step's own tokens
        [group * T, T] (causal)."""
        op = relax.op
        visible = op.less(_const(np.arange(self.ctx), "int32"), kv_len)
        cache = self.emit(op.where(visible, _const(0.0), _const(_NEG)))
        causal = np.where(np.tril(np.ones((self.t, self.t), bool)), 0.0, _NEG)
        return cache, _const(np.tile(causal, (self.c.group, 1)))

    def attention(self, hidden, layer, tables, masks, kv_len, k_cache, v_cache):
        """(output [T, hidden], new keys [kv_heads, head_dim, T], new values
        [kv_heads, T, head_dim]) of the layer's attention on its normed `hidden`."""
        op, c, t = relax.op, self.c, self.t
        lw = self.w.layers[layer]
        x = self.matmul_input(hidden, input_name(layer, "qkv"), lw.attn_norm)
        q = self.rope(self.linear(x, lw.q), c.heads, *tables)
        k = self.rope(self.linear(x, lw.k), c.kv_heads, *tables)
        v = self.emit(op.reshape(self.linear(x, lw.v), (t, c.kv_heads, c.head_dim)))
        # keys as [kv_heads, head_dim, T]: the cache holds them that way, so that the scores
        # read it as the matmul's right operand as it lies (no transposed copy per step)
        new_k = self.emit(op.permute_dims(k, [1, 2, 0]))
        new_v = self.emit(op.permute_dims(v, [1, 0, 2]))
        # query rows of one key/value head together: [kv_heads, group * T, head_dim]
        q = op.permute_dims(op.reshape(q, (t, c.kv_heads, c.group, c.head_dim)), [1, 2, 0, 3])
        q = self.emit(op.reshape(q, (c.kv_heads, c.group * t, c.head_dim)))
        if self.cache_kernel is not None:  # only the valid cache slots (cache_attention.py)
            out = relax.call_tir(self.cache_kernel, [q, k_cache, v_cache, new_k, new_v, kv_len],
                                 relax.TensorType((c.kv_heads, c.group * t, c.head_dim),
                                                  "float32"))
        else:
            out = self.masked_attention(q, k_cache, v_cache, new_k, new_v, masks)
        out = op.permute_dims(op.reshape(out, (c.kv_heads, c.group, t, c.head_dim)),
                              [2, 0, 1, 3])
        out = self.emit(op.reshape(out, (t, c.heads * c.head_dim)))
        return self.linear(self.matmul_input(out, input_name(layer, "o")), lw.o), new_k, new_v

    def masked_attention(self, q, k_cache, v_cache, new_k, new_v, masks):
        """Attention as matmuls over the whole cache and the step's tokens, masked (the form
        for a target without cache_attention's kernel): [kv_heads, group * T, head_dim]."""
        op = relax.op
        scale = _const(self.c.head_dim ** -0.5)
        cached = op.matmul(q, k_cache)
        cached = self.emit(op.add(op.multiply(cached, scale), masks[0]))
        own = op.matmul(q, new_k)
        own = self.emit(op.add(op.multiply(own, scale), masks[1]))
        probs = self.emit(op.nn.softmax(op.concat([cached, own], axis=2), axis=2))
        parts = self.emit(op.split(probs, [self.ctx], axis=2))
        return op.add(op.matmul(relax.TupleGetItem(parts, 0), v_cache),
                      op.matmul(relax.TupleGetItem(parts, 1), new_v))

    def mlp(self, hidden, layer):
        """The layer's SwiGLU on its normed `hidden`."""
        op, lw = relax.op, self.w.layers[layer]
        x = self.matmul_input(hidden, input_name(layer, "gate_up"), lw.mlp_norm)
        act = self.emit(op.multiply(op.nn.silu(self.linear(x, lw.gate)), self.linear(x, lw.up)))
        return self.linear(self.matmul_input(act, input_name(layer, "down")), lw.down)

    def head(self, row):
        """Logits [1, vocab] of a hidden state [1, hidden]: the final norm and the LM head."""
        return self.linear(self.matmul_input(row, LM_HEAD_INPUT, self.w.final_norm),
                           self.w.lm_head)

    def norm(self, x, weight):
        return self.emit(relax.op.nn.rms_norm(x, _const(weight), axes=[-1],
                                              epsilon=self.c.rms_eps))

    def body(self, hidden, pos, kv_len, last, k_caches, v_caches):
        op = relax.op
        tables = self.rope_tables(pos)
        masks = self.masks(kv_len) if self.cache_kernel is None else None
        new_ks, new_vs = [], []
        for i in range(len(self.w.layers)):
            attn, nk, nv = self.attention(hidden, i, tables, masks, kv_len, k_caches[i],
                                          v_caches[i])
            hidden = self.emit(op.add(hidden, attn))
            hidden = self.emit(op.add(hidden, self.mlp(hidden, i)))
            new_ks.append(op.expand_dims(nk, 0))
            new_vs.append(op.expand_dims(nv, 0))
        return relax.Tuple([self.emit(op.take(hidden, last, axis=0)),
                            self.emit(op.concat(new_ks, axis=0)),
                            self.emit(op.concat(new_vs, axis=0))])


def step_module(config: DecoderConfig, weights: DecoderWeights, tokens: int, context: int,
                act_q: dict | None = None, target=None) -> tvm.IRModule:
    """The IRModule whose main computes one step of `tokens` tokens with a cache of `context`
    slots (see the module docstring). act_q: {input name: ActivationQuantization or PER_TOKEN}
    for the int8 form (names: weights.input_names), None for float32. The step attends the
    cache through cache_attention's kernel for `target` where it has one."""
    c = config
    kernel = cache_attention.for_step(
        cache_attention.Shape(c.kv_heads, c.group, c.head_dim, context, tokens), target)
    k_cache = relax.TensorType((c.kv_heads, c.head_dim, context), "float32")
    v_cache = relax.TensorType((c.kv_heads, context, c.head_dim), "float32")
    hidden = relax.Var("hidden", relax.TensorType((tokens, c.hidden), "float32"))
    pos = relax.Var("pos", relax.TensorType((tokens,), "int32"))
    kv_len = relax.Var("kv_len", relax.TensorType((1,), "int32"))
    last = relax.Var("last", relax.TensorType((1,), "int32"))
    k_caches = [relax.Var(f"k_cache{i}", k_cache) for i in range(c.layers)]
    v_caches = [relax.Var(f"v_cache{i}", v_cache) for i in range(c.layers)]
    bb = relax.BlockBuilder()
    with bb.function("main", [hidden, pos, kv_len, last, *k_caches, *v_caches]):
        with bb.dataflow():
            gv = None if kernel is None else bb.add_func(kernel, "cache_attention")
            builder = _Builder(bb, c, weights, tokens, context, act_q, gv, target)
            out = bb.emit_output(builder.body(hidden, pos, kv_len, last, k_caches, v_caches))
        bb.emit_func_output(out)
    return bb.get()


def head_module(config: DecoderConfig, weights: DecoderWeights, act_q: dict | None = None,
                target=None) -> tvm.IRModule:
    """The IRModule whose main(row [1, hidden]) gives the logits [1, vocab] of a step's
    returned hidden state (the final norm, the LM head); act_q and target as step_module."""
    row = relax.Var("row", relax.TensorType((1, config.hidden), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [row]):
        with bb.dataflow():
            builder = _Builder(bb, config, weights, 1, 1, act_q, None, target)
            out = bb.emit_output(builder.head(row))
        bb.emit_func_output(out)
    return bb.get()
