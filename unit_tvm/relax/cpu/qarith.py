"""The arithmetic of a quantized op inside its kernels, shared by the plain and the tensorized
builders: quantizing an activation to uint8 (or rounding it to bf16), the zero-point padding,
the op's arguments, and the epilogue that turns int32 sums into the output (compensation,
per-channel scale, bias, residual, activation, requantization)."""

from tvm import te, tirx

from ... import fastmath
from ...shift import SHIFT
from ..core import activations
from ..core.recipe import blocked_index, dtypes, is_bf16, is_float, packed_shape
from ..core.views import StridedView


def quantize_value(x, scale, zp):
    """fp32 -> uint8: x / scale + zp rounded to nearest (ties to even, the FPU's mode), clipped
    to [0, 255]. Multiplies by 1/scale (a vector divide costs ~10x a multiply); results can
    differ from round(x / scale) + zp by one step only where x / scale lies within an ulp of a
    rounding tie. One fma, then fastmath.rounded_to_uint8 (few instructions per vector: an
    epilogue of a short reduction is bound by them); out-of-range values clip, NaN becomes 0."""
    return fastmath.rounded_to_uint8(x * tirx.const(1.0 / scale, "float32")
                                     + tirx.const(float(zp), "float32"))


def round_to_bf16(v):
    """float32 v rounded to the nearest bfloat16 (ties to even), still float32. Spelled out
    because TVM's BF16 legalization keeps an internal bf16 stage in float32 unless an
    instruction reads its storage: with this, the plain loop nest (the tuner's reference) and
    the tensorized kernel see the same bf16 activations."""
    bits = tirx.reinterpret("uint32", v)
    bits = bits + tirx.const(0x7FFF, "uint32") + ((bits >> tirx.const(16, "uint32"))
                                                   & tirx.const(1, "uint32"))
    return tirx.reinterpret("float32", bits & tirx.const(0xFFFF0000, "uint32"))


def pad_value(recipe):
    """What padding holds in the instruction's activation dtype: real 0.0 (the zero point)."""
    if is_float(recipe):
        return tirx.const(0.0, "float32").astype(recipe.dtype)
    if recipe.x_signed:
        return tirx.const(recipe.x_zp - SHIFT, "int8")
    return tirx.const(recipe.x_zp, "uint8")


def epilogue_fn(recipe, comp, mult, bias, residual):
    """acc (int32) -> fp32: (acc - zp*wsum[k]) * (s_x*s_w[k]) + bias[k] (+ residual), relu.
    A float (bf16 or float32) op's acc is float32 already: acc + bias[k] (+ residual), relu;
    a float bmm's scale (attention's 1 / sqrt(d)) multiplies it first, since its run-time
    operand cannot hold it."""

    def fn(acc, k, out_idx):
        if is_float(recipe):
            v = (acc * mult[k] if mult is not None else acc) + bias[k]
        else:
            # a bmm's zero-point term depends on its run-time second operand: one per batch row
            zp_term = comp[out_idx[0], k] if recipe.kind == "bmm" else comp[k]
            v = (acc - zp_term).astype("float32") * mult[k] + bias[k]
        if recipe.clamp:
            v = _clamped(v, *recipe.clamp)
        if residual is not None:
            rb = recipe.residual_block
            if rb:  # a residual in NCHW[rb]c blocks (a shared uint8 edge)
                r = residual(*blocked_index(out_idx, rb))
            else:
                r = residual(*out_idx)
            if recipe.residual_q:  # a uint8 residual (a pool's or conv's): dequantized here
                scale, zp = recipe.residual_q
                r = (r.astype("float32") - tirx.const(float(zp), "float32")) * tirx.const(
                    float(scale), "float32")
            v = v + r
        if recipe.gelu:  # exact (erf) GELU, as torch.nn.functional.gelu
            v = v * tirx.const(0.5, "float32") * (tirx.const(1.0, "float32") + fastmath.erf(
                v * tirx.const(0.7071067811865476, "float32")))
        if recipe.activation is not None:
            v = activations.expr(recipe.activation, v)
        if recipe.relu and not _clamped_at_zero(recipe):
            v = tirx.max(v, tirx.const(0.0, "float32"))
        if recipe.clip_min is not None:
            v = tirx.max(v, tirx.const(float(recipe.clip_min), "float32"))
        if recipe.clip_max is not None:
            v = tirx.min(v, tirx.const(float(recipe.clip_max), "float32"))
        if recipe.out_q:  # requantize for the next quantized op
            return quantize_value(v, *recipe.out_q)
        return v

    return fn


def _clamped(v, lo, hi):
    return tirx.min(tirx.max(v, tirx.const(float(lo), "float32")),
                    tirx.const(float(hi), "float32"))


def _clamped_at_zero(recipe):
    """Whether the requantization after the activation clips at real 0 anyway (uint8 with zero
    point 0): then relu's max is redundant, bit for bit (round(v * s) <= 0 for v <= 0, and the
    clip to [0, 255] maps it to 0), and leaving it out saves one of the ~10 vector ops per 16
    outputs that dominate a conv with a short reduction (measured: a 16-channel 1x1 conv spends
    about a third of its time in the epilogue)."""
    return bool(recipe.out_q) and float(recipe.out_q[1]) == 0.0


def load_input(x, recipe, idx):
    """The uint8 activation at the logical (NCHW or [rows, k]) index idx, whatever x's layout:
    x itself when the producer already requantized it, else quantized here."""
    if recipe.in_block:
        idx = blocked_index(idx, recipe.in_block)
    return quantized(x(*idx), recipe)


