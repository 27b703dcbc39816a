"""The instruction library: registry, derived descriptions, and every host instruction executed."""

import numpy as np
import pytest
import tvm

import unit_tvm
from unit_tvm import intrinsics, measure, microkernel
from unit_tvm.target import host

from .conftest import HOST_X86, require_host

# the instructions the project promises (UNIT's nine, AMX and its chained forms); the registry may
# hold more: a new instruction is a module in intrinsics/ and needs no edit here
PROMISED = ["x86.tdpbusd.x4", "x86.tdpbusd.x2", "x86.tdpbusd", "x86.tdpbusd.x4.n2",
         "x86.tdpbusd.x2.n2", "x86.tdpbf16ps.x4", "x86.tdpbf16ps.x2", "x86.tdpbf16ps",
         "x86.tdpbf16ps.x4.n2", "x86.tdpbf16ps.x2.n2", "x86.vpdpbusd", "x86.vpdpbusd.256",
         "x86.vdpbf16ps", "x86.vpermb.vpdpbusd", "x86.vpmaddubsw", "x86.vpmaddubsw.256",
         "x86.vpmaddwd", "x86.vpmaddwd.256", "x86.vpunpck.vpmaddwd", "x86.vpunpck.vpmaddwd.256",
         "arm.smmla", "arm.sdot", "arm.udot", "cuda.wmma.f16f32", "cuda.wmma.s8s32"]


def test_all_nine_required_plus_amx_registered():
    names = intrinsics.names()
    assert set(PROMISED) <= set(names) and len(set(names)) == len(names)
    # registration order is _MODULES order, each module's list as written (fastest first)
    assert names == [i.name for m in intrinsics._MODULES for i in m.INTRINSICS]
    assert [i.name for i in intrinsics.all()] == names
    promised_order = [n for n in names if n in PROMISED]
    assert promised_order == PROMISED


def test_get_unknown_lists_known_names():
    with pytest.raises(KeyError) as err:
        intrinsics.get("nope")
    assert all(s in str(err.value) for s in ("nope", "x86.vpdpbusd", "arm.smmla"))


def test_require_names_missing_feature():
    no_vnni = {"kind": "llvm", "mcpu": "skylake-avx512"}
    assert intrinsics.get("x86.vpmaddubsw").supported(no_vnni)
    with pytest.raises(ValueError, match="avx512vnni"):
        intrinsics.require("x86.vpdpbusd", no_vnni)
    assert intrinsics.get("x86.vdpbf16ps").missing_features(no_vnni) == ["avx512bf16"]
    assert intrinsics.get("x86.tdpbusd").missing_features(no_vnni) == ["amx-int8", "amx-tile"]
    aarch64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+dotprod"]}
    assert intrinsics.get("arm.sdot").supported(aarch64)
    assert intrinsics.get("arm.smmla").missing_features(aarch64) == ["i8mm"]
    assert "arch x86_64" in intrinsics.get("x86.vpdpbusd").missing_features(aarch64)[0]


def test_loop_kinds_and_shapes_read_off_semantics():
    v = intrinsics.get("x86.vpdpbusd")
    assert [(e, k) for _, e, k in v.loops] == [(16, "S"), (4, "R")]
    assert (v.lanes, v.reduction_width, v.input_dtypes, v.output_dtype) == (
        16, 4, ("uint8", "int8"), "int32")
    m = intrinsics.get("arm.smmla")
    assert [(e, k) for _, e, k in m.loops] == [(2, "S"), (2, "S"), (8, "R")]
    w = intrinsics.get("cuda.wmma.f16f32")
    assert (w.lanes, w.reduction_width, w.output_dtype) == (256, 16, "float32")
    assert intrinsics.get("x86.vdpbf16ps").input_dtypes == ("bfloat16", "bfloat16")


def test_desc_is_derived_from_semantics():
    """The description is the semantics in accumulate-in-place form, nothing written twice."""
    for intrin in intrinsics.all():
        script = intrin.desc.script()
        out = intrin.output.op.name
        assert f"{out}[" in script and f"= {out}[" in script, intrin.name  # d[..] = d[..] + ...
        for t in intrin.inputs:
            assert f'"{t.dtype}"' in script
        assert str(intrin.output.dtype) in script


