"""Shipping a compiled model: model sources by name or file, export to one shared library, and
loading it back (`unit-tvm compile`, `unit-tvm run`, `unit_tvm.load`).

The library is TVM's own export of the Relax executable (host code, kernels and constants in one
.so); loading it needs TVM's runtime and a C++ runtime only, not unit-tvm's compiler nor LLVM
(a machine with just the runtime sets TVM_USE_RUNTIME_LIB=1).
"""

import os
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ModelSource:
    """A model as Relax, with the input shape calibration and examples use."""

    mod: object  # tvm.IRModule
    input_shape: tuple
    name: str


def model_source(spec: str) -> ModelSource:
    """A zoo name, an ONNX file (.onnx) or a torch.export program file (.pt2) as Relax."""
    from . import frontends

    if spec.endswith(".onnx"):
        import onnx

        proto = onnx.load(spec)
        dims = proto.graph.input[0].type.tensor_type.shape.dim
        shape = tuple(d.dim_value if d.dim_value > 0 else 1 for d in dims)
        name = proto.graph.input[0].name
        return ModelSource(frontends.from_onnx(proto, shapes={name: shape}), shape,
                           os.path.basename(spec))
    if spec.endswith(".pt2"):
        import torch
        from tvm.relax.frontend.torch import from_exported_program

        program = torch.export.load(spec)
        example = program.example_inputs[0][0] if program.example_inputs else None
        if example is None:
            raise ValueError(f"{spec}: the exported program carries no example input, so its "
                             f"input shape is unknown; export it with example inputs")
        return ModelSource(from_exported_program(program), tuple(example.shape),
                           os.path.basename(spec))
    if os.path.exists(spec):
        raise ValueError(f"{spec}: unknown model file type (use .onnx or a torch.export .pt2)")
    import torch

    from . import zoo

    module, shape = zoo.get(spec)  # KeyError naming the known models
    x = torch.from_numpy(zoo.inputs(shape, 1)[0])
    return ModelSource(frontends.from_torch(module, [x]), tuple(shape), spec)


def calibration(path: str | None, shape: tuple, n: int = 4) -> list:
    """Calibration inputs: every array of an .npz (or one .npy), else n fixed random inputs."""
    if path is None:
        from . import zoo

        return zoo.inputs(shape, n)
    data = np.load(path)
    arrays = [data[k] for k in data.files] if hasattr(data, "files") else [data]
    for a in arrays:
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"{path}: a calibration input has shape {a.shape}, the model takes "
                             f"{tuple(shape)}")
    return [a.astype("float32") for a in arrays]


def export(executable, path: str, cc: str | None = None) -> str:
    """Write a compiled model (unit_tvm.compile's result) as one shared library; its path.
    cc: the compiler that links it (a cross compiler for another machine's target)."""
    executable.export_library(path, **({"cc": cc} if cc else {}))
    return path


class CompiledModel:
    """A model loaded from an exported library: call it on numpy arrays, get numpy arrays."""

    def __init__(self, path: str, device: str = "cpu"):
        import tvm
        from tvm.runtime.vm import VirtualMachine  # the runtime's VM: no compiler involved

        if not os.path.exists(path):
            raise FileNotFoundError(f"no compiled model at {path}")
        self.device = tvm.cuda(0) if device == "cuda" else tvm.cpu(0)
        self._vm = VirtualMachine(tvm.runtime.load_module(path), self.device)

    def __call__(self, *inputs):
        """The model's outputs for numpy `inputs`: one array, or a list for several outputs."""
        import tvm

        args = [tvm.runtime.tensor(np.ascontiguousarray(x), self.device) for x in inputs]
        out = self._vm["main"](*args)
        if hasattr(out, "numpy"):
            return out.numpy()
        outs = [o.numpy() for o in out]
        return outs[0] if len(outs) == 1 else outs


def load(path: str, device: str = "cpu") -> CompiledModel:
    """Load a library written by `unit-tvm compile` / unit_tvm.deploy.export."""
    return CompiledModel(path, device)