def quantized(value, recipe):
    """An activation read from the op's input as the instruction takes it: as is when the
    producer already requantized it, else quantized (or rounded to bf16) here; re-based to
    int8 (x - 128, an xor of the sign bit) for an s8 x s8 instruction."""
    if is_float(recipe):
        return value if recipe.in_u8 else second_operand(value, recipe)
    q = value if recipe.in_u8 else quantize_value(value, recipe.x_scale, recipe.x_zp)
    if recipe.x_signed:
        return (q ^ tirx.const(SHIFT, "uint8")).astype("int8")  # u8 - 128 as s8
    return q


def second_operand(value, recipe):
    """A bmm's second operand as the instruction takes it: the int8 values quantized_y made,
    or (bf16) the float32 activation rounded to bf16 here (float32: as it is)."""
    return round_to_bf16(value).astype("bfloat16") if is_bf16(recipe) else value


def operand_at(tensor, view, shape):
    """idx -> a bmm operand's element: tensor[idx], or (view: (elements, offset, strides), the
    recipe's x_view / w_view of an operand of `shape`) the element of the flat source the view
    puts at idx."""
    if not view:
        return tensor
    _, offset, strides = view
    strided = StridedView(tuple(shape), tuple(strides), offset)
    return lambda *idx: tensor(strided.flat_index(idx))


def logical_index(recipe, idx):
    """The [B, M, N] index of a bmm's result element at idx of its output (out_axes order)."""
    if not recipe.out_axes:
        return tuple(idx)
    return tuple(idx[recipe.out_axes.index(d)] for d in range(len(idx)))


def packed_output(recipe, fn, acc_at):
    """te body of a NCHW[out_block]c (NCDHW[out_block]c) result, uint8 (requantized) or float32:
    channel f = ko * block + ki from fn(acc_at(b, ko, *spatial, ki, f), f, logical index); the
    padding channels hold real 0 (the output's zero point, or 0.0)."""
    blk, k = recipe.out_block, recipe.out_channels
    if recipe.out_q:
        zp = tirx.const(int(recipe.out_q[1]), "uint8")
    else:
        zp = tirx.const(0.0, "float32")

    def body(b, ko, *rest):
        *spatial, ki = rest
        f = ko * blk + ki
        if k % blk == 0:  # no padding channel: straight-line code that vectorises
            return fn(acc_at(b, ko, *spatial, ki, f), f, (b, f, *spatial))
        fc = tirx.min(f, k - 1)  # parameters of a padding channel are never used, but read
        return tirx.if_then_else(f < k, fn(acc_at(b, ko, *spatial, ki, fc), fc,
                                           (b, fc, *spatial)), zp)

    return body


class GatedInput:
    """An op's float32 input read through its per-channel gate (recipe.x_gate): indexed like the
    input (NCHW, or NCHW[block]c), each element is x times gate[b, c]. `arguments` lists the
    input, then the gate."""

    def __init__(self, x, gate, block):
        self.x, self.gate, self.block = x, gate, block

    def __getitem__(self, idx):
        idx = idx if isinstance(idx, tuple) else (idx,)
        c = idx[1] * self.block + idx[-1] if self.block else idx[1]
        channels = int(self.gate.shape[1])
        if self.block and channels % self.block:
            c = tirx.min(c, channels - 1)  # a padding lane of a partly full last block
        return self.x[idx] * self.gate[idx[0], c, 0, 0]

    def __call__(self, *idx):
        return self[idx]


def placeholders(recipe, x_shape, w_shape):
    """x, w, comp, mult, bias, residual: the op's arguments (comp None for a float form, which
    has no quantization to undo, and mult too but for a bmm's scale; residual None without
    one; x a GatedInput with recipe.x_gate)."""
    float_form, bmm = is_float(recipe), recipe.kind == "bmm"  # bf16 or float32
    x = te.placeholder(x_shape, "uint8" if recipe.in_u8 else "float32", name="x")
    if recipe.x_gate:
        gate = te.placeholder((recipe.in_shape[0], recipe.in_shape[1], 1, 1), "float32",
                              name="gate")
        x = GatedInput(x, gate, recipe.in_block)
    # a bmm's w is its second operand: int8 (quantized_y), or float32 rounded in the kernel
    w = te.placeholder(w_shape, "float32" if float_form and bmm else dtypes(recipe)[1],
                       name="w")
    k = recipe.out_channels
    comp_shape = (recipe.in_shape[0], k) if bmm else (k,)
    comp = None if float_form else te.placeholder(comp_shape, "int32", name="comp")
    mult = None if float_form and not bmm else te.placeholder((k,), "float32", name="mult")
    bias = te.placeholder((k,), "float32", name="bias")
    rb = recipe.residual_block
    residual = te.placeholder(packed_shape(recipe.out_shape, rb) if rb else recipe.out_shape,
                              "uint8" if recipe.residual_q else "float32",
                              name="residual") if recipe.residual else None
    return x, w, comp, mult, bias, residual


def arguments(*tensors):
    """The PrimFunc's argument list: the given tensors, less the absent (None) ones; a gated
    input is its input, then its gate."""
    out = []
    for t in tensors:
        if isinstance(t, GatedInput):
            out += [t.x, t.gate]
        elif t is not None:
            out.append(t)
    return out


def round_up(v, m):
    return -(-v // m) * m
