"""Rewriter + unit_tvm.build: tensorized kernels equal numpy on every kind of layout and size."""

import math
import warnings

import numpy as np
import pytest
import tvm
from tvm import te

import unit_tvm
from unit_tvm import measure, ops
from unit_tvm.testing import reference
from unit_tvm.prepare import placeholders_of, prepare

from .conftest import require_host

# Table I of the UNIT paper (C, H=W, K, R=S, stride), spatial size reduced for the test suite
TABLE_I = [(288, 35, 384, 3, 2), (160, 9, 224, 3, 1), (1056, 7, 192, 1, 1), (80, 73, 192, 3, 1),
           (128, 16, 128, 3, 1), (192, 16, 192, 3, 1), (256, 16, 256, 3, 1), (1024, 14, 512, 1, 1),
           (128, 16, 160, 3, 1), (576, 14, 192, 1, 1), (96, 16, 128, 3, 1), (1024, 14, 256, 1, 1),
           (576, 14, 128, 1, 1), (64, 29, 96, 3, 1), (64, 56, 128, 1, 2), (608, 14, 192, 1, 1)]


def _run(tensors, arrays, **kw):
    mod = unit_tvm.build(tensors, **kw)
    out = np.zeros([int(s) for s in tensors[-1].shape], str(tensors[-1].dtype))
    args = measure.to_device(list(arrays) + [out], tvm.cpu())
    mod(*args)
    return args[-1].numpy()


