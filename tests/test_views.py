"""Attention's layout ops folded into its bf16 matmuls (relax/core/views.py): the view algebra
against numpy, and models whose heads are split and merged in two different spellings."""

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax, te

import unit_tvm
from unit_tvm import frontends
from unit_tvm.compiler import build_relax
from unit_tvm.relax import UnitTensorize, quantize, recipes
from unit_tvm.relax.core.views import StridedView, _copy_schedule, apply, split_part
from unit_tvm.testing import zoo
from unit_tvm.testing.attention import drawn_heads, drawn_spelling

from .conftest import require_host
from .test_relax import TinyTransformer, _cos, _run


def _read(source, view):
    idx = np.indices(view.shape).reshape(len(view.shape), -1)
    flat = view.offset + sum(i * s for i, s in zip(idx, view.strides))
    return source.reshape(-1)[flat].reshape(view.shape)


def _random_layout_step(rng, a, view):
    """One numpy layout op on `a` and the same on `view` (None: the view needs a copy)."""
    op = rng.integers(0, 4)
    if op == 0:
        axes = [int(v) for v in rng.permutation(a.ndim)]
        return a.transpose(axes), view.permute(axes)
    if op == 1:
        axis = int(rng.integers(0, a.ndim))
        lo = int(rng.integers(0, a.shape[axis]))
        hi, step = int(rng.integers(lo + 1, a.shape[axis] + 1)), int(rng.integers(1, 3))
        index = [slice(None)] * a.ndim
        index[axis] = slice(lo, hi, step)
        return a[tuple(index)], view.slice(axis, lo, hi, step)
    if op == 2:
        axis = int(rng.integers(0, a.ndim + 1))
        return np.expand_dims(a, axis), view.expand(axis)
    dims, left = [], a.size
    while left > 1:
        d = int(rng.choice([x for x in range(2, left + 1) if left % x == 0]))
        dims.append(d)
        left //= d
    dims = [int(v) for v in rng.permutation(dims or [1])]
    return a.reshape(dims), view.reshape(dims)


def test_strided_views_read_what_numpy_layout_ops_give():
    """Random chains of transposes, strided slices, new axes and reshapes: wherever the view
    algebra says the result is still a view of the source, reading the source through it gives
    numpy's result; where it refuses (a reshape that needs a copy) the chain stops."""
    rng = np.random.default_rng(7)
    checked = refused = 0
    for _ in range(400):
        shape = tuple(int(v) for v in rng.choice([1, 2, 3, 4, 6], size=rng.integers(1, 5)))
        source = np.arange(np.prod(shape)).reshape(shape)
        a, view = source, StridedView.contiguous(shape)
        for _ in range(4):
            a, view = _random_layout_step(rng, a, view)
            if view is None:
                refused += 1
                break
            np.testing.assert_array_equal(_read(source, view), a)
            checked += 1
    assert checked > 1000 and refused > 10


@pytest.mark.parametrize("shape, chain", [
    # K^T of a fused QKV projection (BERT-base's, 8 tokens): the tiled path
    ((8, 96), [("reshape", (8, 3, 2, 16)), ("permute", (1, 2, 3, 0)), ("slice", (0, 1, 2)),
               ("reshape", (2, 16, 8))]),
    # extents no tile divides (7 tokens, 5-wide heads), and a 2-D transpose
    ((7, 15), [("reshape", (7, 3, 5)), ("permute", (1, 2, 0))]),
    ((24, 40), [("permute", (1, 0))]),
    # a unit axis in front (stride 0 where expand_dims put it)
    ((24, 40), [("permute", (1, 0)), ("expand", 0)])])
