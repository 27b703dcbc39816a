"""unit_tvm.target: host detection and feature sets."""

import pytest
import tvm

from unit_tvm import target


def _cpuinfo_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def test_host_is_dict_form_llvm_with_cpu(host_target):
    assert host_target.kind.name == "llvm"
    assert str(host_target.attrs["mcpu"]) == tvm.target.codegen.llvm_get_system_cpu()
    assert int(host_target.attrs["num-cores"]) >= 1


@pytest.mark.parametrize("flag,feature", [("avx512_vnni", "avx512vnni"), ("avx_vnni", "avxvnni"),
                                          ("avx512_bf16", "avx512bf16"), ("avx512bw", "avx512bw")])
def test_host_features_follow_cpuinfo(flag, feature):
    # every instruction-relevant flag the kernel reports must be enabled in the target (the
    # host's own, whatever ISA level UNIT_TVM_ISA holds this process to)
    native = target.restricted("native")
    assert (flag in _cpuinfo_flags()) == (feature in target.features(native))


def test_string_target_rejected_with_hint():
    with pytest.raises(TypeError, match="dict"):
        target.as_target("llvm -mcpu=znver4")


def test_arch_and_cuda_features():
    assert target.arch({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}) == "aarch64"
    assert target.arch({"kind": "cuda", "arch": "sm_80"}) == "cuda"
    assert "tensorcore" in target.features({"kind": "cuda", "arch": "sm_80"})
    assert "tensorcore" not in target.features({"kind": "cuda", "arch": "sm_61"})
