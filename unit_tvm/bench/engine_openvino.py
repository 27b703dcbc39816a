"""OpenVINO int8: the model converted from PyTorch, quantized by NNCF post-training
quantization on the same calibration inputs, compiled for the CPU with the latency hint."""

from .engines import Engine, ModelCase, Stopwatch, first_output


_COMPUTE = ("Convolution", "FullyConnected", "MatMul", "GroupConvolution", "Deconvolution")


def _layers(compiled):
    """{"int8_layers", "compute_layers", "kernels"}: how many convolution/matmul layers of the
    runtime model run in int8, and which oneDNN primitives run them."""
    int8 = total = 0
    kernels = set()
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        field = {k: info[k].astype(str) for k in ("layerType", "runtimePrecision", "primitiveType")
                 if k in info}
        if field.get("layerType") in _COMPUTE:
            total += 1
            if field.get("runtimePrecision") in ("u8", "i8"):
                int8 += 1
                kernels.add(field.get("primitiveType", ""))
    return {"int8_layers": int8, "compute_layers": total, "kernels": sorted(kernels)}


def openvino_int8(case: ModelCase) -> Engine:
    """NNCF int8 (transformer preset for BERT), INFERENCE_NUM_THREADS = case.threads."""
    import nncf
    import openvino as ov
    import torch

    watch = Stopwatch()
    model = ov.convert_model(case.model, example_input=torch.tensor(case.calibration[0]))
    preset = {"model_type": nncf.ModelType.TRANSFORMER} if case.transformer else {}
    quantized = nncf.quantize(model, nncf.Dataset(case.calibration),
                              subset_size=len(case.calibration), **preset)
    compiled = ov.Core().compile_model(quantized, "CPU", {
        "INFERENCE_NUM_THREADS": case.threads, "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    x = case.inputs[0]

    def infer(inp):
        return first_output(compiled({0: inp})[0])

    return Engine(
        "OpenVINO int8", "int8", lambda: request.infer({0: x}), infer,
        threads=str(compiled.get_property("INFERENCE_NUM_THREADS")), compile_s=watch(),
        variant=f"NNCF PTQ, {compiled.get_property('INFERENCE_PRECISION_HINT')} elsewhere",
        extra={**_layers(compiled), "streams": str(compiled.get_property("NUM_STREAMS"))})
