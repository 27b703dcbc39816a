"""Random tensor operations for the differential fuzzer, written with tvm.te / tvm.topi directly.

A Case is plain data (kind, dtypes, integer parameters, epilogue): it is generated from
(seed, index) alone, so `unit-tvm fuzz --seed S --case I` rebuilds exactly the same operation,
and it crosses process boundaries as it is. `make_op(case)` turns it into te tensors
(inputs..., output) with no unit-tvm code involved: the ops are the ones users write.
"""

import random
from dataclasses import dataclass

from tvm import te, topi

from .. import ops
from ..te_expr import placeholders_of
from .model_cases import attention_params, model_params, speech_params

INT_PAIRS = (("uint8", "int8"), ("int8", "int8"), ("uint8", "uint8"), ("int8", "uint8"))
FLOAT_PAIRS = (("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "float32"))
INT_EPILOGUES = ("bias_relu", "requant_int8", "dequant_float32")
FLOAT_EPILOGUES = ("bias_relu",)
# extents users hit: tiny, primes, instruction multiples and their neighbours
_EXTENTS = (1, 2, 3, 4, 5, 7, 8, 11, 13, 16, 17, 24, 27, 31, 32, 33, 48, 64, 65)


@dataclass(frozen=True)
class Case:
    """One generated operation: what to build, not how unit-tvm builds it."""

    seed: int
    index: int
    kind: str
    a_dtype: str
    b_dtype: str
    params: tuple  # ((name, int | str), ...), sorted by name
    epilogue: str = ""

    @property
    def acc_dtype(self) -> str:
        """The accumulator the op reduces into: int32 for integer operands, float32 otherwise."""
        return "int32" if "int" in self.a_dtype else "float32"

    def param(self, name):
        """One parameter's value."""
        return dict(self.params)[name]

    def describe(self) -> str:
        """One line naming everything that makes this case."""
        ps = " ".join(f"{k}={v}" for k, v in self.params)
        epi = f" +{self.epilogue}" if self.epilogue else ""
        return f"{self.kind} {self.a_dtype}x{self.b_dtype} {ps}{epi}"

    def reproduce(self) -> str:
        """The command that runs this case again."""
        return f"unit-tvm fuzz --seed {self.seed} --case {self.index}"


def _ext(rng, most=65):
    return rng.choice([e for e in _EXTENTS if e <= most] + [rng.randint(1, most)])


def _conv_geometry(rng, dims, most_size):
    size = [rng.randint(1, most_size) for _ in range(dims)]
    window = [rng.choice((1, 1, 2, 3, 3, 5)) for _ in range(dims)]
    stride = rng.choice((1, 1, 1, 2, 3))
    dilation = rng.choice((1, 1, 1, 2))
    pad = rng.choice((0, 0, 1, 2))
    # the dilated window must fit the padded input
    size = [max(s, (w - 1) * dilation + 1 - 2 * pad) for s, w in zip(size, window)]
    return size, window, stride, dilation, pad


def _params_for(kind, rng):
    if kind in ("dense", "minmax"):
        form = (rng.choice(("topi_dense", "te_nt", "topi_matmul_nn")) if kind == "dense"
                else rng.choice(("max", "min")))
        return {"form": form, "M": _ext(rng), "N": _ext(rng), "K": _ext(rng)}
    if kind == "batch_matmul":
        return {"B": rng.randint(1, 3), "M": _ext(rng, 33), "N": _ext(rng, 33), "K": _ext(rng),
                "transpose_b": rng.randint(0, 1)}
    if kind == "odd_index":
        return {"form": rng.choice(("reversed", "strided", "offset", "modulo", "transposed",
                                    "flat", "diagonal")),
                "M": _ext(rng, 33), "N": _ext(rng, 33), "K": _ext(rng, 33)}
    if kind == "packed":  # the blocked layouts tile instructions read (AMX, vpdpbusd blocks)
        form = rng.choice(("dense", "nchwc", "folded"))
        x, y = rng.choice((4, 16, 64, 128, 256)), rng.choice((16, 32))
        if form == "dense":
            return {"form": form, "x": x, "y": y, "M": _ext(rng), "N": y * rng.randint(1, 3),
                    "K": x * rng.randint(1, 2)}
        window, stride = rng.choice((1, 3)), rng.choice((1, 2))
        size = rng.randint(window, 12)
        if form == "folded":
            return {"form": form, "x": rng.choice((64, 128, 256)), "y": y, "C": _ext(rng, 48),
                    "K": y * rng.randint(1, 2), "size": size, "window": window, "stride": stride}
        return {"form": form, "x": x, "y": y, "C": x * rng.randint(1, 2),
                "K": y * rng.randint(1, 2), "size": size, "window": window, "stride": stride}
    dims = {"conv1d": 1, "conv2d": 2, "conv3d": 3, "group_conv2d": 2, "depthwise": 2}[kind]
    size, window, stride, dilation, pad = _conv_geometry(rng, dims, {1: 40, 2: 14, 3: 7}[dims])
    p = {"layout": rng.choice(("first", "last")), "stride": stride, "dilation": dilation,
         "pad": pad, "size": "x".join(map(str, size)), "window": "x".join(map(str, window))}
    if kind == "group_conv2d":
        groups = rng.choice((2, 3, 4))
        p.update(groups=groups, C=groups * rng.choice((1, 3, 4, 8, 16, 5)),
                 K=groups * rng.choice((4, 8, 16, 27, 35, 32)))
    elif kind == "depthwise":
        p.update(C=rng.choice((3, 8, 16, 17, 32)), multiplier=1)
    else:
        p.update(C=_ext(rng, 48 if dims < 3 else 17), K=_ext(rng, 48 if dims < 3 else 17))
    return p


KINDS = ("dense", "batch_matmul", "conv1d", "conv2d", "conv3d", "group_conv2d", "depthwise",
         "minmax", "odd_index", "packed")
# whole small models (fuzz/model_cases.py): asked for by name, not in the default mix (a case takes
# seconds and needs PyTorch)
MODEL_KIND = "model"
# the same models quantized into QDQ files (fuzz/qdq_check.py; needs onnxruntime, and NNCF for
# its third of the cases)
QDQ_KIND = "qdq"
# the same models through the GPU path in fp16 (fuzz/gpu_check.py: the graph around the
# Tensor Core kernels checked on this CPU, the kernels built for sm_90 where nvcc is)
GPU_MODEL_KIND = "gpu_model"
# conv1d front ends and torch's transformer layer (model_cases.speech_params), checked as "model"
SPEECH_KIND = "speech"
# one attention layer in a drawn spelling and size (model_cases.attention_params), quantized
# with the default attention (long attention fused, int8 where its guard allows) against the
# same model with float32 attention (fuzz/attention_case.py)
ATTENTION_KIND = "attention"
WHOLE_MODEL_KINDS = (MODEL_KIND, QDQ_KIND, GPU_MODEL_KIND, SPEECH_KIND, ATTENTION_KIND)
QDQ_QUANTIZERS = ("ort", "ort_per_channel", "ort_s8s8", "ort_qoperator", "nncf")


def make_case(seed: int, index: int, kinds=KINDS) -> Case:
    """The case number `index` of a fuzzing run with `seed` (deterministic)."""
    rng = random.Random(seed * 1_000_003 + index)
    kind = rng.choice(list(kinds))
    if kind in WHOLE_MODEL_KINDS:

        params = {SPEECH_KIND: speech_params, ATTENTION_KIND: attention_params}.get(
            kind, model_params)(rng)
        if kind == QDQ_KIND:
            params["quantizer"] = rng.choice(QDQ_QUANTIZERS)
            if params["quantizer"] in ("ort", "ort_per_channel", "ort_s8s8"):
                params["dedicated"] = rng.randint(0, 1)  # a DequantizeLinear per reader
        return Case(seed, index, kind, "float32", "int8", tuple(sorted(params.items())))
    if rng.random() < 0.7:
        a_dtype, b_dtype = rng.choice(INT_PAIRS)
    else:
        a_dtype, b_dtype = rng.choice(FLOAT_PAIRS)
    params = _params_for(kind, rng)
    epilogue = ""
    if kind in ("dense", "conv2d", "group_conv2d", "batch_matmul") and rng.random() < 0.3:
        epilogue = rng.choice(INT_EPILOGUES if "int" in a_dtype else FLOAT_EPILOGUES)
    return Case(seed, index, kind, a_dtype, b_dtype, tuple(sorted(params.items())), epilogue)


# -- building the te operation ------------------------------------------------------------------
def _cast_mul(acc):
    return lambda x, y: x.astype(acc) * y.astype(acc)


def _dense(case):
    m, n, k = case.param("M"), case.param("N"), case.param("K")
    acc, form = case.acc_dtype, case.param("form")
    a = te.placeholder((m, k), case.a_dtype, name="A")
    if form == "topi_dense":
        b = te.placeholder((n, k), case.b_dtype, name="B")
        return [a, b], topi.nn.dense(a, b, out_dtype=acc)
    if form == "topi_matmul_nn":
        b = te.placeholder((k, n), case.b_dtype, name="B")
        return [a, b], topi.nn.matmul(a, b, out_dtype=acc)
    b = te.placeholder((n, k), case.b_dtype, name="B")
    r = te.reduce_axis((0, k), name="r")
    return [a, b], te.compute((m, n), lambda i, j: te.sum(_cast_mul(acc)(a[i, r], b[j, r]), axis=r),
                              name="dense_nt")


def _minmax(case):
    m, n, k = case.param("M"), case.param("N"), case.param("K")
    acc = case.acc_dtype
    a = te.placeholder((m, k), case.a_dtype, name="A")
    b = te.placeholder((n, k), case.b_dtype, name="B")
    r = te.reduce_axis((0, k), name="r")
    reducer = te.max if case.param("form") == "max" else te.min
    out = te.compute((m, n), lambda i, j: reducer(_cast_mul(acc)(a[i, r], b[j, r]), axis=r),
                     name=f"{case.param('form')}_of_products")
    return [a, b], out


def _batch_matmul(case):
    bs, m, n, k = (case.param(x) for x in ("B", "M", "N", "K"))
    a = te.placeholder((bs, m, k), case.a_dtype, name="A")
    tb = bool(case.param("transpose_b"))
    b = te.placeholder((bs, n, k) if tb else (bs, k, n), case.b_dtype, name="B")
    return [a, b], topi.nn.batch_matmul(a, b, out_dtype=case.acc_dtype, transpose_b=tb)


def _odd_index(case):
    """Dense-like reductions whose operands are read through index expressions users write."""
    m, n, k = case.param("M"), case.param("N"), case.param("K")
    form, mul = case.param("form"), _cast_mul(case.acc_dtype)
    r = te.reduce_axis((0, k), name="r")
    a_shape, b_shape = (m, k), (n, k)
    read_a = lambda a, i, rr: a[i, rr]  # noqa: E731
    read_b = lambda b, j, rr: b[j, rr]  # noqa: E731
    if form == "reversed":
        read_a = lambda a, i, rr: a[i, k - 1 - rr]  # noqa: E731
    elif form == "strided":
        a_shape = (m, 2 * k)
        read_a = lambda a, i, rr: a[i, 2 * rr]  # noqa: E731
    elif form == "offset":
        a_shape, b_shape = (m + 1, k + 3), (n + 2, k + 3)
        read_a = lambda a, i, rr: a[i + 1, rr + 3]  # noqa: E731
        read_b = lambda b, j, rr: b[j + 2, rr]  # noqa: E731
    elif form == "modulo":
        read_b = lambda b, j, rr: b[(j * 3 + 1) % n, rr]  # noqa: E731
    elif form == "transposed":
        b_shape = (k, n)
        read_b = lambda b, j, rr: b[rr, j]  # noqa: E731
    elif form == "flat":
        a_shape = (m * k,)
        read_a = lambda a, i, rr: a[i * k + rr]  # noqa: E731
    elif form == "diagonal":
        a_shape = (m + k,)
        read_a = lambda a, i, rr: a[i + rr]  # noqa: E731
    a = te.placeholder(a_shape, case.a_dtype, name="A")
    b = te.placeholder(b_shape, case.b_dtype, name="B")
    out = te.compute((m, n), lambda i, j: te.sum(mul(read_a(a, i, r), read_b(b, j, r)), axis=r),
                     name=f"odd_{form}")
    return [a, b], out


def _dims(case, key):
    return [int(x) for x in str(case.param(key)).split("x")]


def _conv(case):
    kind, first = case.kind, case.param("layout") == "first"
    size, window = _dims(case, "size"), _dims(case, "window")
    stride, dil, pad = case.param("stride"), case.param("dilation"), case.param("pad")
    acc, nd = case.acc_dtype, len(size)
    c = case.param("C")
    if kind == "depthwise":
        k, groups = c * case.param("multiplier"), c
    else:
        k, groups = case.param("K"), case.param("groups") if kind == "group_conv2d" else 1
    spatial_axes = "DHW"[-nd:] if nd > 1 else "W"
    data_layout = ("NC" + spatial_axes) if first else ("N" + spatial_axes + "C")
    data_shape = [1, c, *size] if first else [1, *size, c]
    data = te.placeholder(data_shape, case.a_dtype, name="data")
    if kind == "depthwise":
        if first:
            kern = te.placeholder((c, case.param("multiplier"), *window), case.b_dtype,
                                  name="kernel")
            return [data, kern], topi.nn.depthwise_conv2d_nchw(data, kern, stride, pad, dil, acc)
        kern = te.placeholder((*window, c, case.param("multiplier")), case.b_dtype, name="kernel")
        return [data, kern], topi.nn.depthwise_conv2d_nhwc(data, kern, stride, pad, dil,
                                                           out_dtype=acc)
    if first:
        kernel_layout = "OI" + spatial_axes
        kern = te.placeholder((k, c // groups, *window), case.b_dtype, name="kernel")
    else:
        kernel_layout = spatial_axes + "IO"
        kern = te.placeholder((*window, c // groups, k), case.b_dtype, name="kernel")
    out = topi.nn.conv(data, kern, stride, pad, dil, groups, data_layout, kernel_layout,
                       out_dtype=acc)
    return [data, kern], out


def _epilogue(case, inputs, core):
    """Elementwise stages after the reduction, as separate te.computes (a layer as users write it).
    The bias follows the output channels (the last axis for 'last' layouts and matmuls)."""
    shape = [int(s) for s in core.shape]
    chan = 1 if case.kind in ("conv2d", "group_conv2d") and case.param("layout") == "first" else -1
    bias = te.placeholder((shape[chan],), case.acc_dtype, name="bias")

    def bias_of(idx):
        return bias[idx[chan]]

    added = te.compute(shape, lambda *i: core(*i) + bias_of(i), name="bias_add")
    zero = te.const(0, case.acc_dtype)
    relu = te.compute(shape, lambda *i: te.max(added(*i), zero), name="relu")
    if case.epilogue == "bias_relu":
        return inputs + [bias], relu
    if case.epilogue == "requant_int8":  # integer fixed-point requantization, as QNN does
        out = te.compute(shape, lambda *i: te.max(te.min(
            (relu(*i) * 181 + (1 << 13)) >> 14, te.const(127, "int32")), te.const(-128, "int32"))
            .astype("int8"), name="requantize")
        return inputs + [bias], out
    scale = te.placeholder((shape[chan],), "float32", name="scale")
    out = te.compute(shape, lambda *i: added(*i).astype("float32") * scale[i[chan]],
                     name="dequantize")
    return inputs + [bias, scale], out


def _packed(case):
    """ops.dense_packed / conv2d_nchwc / conv2d_window_folded: operands already in the layout a
    tile instruction reads, as a model compiler would hand them over."""
    form, x, y = case.param("form"), case.param("x"), case.param("y")
    a, b, acc = case.a_dtype, case.b_dtype, case.acc_dtype
    if form == "dense":
        out = ops.dense_packed(case.param("M"), case.param("N"), case.param("K"), y, x, a, b, acc)
    elif form == "nchwc":
        size, w = case.param("size"), case.param("window")
        out = ops.conv2d_nchwc(1, case.param("C"), size, size, case.param("K"), w, w,
                               case.param("stride"), 1, x, y, a, b, acc)
    else:
        out = ops.conv2d_window_folded(case.param("C"), case.param("size"), case.param("K"),
                                       case.param("window"), case.param("stride"), "s", x, y,
                                       a_dtype=a, b_dtype=b, acc=acc)
    return placeholders_of(out), out


_BUILDERS = {"packed": _packed, "dense": _dense, "minmax": _minmax, "batch_matmul": _batch_matmul,
             "odd_index": _odd_index}


def make_op(case: Case):
    """te tensors [inputs..., output] of a case."""
    inputs, out = _BUILDERS.get(case.kind, _conv)(case)
    if case.epilogue:
        inputs, out = _epilogue(case, inputs, out)
    return inputs + [out]