def test_adding_an_instruction_needs_only_semantics_and_emit():
    """A new Intrinsic built from a te.compute registers as a TensorIntrin usable by tensorize."""
    from tvm import te, tirx
    from tvm.script.ir_builder import tirx as T

    def semantics():
        a, b = intrinsics.placeholders(a=((4,), "uint8"), b=((16, 4), "int8"))
        k = te.reduce_axis((0, 4), name="k")
        return te.compute((16,), lambda i: te.sum(a[k].astype("int32") * b[i, k].astype("int32"),
                                                  axis=k), name="d")

    def emit(bufs):
        a, b, d = bufs["a"], bufs["b"], bufs["d"]
        word = tirx.reinterpret("int32", a.vload([0], "uint8x4"))
        T.buffer_store(d, tirx.call_llvm_pure_intrin(
            "int32x16", "llvm.x86.avx512.vpdpbusd.512", d.vload([0], "int32x16"),
            tirx.reinterpret("uint8x64", tirx.Broadcast(word, 16)), b.vload([0, 0], "int8x64")),
            [tirx.Ramp(0, 1, 16)])

    mine = intrinsics.Intrinsic("test.my_vnni", arch="x86_64", requires=[("avx512vnni",)],
                                semantics=semantics, emit=emit, doc="test")
    func, _, _ = microkernel.instruction_kernel(mine, 4)
    # compiled and read, not run: the host may lack VNNI
    target = unit_tvm.target.instruction_target(mine)
    assert "vpdpbusd" in tvm.tirx.build(func, target=target).inspect_source("asm")


@pytest.mark.parametrize("name,steps,cols,rows", [
    ("x86.tdpbusd", 1, 1, 1), ("x86.tdpbusd.x2", 2, 1, 1), ("x86.tdpbusd.x4", 4, 1, 1),
    ("x86.tdpbusd.x2.n2", 2, 2, 1), ("x86.tdpbusd.x4.n2", 4, 2, 1),
    ("x86.tdpbusd.x4.m2n2", 4, 2, 2)])
def test_amx_tdpbusd_bit_exact(name, steps, cols, rows, rng):
    require_host(name)
    intrin = intrinsics.get(name)
    assert intrin.family == "x86.amx-int8" and intrin.reduction_width == 64 * steps
    assert intrin.lanes == 256 * cols * rows
    func, (a_t, b_t), out = microkernel.instruction_kernel(intrin, 8)
    lib = tvm.tirx.build(func, target=host())
    asm = lib.inspect_source("asm")
    # a chain keeps the accumulator in its tile: one load and one store per `steps` tdpbusd
    n_mma, n_store = asm.count("\ttdpbusd\t"), asm.count("\ttilestored\t")
    assert n_mma >= steps and n_mma == steps * n_store
    a = measure.random_array(a_t.shape, "uint8", rng)
    b = measure.random_array(b_t.shape, "int8", rng)
    args = measure.to_device([a, b, np.zeros((8, 16 * rows, 16 * cols), "int32")], tvm.cpu())
    lib(*args)
    bk = b.astype(np.int64).transpose(0, 1, 3, 2).reshape(8, 64 * steps, 16 * cols)  # [x, k, n]
    np.testing.assert_array_equal(args[-1].numpy(),
                                  np.einsum("xmk,xkn->xmn", a.astype(np.int64), bk))


@pytest.mark.parametrize("name,steps,cols", [("x86.tdpbf16ps", 1, 1), ("x86.tdpbf16ps.x4", 4, 1),
                                             ("x86.tdpbf16ps.x2.n2", 2, 2)])
def test_amx_tdpbf16ps_within_f32_accumulation_rounding(name, steps, cols, rng):
    """AMX-BF16: bf16 products are exact in f32; per instruction the 32-term sums round in f32.
    Within 32 * steps ulp(f32) of the float64 result, relative to the sum of |products| (bf16
    rounding of a product would be ~2^-8, far outside)."""
    require_host(name)
    intrin = intrinsics.get(name)
    assert intrin.family == "x86.amx-bf16" and intrin.reduction_width == 32 * steps
    assert intrin.channel_blocks == (32 * steps, 16 * cols)
    func, (a_t, b_t), _ = microkernel.instruction_kernel(intrin, 8)
    lib = tvm.tirx.build(func, target=host())
    asm = lib.inspect_source("asm")
    n_mma, n_store = asm.count("\ttdpbf16ps\t"), asm.count("\ttilestored\t")
    assert n_mma >= steps and n_mma == steps * n_store
    a = measure.random_array(a_t.shape, "bfloat16", rng)
    b = measure.random_array(b_t.shape, "bfloat16", rng)
    args = measure.to_device([a, b, np.zeros((8, 16, 16 * cols), "float32")], tvm.cpu())
    lib(*args)
    bk = b.astype(np.float64).transpose(0, 1, 3, 2).reshape(8, 32 * steps, 16 * cols)
    prods = a.astype(np.float64)[:, :, :, None] * bk[:, None]  # [x, m, k, n]
    expected, scale = prods.sum(2), np.abs(prods).sum(2)
    got = args[-1].numpy()
    assert np.all(np.abs(got - expected) <= 32 * steps * np.finfo(np.float32).eps * scale)