def test_gathered_operand_equals_numpy(shape, chain, host_target):
    """The one copy kernel that gathers an operand whose lanes are not contiguous in its
    source (K^T) reads what numpy's layout ops give, tiled or not."""
    source = np.arange(np.prod(shape), dtype="float32").reshape(shape)
    a, view = source, StridedView.contiguous(shape)
    for op, arg in chain:
        if op == "reshape":
            a, view = a.reshape(arg), view.reshape(arg)
        elif op == "permute":
            a, view = a.transpose(arg), view.permute(arg)
        elif op == "slice":
            axis, lo, hi = arg
            a, view = a[(slice(None),) * axis + (slice(lo, hi),)], view.slice(axis, lo, hi)
        else:
            a, view = np.expand_dims(a, arg), view.expand(arg)
    assert view.strides[-1] != 1
    src = te.placeholder((source.size,), "float32", name="src")
    out = te.compute(view.shape, lambda *i: src[view.flat_index(i)], name="view_copy")
    lib = tvm.compile(tvm.IRModule({"main": _copy_schedule(te.create_prim_func([src, out]),
                                                           view.strides)}), target=host_target)
    got = tvm.runtime.tensor(np.zeros(view.shape, "float32"))
    lib(tvm.runtime.tensor(source.reshape(-1)), got)
    np.testing.assert_array_equal(got.numpy(), a)


@pytest.mark.parametrize("shape,sections,axis", [
    ((3, 1, 4, 6, 8), 3, 0),  # ONNX's Split of a QKV projection's 5-D transpose
    ((2, 5, 12), 3, -1),  # torch.chunk along the last axis
    ((4, 9, 2), [2, 7], 1),  # indices: unequal parts
    ((4, 9, 2), [3, 3, 20], 1),  # an empty part and one cut past the end
    ((10, 4), 3, 0),  # sections that do not divide: Relax's parts are 4, 4 and 2
])
def test_split_parts_read_as_numpy_splits(shape, sections, axis):
    """A TupleGetItem of Relax's split, as the strided_slice split_part makes of it, read
    through the view algebra, is numpy's part; a TupleGetItem of anything else is not one."""
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    split = relax.op.split(x, sections, axis)
    parts_var = relax.Var("parts", relax.BlockBuilder().normalize(split).ty)
    a = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    parts = parts_var.ty.fields
    extents = [int(f.shape[axis]) for f in parts]  # Relax's parts, checked against numpy's
    want = np.split(a, np.cumsum(extents)[:-1], axis)
    if isinstance(sections, list) or shape[axis] % sections == 0:
        assert [w.shape for w in want] == [p.shape for p in np.split(a, sections, axis)]
    else:  # as torch.chunk: ceiling division
        step = -(-shape[axis] // sections)
        assert extents == [min(step, shape[axis] - k) for k in range(0, shape[axis], step)]
    for i, part in enumerate(want):
        call = split_part(relax.TupleGetItem(parts_var, i), {parts_var: split}.get)
        view = apply(StridedView.contiguous(shape), call)
        assert list(view.shape) == list(part.shape)
        np.testing.assert_array_equal(_read(a, view), part)
    other = relax.Var("t", relax.TupleType([relax.TensorType(shape, "float32")]))
    assert split_part(relax.TupleGetItem(other, 0), {}.get) is None
    assert split_part(relax.TupleGetItem(parts_var, 0), {parts_var: x}.get) is None


def test_take_of_one_index_reads_as_numpy_take():
    """take(x, i, axis) of one constant index in range, read through the view algebra, is
    numpy's take; a negative index (take's modes disagree there) and an index tensor are not
    read as views."""
    shape = (3, 4, 5)
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    a = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    for axis in (0, 1, -1):
        for i in range(a.shape[axis]):
            call = bb.normalize(relax.op.take(x, relax.const(i, "int64"), axis=axis))
            np.testing.assert_array_equal(_read(a, apply(StridedView.contiguous(shape), call)),
                                          np.take(a, i, axis=axis))
    for index in (-1, [1, 2]):
        call = bb.normalize(relax.op.take(x, relax.const(index, "int64"), axis=0))
        assert apply(StridedView.contiguous(shape), call) is None


def test_reshape_of_a_transpose_that_needs_a_copy_is_refused():
    """Merging a transposed pair of axes is not a view (numpy copies); splitting one is."""
    t = StridedView.contiguous((4, 6)).permute((1, 0))
    assert t.reshape((24,)) is None
    assert t.reshape((3, 2, 4)).strides == (2, 1, 6)
    assert StridedView.contiguous((4, 6)).is_contiguous() and not t.is_contiguous()


class SplitHeads(nn.Module):
    """Attention spelled as Hugging Face's BERT does: three projections, view + transpose(1, 2)
    per head, K transposed by transpose(-1, -2), the heads merged by transpose + contiguous +
    view, the scale applied after the matmul."""

    def __init__(self, hidden=64, heads=4):
        super().__init__()
        self.heads, self.d = heads, hidden // heads
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, s, h = x.shape

        def split(t):
            return t.view(b, s, self.heads, self.d).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / self.d ** 0.5, dim=-1)
        ctx = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, s, h)
        return self.out(ctx)


