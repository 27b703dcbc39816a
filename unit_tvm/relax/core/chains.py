"""The op chains a quantizer can fuse: a conv2d (grouped and depthwise included), a conv3d
(ungrouped), a dense / matmul with a constant weight or a matmul between two activations
("bmm": attention's), and the elementwise ops after it that fold into its epilogue (per-channel
affine ops: bias add, inference batch norm, attention's 1 / sqrt(d); a residual add; relu, relu6,
gelu, and the activations of activations.py: SiLU, hardswish, sigmoid, tanh, tanh-GELU)."""

import numpy as np
import tvm
from tvm import relax

from . import activations
from .graph import dataflow_bindings, readers, static_shape
from .graph import uses as count_uses


_AFFINE = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide"}


def _const(expr):
    return isinstance(expr, tvm.ir.expr.Constant)


def _np(expr):
    return expr.value.numpy()


def _weight(expr) -> np.ndarray:
    """A constant weight without a copy where it is float32 (every use multiplies it by a
    float64 per-channel scale first, so its values are exact either way); other dtypes as
    float64. A chain is found for every layer before any is quantized: float64 copies of a
    billion-parameter model's weights would not fit in memory."""
    w = _np(expr)
    return w if w.dtype == np.float32 else w.astype(np.float64)


def _channel_vector(c, channels, axis, ndim):
    """A constant that is one value per output channel (or a scalar): its [channels] vector."""
    arr = np.asarray(c, np.float64)
    if arr.size == 1:
        return np.full(channels, float(arr.reshape(-1)[0]))
    if arr.size != channels:
        return None
    shape = [1] * (ndim - arr.ndim) + list(arr.shape)
    if shape[axis] != channels:
        return None
    return arr.reshape(-1)


class _Chain:
    """A quantizable op and the elementwise ops fused after it."""

    def __init__(self, start, kind, x, weight, attrs, y=None, out_channels=None):
        self.start, self.kind, self.x, self.weight, self.attrs = start, kind, x, weight, attrs
        self.y = y  # a bmm's second activation (its "weight", known only at run time)
        self.out_channels = out_channels if weight is None else weight.shape[0]
        self.scale = None
        self.shift = None
        self.residual = None
        self.relu = False
        self.clip_max = None
        self.clip_min = None
        self.clamp = None  # (lo, hi) before the residual (Recipe.clamp)
        self.gelu = False
        self.activation = None  # a name of activations.NAMES
        self.end = start
        self.members = [start]
        # a bf16 bmm's operands read through the layout ops before it and its result written
        # transposed (relax/core/views.py): views.OperandView per operand, the result's axis order
        self.x_view = self.y_view = self.out_axes = None

    @property
    def activated(self):
        """Whether an activation ends the epilogue (no affine op or residual may follow)."""
        return (self.relu or self.gelu or self.activation is not None
                or self.clip_min is not None)

    @property
    def x_source(self):
        """The variable the op's kernel reads its first operand from."""
        return self.x_view.source if self.x_view is not None else self.x

    @property
    def y_source(self):
        """The variable a bmm's kernel reads its second operand from."""
        return self.y_view.source if self.y_view is not None else self.y


def _prim_value(expr):
    """Float value of a scalar argument (IntImm/FloatImm, PrimValue or constant), or None."""
    v = getattr(expr, "value", None)
    for _ in range(3):
        if isinstance(v, (int, float)):
            return float(v)
        if hasattr(v, "numpy"):
            return float(v.numpy())
        v = getattr(v, "value", None)
    return None


# the convolutions quantized: Relax op -> (recipe kind, data layout, kernel layout)
CONVS = {"relax.nn.conv2d": ("conv2d", "NCHW", "OIHW"),
          "relax.nn.conv3d": ("conv3d", "NCDHW", "OIDHW")}


def _match_start(binding):
    value = binding.value
    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
        return None
    name = value.op.name
    if name in CONVS and _const(value.args[1]):
        kind, data_layout, kernel_layout = CONVS[name]
        a = value.attrs
        if (str(a.data_layout) != data_layout or str(a.kernel_layout) != kernel_layout
                or str(value.args[0].ty.dtype) != "float32"):
            return None
        if kind == "conv3d" and int(a.groups) != 1:
            return None  # grouped conv3d: no quantized form (it stays fp32, reported as such)
        return _Chain(binding.var, kind, value.args[0], _weight(value.args[1]), a)
    if name == "relax.matmul" and not _const(value.args[1]):
        return _match_bmm(binding)
    if name == "relax.matmul" and _const(value.args[1]) and len(value.args[1].ty.shape) == 2:
        x = value.args[0]
        if len(x.ty.shape) < 2 or str(x.ty.dtype) != "float32":
            return None
        return _Chain(binding.var, "dense", x, _weight(value.args[1]).T, None)
    return None


def _match_bmm(binding):
    """A matmul of two float32 activations [..., M, K] x [..., K, N] with the same static
    leading dimensions (attention's Q x K^T and P x V), as a "bmm" chain."""
    a, b = binding.value.args
    sa, sb = static_shape(a), static_shape(b)
    if (sa is None or sb is None or len(sa) < 3 or len(sa) != len(sb) or sa[:-2] != sb[:-2]
            or sa[-1] != sb[-2] or any(str(t.ty.dtype) != "float32" for t in (a, b))):
        return None
    return _Chain(binding.var, "bmm", a, None, None, y=b, out_channels=sb[-1])


def _grouped(chain):
    """Whether the chain's op is a grouped (depthwise) conv: its kernel computes a smooth
    activation lane by lane where it writes float32 (a squeeze-excitation reads the result):
    EfficientNet's 144-channel 56x56 depthwise conv took 849 us with SiLU fused, 449 us as the
    conv, then SiLU's vectorized kernels (Zen 5). Written in channel blocks (f32_blocks.py) the
    fused form cost as much as the two kernels. Its activation stays an op of its own."""
    return chain.kind in ("conv2d", "conv3d") and int(chain.attrs.groups) != 1