def _run_instruction(name, rng, n=256):
    intrin = intrinsics.get(name)
    func, ins, out = microkernel.instruction_kernel(intrin, n)
    lib = tvm.tirx.build(func, target=host())
    arrays = []
    for t in ins:
        rng_limits = intrin.operand_ranges.get(t.op.name)
        arrays.append(measure.random_array(t.shape, t.dtype, rng, value_range=rng_limits))
    result = np.zeros([int(s) for s in out.shape], measure.numpy_dtype(out.dtype))
    dev = tvm.cpu()
    args = measure.to_device(arrays + [result], dev)
    lib(*args)
    return intrin, arrays, args[-1].numpy(), lib.inspect_source("asm")


@pytest.mark.parametrize("name", ["x86.vpdpbusd", "x86.vpdpbusd.256", "x86.vpmaddwd",
                                  "x86.vpmaddwd.256", "x86.vpmaddubsw", "x86.vpmaddubsw.256"])
def test_integer_instruction_bit_exact(name, rng):
    require_host(name)
    intrin, (a, b), got, asm = _run_instruction(name, rng)
    mnemonic = name.split(".")[1]
    assert mnemonic in asm, f"{mnemonic} not in generated code"
    lo, hi = intrin.operand_ranges.get("a", (0, 255))
    assert a.min() == lo and a.max() == hi and b.min() == -128 and b.max() == 127
    expected = np.einsum("nk,nik->ni", a.astype(np.int64), b.astype(np.int64))
    np.testing.assert_array_equal(got.astype(np.int64), expected)


@pytest.mark.parametrize("name,mnemonics", [
    ("x86.vpermb.vpdpbusd", ("vpermb", "vpdpbusd")),
    ("x86.vpunpck.vpmaddwd", ("vpmaddwd",)),
    ("x86.vpunpck.vpmaddwd.256", ("vpmaddwd",)),
])
def test_lanewise_instruction_bit_exact(name, mnemonics, rng):
    """Each lane sums its own channel's activations (rows of `lanes` channels, as neighbouring
    pixels of NCHW[lanes]c) times its own weights: vpermb + vpdpbusd 4 rows of 16, the int16
    forms 2 rows of 16 or 8; u8 255 x s8 -128 included."""
    require_host(name)
    intrin, (a, b), got, asm = _run_instruction(name, rng)
    assert all(m in asm for m in mnemonics)
    width, lanes = intrin.reduction_width, intrin.lanes
    assert a.shape[1:] == (width, lanes) and b.shape[1:] == (lanes, width)
    assert a.max() == 255 and b.min() == -128
    expected = np.einsum("ntc,nct->nc", a.astype(np.int64), b.astype(np.int64))
    np.testing.assert_array_equal(got.astype(np.int64), expected)


def test_operand_roles_read_off_semantics():
    """Which operand is broadcast, and whether lanes read their own operands, come from the
    semantics: they decide the packed layouts (channel blocks) an instruction can serve."""
    assert intrinsics.get("x86.vpdpbusd").broadcast_operand == "a"
    assert not intrinsics.get("x86.vpdpbusd").lanewise
    amx = intrinsics.get("x86.tdpbusd")
    assert amx.broadcast_operand is None and not amx.lanewise  # each operand misses one loop
    dw = intrinsics.get("x86.vpermb.vpdpbusd")
    assert dw.lanewise and dw.broadcast_operand is None
    assert dw.channel_blocks == (16, 16) and dw.reduction_width == 4
    # tile instructions (rows of pixels shared by a tile, nothing broadcast) get folded conv layouts
    tiles = {i.name for i in intrinsics.all() if i.tile}
    assert {"x86.tdpbusd", "x86.tdpbusd.x4.n2", "arm.smmla", "cuda.wmma.s8s32"} <= tiles
    assert not tiles & {"x86.vpdpbusd", "x86.vpermb.vpdpbusd", "arm.sdot", "x86.vdpbf16ps"}


def test_vdpbf16ps_within_f32_accumulation_rounding(rng):
    """bf16*bf16 products are exact in f32; only the two f32 additions round. So the result is
    within 2 ulp(f32) of the float64 dot product, relative to the sum of |products| (tighter
    than bf16 rounding, which would be 2^-8)."""
    require_host("x86.vdpbf16ps")
    _, (a, b), got, asm = _run_instruction("x86.vdpbf16ps", rng)
    assert "vdpbf16ps" in asm
    prods = a.astype(np.float64)[:, None, :] * b.astype(np.float64)
    expected = prods.sum(-1)
    scale = np.abs(prods).sum(-1)
    assert np.all(np.abs(got - expected) <= 2 * np.finfo(np.float32).eps * scale + 1e-30)


