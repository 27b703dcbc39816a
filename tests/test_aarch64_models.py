"""Whole int8 models compiled for aarch64 by unit_tvm.compile, run under qemu by an aarch64
Python with TVM's runtime, against the same model compiled for this x86 host."""

import functools

from typing import NamedTuple

import numpy as np
import pytest
import torch
import tvm

import unit_tvm
from unit_tvm import frontends
from unit_tvm.bench.engines import cosine as _cosine
from unit_tvm.cross import aarch64, arm_python
from unit_tvm.relax import quantize
from unit_tvm.relax.core.graph import model_macs
from unit_tvm.testing import zoo

pytestmark = pytest.mark.skipif(
    bool(arm_python.missing()),
    reason=f"cannot run aarch64 models: missing {'; '.join(arm_python.missing())}")



class Model(NamedTuple):
    """A zoo model quantized once (calibrated on this host), its input and fp32 output."""

    qmod: object
    x: np.ndarray
    fp32: np.ndarray
    macs: int


@functools.lru_cache(maxsize=None)
def _model(name):
    module, shape = zoo.get(name)
    x = zoo.inputs(shape, 1, seed=7)[0]
    mod = frontends.from_torch(module, [torch.from_numpy(x)])
    with torch.no_grad():
        fp32 = module(torch.from_numpy(x)).numpy()
    # quantized for the ARM server (its attention stays fp32: no bf16 dot product there)
    return Model(quantize(mod, calibration_data=zoo.inputs(shape, 4), target=aarch64.TARGET), x,
                 fp32, model_macs(mod))


@functools.lru_cache(maxsize=None)
def _x86(name):
    """The model's output compiled for and run on this host."""
    m = _model(name)
    vm = tvm.relax.VirtualMachine(unit_tvm.compile(m.qmod), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(m.x))
    return (out if hasattr(out, "numpy") else out[0]).numpy()


@functools.lru_cache(maxsize=None)
def _arm(name, dotprod_only=False):
    """(executable for aarch64, the instructions its report names)."""
    report = []
    ex = unit_tvm.compile(_model(name).qmod, target=aarch64.DOTPROD_TARGET if dotprod_only
                          else aarch64.TARGET, report=report)
    return ex, {row[1] for row in report}


def _static_count(executable, mnemonic):
    """How often `mnemonic` is in the aarch64 kernels' code."""
    return aarch64.instruction_count(executable.mod.imports[0], mnemonic)


# Under qemu with instruction counts, resnet18 takes 35 s and mobilenet_v2 (depthwise, inverted
# residuals) a minute: `make test-all` runs them. The default suite keeps resnet18 bit-exact on
# sdot (below) and a transformer layer on smmla.
@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_cnn_on_aarch64_is_bit_exact_with_x86(name):
    """Integer sums are exact on either ISA and the float epilogues are the same arithmetic:
    the aarch64 build (smmla, sdot where smmla pads too much) equals the x86 one exactly."""
    m, (ex, used) = _model(name), _arm(name)
    run = arm_python.run_model(ex, [m.x], count=(name == "resnet18"))
    out = run.outputs[0]
    np.testing.assert_array_equal(out, _x86(name))
    assert _cosine(out, m.fp32) > 0.99 and out.argmax() == m.fp32.argmax()
    assert "arm.smmla" in used and _static_count(ex, "smmla") > 0
    if run.counts is not None:
        # every conv and the classifier ran on the instructions: their multiply-adds cover the
        # model's, plus only the padding (3 input channels to 4, one row to two)
        c = run.counts
        assert c.executed["smmla"] > 0 and c.executed["sdot"] > 0
        assert m.macs <= c.tensorized_macs <= 1.1 * m.macs, (c, m.macs)


def test_bert_layer_on_aarch64_within_int8_rounding():
    """A transformer layer: the dense layers on smmla, the attention matmuls (float32 on ARM)
    on fmla; softmax and layer norm reduce in NEON's vector widths, so results may differ from
    x86's in float rounding, not more than a step of the output's int8 grid."""
    m, (ex, used), x86 = _model("bert_layer"), _arm("bert_layer"), _x86("bert_layer")
    out = arm_python.run_model(ex, [m.x]).outputs[0]
    step = (x86.max() - x86.min()) / 255
    assert np.abs(out - x86).max() <= 2 * step
    assert _cosine(out, x86) > 0.9999 and _cosine(out, m.fp32) > 0.99
    assert used == {"arm.smmla", "arm.fmla"}


def test_dotprod_only_server_gets_sdot():
    """Without I8MM the same policy picks sdot for every conv; still exact against x86."""
    ex, used = _arm("resnet18", dotprod_only=True)
    assert used == {"arm.sdot"} and _static_count(ex, "smmla") == 0
    assert _static_count(ex, "sdot") > 0
    out = arm_python.run_model(ex, [_model("resnet18").x]).outputs[0]
    np.testing.assert_array_equal(out, _x86("resnet18"))


def test_run_model_reports_failures():
    """A library that does not load is an error naming qemu's output, not a crash or a
    silent empty result."""
    with pytest.raises(RuntimeError, match="under qemu-aarch64"):
        arm_python.run_model(__file__, [np.zeros((1,), "float32")])
