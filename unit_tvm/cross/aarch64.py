"""Run TVM-built aarch64 kernels under qemu-aarch64 and compare with numpy.

Tools (Debian): gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user. `missing_tools()` says
which are absent; `make test` installs them when it can (root + apt).
"""

import atexit
import functools
import os
import shutil
import subprocess
import tempfile

import numpy as np
import tvm
import tvm_ffi

CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
SYSROOT = "/usr/aarch64-linux-gnu"
TARGET = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+dotprod", "+i8mm"],
          "num-cores": 1}
# a DotProd server without I8MM (Graviton 2, Neoverse N1): sdot, no smmla
DOTPROD_TARGET = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+dotprod"],
                  "num-cores": 1}
_DTYPE_CODES = {"int": 0, "uint": 1, "float": 2, "bfloat": 4}


def missing_tools():
    """Names of the tools needed to run aarch64 code here that are not installed."""
    out = [t for t in (CC, QEMU) if shutil.which(t) is None]
    if not os.path.isdir(SYSROOT):
        out.append(f"aarch64 libc ({SYSROOT}, package libc6-dev-arm64-cross)")
    return out


def process_temp_dir(prefix: str) -> str:
    """A new temp folder for tools built once per process, removed when the process exits."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path


@functools.lru_cache(maxsize=None)
def harness():
    """Path of the compiled aarch64 harness (built once per process, in a temp folder)."""
    include = os.path.join(os.path.dirname(tvm_ffi.__file__), "include")
    src = os.path.join(os.path.dirname(__file__), "aarch64_harness.c")
    out = os.path.join(process_temp_dir("unit_tvm_arm_"), "harness")
    subprocess.run([CC, "-O2", "-I", include, "-o", out, src, "-ldl", "-rdynamic"], check=True,
                   capture_output=True, text=True)
    return out


def _dtype_spec(dtype):
    dtype = str(dtype)
    for prefix in ("bfloat", "uint", "int", "float"):
        if dtype.startswith(prefix):
            return _DTYPE_CODES[prefix], int(dtype[len(prefix):])
    raise ValueError(f"unsupported dtype {dtype}")


def run(module, arrays, timeout=600):
    """Call a module built for TARGET on numpy `arrays` (inputs then output) under qemu-aarch64.

    Returns the output array as the kernel wrote it.
    """
    missing = missing_tools()
    if missing:
        raise FileNotFoundError(f"cannot run aarch64 code here: missing {', '.join(missing)}")
    with tempfile.TemporaryDirectory(prefix="unit_tvm_arm_") as tmp:
        lib = os.path.join(tmp, "kernel.so")
        module.export_library(lib, cc=CC)
        argv = [QEMU, "-L", SYSROOT, harness(), lib, str(len(arrays))]
        for i, arr in enumerate(arrays):
            path = os.path.join(tmp, f"arg{i}.bin")
            np.ascontiguousarray(arr).tofile(path)
            code, bits = _dtype_spec(arr.dtype)
            argv += [path, str(code), str(bits), str(arr.ndim), *map(str, arr.shape)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"aarch64 kernel failed ({proc.returncode}): {proc.stderr[-2000:]}")
        out = np.fromfile(os.path.join(tmp, f"arg{len(arrays) - 1}.bin"), dtype=arrays[-1].dtype)
        return out.reshape(arrays[-1].shape)


def instruction_count(module, mnemonic):
    """How many times `mnemonic` appears as an instruction in the module's aarch64 assembly."""
    asm = module.inspect_source("asm")
    return sum(1 for line in asm.splitlines() if line.split()[:1] == [mnemonic])


def target():
    """The aarch64 target (DotProd + I8MM) as a tvm.target.Target."""
    return tvm.target.Target(TARGET)
