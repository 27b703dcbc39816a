"""The default CPU schedule of leftover operators, and the vectorizable exp/erf it relies on."""

import math

import ml_dtypes
import numpy as np
import pytest
import torch
import tvm
from tvm import relax, te, tirx

import unit_tvm
from unit_tvm import fastmath, frontends
from unit_tvm.relax.cpu.default_schedule import DefaultCPUSchedule
from unit_tvm.relax.cpu.fuse_elementwise import fuse_elementwise


def _run_elementwise(fn, xs, host_target):
    n = xs.size
    x = te.placeholder((n,), "float32", name="x")
    y = te.compute((n,), lambda i: fn(x[i]), name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    (i,) = sch.get_loops(sch.get_sblock("y"))
    _, v = sch.split(i, [None, 16])
    sch.vectorize(v)
    lib = tvm.compile(sch.mod, target=host_target)
    out = tvm.runtime.tensor(np.zeros(n, "float32"))
    lib(tvm.runtime.tensor(xs), out)
    return out.numpy()


def _samples():
    rng = np.random.default_rng(0)
    return np.concatenate([np.linspace(-90, 90, 4001), rng.standard_normal(4000) * 3,
                           [0.0, -0.0, 1e-8, -1e-8]]).astype("float32")


def test_fast_exp_is_accurate(host_target):
    xs = _samples()
    got = _run_elementwise(fastmath.exp, xs, host_target)
    keep = (xs > -87) & (xs < 88)
    ref = np.exp(xs[keep].astype("float64"))
    assert np.max(np.abs(got[keep] - ref) / ref) < 1e-6
    # saturates instead of overflowing, and is 0 rather than a subnormal below -87 (a softmax
    # row divides it, and subnormals take the CPU's slow path)
    assert np.isfinite(got).all() and (got[xs >= -87] > 0).all() and (got[xs < -87] == 0).all()
    assert (got[got > 0] >= np.finfo(np.float32).tiny).all()


def test_bf16_exp_rounds_as_the_exact_exp_nearly_everywhere(host_target):
    """exp_nonpositive_bf16 (softmax exps rounded to bf16, x <= 0): within 1e-4 relative of
    exp on [-87, 0], 0 below -87 and at -inf, never a subnormal; rounded to bf16 it gives the
    same value as the exact exp for at least 95% of arguments and one bf16 step away for the
    rest."""
    xs = np.concatenate([np.linspace(-90, 0, 40001), -np.abs(np.random.default_rng(1)
                                                              .standard_normal(4000) * 3),
                         [0.0, -np.inf]]).astype("float32")
    got = _run_elementwise(fastmath.exp_nonpositive_bf16, xs, host_target)
    keep = xs >= -87
    ref = np.exp(xs[keep].astype("float64"))
    assert np.max(np.abs(got[keep] - ref) / ref) < 1e-4
    assert (got[~keep] == 0).all() and (got[got > 0] >= np.finfo(np.float32).tiny).all()
    bf = [v.astype(ml_dtypes.bfloat16).astype(np.float64) for v in (got[keep], ref)]
    same = bf[0] == bf[1]
    assert same.mean() > 0.95, same.mean()
    assert np.max(np.abs(bf[0] - bf[1]) / bf[1]) <= 2 ** -7


def test_fast_erf_is_accurate(host_target):
    """Within 1e-6 everywhere, densely where the rational approximation works (|x| <= 4) and
    across its clamp, exactly odd."""
    xs = np.concatenate([_samples(), np.linspace(-5, 5, 100001, dtype="float32")])
    got = _run_elementwise(fastmath.erf, xs, host_target)
    ref = np.array([math.erf(float(v)) for v in xs])
    assert np.max(np.abs(got - ref)) < 1e-6
    np.testing.assert_array_equal(_run_elementwise(fastmath.erf, -xs, host_target), -got)


def test_fast_sigmoid_and_tanh_are_accurate(host_target):
    """Within 3e-7 absolute (float32 rounding of the last operations), monotone saturation to
    the exact limits at both ends, no NaN, infinity or subnormal anywhere (a subnormal gate
    makes every product of it take the CPU's slow path)."""
    xs = np.concatenate([_samples(), np.linspace(-20, 20, 200001, dtype="float32")])
    ref = xs.astype("float64")
    for fn, exact, limits in ((fastmath.sigmoid, 1 / (1 + np.exp(-ref)), (0.0, 1.0)),
                              (fastmath.tanh, np.tanh(ref), (-1.0, 1.0))):
        got = _run_elementwise(fn, xs, host_target)
        assert np.isfinite(got).all()
        assert ((got == 0) | (np.abs(got) >= np.finfo(np.float32).tiny)).all(), fn.__name__
        assert np.max(np.abs(got - exact)) < 3e-7, fn.__name__
        assert abs(got[np.argmin(xs)] - limits[0]) < 1e-37 and got[np.argmax(xs)] == limits[1]


def test_vectorizable_turns_small_powers_into_products(host_target):
    """x ** 3 (GELU's tanh form) and x ** 2 become products, x ** 0.5 a square root, and they
    equal numpy's; x ** 2.5 keeps the library call."""
    x = te.placeholder((64,), "float32", name="x")

    def power(k, e):
        return te.compute((64,), lambda i: tirx.pow(x[i], tirx.const(e, "float32")),
                          name=f"y{k}")

    ys = [power(k, e) for k, e in enumerate((3.0, 2.0, 0.5, 2.5))]
    func = fastmath.vectorizable(te.create_prim_func([x, *ys]))
    assert func.script().count("T.pow(") == 1
    lib = tvm.compile(tvm.IRModule({"main": func}), target=host_target)
    xs = np.linspace(0.1, 3, 64).astype("float32")
    outs = [tvm.runtime.tensor(np.zeros(64, "float32")) for _ in ys]
    lib(tvm.runtime.tensor(xs), *outs)
    for out, e in zip(outs, (3.0, 2.0, 0.5, 2.5)):
        np.testing.assert_allclose(out.numpy(), xs.astype("float64") ** e, rtol=1e-6)


def test_vectorizable_replaces_libm_calls(host_target):
    x = te.placeholder((64,), "float32", name="x")
    y = te.compute((64,), lambda i: tirx.exp(x[i]) + tirx.erf(x[i]), name="y")
    d = te.placeholder((64,), "float64", name="d")
    z = te.compute((64,), lambda i: tirx.exp(d[i]), name="z")
    func = fastmath.vectorizable(te.create_prim_func([x, d, y, z]))
    text = func.script()
    assert "T.erf" not in text
    assert text.count("T.exp(") == 1  # float64 keeps the libm call
    lib = tvm.compile(tvm.IRModule({"main": func}), target=host_target)
    xs = np.linspace(-3, 3, 64).astype("float32")
    out_y = tvm.runtime.tensor(np.zeros(64, "float32"))
    out_z = tvm.runtime.tensor(np.zeros(64, "float64"))
    lib(tvm.runtime.tensor(xs), tvm.runtime.tensor(xs.astype("float64")), out_y, out_z)
    ref = np.exp(xs.astype("float64")) + np.array([math.erf(float(v)) for v in xs])
    np.testing.assert_allclose(out_y.numpy(), ref, rtol=1e-6, atol=1e-6)


def _leftover_module(shape, build, target=None):
    """A one-op Relax module (op built by build(x)), legalized and given the default schedule
    (with target's vector widths)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build(x))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    return DefaultCPUSchedule(target)(mod)


def _numpy_layer_norm(a):
    mean = a.mean(-1, keepdims=True)
    return (a - mean) / np.sqrt(a.var(-1, keepdims=True) + 1e-5)


def _softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


CASES = {
    "softmax": ((2, 4, 32, 64), lambda x: relax.op.nn.softmax(x, axis=-1), _softmax),
    "layer_norm": ((1, 128, 96), lambda x: relax.op.nn.layer_norm(
        x, relax.const(np.ones(96, "float32")), relax.const(np.zeros(96, "float32")), axes=[-1]),
        _numpy_layer_norm),
    "q_kt": ((4, 40, 64), lambda x: relax.op.matmul(x, relax.op.permute_dims(x, [0, 2, 1])),
             lambda a: a @ a.transpose(0, 2, 1)),
    # attention with token counts that are not multiples of the vector width (ViT's 197)
    "q_kt_197": ((2, 197, 32), lambda x: relax.op.matmul(x, relax.op.permute_dims(x, [0, 2, 1])),
                 lambda a: a @ a.transpose(0, 2, 1)),
    "attention_13": ((2, 13, 32), lambda x: relax.op.matmul(relax.op.nn.softmax(relax.op.matmul(
        x, relax.op.permute_dims(x, [0, 2, 1]))), x),
        lambda a: _softmax(a @ a.transpose(0, 2, 1)) @ a),
    "attention_197": ((2, 197, 32), lambda x: relax.op.matmul(relax.op.nn.softmax(
        relax.op.matmul(x, relax.op.permute_dims(x, [0, 2, 1])) * relax.const(0.1)), x),
        lambda a: _softmax(0.1 * (a @ a.transpose(0, 2, 1))) @ a),
    # row reductions at extents that are not whole 16-lane vectors (197, 200 tokens)
    "softmax_197": ((2, 4, 32, 197), lambda x: relax.op.nn.softmax(x, axis=-1), _softmax),
    "softmax_200": ((2, 4, 32, 200), lambda x: relax.op.nn.softmax(x, axis=-1), _softmax),
    # a row of whole 4-lane vectors only (Whisper's 1500 frames)
    "softmax_60": ((2, 4, 32, 60), lambda x: relax.op.nn.softmax(x, axis=-1), _softmax),
    # rows shorter than a vector, down to one element (compute_at drops that loop)
    "softmax_3": ((96, 3), lambda x: relax.op.nn.softmax(x, axis=-1), _softmax),
    "softmax_1": ((64, 1), lambda x: relax.op.nn.softmax(x, axis=-1), _softmax),
    "gelu_197": ((64, 197), lambda x: relax.op.nn.gelu(x),
                 lambda a: a * 0.5 * (1 + np.vectorize(math.erf)(a / math.sqrt(2)))),
    "channel_mean": ((4, 48, 32, 16), lambda x: relax.op.mean(x, axis=[1]), lambda a: a.mean(1)),
    # squeeze-excitation's pool: few channels, each a long run of pixels
    "spatial_mean": ((1, 32, 56, 56), lambda x: relax.op.mean(x, axis=[2, 3], keepdims=True),
                     lambda a: a.mean((2, 3), keepdims=True)),
    "sigmoid": ((96, 80), relax.op.sigmoid, lambda a: 1 / (1 + np.exp(-a))),
    "tanh": ((96, 80), relax.op.tanh, np.tanh),
    # a late CNN stage: rows of 14 pixels, merged with their columns to vectorise
    "sigmoid_14x14": ((1, 96, 14, 14), relax.op.sigmoid, lambda a: 1 / (1 + np.exp(-a))),
    "gelu": ((128, 256), lambda x: relax.op.nn.gelu(x),
             lambda a: a * 0.5 * (1 + np.vectorize(math.erf)(a / math.sqrt(2)))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_default_schedule_is_correct_and_parallel(case, host_target, rng):
    shape, build, ref = CASES[case]
    mod = _leftover_module(shape, build)
    prims = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert prims and all("tirx.is_scheduled" in f.attrs for f in prims)
    text = "".join(f.script() for f in prims)
    assert "T.parallel" in text
    assert not any(f"T.{fn}(" in text for fn in ("exp", "erf", "sigmoid", "tanh"))
    ex = tvm.compile(mod, target=host_target)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    a = rng.standard_normal(shape).astype("float32")
    got = vm["main"](tvm.runtime.tensor(a)).numpy()
    np.testing.assert_allclose(got, ref(a.astype("float64")), rtol=2e-5, atol=2e-5)


def test_odd_token_matmuls_are_padded_to_the_register_tile():
    """197 columns (and 197 rows, prime) would leave a scalar loop nest (10x slower than 192):
    the matmul runs on extents padded to the vector width and the tile's rows, then is cropped."""
    mod = _leftover_module((2, 197, 32), CASES["q_kt_197"][1])
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)
               and "matmul" in f.script()]
    text = func.script()
    assert "T.sblock_alloc_buffer((T.int64(2), T.int64(200), T.int64(208))" in text, text
    assert "T.vectorized(T.int64(16))" in text


