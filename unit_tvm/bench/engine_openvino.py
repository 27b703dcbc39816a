"""OpenVINO int8: the model converted from PyTorch (or read from the user's ONNX file),
quantized by NNCF post-training quantization on the same calibration inputs, compiled for the
CPU with the latency hint; OpenVINO fp32: the same converted model, INFERENCE_PRECISION_HINT
f32 (without it OpenVINO runs bf16 on CPUs with a bf16 dot product)."""

import contextlib
import sys

import numpy as np

from ..frontends import attention_as_ops
from .engines import Engine, ModelCase, Stopwatch, cosine, fastest_accurate, first_output
from ..timing import interleaved

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


# the precision OpenVINO runs the non-quantized parts in: its default (bf16 on CPUs with bf16
# instructions) and f32, which a user whose accuracy suffers would set
_PRECISIONS = {"default": {}, "f32": {"INFERENCE_PRECISION_HINT": "f32"}}


def _quantized(case: ModelCase, model) -> dict:
    """{NNCF preset name: int8 model}: the default preset, and for a transformer also NNCF's
    transformer one, so that the benchmark picks per model as a user would (on ViT-B/16 the
    transformer preset alone gave cosine 0.975, the default 0.996); a file that arrives
    quantized as it is."""
    import nncf

    if case.quantized:  # the file's own quantization: OpenVINO reads its QDQ pairs
        return {"the file": model}
    presets = {"NNCF PTQ": {}}
    if case.transformer:
        presets["NNCF PTQ transformer"] = {"model_type": nncf.ModelType.TRANSFORMER}
    out = {}
    for name, preset in presets.items():
        # NNCF draws progress bars on stdout, which `bench-model --json` keeps for its JSON
        with contextlib.redirect_stdout(sys.stderr):
            out[name] = nncf.quantize(model, nncf.Dataset(case.calibration),
                                      subset_size=len(case.calibration), **preset)
    return out


def _converted(case: ModelCase):
    """The case's model as an OpenVINO model (from the torch module, or the ONNX file)."""
    import openvino as ov

    if case.onnx_path:
        model = ov.convert_model(case.onnx_path)
        model.reshape(list(case.shape))  # symbolic dimensions as the benchmark feeds them
        return model
    import torch

    with attention_as_ops():
        return ov.convert_model(case.model, example_input=torch.tensor(case.calibration[0]))


def openvino_fp32(case: ModelCase) -> Engine:
    """The model in float32 (INFERENCE_PRECISION_HINT f32), INFERENCE_NUM_THREADS =
    case.threads, the latency hint."""
    import openvino as ov

    watch = Stopwatch()
    compiled = ov.Core().compile_model(_converted(case), "CPU", {
        "INFERENCE_NUM_THREADS": case.threads, "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": "f32"})
    request, x = compiled.create_infer_request(), case.inputs[0].copy()  # it writes its inputs
    return Engine(
        "OpenVINO fp32", "fp32", lambda: request.infer({0: x}),
        lambda inp: first_output(compiled({0: inp.copy()})[0]).copy(),
        threads=str(compiled.get_property("INFERENCE_NUM_THREADS")), compile_s=watch(),
        variant="f32", extra=_layers(compiled))


def openvino_int8(case: ModelCase, references) -> Engine:
    """NNCF int8 (default preset, and the transformer one for transformers),
    INFERENCE_NUM_THREADS = case.threads; the fastest of its presets and precision settings
    that keeps cosine >= 0.99 (references: fp32 outputs)."""
    import openvino as ov

    watch = Stopwatch()
    model = _converted(case)
    # OpenVINO writes into the numpy arrays it is given (measured: the benchmark's inputs changed
    # after its first inferences), so it only ever sees copies
    x = case.inputs[0].copy()
    compiled, requests, cosines, refused = {}, {}, {}, []
    for preset, quantized in _quantized(case, model).items():
        for precision, extra in _PRECISIONS.items():
            name = (preset, precision)
            try:
                c = ov.Core().compile_model(quantized, "CPU", {
                    "INFERENCE_NUM_THREADS": case.threads, "PERFORMANCE_HINT": "LATENCY",
                    **extra})
            except RuntimeError as e:
                # held to an ISA below the CPU's (ONEDNN_MAX_CPU_ISA=AVX2 on a CPU with bf16),
                # its default precision can find no primitive for some layers: that variant
                # does not exist on such a host; the others still do
                refused.append(f"{' / '.join(name)}: {str(e).splitlines()[-1][:120]}")
                continue
            compiled[name], requests[name] = c, c.create_infer_request()
            outs = [first_output(c({0: i.copy()})[0]).copy() for i in case.inputs]
            cosines[name] = float(np.mean([cosine(o, r) for o, r in zip(outs, references)]))
    if not compiled:
        raise RuntimeError("OpenVINO compiled no variant: " + "; ".join(refused))
    times = interleaved({n: (lambda r=r: r.infer({0: x})) for n, r in requests.items()},
                        rounds=6, warmup=2)
    best = fastest_accurate(times, cosines)
    chosen, request = compiled[best], requests[best]
    return Engine(
        "OpenVINO int8", "int8", lambda: request.infer({0: x}),
        lambda inp: first_output(chosen({0: inp.copy()})[0]).copy(),
        threads=str(chosen.get_property("INFERENCE_NUM_THREADS")), compile_s=watch(),
        variant=f"{best[0]}, "
                f"{chosen.get_property('INFERENCE_PRECISION_HINT').get_type_name()} elsewhere",
        extra={**_layers(chosen), "streams": str(chosen.get_property("NUM_STREAMS")),
               "variants": {" / ".join(n): {"min_ms": times[n].min_ms, "cosine": cosines[n]}
                            for n in compiled}, "refused": refused})