def _grow(chain, by_var, users, uses, taken, all_readers):
    """Follow single-use consumers: per-channel affine ops, tuple packing, residual add, relu,
    and the activations of activations.py (whose spellings read the value twice; all_readers:
    {Var: [bindings reading it]}). Bindings already fused into another chain (`taken`) end the
    chain."""
    out_ch = chain.out_channels
    # a conv's channels are axis 1 of its NCHW / NCDHW result; a dense layer's or bmm's the last
    if chain.kind == "dense":
        axis, ndim = -1, 2
    elif chain.kind == "bmm":
        axis, ndim = -1, len(chain.start.ty.shape)
    else:
        axis, ndim = 1, chain.weight.ndim
    scale, shift = np.ones(out_ch), np.zeros(out_ch)
    cur = chain.start
    while cur in users and users[cur].var not in taken:
        found = None if chain.activated or _grouped(chain) else activations.match(
            cur, all_readers, uses)
        if found is not None and not taken.intersection(found.members):
            chain.activation = found.name
            chain.members += list(found.members)
            cur = found.end
            continue
        if uses.get(cur, 0) != 1:
            break
        b = users[cur]
        v = b.value
        if isinstance(v, relax.Tuple) and v.fields and v.fields[0].same_as(cur):
            getter = users.get(b.var)
            if (getter is None or uses.get(b.var, 0) != 1
                    or not isinstance(getter.value, relax.TupleGetItem) or getter.value.index != 0):
                break
            chain.members += [b.var, getter.var]
            cur = getter.var
            continue
        if not isinstance(v, relax.Call) or not isinstance(v.op, tvm.ir.Op):
            break
        name = v.op.name
        if chain.residual is None and not chain.activated and name in _AFFINE:
            other = v.args[1] if v.args[0].same_as(cur) else v.args[0]
            vec = _channel_vector(_np(other), out_ch, axis, ndim) if _const(other) else None
            # (after a clamp, an affine op would have to come before it: it ends the chain)
            if vec is not None and chain.clamp is None and not (
                    name in ("relax.subtract", "relax.divide") and not v.args[0].same_as(cur)):
                if name == "relax.add":
                    shift = shift + vec
                elif name == "relax.subtract":
                    shift = shift - vec
                elif name == "relax.multiply":
                    scale, shift = scale * vec, shift * vec
                else:
                    scale, shift = scale / vec, shift / vec
                chain.members.append(b.var)
                cur = b.var
                continue
            if (name == "relax.add" and not _const(other) and not chain.activated
                    and chain.kind != "bmm" and list(other.ty.shape) == list(v.ty.shape)):
                chain.residual = other
                chain.members.append(b.var)
                cur = b.var
                continue
            break
        if (name == "relax.reshape" and chain.kind in ("dense", "bmm")
                and int(v.ty.shape[-1]) == int(b.value.args[0].ty.shape[-1])):
            # [rows, N] <-> [batch, seq, N] (a bmm: [B, M, N] <-> [1, heads, M, N]):
            # transparent for an epilogue per output column
            chain.members.append(b.var)
            cur = b.var
            continue
        if name == "relax.nn.gelu" and not chain.activated and chain.residual is None:
            chain.gelu = True
            chain.members.append(b.var)
            cur = b.var
            continue
        if name == "relax.nn.relu" and not chain.activated:
            chain.relu = True
            chain.members.append(b.var)
            cur = b.var
            continue
        if name == "relax.clip" and len(v.args) == 3 and _take_clip(chain, v):
            chain.members.append(b.var)
            cur = b.var
            continue
        break
    chain.scale, chain.shift, chain.end = scale, shift, cur
    return chain


def epilogue_fields(chain) -> dict:
    """The Recipe fields of the chain's fused activation and clamps."""
    return dict(relu=bool(chain.relu), clip_max=chain.clip_max, clip_min=chain.clip_min,
                clamp=chain.clamp, gelu=bool(chain.gelu), activation=chain.activation)


def _take_clip(chain, clip) -> bool:
    """Fold clip(v, lo, hi) into the epilogue if it can be: from 0, a ReLU6-like end (after a
    ReLU too: a quantized model's pair capping one); from below 0, the op's own result clamped
    before a residual, or the end clamp after one (a QDQ pair's range, quantization/qdq.py)."""
    lo, hi = (_prim_value(a) for a in clip.args[1:])
    if (lo is None or hi is None or chain.clip_max is not None or chain.gelu
            or chain.activation is not None):
        return False
    if lo == 0.0:
        chain.relu, chain.clip_max = True, hi
        return True
    if lo > 0.0 or chain.activated:
        return False
    if chain.residual is None and chain.clamp is None:
        chain.clamp = (lo, hi)
    else:
        chain.clip_min, chain.clip_max = lo, hi
    return True


def find_chains(func):
    """The quantizable ops of a Relax main function, each with its fusable epilogue."""
    bindings = dataflow_bindings(func)
    uses = count_uses(bindings, func)
    all_readers = readers(bindings)
    users = {v: bs[0] for v, bs in all_readers.items()}  # each var's first reader
    by_var = {b.var: b for b in bindings}
    chains = []
    taken = set()
    for b in bindings:
        if b.var in taken:
            continue
        chain = _match_start(b)
        if chain is None:
            continue
        _grow(chain, by_var, users, uses, taken, all_readers)
        # a residual must be computed before the chain ends (it is an argument of the fused op)
        taken.update(chain.members)
        chains.append(chain)
    return chains


# -- calibration ------------------------------------------------------------------------------