def _grouped_ref(d, w, groups, stride=1, dilation=1):
    c, k = d.shape[1], w.shape[0]
    return np.concatenate([reference.conv2d_nchw(d[:, g * c // groups:(g + 1) * c // groups],
                                                 w[g * k // groups:(g + 1) * k // groups],
                                                 stride, dilation) for g in range(groups)], axis=1)


@pytest.mark.parametrize("layer", TABLE_I, ids=[f"L{i + 1}" for i in range(16)])
def test_table1_layers_nchwc_small(layer, rng):
    require_host("x86.vpdpbusd")
    c, h, k, r, stride = layer
    h = min(h, r + 2 * stride + 3)  # keep the test fast; channels and windows are the table's
    op = ops.conv2d_nchwc(1, c, h, h, k, r, r, stride)
    d = rng.integers(0, 256, (1, c, h, h)).astype("uint8")
    w = rng.integers(-128, 128, (k, c, r, r)).astype("int8")
    got = _run([*op.op.input_tensors, op], [reference.pack_nchwc(d), reference.pack_kcrs(w)])
    np.testing.assert_array_equal(reference.unpack_nchwc(got).astype(np.int64),
                                  reference.conv2d_nchw(d, w, stride))


@pytest.mark.parametrize("c,h,k,r,stride,dilation,groups", [
    (3, 9, 10, 3, 1, 1, 1),  # C=3, K=10: both padded
    (16, 11, 32, 3, 2, 1, 1),  # strided, odd width
    (16, 13, 32, 3, 1, 2, 1),  # dilated
    (32, 10, 32, 3, 1, 1, 2),  # grouped (16 channels per group)
    (8, 7, 24, 1, 1, 1, 1),  # 1x1, K not a multiple of 16
])
def test_conv_nchw_packing_and_padding(c, h, k, r, stride, dilation, groups, rng):
    require_host("x86.vpdpbusd")
    op = ops.conv2d_nchw(c, h, k, r, stride, dilation, groups)
    d = rng.integers(0, 256, (1, c, h, h)).astype("uint8")
    w = rng.integers(-128, 128, (k, c // groups, r, r)).astype("int8")
    with warnings.catch_warnings():
        warnings.simplefilter("error", unit_tvm.FallbackWarning)  # every case tensorizes
        got = _run([*op.op.input_tensors, op], [d, w])
    np.testing.assert_array_equal(got.astype(np.int64),
                                  _grouped_ref(d, w, groups, stride, dilation))


@pytest.mark.parametrize("m,n,k", [(64, 48, 40), (7, 10, 3), (1, 16, 4), (33, 17, 130)])
def test_dense_unpacked_and_odd(m, n, k, rng):
    require_host("x86.vpdpbusd")
    op = ops.dense(m, n, k)
    a = rng.integers(0, 256, (m, k)).astype("uint8")
    b = rng.integers(-128, 128, (n, k)).astype("int8")
    np.testing.assert_array_equal(_run([*op.op.input_tensors, op], [a, b]).astype(np.int64),
                                  reference.dense(a, b))


def test_s8s8_shift_with_compensation_is_exact(rng):
    require_host("x86.vpdpbusd")
    op = ops.dense(40, 32, 72, a_dtype="int8")
    a = rng.integers(-128, 128, (40, 72)).astype("int8")
    a[0, :] = -128
    a[1, :] = 127
    b = rng.integers(-128, 128, (32, 72)).astype("int8")
    prepared = prepare(op, unit_tvm.intrinsics.get("x86.vpdpbusd"))
    assert prepared.shifted == "A" and "compensation" in prepared.stages
    np.testing.assert_array_equal(_run([*op.op.input_tensors, op], [a, b]).astype(np.int64),
                                  reference.dense(a, b))


def test_s8s8_conv_shift(rng):
    require_host("x86.vpdpbusd")
    op = ops.conv2d_nchw(8, 8, 16, 3, a="int8")
    d = rng.integers(-128, 128, (1, 8, 8, 8)).astype("int8")
    w = rng.integers(-128, 128, (16, 8, 3, 3)).astype("int8")
    np.testing.assert_array_equal(_run([*op.op.input_tensors, op], [d, w]).astype(np.int64),
                                  reference.conv2d_nchw(d, w))


def test_weights_packed_once_per_call_not_per_tile():
    """The pack of B is a root-level stage (its loop nest is not under the core's tile loops)."""
    op = ops.dense(64, 64, 64)
    sch = unit_tvm.rewrite(op, "x86.vpdpbusd", target=_vnni_target())
    script = sch.mod.script()
    pack_at = script.index('T.sblock("B_packed")')
    core_at = script.index('T.sblock("dense_core_update_o")')
    assert pack_at < core_at
    assert sch.mod.script().count('T.sblock("B_packed")') == 1


def test_other_instructions_run_through_build(rng):
    """vpdpbusd.256 and vpmaddubsw (a in [0,127]) and vdpbf16ps through the same path."""
    require_host("x86.vpdpbusd.256")
    op = ops.dense(24, 40, 36)
    a = rng.integers(0, 128, (24, 36)).astype("uint8")
    b = rng.integers(-128, 128, (40, 36)).astype("int8")
    for name in ("x86.vpdpbusd.256", "x86.vpmaddubsw"):
        got = _run([*op.op.input_tensors, op], [a, b], intrinsic=name)
        np.testing.assert_array_equal(got.astype(np.int64), reference.dense(a, b))


def test_bf16_dense(rng):
    require_host("x86.vdpbf16ps")
    import ml_dtypes

    op = ops.dense(16, 32, 30, "bfloat16", "bfloat16", "float32")
    a = rng.standard_normal((16, 30)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((32, 30)).astype(ml_dtypes.bfloat16)
    got = _run([*op.op.input_tensors, op], [a, b])
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T
    assert np.all(np.abs(got - ref) <= 30 * np.finfo(np.float32).eps * scale + 1e-6)


def test_fallback_maxpool_warns_and_is_correct(rng):
    data = te.placeholder((1, 8, 9, 9), "float32", name="data")
    ry = te.reduce_axis((0, 3), name="ry")
    rx = te.reduce_axis((0, 3), name="rx")
    pool = te.compute((1, 8, 7, 7), lambda n, c, y, x: te.max(data[n, c, y + ry, x + rx],
                                                                 axis=[ry, rx]), name="maxpool")
    d = rng.standard_normal((1, 8, 9, 9)).astype("float32")
    # the reason names why each instruction does not fit (a sum is not a max, or their dtypes)
    with pytest.warns(unit_tvm.FallbackWarning, match="does not fit maxpool"):
        got = _run([data, pool], [d])
    ref = np.max(np.stack([d[:, :, i:i + 7, j:j + 7] for i in range(3) for j in range(3)]), axis=0)
    np.testing.assert_array_equal(got, ref)


def test_build_rejects_wrong_inputs():
    op = ops.dense(16, 16, 16)
    other = te.placeholder((16, 16), "uint8", name="Other")
    with pytest.raises(ValueError, match="placeholders"):
        unit_tvm.build([op.op.input_tensors[0], other, op])
    with pytest.raises(TypeError):
        unit_tvm.build([])


def test_target_without_instruction_says_which_feature():
    op = ops.dense(16, 16, 16)
    with pytest.raises(ValueError, match="avx512vnni"):
        unit_tvm.build([*op.op.input_tensors, op], {"kind": "llvm", "mcpu": "skylake"},
                       intrinsic="x86.vpdpbusd")


@pytest.mark.parametrize("intrin,x,y", [("x86.tdpbusd.x2", 128, 16), ("x86.tdpbusd.x4", 256, 16),
                                        ("x86.tdpbusd.x4.n2", 256, 32),
                                        ("x86.tdpbusd.x4.m2n2", 256, 32)])
def test_amx_chained_forms_build_exact_convs(intrin, x, y, rng):
    """The chained, two-column and 2 x 2 AMX forms through the whole Rewriter: packed operands,
    odd output width (padded M), channels a multiple of the chain, bit-exact against numpy."""
    require_host(intrin)
    c, h, k, r = 2 * x, 9, 2 * y, 3
    op = ops.conv2d_nchwc(1, c, h, h, k, r, r, 1, x=x, y=y)
    d = rng.integers(0, 256, (1, c, h, h)).astype("uint8")
    w = rng.integers(-128, 128, (k, c, r, r)).astype("int8")
    got = _run([*op.op.input_tensors, op],
               [reference.pack_nchwc(d, x), reference.pack_kcrs(w, y, x)], intrinsic=intrin)
    np.testing.assert_array_equal(reference.unpack_nchwc(got).astype(np.int64),
                                  reference.conv2d_nchw(d, w, 1))


def test_build_picks_the_amx_form_that_pads_least():
    require_host("x86.tdpbusd")
    from unit_tvm.build import choose

    for c, want in ((128, "x86.tdpbusd.x2"), (256, "x86.tdpbusd.x4"), (192, "x86.tdpbusd")):
        op = ops.dense_packed(64, 64, c, 16, c)  # one channel block: every form reads rows
        intrin, prepared, _ = choose(op)
        assert intrin.name == want, (c, intrin.name)


@pytest.mark.parametrize("c,h,k,r,stride,fold", [(80, 9, 32, 3, 1, "s"), (48, 9, 32, 3, 2, "s"),
                                                 (32, 8, 16, 3, 2, "rs"), (20, 7, 16, 2, 1, "rs")])
def test_window_folded_conv_is_a_conv(c, h, k, r, stride, fold, rng, host_target):
    """The folded layout (im2col buffer built in the kernel, window and channels one reduction)
    computes the conv: TVM's own build, against numpy, for odd channels and strides."""
    op = ops.conv2d_window_folded(c, h, k, r, stride, fold, x=64, y=16)
    data, kern = placeholders_of(op)  # data sits behind the im2col stage
    lib = tvm.tirx.build(te.create_prim_func([data, kern, op]), target=host_target)
    d = rng.integers(0, 256, (1, c, h, h)).astype("uint8")
    w = rng.integers(-128, 128, (k, c, r, r)).astype("int8")
    out = np.zeros([int(s) for s in op.shape], "int32")
    args = measure.to_device([d.transpose(0, 2, 3, 1).copy(),
                              reference.pack_folded_kernel(w, fold, 64, 16), out], tvm.cpu())
    lib(*args)
    o = (h - r) // stride + 1
    got = args[-1].numpy().reshape(1, k // 16, o, o, 16)
    np.testing.assert_array_equal(reference.unpack_nchwc(got).astype(np.int64),
                                  reference.conv2d_nchw(d, w, stride))


@pytest.mark.parametrize("intrin,x,y", [("x86.tdpbusd", 64, 16), ("x86.tdpbusd.x4.n2", 256, 32),
                                        ("x86.vpdpbusd", 4, 16)])
def test_window_folded_conv_tensorized_reads_im2col_in_place(intrin, x, y, rng):
    """Tensorized on the folded layout: bit-exact, and the im2col buffer (already laid out to the
    padded row count) is read by the instruction in place, not copied into another pack, while
    an operand whose padded rows would leave the tensor is still packed."""
    require_host(intrin)
    c, h, k, r = 80, 11, 2 * y, 3
    op = ops.conv2d_window_folded(c, h, k, r, 1, "s", x=x, y=y)
    prepared = prepare(op, intrin)
    assert not any(s.endswith("_packed") for s in prepared.stages), prepared.stages
    d = rng.integers(0, 256, (1, c, h, h)).astype("uint8")
    w = rng.integers(-128, 128, (k, c, r, r)).astype("int8")
    got = _run([*placeholders_of(op), op], [d.transpose(0, 2, 3, 1).copy(),
                                            reference.pack_folded_kernel(w, "s", x, y)],
               intrinsic=intrin)
    o = h - r + 1
    np.testing.assert_array_equal(reference.unpack_nchwc(got.reshape(1, k // y, o, o, y))
                                  .astype(np.int64), reference.conv2d_nchw(d, w, 1))
    if x > 4:  # a tile instruction pads the 9 output columns to 16 rows: the direct layout's
        # rows would read past its 11 columns, so its data is still packed (zero-guarded)
        direct = ops.conv2d_nchwc(1, x, h, h, k, r, r, 1, x=x, y=y)
        assert "data_packed" in prepare(direct, intrin).stages


@pytest.mark.parametrize("h, stride, columns, computed", [
    (35, 2, 17, 17), (19, 1, 17, 17),  # one register tile as wide as the row
    (33, 1, 31, 32),  # too wide for one tile: computed padded, cropped by the write-back
])
def test_prime_column_count_is_computed_exactly(h, stride, columns, computed, rng):
    """A conv whose output columns no register tile width (4..8) divides: 17 of them are one
    tile of 17 accumulators; 31 are more than a tile holds, so the core computes 32 from zero
    padding and the write-back crops them; same result as numpy either way."""
    require_host("x86.vpdpbusd")
    op = ops.conv2d_nchwc(1, 32, h, h, 32, 3, 3, stride)
    prepared = unit_tvm.build_report([*op.op.input_tensors, op])
    assert int(op.shape[3]) == columns
    from unit_tvm.build import prepare_op

    core = prepare_op(op, "x86.vpdpbusd").core
    assert [int(s) for s in core.shape][3] == computed, core.shape
    d = rng.integers(0, 256, (1, 32, h, h)).astype("uint8")
    w = rng.integers(-128, 128, (32, 32, 3, 3)).astype("int8")
    got = _run([*op.op.input_tensors, op], [reference.pack_nchwc(d), reference.pack_kcrs(w)])
    np.testing.assert_array_equal(reference.unpack_nchwc(got).astype(np.int64),
                                  reference.conv2d_nchw(d, w, stride))
    assert prepared.intrinsic is not None


@pytest.mark.parametrize("pad, lanes", [(3, 4), (1, 16), (0, 4)])
def test_padding_stage_runs_its_interior_unguarded(pad, lanes):
    """A pad-and-pack stage (the value outside the input, the input inside) has its guarded
    loop marked for partitioning into left pad, interior and right pad; the result is
    unchanged."""
    from tvm import s_tir, tirx

    from unit_tvm.schedules.cpu_stages import parallel_stage

    c, h = 3, 10
    x = te.placeholder((1, c, h, h), "float32", name="x")

    def body(b, co, i, j, ci):
        ch = co * lanes + ci
        inside = tirx.all(i >= pad, i < h + pad, j >= pad, j < h + pad, ch < c)
        return tirx.if_then_else(inside, (x[b, ch, i - pad, j - pad] * 4.0).astype("int32"),
                                 tirx.const(7, "int32"))

    xq = te.compute((1, 1, h + 2 * pad, h + 2 * pad, lanes), body, name="xq")
    sch = s_tir.Schedule(te.create_prim_func([x, xq]))
    parallel_stage(sch, sch.get_sblock("xq"), min_extent=4)
    # the guarded loop below the parallel one is handed to TVM's LoopPartition pass, which
    # splits it where the guard's value changes (nowhere without padding)
    script = sch.mod.script()
    assert script.count("pragma_loop_partition_hint") == 1, script
    got = tvm.tirx.build(sch.mod, target=unit_tvm.target.host())
    want = tvm.tirx.build(te.create_prim_func([x, xq]), target=unit_tvm.target.host())
    xs = np.random.default_rng(0).standard_normal((1, c, h, h)).astype("float32")
    outs = []
    for lib in (got, want):
        out = tvm.runtime.tensor(np.zeros((1, 1, h + 2 * pad, h + 2 * pad, lanes), "int32"))
        lib(tvm.runtime.tensor(xs), out)
        outs.append(out.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])


def test_a_config_whose_tile_does_not_divide_is_refused():
    """A CpuConfig from a user (or an old database record) whose unroll factor does not divide
    its loop is a clear ValueError, not a failure inside TVM's tensorize."""
    from unit_tvm.schedules.cpu import CpuConfig

    op = ops.conv2d_nchwc(1, 32, 19, 19, 32, 3, 3, 1)  # 17 output columns
    with pytest.raises(ValueError, match="factors must divide"):
        unit_tvm.rewrite(op, "x86.vpdpbusd", config=CpuConfig(unroll=((3, 6),), parallel=1),
                         target=_vnni_target())


def _assert_int8_dense_exact(m, n, k, rng):
    """unit_tvm.build's uint8 x int8 dense of m x n x k (its default config) equals numpy's."""
    op = ops.dense(m, n, k)
    a = rng.integers(0, 256, (m, k)).astype("uint8")
    b = rng.integers(-128, 128, (n, k)).astype("int8")
    np.testing.assert_array_equal(_run([*op.op.input_tensors, op], [a, b]),
                                  a.astype(np.int32) @ b.astype(np.int32).T)


def _vnni_target():
    """This host with VNNI (and so AVX-512's 32 registers) added where it lacks it: for the
    schedules that are read, not run."""
    return unit_tvm.target.instruction_target(unit_tvm.intrinsics.get("x86.vpdpbusd"))


def _default_config(op, target=None):
    """The CPU strategy's default config for `op` prepared for vpdpbusd on a VNNI target."""
    from unit_tvm.schedules import cpu

    return cpu.default(prepare(op, unit_tvm.intrinsics.get("x86.vpdpbusd")),
                       target or _vnni_target())

def test_default_reads_a_dense_layers_weight_panels_once(rng):
    """A dense layer's default config puts its blocks of columns first, so each weight panel is
    read once while every row passes it; a one-row dense, a batched matmul and a conv keep the
    op's order. The dense so ordered (rows no register tile divides) equals numpy."""
    def front(op):
        return _default_config(op).front

    assert front(ops.dense(40, 64, 32)) == 1
    assert front(ops.dense(1, 64, 32)) == -1
    assert front(ops.batch_matmul(2, 40, 64, 32)) == -1
    assert front(ops.conv2d_nchw(32, 14, 64, 3)) == -1
    require_host("x86.vpdpbusd")
    _assert_int8_dense_exact(45, 80, 36, rng)


def test_default_tile_of_power_of_two_loops_has_16_accumulators(rng):
    """Loops whose divisors give at most 8 accumulators under the default budget of 14 (a
    batched matmul's 32 rows x 4 column blocks) take a 4 x 4 tile; a layer that reaches 14
    keeps it, a one-row dense of 7 blocks keeps 7. The 16-accumulator batched matmul is exact."""
    def accumulators(op):
        return _default_config(op).accumulators()

    assert accumulators(ops.batch_matmul(3, 32, 64, 32)) == 16
    assert accumulators(ops.conv2d_nchw(32, 16, 64, 3)) == 14
    assert accumulators(ops.dense(1, 112, 32)) == 7
    require_host("x86.vpdpbusd")
    op = ops.batch_matmul(3, 32, 64, 32)
    a = rng.integers(0, 256, (3, 32, 32)).astype("uint8")
    b = rng.integers(-128, 128, (3, 64, 32)).astype("int8")
    np.testing.assert_array_equal(_run([*op.op.input_tensors, op], [a, b]),
                                  np.einsum("bik,bjk->bij", a.astype(np.int32), b.astype(np.int32)))


def test_idle_tile_takes_a_channel_block_factor(rng):
    """Rows and columns whose divisors give at most IDLE_TILE accumulators and no wide tile
    (Inception's 71 rows x 72 columns: 1 x 8) take a factor of the channel blocks as well
    (3 blocks x 4 columns); 3 rows x 3 columns, an 8x8 layer's 4 x 4 (where no channel-block
    loop is named: block_tile takes those, test_block_tiles.py) and AVX2's budget of 8 keep
    theirs. A float32 conv with 11 rows x 8 columns gets 3 x 4 and matches numpy."""
    from unit_tvm.rewriter import prepare_for
    from unit_tvm.schedules import cpu, register_tiles as rt

    assert rt.default_tile([1, 12, 71, 72, 1], 14, 3, 16, (1, 16)) == ((1, 3), (3, 4))
    assert rt.default_tile([1, 4, 147, 147, 1], 14, 3, 16, None) == ((2, 3), (3, 3))
    assert rt.default_tile([1, 24, 8, 8, 1], 14, 3, 16, None) == ((2, 4), (3, 4))
    assert rt.default_tile([1, 12, 71, 72, 1], 8, 3, None) == ((3, 8),)
    op = ops.conv2d_nchwc(1, 16, 13, 10, 48, 3, 3, x=1, y=16, a_dtype="float32",
                          b_dtype="float32", acc="float32", word=1)
    fma = unit_tvm.intrinsics.get("x86.vfmadd231ps.512")
    target = unit_tvm.target.instruction_target(fma)
    assert cpu.default(prepare_for(op, fma, target), target).unroll == ((1, 3), (3, 4))
    require_host("x86.vfmadd231ps.512")
    d = rng.standard_normal((1, 16, 13, 10, 1)).astype("float32")
    w = rng.standard_normal((3, 16, 3, 3, 1, 16, 1)).astype("float32")
    got = _run([*op.op.input_tensors, op], [d, w], intrinsic=fma)
    x = d[0, :, :, :, 0]  # [c, h, w]
    k = w[:, :, :, :, 0, :, 0].transpose(0, 4, 1, 2, 3).reshape(48, 16, 3, 3)  # [k, c, r, s]
    want = np.einsum("chwrs,kcrs->khw", np.lib.stride_tricks.sliding_window_view(
        x, (3, 3), axis=(1, 2)), k)
    np.testing.assert_allclose(got[0].transpose(0, 3, 1, 2).reshape(48, 11, 8), want,
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("extents, stream, tile", [
    ([128, 48], (1, 16), ((0, 8), (1, 2))),  # rows take 8: each weight vector serves 8
    ([198, 48], (1, 16), ((0, 6), (1, 2))),  # 198 rows: 6, not 2 rows x 8 blocks
    ([12, 128, 8], (2, 16), ((1, 8), (2, 2))),  # a batched matmul's rows x column blocks
    ([128, 3], (1, 16), ((0, 4), (1, 3))),  # 12 accumulators before 8 rows x 1 block
    ([1, 32, 7, 7, 1], (1, 16), ((1, 2), (3, 7))),  # a conv's blocks are not innermost
    ([17, 48], (1, 16), ((0, 17),)),  # 17 rows: no tile of 12; the whole-row tile stays
])
def test_streamed_panel_tile(extents, stream, tile):
    """Where the instruction's vector operand varies along one of the two innermost loops (a
    dense layer's column blocks), the default tile has at least STREAM_FLOOR accumulators and
    the fewest bytes past L1 per instruction: the other loop (rows) takes the larger factor."""
    from unit_tvm.schedules import register_tiles as rt

    unroll = rt.default_tile(extents, rt.ACCUMULATORS, 0, rt.WIDE_TILE, stream)
    assert unroll == tile
    assert math.prod(f for _, f in unroll) <= max(rt.WIDE_TILE, extents[0])


def test_dense_default_tile_is_eight_rows_by_two_blocks(rng):
    """A dense layer's default tile on 32 registers is 8 rows x 2 column blocks (the weight
    panel is what streams); on AVX2's 16 registers the operand-reuse tile stays. The int8
    kernel is exact and the float32 one within rounding."""
    from unit_tvm.schedules import cpu

    assert _default_config(ops.dense(128, 256, 64)).unroll == ((0, 8), (1, 2))
    avx2 = unit_tvm.target.restricted("avx2")
    prepared = prepare(ops.dense(128, 256, 64), unit_tvm.intrinsics.get("x86.vpdpbusd"))
    assert cpu.default(prepared, avx2).accumulators() <= 8
    require_host("x86.vpdpbusd")
    _assert_int8_dense_exact(64, 96, 48, rng)
    op = ops.dense(64, 96, 48, "float32", "float32", "float32")
    x = rng.standard_normal((64, 48)).astype("float32")
    w = rng.standard_normal((96, 48)).astype("float32")
    np.testing.assert_allclose(_run([*op.op.input_tensors, op], [x, w]), x @ w.T,
                               rtol=1e-5, atol=1e-5)


def test_default_tile_fits_sixteen_registers_on_avx2():
    """With AVX2's 16 ymm registers the default register tile holds at most 8 accumulators
    (32 zmm: 14-16), and the tuning space at most 12: a tile of 14 would spill."""
    from unit_tvm.schedules import cpu

    avx2 = unit_tvm.target.restricted("avx2")
    assert unit_tvm.target.vector_registers(avx2) == 16
    assert unit_tvm.target.vector_registers(_vnni_target()) == 32
    for op in (ops.batch_matmul(3, 32, 64, 32), ops.conv2d_nchw(32, 16, 64, 3),
               ops.dense(64, 256, 64)):
        prepared = prepare(op, unit_tvm.intrinsics.get("x86.vpdpbusd"))
        assert 4 <= cpu.default(prepared, avx2).accumulators() <= 8
        assert max(c.accumulators() for c in cpu.space(prepared, avx2)) <= 12
        assert cpu.default(prepared, _vnni_target()).accumulators() >= 14


def test_avx2_fma_tile_reuses_broadcasts_across_channel_blocks(rng):
    """On 16 registers the float32 multiply-add's default tile spans blocks of output channels
    x columns (each broadcast pixel feeds several weight vectors: 2 x 4 on 16 columns, 6
    operand loads per 8 instructions; 4 x 3 where the columns allow, tests/test_reuse_tiles.py)
    instead of rows x columns (one weight vector, 8 broadcasts: 9 loads); with
    32 registers, and for an instruction whose scratch registers are unknown (the pre-VNNI
    forms), the measured rows x columns tile stays. The 2 x 4 tile's conv equals float64."""
    from unit_tvm.schedules import cpu, register_tiles

    avx2 = unit_tvm.target.restricted("avx2")
    fma = unit_tvm.intrinsics.get("x86.vfmadd231ps")
    op = ops.conv2d_nchw(64, 16, 64, 1, a="float32", b="float32", acc="float32")
    prepared = prepare(op, fma)
    extents = cpu.outer_extents(prepared)
    lanes = cpu.lanes_loop(prepared)
    assert extents[lanes] == 64 // fma.lanes  # the output channels' blocks
    config = cpu.default(prepared, avx2)
    tile = dict(config.unroll)
    assert tile.get(lanes, 1) * max(f for p, f in config.unroll if p != lanes) == 8, config
    assert tile.get(lanes, 1) >= 2 and len(tile) == 2, config
    # the bound: accumulators, the inner loop's operands held, one in flight <= 16 (16
    # columns have no 3 for 4 x 3: 2 x 4 and 4 x 2 tie)
    assert register_tiles.operand_reuse_tile([1, 8, 16, 16], 1, 16, 12) == ((1, 2), (3, 4))
    assert register_tiles.operand_reuse_tile([1, 1, 16, 16], 1, 16, 8) is None
    pre_vnni = prepare(ops.conv2d_nchw(64, 16, 64, 1), unit_tvm.intrinsics.get(
        "x86.vpmaddubsw.256"))
    assert cpu.lanes_loop(pre_vnni) not in dict(cpu.default(pre_vnni, avx2).unroll)
    require_host("x86.vfmadd231ps")
    x = rng.standard_normal((1, 64, 16, 16)).astype("float32")
    w = rng.standard_normal((64, 64, 1, 1)).astype("float32")
    got = _run([*op.op.input_tensors, op], [x, w], target=avx2, intrinsic="x86.vfmadd231ps")
    want = np.einsum("nchw,kc->nkhw", x.astype(np.float64), w[:, :, 0, 0].astype(np.float64))
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