def test_odd_elementwise_extent_vectorised_with_a_peeled_tail():
    """197 columns: 192 run as 12 zmm vectors, the last 5 as a scalar tail (9x faster GELU on
    12 x 197 x 197 than the scalar loop it replaced)."""
    mod = _leftover_module((64, 197), CASES["gelu_197"][1])
    text = "".join(f.script() for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    assert "T.vectorized(T.int64(16))" in text and "192" in text


def test_rows_of_14_pixels_are_vectorised_with_their_columns():
    """[1, 96, 14, 14]: 14 is no vector width; H and W fused give 196 (12 vectors and a tail).
    EfficientNetV2-S's SiLU after 14x14 depthwise convs: 182 -> 30 us per call (Zen 5)."""
    mod = _leftover_module((1, 96, 14, 14), CASES["sigmoid_14x14"][1])
    text = "".join(f.script() for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    assert "T.vectorized(T.int64(16))" in text, text


def test_row_reductions_are_vectorised_by_rfactor():
    mod = _leftover_module((1, 128, 96), CASES["layer_norm"][1])
    text = "".join(f.script() for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    assert "_rf" in text and "T.vectorized(T.int64(16))" in text


def test_spatial_mean_is_one_vectorised_run_per_channel():
    """A mean over H and W (32 channels of 56 x 56: EfficientNet's squeeze-excitation pool) is
    one reduction loop per channel, vectorised by rfactor, the channels in parallel although
    fewer than MIN_PARALLEL: 219 -> 35 us for 144 channels of 56 x 56 (Zen 5)."""
    mod = _leftover_module((1, 32, 56, 56), CASES["spatial_mean"][1])
    text = "".join(f.script() for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    assert "_rf" in text and "T.vectorized(T.int64(16))" in text and "T.parallel" in text


def test_softmax_rows_run_in_one_parallel_pass():
    """Softmax's four stages (row max, exp, row sum, divide) run inside one parallel loop over
    rows, the reductions on vectors of partial results: one fork-join instead of four, a row
    kept in L1 from the first stage to the last (BERT-base's 12 x 128 x 128, Zen 4: 55 -> 48
    us in the model). Its numbers: test_default_schedule_is_correct_and_parallel[softmax]."""
    mod = _leftover_module(*CASES["softmax"][:2])
    text = "".join(f.script() for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    assert text.count("T.parallel") == 1 and text.count("_rf") >= 2
    assert "T.vectorized(T.int64(16))" in text


@pytest.mark.parametrize("tokens,lanes", [(200, 8), (197, 16)])
def test_odd_row_reductions_are_vectorised_too(tokens, lanes):
    """Softmax over 200 tokens reduces rows in 8-lane partials, over 197 in 16-lane partials
    whose last step is predicated; both scalar before (2.6x the time per element of 192)."""
    mod = _leftover_module((2, 4, 32, tokens), CASES[f"softmax_{tokens}"][1])
    text = "".join(f.script() for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    assert text.count("_rf") >= 2 and f"T.vectorized(T.int64({lanes}))" in text


@pytest.mark.parametrize("stride", [1, 2])
def test_blocked_depthwise_conv_vectorised_and_requantized_in_registers(stride, host_target, rng):
    """A packed int8 depthwise conv (NCHW16c in and out, 20 channels so 12 are padding): the
    accumulation is vectorised over the 16 channels of a block, several output pixels at once
    (unrolled rows of accumulators), and the requantization runs inside the same parallel loop
    (no second pass over an int32 buffer); the result equals
    TVM's build of the unscheduled loop nest."""
    from unit_tvm.relax.cpu.qops import plain_func
    from unit_tvm.relax.core.recipe import Recipe, in_shape, out_shape
    from unit_tvm.relax.cpu.weights import plain_weight_shape

    oh = (16 + 2 - 3) // stride + 1
    recipe = Recipe(kind="conv2d", in_shape=(1, 20, 16, 16), w_shape=(20, 1, 3, 3),
                    out_channels=20, out_shape=(1, 20, oh, oh), stride=(stride, stride),
                    dilation=(1, 1), padding=(1, 1, 1, 1), groups=20, x_scale=0.1, x_zp=3,
                    in_u8=True, out_q=(0.2, 5), relu=True, clip_max=6.0, in_block=16,
                    out_block=16)
    func = plain_func(recipe)
    scheduled = DefaultCPUSchedule()(tvm.IRModule({"main": func}))["main"]
    text = scheduled.script()
    acc_loops = text[text.index('T.sblock("xq")'):text.index('T.sblock("acc_update")')]
    assert "T.vectorized(16)" in acc_loops
    assert "T.unroll(" in acc_loops  # rows of accumulators held in registers
    assert text.count("T.parallel(") == 2  # padding pass; accumulation + requantization
    assert text.index('T.sblock("out")') > text.index('T.sblock("acc_update")')
    args = [rng.integers(0, 256, in_shape(recipe)).astype("uint8"),
            rng.integers(-128, 128, plain_weight_shape(recipe)).astype("int8"),
            rng.integers(-50, 50, 20).astype("int32"), np.full(20, 2e-5, "float32"),
            rng.standard_normal(20).astype("float32")]
    outs = []
    for f in (scheduled, func):
        lib = tvm.compile(tvm.IRModule({"main": f}), target=host_target)
        out = tvm.runtime.tensor(np.zeros(out_shape(recipe), "uint8"))
        lib(*[tvm.runtime.tensor(a) for a in args], out)
        outs.append(out.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    assert len(np.unique(outs[0])) > 8


def test_aarch64_gets_neon_vector_widths():
    """On aarch64 the leftover ops vectorise 8 float32 lanes (two q registers), not a zmm's 16:
    the same softmax runs on x86 with 16-lane vectors."""
    from unit_tvm.cross import aarch64

    shape, build, _ = CASES["softmax"]
    arm = _leftover_module(shape, build, aarch64.target()).script()
    x86 = _leftover_module(shape, build).script()
    assert "T.vectorized(T.int64(8))" in arm and "T.vectorized(T.int64(16))" not in arm
    assert "T.vectorized(T.int64(16))" in x86


class _HardswishGate(torch.nn.Module):
    """hardswish (five ops as torch.export spells it) and a squeeze-excitation style gate."""

    def forward(self, x):
        y = torch.nn.functional.hardswish(x)
        return y * torch.sigmoid(y.mean((2, 3), keepdim=True))


def _stages(func):
    text = func.script()
    return text.count('T.sblock("') - text.count('T.sblock("root")')


def test_leftover_elementwise_chain_is_one_single_pass_kernel(host_target, rng):
    """hardswish's five ops become one kernel with one stage (one pass over the tensor); the
    gate's per-channel sigmoid stays a stage of its own (inlined it would run once per pixel);
    the compiled module equals PyTorch."""
    x = rng.standard_normal((1, 24, 16, 16)).astype("float32")
    mod = frontends.from_torch(_HardswishGate(), [torch.tensor(x)])
    fused = fuse_elementwise(relax.transform.LegalizeOps()(mod))
    names = [gv.name_hint for gv in fused.functions if gv.name_hint != "main"]
    (chain,) = [n for n in names if "clip" in n]
    assert all(op in chain for op in ("add", "multiply", "divide")), names
    scheduled = DefaultCPUSchedule(host_target)(fused)
    assert _stages(scheduled[chain]) == 1
    (gate,) = [n for n in names if "sigmoid" in n]
    assert _stages(scheduled[gate]) == 2
    vm = relax.VirtualMachine(unit_tvm.compile(mod, target=host_target), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x))
    got = got[0].numpy() if not hasattr(got, "numpy") else got.numpy()
    with torch.no_grad():
        ref = _HardswishGate()(torch.tensor(x)).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