@pytest.mark.parametrize("name", ["x86.vpmaddubsw", "x86.vpmaddubsw.256"])
def test_vpmaddubsw_restriction_is_needed(name):
    """Outside a in [0,127] the s16 step saturates, which is why the instruction is restricted."""
    require_host(name)
    intrin = intrinsics.get(name)
    func, ins, out = microkernel.instruction_kernel(intrin, 1)
    lib = tvm.tirx.build(func, target=host())
    a = np.full((1, 4), 255, "uint8")
    b = np.full((1, intrin.lanes, 4), -128, "int8")
    args = measure.to_device([a, b, np.zeros((1, intrin.lanes), "int32")], tvm.cpu())
    lib(*args)
    assert args[-1].numpy()[0, 0] == 2 * -32768  # saturated pairs, not the exact 4*255*-128
    assert intrin.operand_ranges["a"] == (0, 127)


@pytest.mark.parametrize("name", HOST_X86)
def test_peak_kernel_computes_correct_sums(name, rng):
    """The peak micro-kernel is a real computation: its output equals numpy's."""
    require_host(name)
    intrin = intrinsics.get(name)
    func, ins, out, ops = microkernel.peak_kernel(intrin, 2, rows=2, cols=3, steps=4, reps=3)
    assert ops == 2 * 3 * 4 * 2 * 3 * intrin.ops_per_instruction
    lib = tvm.tirx.build(func, target=host())
    rng_limits = intrin.operand_ranges.get("a")
    arrays = [measure.random_array(t.shape, t.dtype, rng, value_range=rng_limits if t.op.name == "a"
                                   else None) for t in ins]
    got = np.zeros([int(s) for s in out.shape], measure.numpy_dtype(out.dtype))
    args = measure.to_device(arrays + [got], tvm.cpu())
    lib(*args)
    a, b = (x.astype(np.float64) for x in arrays)
    if b.ndim == 6:  # words packed apart (the quad form's [2][lanes][4]): lanes before words
        b = b.transpose(0, 1, 2, 4, 3, 5).reshape(b.shape[:3] + (b.shape[4], -1))
    if intrin.lanewise:  # a: [t, step, rows, w, l], b: [t, step, cols, l, w]
        expected = 3 * np.einsum("tsrkl,tsclk->trcl", a, b)
    else:  # a: [t, step, rows, w], b: [t, step, cols, l, w]
        expected = 3 * np.einsum("tsrk,tscik->trci", a, b)
    np.testing.assert_allclose(args[-1].numpy().astype(np.float64), expected, rtol=1e-5)


@pytest.mark.parametrize("name", ["x86.vpmaddwd", "x86.vpmaddwd.256", "x86.vpunpck.vpmaddwd",
                                  "x86.vpunpck.vpmaddwd.256"])
@pytest.mark.parametrize("a_value,b_value", [(255, -128), (255, 127)])
def test_int16_forms_exact_where_the_pair_form_saturates(name, a_value, b_value):
    """Every product at the end of its range (the case where vpmaddubsw's int16 pair sum
    saturates): the int16 forms, which are chosen without any range precondition, stay exact."""
    require_host(name)
    intrin = intrinsics.get(name)
    assert not intrin.operand_ranges
    func, (a_t, b_t), out = microkernel.instruction_kernel(intrin, 2)
    lib = tvm.tirx.build(func, target=host())
    a = np.full([int(x) for x in a_t.shape], a_value, "uint8")
    b = np.full([int(x) for x in b_t.shape], b_value, "int8")
    args = measure.to_device([a, b, np.zeros([int(x) for x in out.shape], "int32")], tvm.cpu())
    lib(*args)
    assert np.all(args[-1].numpy() == intrin.reduction_width * a_value * b_value)


def test_pre_vnni_forms_are_superseded_where_vnni_runs():
    """Where the target runs vpdpbusd, selection never sees the pre-VNNI forms (a VNNI host's
    choices are what they were), though a caller may still name them; held to AVX2 they are
    what it chooses from, the quad and pair forms first."""
    vnni = unit_tvm.target.instruction_target(intrinsics.get("x86.vpdpbusd"))
    chosen_from = {i.name for i in intrinsics.for_target(vnni)}
    assert "x86.vpdpbusd" in chosen_from
    pre_vnni = {"x86.vpmaddubsw.quad.256", "x86.vpmaddubsw.256", "x86.vpmaddwd.256"}
    assert not pre_vnni & chosen_from
    assert intrinsics.get("x86.vpmaddwd.256").supported(vnni)
    avx2 = [i.name for i in intrinsics.for_target(unit_tvm.target.restricted("avx2"))]
    assert avx2 == ["x86.vpmaddubsw.quad.256", "x86.vpmaddubsw.256", "x86.vpmaddwd.256",
                    "x86.vpunpck.vpmaddwd.256",
                    "x86.vfmadd231ps", "x86.vfmadd231ps.lanewise"]
