"""Where `unit-tvm compile` and `bench` take a model from: a zoo name, an ONNX file or a
torch.export program, as Relax with its input shape; and the calibration inputs for it."""

import os
from dataclasses import dataclass

import numpy as np
from . import frontends


@dataclass(frozen=True)
class ModelSource:
    """A model as Relax, with the input shape calibration and examples use."""

    mod: object  # tvm.IRModule
    input_shape: tuple
    name: str


def onnx_input(model) -> tuple:
    """(name, shape) of an ONNX model's (path's or ModelProto's) first input, symbolic
    dimensions as 1 (batch 1)."""
    import onnx

    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(model)
    first = proto.graph.input[0]
    dims = first.type.tensor_type.shape.dim
    return first.name, tuple(d.dim_value if d.dim_value > 0 else 1 for d in dims)


def model_source(spec: str) -> ModelSource:
    """A zoo name, an ONNX file (.onnx) or a torch.export program file (.pt2) as Relax."""

    if spec.endswith(".onnx"):
        import onnx

        proto = onnx.load(spec)
        name, shape = onnx_input(proto)
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

    from .testing import zoo  # torch: only for a zoo name

    module, shape = zoo.get(spec)  # KeyError naming the known models
    x = torch.from_numpy(zoo.inputs(shape, 1)[0])
    return ModelSource(frontends.from_torch(module, [x]), tuple(shape), spec)


def calibration(path: str | None, shape: tuple, n: int = 4) -> list:
    """Calibration inputs: every array of an .npz (or one .npy), else n fixed random inputs."""
    if path is None:
        from .testing import zoo  # torch: only for a zoo name

        return zoo.inputs(shape, n)
    data = np.load(path)
    arrays = [data[k] for k in data.files] if hasattr(data, "files") else [data]
    for a in arrays:
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"{path}: a calibration input has shape {a.shape}, the model takes "
                             f"{tuple(shape)}")
    return [a.astype("float32") for a in arrays]
