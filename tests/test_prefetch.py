"""unit_tvm.prefetch: a tensorized kernel prefetches the weight panel its next register tile
reads, one panel ahead of each weight vector, only where the tile reuses that vector; the
kernels stay exact."""

import numpy as np
import pytest
import tvm
from tvm import te, topi

import unit_tvm
from unit_tvm import intrinsics, lowering, prefetch
from unit_tvm.schedules.cpu import CpuConfig

from .conftest import require_host
from .test_padding_columns import _recipe
from .test_width_fold import tensorized_and_plain

_VNNI = "x86.vpdpbusd"


def _compile_target():
    """This host with VNNI added where it lacks it: the kernels below are compiled and read,
    never run, so they may use an instruction this CPU does not have."""
    return unit_tvm.target.instruction_target(intrinsics.get(_VNNI))


def _dense(m, n, k):
    """topi's int8 dense (not written for unit-tvm): uint8 [m, k] x int8 [n, k] -> int32."""
    a = te.placeholder((m, k), "uint8", name="a")
    b = te.placeholder((n, k), "int8", name="b")
    return a, b, topi.nn.dense(a, b, out_dtype="int32")


def _scheduled(m, n, k, config=None):
    a, b, out = _dense(m, n, k)
    sch = unit_tvm.rewrite(out, _VNNI, config=config, target=_compile_target())
    return sch.mod["main"].with_attr("global_symbol", "main")


def _asm(func, build=lowering.build):
    return build(tvm.IRModule({"main": func}), _compile_target()).inspect_source("asm")


def _lowered_with_prefetch(func):
    """The function through TVM's lowering, then the prefetch pass (as lowering.build runs it)."""
    host = _compile_target()
    mod = tvm.tirx.transform.BindTarget(host.with_host(host))(tvm.IRModule({"main": func}))
    lower, _, _ = tvm.tirx.get_tir_pipeline("s_tir")
    return prefetch.prefetch_next_panel(lower(mod))["main"].script()


def test_a_reused_weight_tile_prefetches_the_next_panel():
    """128 KB of weights, 8 rows x 2 column blocks: each 64-byte weight vector feeds 8
    instructions. One tile's
    reduction reads 2 blocks x 64 steps x 64 bytes = 8192 bytes of the packed weights: the
    prefetches look exactly that far ahead; TVM's own pipeline has none."""
    func = _scheduled(64, 512, 256, CpuConfig(unroll=((0, 8), (1, 2)), parallel=1))
    script = _lowered_with_prefetch(func)
    assert script.count("llvm.prefetch") == 2  # one per weight vector of a reduction step
    assert "handle_add_byte_offset" in script and ", 8192)" in script
    assert "prefetcht1" in _asm(func)
    assert "prefetcht1" not in _asm(func, lambda m, t: tvm.tirx.build(m, target=t))


@pytest.mark.parametrize("m, n, k", [
    (1, 1000, 256),  # one row: each weight vector feeds one instruction; the hardware prefetcher
                     # follows a stream read once, a prefetch per instruction only costs issue slots
    (64, 64, 256),   # 16 KB of weights: they stay in cache
])
def test_no_prefetch_without_reuse_or_for_small_weights(m, n, k):
    assert "llvm.prefetch" not in _lowered_with_prefetch(_scheduled(m, n, k))


def test_no_prefetch_of_a_panel_that_would_crowd_l2():
    """8 rows x 2 column blocks over a 16384-deep reduction: one tile's panel is 2 x 4096 x 64
    bytes = 512 KB, above prefetch.MAX_PANEL_BYTES; 4096 deep (128 KB) still prefetches."""
    config = CpuConfig(unroll=((0, 8), (1, 2)), parallel=1)
    assert "llvm.prefetch" not in _lowered_with_prefetch(_scheduled(64, 64, 16384, config))
    assert "llvm.prefetch" in _lowered_with_prefetch(_scheduled(64, 64, 4096, config))


@pytest.mark.parametrize("m, n, k", [(64, 256, 256), (15, 48, 100), (1, 32, 64)])
def test_kernels_with_prefetches_are_exact(m, n, k, rng):
    """The prefetch addresses are clamped to the buffer; results equal numpy's, bit for bit,
    including odd shapes whose last panel ends at the buffer's end."""
    require_host(_VNNI)
    a, b, out = _dense(m, n, k)
    mod = unit_tvm.build([a, b, out], intrinsic=_VNNI)
    x = rng.integers(0, 256, size=(m, k)).astype("uint8")
    w = rng.integers(-128, 128, size=(n, k)).astype("int8")
    got = tvm.runtime.tensor(np.zeros((m, n), "int32"))
    mod(tvm.runtime.tensor(x), tvm.runtime.tensor(w), got)
    np.testing.assert_array_equal(got.numpy(), x.astype(np.int64) @ w.T.astype(np.int64))


def test_a_strided_padded_conv_with_prefetches_equals_the_plain_loop_nest(rng):
    """ResNet-50's 3x3 stride-2 shape at 14x14 (147 KB of weights, window taps at the edges
    skipped): prefetched, and bit-exact against the plain int8 loop nest."""
    require_host(_VNNI)
    recipe = _recipe(256, 64, (14, 14), (3, 3), (1, 1), stride=2)
    x = rng.integers(0, 256, size=(1, 16, 14, 14, 16)).astype("uint8")
    got, want, func, _ = tensorized_and_plain(recipe, intrinsics.get(_VNNI), x, rng,
                                              mult=(2e-6, 1e-5))
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) > 20
    assert "llvm.prefetch" in _lowered_with_prefetch(func.with_attr("global_symbol", "main"))