def _ops(mod):
    names = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
            names.append(e.op.name)

    relax.analysis.post_order_visit(mod["main"], visit)
    return names


@pytest.mark.parametrize("model_cls", [SplitHeads, TinyTransformer])
def test_bf16_attention_reads_heads_in_place_and_writes_them_merged(model_cls):
    """attention="bf16" on two spellings of multi-head attention: Q and V are read by the
    matmul kernels where the projections wrote them (no transpose or slice left in the graph),
    K^T is gathered by one copy, P x V writes its heads merged (no transpose after it), and the
    1 / sqrt(d) scale is in Q x K^T's epilogue (no divide). TVM's plain build of that module
    (any x86 host) is as close to the fp32 model as with fp32 attention."""
    model = model_cls()
    zoo._randomize(model, 0)
    model.eval()
    cal, xs = zoo.inputs((1, 16, 64), 2, seed=1), zoo.inputs((1, 16, 64), 2, seed=2)
    with torch.no_grad():
        refs = [model(torch.tensor(x)).numpy() for x in xs]
    mod = frontends.from_torch(model, [torch.tensor(xs[0])])
    qmod = quantize(mod, calibration_data=cal, attention="bf16")
    ops = _ops(qmod)
    assert not {"relax.permute_dims", "relax.strided_slice", "relax.divide"} & set(ops), ops
    bmm = [r for _, r in recipes(qmod) if r["kind"] == "bmm"]
    assert "x_view" in bmm[0] and "w_view" not in bmm[0]  # Q in place, K^T gathered
    assert "w_view" in bmm[1] and bmm[1]["out_axes"] == [1, 0, 2]  # V in place, heads merged
    copies = [gv.name_hint for gv in qmod.functions if gv.name_hint.startswith("view_copy")]
    assert len(copies) == 1
    host = unit_tvm.target.host()
    fp32 = _run(tvm.compile(quantize(mod, calibration_data=cal, attention="fp32"), target=host),
                xs)
    plain = _run(tvm.compile(qmod, target=host), xs)
    for got, other, ref in zip(plain, fp32, refs):
        assert _cos(got, ref) > _cos(other, ref) - 1e-3 and _cos(got, other) > 0.9999
    require_host("x86.vdpbf16ps")
    tpass = UnitTensorize()
    tensorized = _run(build_relax(tpass(qmod), host), xs)
    assert all(instr for _, instr, _ in tpass.report), tpass.report
    for got, base in zip(tensorized, plain):
        np.testing.assert_allclose(got, base, rtol=1e-4, atol=1e-5)


def DrawnHeads(seed):  # noqa: N802 - a model class's name, as the tests read
    """Multi-head attention (3 heads of 16) in the spelling drawn from `seed`
    (unit_tvm.testing.attention: heads split, sliced, transposed and merged differently)."""
    return drawn_heads(drawn_spelling(seed))


SEEDS = (0, 2, 4, 7, 9, 11, 17)  # every spelling option drawn at least once, batch 1 and 2


def drawn_attention(seed):
    """DrawnHeads(seed) with random weights (batch 1 or 2, 16 tokens): its Relax module, two
    calibration inputs and two test inputs."""
    model = DrawnHeads(seed)
    zoo._randomize(model, seed)
    model.eval()
    shape = (1 + seed % 2, 16, 48)
    cal, xs = zoo.inputs(shape, 2, seed=1), zoo.inputs(shape, 2, seed=2)
    return frontends.from_torch(model, [torch.tensor(xs[0])]), cal, xs


