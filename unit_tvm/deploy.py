"""Shipping a compiled model: export to one shared library, and loading it back (`unit-tvm
compile`, `unit-tvm run`, `unit_tvm.load`).

The library is TVM's own export of the Relax executable (host code, kernels and constants in one
.so); loading it needs TVM's runtime and a C++ runtime only, not unit-tvm's compiler nor LLVM
(a machine with just the runtime sets TVM_USE_RUNTIME_LIB=1).
"""

import os

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine  # the runtime's VM: no compiler involved

from .runner import prepare_host


def export(executable, path: str, cc: str | None = None) -> str:
    """Write a compiled model (unit_tvm.compile's result) as one shared library; its path.
    cc: the compiler that links it (a cross compiler for another machine's target)."""
    executable.export_library(path, **({"cc": cc} if cc else {}))
    return path


class CompiledModel:
    """A model loaded from an exported library: call it on numpy arrays, get numpy arrays."""
    def __init__(self, path: str, device: str = "cpu"):
        if not os.path.exists(path):
            raise FileNotFoundError(f"no compiled model at {path}")
        prepare_host()
        if device == "cuda" and not tvm.cuda(0).exist:
            raise RuntimeError("device 'cuda' asked for, and this machine has no CUDA GPU")
        self.device = tvm.cuda(0) if device == "cuda" else tvm.cpu(0)
        try:
            module = tvm.runtime.load_module(path)
        except Exception as e:  # noqa: BLE001 - TVM's message names a loader, not the cause
            if "load_from_bytes.cuda" not in str(e):
                raise
            raise RuntimeError(f"{path} holds CUDA kernels (unit-tvm compile --target cuda): "
                               "run it with --device cuda on a machine with a CUDA GPU; this "
                               "TVM has no CUDA runtime") from None
        self._vm = VirtualMachine(module, self.device)

    def __call__(self, *inputs):
        """The model's outputs for numpy `inputs`: one array, or a list for several outputs."""

        args = [tvm.runtime.tensor(np.ascontiguousarray(x), self.device) for x in inputs]
        out = self._vm["main"](*args)
        if hasattr(out, "numpy"):
            return out.numpy()
        outs = [o.numpy() for o in out]
        return outs[0] if len(outs) == 1 else outs


def load(path: str, device: str = "cpu") -> CompiledModel:
    """Load a library written by `unit-tvm compile` / unit_tvm.deploy.export."""
    return CompiledModel(path, device)
