"""Model frontends: PyTorch (torch.export) and ONNX, both to a Relax IRModule."""


def from_torch(module, example_inputs):
    """torch.nn.Module (eval mode) -> Relax IRModule via torch.export, weights as constants."""
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    module = module.eval()
    with torch.no_grad():
        exported = torch.export.export(module, tuple(example_inputs))
    return from_exported_program(exported)


def from_onnx(model, shapes=None):
    """ONNX model (path or onnx.ModelProto) -> Relax IRModule, initializers as constants.

    shapes: {input name: shape} for inputs with symbolic dimensions.
    """
    import onnx
    from tvm.relax.frontend.onnx import from_onnx as _from_onnx

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(model)
    return _from_onnx(model, shape_dict=shapes, keep_params_in_input=False)


def export_onnx(module, example_inputs, path):
    """Write a torch module to an ONNX file (opset 17) for ONNX Runtime and the ONNX frontend."""
    import torch

    with torch.no_grad():
        torch.onnx.export(module.eval(), tuple(example_inputs), path, opset_version=17,
                          input_names=[f"input{i}" for i in range(len(example_inputs))],
                          dynamo=False)
    return path