@pytest.mark.parametrize("seed", SEEDS)
def test_bf16_attention_in_drawn_spellings_equals_fp32_attention(seed):
    """Attention spelled six drawn ways (batch 1 or 2): wherever quantize folds the layout ops
    into the bf16 matmuls or leaves them, TVM's plain build of the module is as close to the
    fp32-attention module as bf16 rounding allows (a head or token read from the wrong place
    would not be), and the tensorized build equals the plain one."""
    mod, cal, xs = drawn_attention(seed)
    qmod = quantize(mod, calibration_data=cal, attention="bf16")
    host = unit_tvm.target.host()
    fp32 = _run(tvm.compile(quantize(mod, calibration_data=cal, attention="fp32"), target=host),
                xs)
    plain = _run(tvm.compile(qmod, target=host), xs)
    for got, other in zip(plain, fp32):
        assert _cos(got, other) > 0.9999
        np.testing.assert_allclose(got, other, atol=2e-2 * np.abs(other).max())
    require_host("x86.vdpbf16ps")
    tpass = UnitTensorize()
    tensorized = _run(build_relax(tpass(qmod), host), xs)
    for got, base in zip(tensorized, plain):
        np.testing.assert_allclose(got, base, rtol=1e-4, atol=1e-5)


def test_drawn_spellings_fold_views_both_ways():
    """The six spellings above reach every fold: an operand read in place, one gathered, a
    result written transposed, and one left to a copy (the interleaved merge)."""
    seen = set()
    for seed in SEEDS:
        model = DrawnHeads(seed)
        mod = frontends.from_torch(model, [torch.zeros(1 + seed % 2, 16, 48)])
        qmod = quantize(mod, calibration_data=zoo.inputs((1 + seed % 2, 16, 48), 1),
                        attention="bf16")
        for _, r in recipes(qmod):
            if r["kind"] == "bmm":
                seen |= {key for key in ("x_view", "w_view", "out_axes") if key in r}
        if any(g.name_hint.startswith("view_copy") for g in qmod.functions):
            seen.add("copy")
        if "relax.permute_dims" in _ops(qmod):
            seen.add("left")
    assert seen == {"x_view", "w_view", "out_axes", "copy", "left"}, seen


class TwoAttentions(nn.Module):
    """Two attention layers one after the other: with different head counts (K^T gathered in
    two shapes, as in Swin's or MaxViT's stages) or the same (one gather serves both)."""

    def __init__(self, heads=(4, 2)):
        super().__init__()
        self.first, self.second = SplitHeads(64, heads[0]), SplitHeads(64, heads[1])

    def forward(self, x):
        return self.second(self.first(x))


@pytest.mark.parametrize("heads,copies", [((4, 2), 2), ((4, 4), 1)])
def test_attention_layers_of_two_shapes_get_a_copy_kernel_each(heads, copies):
    """Each distinct K^T gather is one copy kernel exported under its own name (two under one
    name stopped TVM's build: "duplicate global symbol view_copy", found on torchvision's
    swin_t); identical gathers share one. The built module equals the fp32-attention one."""
    model = TwoAttentions(heads)
    zoo._randomize(model, 0)
    model.eval()
    cal, xs = zoo.inputs((1, 16, 64), 2, seed=1), zoo.inputs((1, 16, 64), 2, seed=2)
    mod = frontends.from_torch(model, [torch.tensor(xs[0])])
    qmod = quantize(mod, calibration_data=cal, attention="bf16")
    names = sorted(gv.name_hint for gv in qmod.functions if gv.name_hint.startswith("view_copy"))
    assert len(names) == copies, names
    symbols = {qmod[n].attrs["global_symbol"] for n in names}
    assert symbols == set(names)
    host = unit_tvm.target.host()
    fp32 = _run(tvm.compile(quantize(mod, calibration_data=cal, attention="fp32"), target=host),
                xs)
    for got, other in zip(_run(tvm.compile(qmod, target=host), xs), fp32):
        assert _cos(got, other) > 0.999  # bf16 rounding through two layers: 0.9994-0.9996
