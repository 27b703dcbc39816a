"""unit_tvm.lowering: register tiles above TVM's 1024-byte stack limit stay on the stack (where
LLVM keeps them in registers), larger allocations keep TVM's runtime workspace, GPU targets keep
TVM's pipeline; kernels built either way compute the same."""

import numpy as np
import pytest
import tvm
from tvm import te

import unit_tvm
from unit_tvm import intrinsics, lowering
from unit_tvm.relax.cpu.qops import tensorized_func

from .conftest import require_host
from .test_padding_columns import _recipe
from .test_width_fold import tensorized_and_plain

_WORKSPACE = "TVMBackendAllocWorkspace"


def _two_stage(n, dtype):
    """A te op with an intermediate buffer of n elements (allocated by the kernel itself)."""
    a = te.placeholder((n,), dtype, name="a")
    mid = te.compute((n,), lambda i: a[i] * 3, name="mid")
    out = te.compute((n,), lambda i: mid[n - 1 - i] + a[i], name="out")
    return te.create_prim_func([a, out])


def _asm(func, build):
    return build(tvm.IRModule({"main": func}), unit_tvm.target.host()).inspect_source("asm")


@pytest.mark.parametrize("n, dtype, on_stack", [
    (272, "int32", True),     # 1088 bytes: a 17-accumulator tile, a workspace for TVM alone
    (384, "int32", True),     # 1536 bytes: the bound
    (385, "int32", False),    # one element more
    (4096, "float32", False),
])
def test_only_allocations_up_to_the_bound_move_to_the_stack(n, dtype, on_stack):
    func = _two_stage(n, dtype)
    assert _WORKSPACE in _asm(func, lambda m, t: tvm.tirx.build(m, target=t))
    assert (_WORKSPACE not in _asm(func, lowering.build)) == on_stack


def test_the_pass_marks_what_it_moves():
    """The annotation LowerTVMBuiltin reads is on the small allocation and not on the large."""
    mod = tvm.IRModule({name: _two_stage(n, "int32").with_attr("global_symbol", name)
                        for name, n in (("main", 272), ("big", 4096))})
    host = unit_tvm.target.host()
    mod = tvm.tirx.transform.BindTarget(host.with_host(host))(mod)
    lower, _, _ = tvm.tirx.get_tir_pipeline("s_tir")
    marked = lowering.tiles_on_stack(lower(mod))
    assert "disable_lower_builtin" in marked["main"].script()
    assert "disable_lower_builtin" not in marked["big"].script()


def test_gpu_targets_keep_tvms_pipeline():
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
    assert lowering.pipeline(cuda) == "default"
    assert lowering.pipeline(unit_tvm.target.host()) == lowering.PIPELINE


@pytest.mark.parametrize("c, k, window, pad, row_test", [
    (64, 16, (1, 1), (0, 0), False),  # Inception's 1x1 at 17x17: one 17-accumulator tile per row
    (16, 32, (7, 1), (3, 0), True),   # its 7x1: the same tile, padding rows skipped by a test
])
def test_a_row_wide_tile_skips_padding_rows_and_is_exact(c, k, window, pad, row_test, rng):
    """The 17-column tile (1088 bytes) is on the stack, so the padding-row test is added and the
    window-row loop unrolled (schedules/padding_taps.py); the kernel equals the plain int8 loop
    nest either way."""
    require_host("x86.vpdpbusd")
    intrin = intrinsics.get("x86.vpdpbusd")
    recipe = _recipe(c, k, (17, 17), window, pad)
    x = rng.integers(0, 256, size=(1, c // 16, 17, 17, 16)).astype("uint8")
    got, want, func, _ = tensorized_and_plain(recipe, intrin, x, rng, mult=(2e-6, 1e-5))
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) > 20
    script = func.script()
    assert "for i3_1 in T.unroll(17)" in script
    assert ("+ rr >= 3 and" in script) == row_test
    assert ("for rr in T.unroll(7)" in script) == row_test  # each row its own test, unrolled


def test_a_window_longer_than_the_unroll_bound_keeps_a_loop(rng):
    """A 9x1 window (more rows than MAX_UNROLLED_TAPS) keeps its padding-row test inside a
    serial row loop, and stays exact."""
    require_host("x86.vpdpbusd")
    intrin = intrinsics.get("x86.vpdpbusd")
    recipe = _recipe(16, 16, (17, 17), (9, 1), (4, 0))
    x = rng.integers(0, 256, size=(1, 1, 17, 17, 16)).astype("uint8")
    got, want, func, _ = tensorized_and_plain(recipe, intrin, x, rng, mult=(2e-6, 1e-5))
    np.testing.assert_array_equal(got, want)
    script = func.script()
    assert "+ rr >= 4 and" in script and "for rr in range(9)" in script
    assert "T.unroll(9)" not in script


def test_the_row_wide_tile_needs_no_workspace():
    """A 1x1 conv allocates nothing but its tile: TVM's pipeline asks the runtime for it,
    unit-tvm's keeps it on the stack."""
    require_host("x86.vpdpbusd")
    intrin = intrinsics.get("x86.vpdpbusd")
    func = tensorized_func(_recipe(64, 16, (17, 17), (1, 1), (0, 0)), intrin,
                           unit_tvm.target.host())[0].with_attr("global_symbol", "main")
    assert _WORKSPACE in _asm(func, lambda m, t: tvm.tirx.build(m, target=t))
    assert _WORKSPACE not in _asm(func, lowering.build)


def test_the_profile_and_tuner_build_through_the_pipeline(monkeypatch):
    """Every unit-tvm build of a tensorized kernel goes through lowering.build (the tuner times
    what the model runs)."""
    from unit_tvm.tuner import search

    require_host("x86.vpdpbusd")
    calls = []
    real = lowering.build
    monkeypatch.setattr(lowering, "build", lambda *a: calls.append(a) or real(*a))
    intrin = intrinsics.get("x86.vpdpbusd")
    recipe = _recipe(16, 16, (7, 7), (3, 3), (1, 1))
    func, _, prepared = tensorized_func(recipe, intrin, unit_tvm.target.host())
    search.candidate_module(prepared, intrin, None, unit_tvm.target.host())
    assert len(calls) == 1


def test_cuda_builds_add_async_copies_to_the_callers_pass_context():
    """lowering.build / compile_relax for CUDA turn on TVM's async copies (the pipeline's
    cp.async) and keep what the caller's PassContext set; CPU builds get nothing added."""
    assert lowering.gpu_pass_config(tvm.target.Target("llvm")) == {}
    with tvm.transform.PassContext(opt_level=2, disabled_pass=["FuseOps"],
                                   config={"tirx.disable_vectorize": True}):
        with lowering._context(tvm.target.Target({"kind": "cuda", "arch": "sm_90"})):
            ctx = tvm.transform.PassContext.current()
            assert ctx.opt_level == 2 and list(ctx.disabled_pass) == ["FuseOps"]
            assert dict(ctx.config) == {"tirx.disable_vectorize": True,
                                        "tirx.use_async_copy": True}
