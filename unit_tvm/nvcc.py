"""Compile CUDA C produced by TVM to PTX with the machine's nvcc, to inspect what it emits."""

import os
import re
import shutil
import subprocess
import tempfile


def find_nvcc():
    """Path of nvcc (PATH, then $CUDA_HOME/bin, then /usr/local/cuda/bin), or None."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "bin", "nvcc")):
            return os.path.join(root, "bin", "nvcc")
    return None


def cuda_source(lib):
    """The CUDA C source of the device module inside a module built by tvm.build, or inside a
    Relax executable's module (VM executable -> host code -> cuda)."""
    stack = list(lib.imports)
    while stack:
        mod = stack.pop()
        if mod.kind == "cuda":
            return mod.inspect_source("")
        stack.extend(mod.imports)
    raise ValueError("module has no CUDA device code")


def _nvcc(source, arch, flags, output):
    """Run nvcc on CUDA `source`; returns (the output file's text or None, nvcc's stderr)."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.cu")
        out = os.path.join(tmp, output)
        with open(src, "w") as f:
            f.write(source)
        proc = subprocess.run([nvcc, *flags, f"-arch={arch}", "-O3", "-o", out, src],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed for {arch}:\n{proc.stderr[-4000:]}")
        text = open(out).read() if output.endswith(".ptx") else None
        return text, proc.stderr


def ptx(source, arch="sm_80"):
    """PTX text for CUDA `source` compiled by nvcc for `arch`; RuntimeError with nvcc's output."""
    return _nvcc(source, arch, ["-ptx"], "kernel.ptx")[0]


def resources(source, arch="sm_80"):
    """{kernel name: {'registers': int, 'shared': bytes}} from ptxas -v for CUDA `source`."""
    _, log = _nvcc(source, arch, ["-cubin", "--ptxas-options=-v"], "kernel.cubin")
    out, current = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = out.setdefault(m.group(1), {"registers": 0, "shared": 0})
        m = re.search(r"Used (\d+) registers", line)
        if m and current is not None:
            current["registers"] = int(m.group(1))
        m = re.search(r"(\d+) bytes smem", line)
        if m and current is not None:
            current["shared"] = int(m.group(1))
    return out


def launch_shapes(lib):
    """{kernel: threads per block} from the __launch_bounds__ TVM declares on each kernel."""
    out = {}
    for mod in lib.imports:
        if mod.kind != "cuda":
            continue
        src = mod.inspect_source("")

        for m in re.finditer(r"__launch_bounds__\((\d+)\)\s+(\w+)\(", src):
            out[m.group(2)] = int(m.group(1))
    return out
