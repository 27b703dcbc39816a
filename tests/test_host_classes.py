"""Both x86 server classes are compiled for on every host: an AMX Xeon, the same Xeon restricted
to VNNI (what `--isa avx512_core_vnni` gives there) and a VNNI-only Zen 4. Only one class can run
here, so these check the graphs build and the kernels carry each class's instruction; the
results themselves are checked on the host's own class by test_relax.py."""

import pytest
import torch
import tvm

from unit_tvm import frontends
from unit_tvm.compiler import build_relax
from unit_tvm.cross import aarch64
from unit_tvm.relax import UnitTensorize, quantize
from unit_tvm.relax.quantization.ptq import default_attention
from unit_tvm.target import ISA_LEVELS

from .test_relax import SmallCNN, TinyTransformer, WideHeads, _asm, _prepare

_AMX = ("-amx-tile", "-amx-int8", "-amx-bf16")
# what `--isa avx512_core_vnni` turns off
_VNNI_ONLY = [f"-{feature}" for feature in ISA_LEVELS["avx512_core_vnni"]]
_CLASSES = {
    # name: (target, instruction that must be in the int8 kernels, one that must not)
    "amx": ({"mcpu": "sapphirerapids"}, "tdpbusd", None),
    "amx_restricted_to_vnni": ({"mcpu": "sapphirerapids", "mattr": _VNNI_ONLY},
                               "vpdpbusd", "tdpbusd"),
    "zen4": ({"mcpu": "znver4"}, "vpdpbusd", "tdpbusd"),
}


def _target(spec):
    return tvm.target.Target({"kind": "llvm", "num-cores": 2, **spec})


def _compiled(model, shape, target, **quantize_args):
    _, xs, _ = _prepare(model, shape)
    mod = frontends.from_torch(model, [torch.tensor(xs[0])])
    qmod = quantize(mod, target=target, **quantize_args)
    tpass = UnitTensorize(target)
    return tpass, _asm(build_relax(tpass(qmod), target))


@pytest.mark.parametrize("cls", sorted(_CLASSES))
@pytest.mark.parametrize("model, shape", [(SmallCNN, (1, 3, 16, 16)),
                                          (TinyTransformer, (1, 16, 64))])
def test_int8_models_compile_for_each_x86_class(cls, model, shape):
    spec, want, unwanted = _CLASSES[cls]
    target = _target(spec)
    model = model()
    cal, _, _ = _prepare(model, shape)
    tpass, asm = _compiled(model, shape, target, calibration_data=cal)
    used = [instr for _, instr, _ in tpass.report if instr]
    assert used, tpass.report
    if unwanted:
        assert not any(unwanted in i for i in used), used
        assert unwanted not in asm
    assert want in asm, f"{cls}: no {want} in the kernels ({used})"


def test_bf16_model_compiles_for_amx_bf16():
    """bf16 on the AMX class takes the tile instruction; restricted to VNNI (no AMX, no
    AVX512-BF16) the same model's bf16 ops keep TVM's loop nest, with a warning, and still
    build (its attention, float32 there, runs on the float32 multiply-add)."""
    tpass, asm = _compiled(TinyTransformer(), (1, 16, 64), _target({"mcpu": "sapphirerapids"}),
                           dtype="bfloat16")
    assert all(instr for _, instr, _ in tpass.report), tpass.report
    assert "tdpbf16ps" in asm
    restricted = _target({"mcpu": "sapphirerapids", "mattr": [*_AMX, "-avx512bf16"]})
    with pytest.warns(UserWarning, match="no instruction for its dtypes"):
        tpass, asm = _compiled(TinyTransformer(), (1, 16, 64), restricted, dtype="bfloat16")
    assert not any(instr for op, instr, _ in tpass.report if not op.startswith("bmm"))
    assert all(instr.startswith("x86.vfmadd231ps") for op, instr, _ in tpass.report
               if op.startswith("bmm"))
    assert "tdpbf16ps" not in asm


def test_attention_defaults_to_bf16_only_where_a_bf16_dot_product_runs_it():
    """Attention matmuls go bf16 on the classes with a bf16 dot product (AMX Xeons, Zen 4);
    a Cascade Lake, an AMX Xeon restricted to VNNI and an ARM server keep them fp32, which
    a bf16 loop nest there would only slow down."""
    got = {name: default_attention(_target(spec)) for name, (spec, _, _) in _CLASSES.items()}
    assert got == {"amx": "bf16", "amx_restricted_to_vnni": "fp32", "zen4": "bf16"}
    assert default_attention(_target({"mcpu": "cascadelake"})) == "fp32"
    assert default_attention(aarch64.TARGET) == "fp32"


@pytest.mark.parametrize("cls, instruction", [("amx", "tdpbf16ps"), ("zen4", "vdpbf16ps"),
                                              ("amx_restricted_to_vnni", None)])
def test_default_attention_compiles_on_each_x86_class(cls, instruction):
    """BERT-sized heads (64): the attention matmuls on AMX-BF16 tiles on the AMX class, on
    vdpbf16ps on Zen 4, float32 on the Xeon restricted to VNNI (on its float32 multiply-add)."""
    model = WideHeads()
    cal, _, _ = _prepare(model, (1, 32, 128))
    tpass, asm = _compiled(model, (1, 32, 128), _target(_CLASSES[cls][0]), calibration_data=cal)
    used = [instr for op, instr, _ in tpass.report if op.startswith("bmm")]
    if instruction is None:
        assert len(used) == 2 and all(i.startswith("x86.vfmadd231ps") for i in used), used
        assert "dpbf16ps" not in asm
    else:
        assert len(used) == 2 and all(i.startswith(f"x86.{instruction}") for i in used), used
        assert instruction in asm
