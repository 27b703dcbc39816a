"""Instructions this host cannot execute: compiled for their target, instruction in the output."""

import pytest
import tvm

from unit_tvm import intrinsics, microkernel, nvcc

AARCH64 = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu",
                             "mattr": ["+neon", "+dotprod", "+i8mm"]})


def _has_aarch64_backend():
    return "aarch64" in [str(t) for t in tvm.target.codegen.llvm_get_targets()]


@pytest.mark.parametrize("name,mnemonic", [("arm.sdot", "sdot"), ("arm.udot", "udot"),
                                           ("arm.smmla", "smmla")])
def test_arm_instruction_in_aarch64_assembly(name, mnemonic):
    if not _has_aarch64_backend():
        pytest.skip("this TVM's LLVM has no AArch64 backend")
    func, _, _ = microkernel.instruction_kernel(intrinsics.get(name), 8)
    asm = tvm.tirx.build(func, target=AARCH64).inspect_source("asm")
    lines = [line.split() for line in asm.splitlines()]
    assert sum(1 for words in lines if words and words[0] == mnemonic) >= 8


@pytest.mark.parametrize("name,ptx_type", [("cuda.wmma.f16f32", "f32.f32"),
                                           ("cuda.wmma.s8s32", "s32.s8.s8.s32")])
def test_wmma_in_ptx_from_nvcc(name, ptx_type):
    if nvcc.find_nvcc() is None:
        pytest.skip("nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    func, _, _ = microkernel.wmma_kernel(intrinsics.get(name), 4)
    lib = tvm.tirx.build(func, target=tvm.target.Target({"kind": "cuda", "arch": "sm_80"}))
    ptx = nvcc.ptx(nvcc.cuda_source(lib), "sm_80")
    mma = [line for line in ptx.splitlines() if "wmma.mma.sync" in line]
    assert mma and ptx_type in mma[0]
    assert "wmma.load.a.sync" in ptx and "wmma.store.d.sync" in ptx
