"""unit_tvm.llm.row_scale: a matmul input's RMSNorm and per-token int8 scale in one kernel,
against float64 numpy on each x86 class this host can run, and the int8 step's use of it."""

import numpy as np
import pytest
import tvm

from unit_tvm import lowering
from unit_tvm.llm import row_scale
from unit_tvm.target import as_target, host

from .conftest import tiny_decoder, x86_classes


def _reference(x, weight, eps):
    """(y / scale, scale [rows, 1]) in float64: y the RMSNorm of x (weight, eps) or x."""
    y = x.astype(np.float64)
    if eps is not None:
        y = y / np.sqrt((y * y).mean(-1, keepdims=True) + eps) * weight
    scale = np.maximum(np.abs(y).max(-1, keepdims=True), row_scale.TINY) / row_scale.LEVELS
    return y / scale, scale


@pytest.mark.parametrize("name,target", x86_classes(),
                         ids=[n for n, _ in x86_classes()])
@pytest.mark.parametrize("rows,width,eps", [(1, 2048, 1e-5), (6, 40, None), (5, 24, 1e-6),
                                            (3, 7, None)])
def test_matches_float64(name, target, rows, width, eps):
    # a decode row, a chunk's rows; widths the vector does not divide (40, 24: fewer lanes,
    # 7: one), an all-zero row (a finite scale, zeros out) and a row of one large value
    func = row_scale.for_target(row_scale.RowScale(rows, width, eps), target)
    lib = lowering.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                         target)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((rows, width)) * 3).astype(np.float32)
    if rows > 2:
        x[-1] = 0.0
        x[0] = 0.0
        x[0, width // 2] = -1e4
    weight = (rng.standard_normal(width) + 1).astype(np.float32)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros((rows, width), np.float32), dev)
    scale = tvm.runtime.tensor(np.zeros((rows, 1), np.float32), dev)
    args = [tvm.runtime.tensor(x, dev)] + ([tvm.runtime.tensor(weight, dev)] if eps else [])
    lib["main"](*args, out, scale)
    want_out, want_scale = _reference(x, weight, eps)
    np.testing.assert_allclose(scale.numpy(), want_scale, rtol=1e-5)
    # the scaled row feeds int8 rounding: within a small fraction of one level
    np.testing.assert_allclose(out.numpy(), want_out, rtol=1e-5, atol=1e-4)
    assert np.abs(out.numpy()).max() <= row_scale.LEVELS * (1 + 1e-6)


def test_off_a_cpu_the_step_keeps_relax_ops():
    cuda = as_target({"kind": "cuda", "arch": "sm_90"})
    assert row_scale.for_target(row_scale.RowScale(4, 64, 1e-5), cuda) is None


def test_int8_step_quantizes_each_input_in_one_kernel():
    from tvm import relax

    from unit_tvm.llm import graph, weights

    cfg, w = tiny_decoder(layers=2, vocab=128, tied=False)
    act = dict.fromkeys(weights.input_names(cfg.layers), graph.PER_TOKEN)
    step = graph.step_module(cfg, w, 8, 32, act, host())
    head = graph.head_module(cfg, w, act, host())

    def kernels(mod):
        return sorted(gv.name_hint for gv, f in mod.functions.items()
                      if isinstance(f, tvm.tirx.PrimFunc) and "row_scale" in gv.name_hint)

    # normed inputs (q / k / v, gate / up) of 8 rows, o and down inputs; the LM head's row
    assert kernels(step) == ["norm_row_scale_8x64", "row_scale_8x64", "row_scale_8x96"]
    assert kernels(head) == ["norm_row_scale_1x64"]
    for mod in (step, head):
        ops = set()
        relax.analysis.post_order_visit(mod["main"], lambda e: isinstance(e, relax.Call) and
                                        isinstance(e.op, tvm.ir.Op) and ops.add(e.op.name))
        assert not ops & {"relax.abs", "relax.max", "relax.nn.rms_norm"}, ops
        assert "relax.call_tir" in ops
