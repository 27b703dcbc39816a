"""ONNX Runtime int8 in its best configuration for each model (and fp32 references of a model
given as an ONNX file).

Every variant a user would try is built from the same ONNX model (the torch module's export, or
the user's file; after ORT's own quantization pre-processing) and calibration inputs: static
QDQ and static QOperator, per-channel weights, u8 activations x s8 weights; for transformers
also dynamic quantization. The fastest variant whose outputs stay within cosine 0.99 of fp32 is
the one reported (its name is the variant)."""

import os
import tempfile

import numpy as np

from .. import frontends
from .engines import Engine, ModelCase, Stopwatch, cosine, fastest_accurate, first_output
from ..timing import interleaved


def _session(path, threads):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def _graph_inputs(path):
    """An ONNX model's inputs that are not initializers (older exports list weights there)."""
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    weights = {t.name for t in graph.initializer}
    return [i for i in graph.input if i.name not in weights]


def input_name(path):
    """The name of an ONNX model's (first) input."""
    return _graph_inputs(path)[0].name


def check_single_float_input(path):
    """ValueError unless the ONNX model takes exactly one float32 input (what the benchmark's
    random normal samples can feed)."""
    import onnx

    inputs = _graph_inputs(path)
    if len(inputs) != 1 or inputs[0].type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
        raise ValueError(f"{path}: bench-model feeds one float32 input of random samples; this "
                         f"model takes {len(inputs)} input(s) "
                         f"({', '.join(i.name for i in inputs)}) of other kinds")


def is_quantized(path) -> bool:
    """Whether an ONNX file arrives quantized: QuantizeLinear / DequantizeLinear nodes (what
    quantize_static's QDQ format and NNCF write)."""
    import onnx

    ops = {n.op_type for n in onnx.load(path, load_external_data=False).graph.node}
    return bool(ops & {"QuantizeLinear", "DequantizeLinear"})


def fp32_outputs(case: ModelCase) -> list:
    """ONNX Runtime's fp32 outputs of case.inputs for the model file case.onnx_path."""
    sess = _session(case.onnx_path, case.threads)
    name = sess.get_inputs()[0].name
    return [first_output(sess.run(None, {name: x})[0]) for x in case.inputs]


def _variants(case, fp32, tmp):
    """{variant name: path of the quantized model}."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    name = input_name(fp32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{name: c} for c in case.calibration])

        def get_next(self):
            return next(self.it, None)

    out = {}
    for fmt in (QuantFormat.QDQ, QuantFormat.QOperator):
        path = os.path.join(tmp, f"static_{fmt.name}.onnx")
        quantize_static(fp32, path, Reader(), quant_format=fmt, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        out[f"static {fmt.name}, per-channel, U8S8"] = path
    if case.transformer:
        path = os.path.join(tmp, "dynamic.onnx")
        quantize_dynamic(fp32, path, per_channel=True, weight_type=QuantType.QInt8)
        out["dynamic, per-channel, S8 weights"] = path
    return out


def _preprocessed(case, tmp):
    """Path of the fp32 ONNX model after ORT's quantization pre-processing: the user's file, or
    the torch module exported."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    raw = case.onnx_path
    if raw is None:
        import torch

        raw = frontends.export_onnx(case.model, [torch.tensor(case.calibration[0])],
                                    os.path.join(tmp, "model.onnx"))
    fp32 = os.path.join(tmp, "model.pre.onnx")
    quant_pre_process(raw, fp32, skip_symbolic_shape=True)
    return fp32


def ort_fp32(case: ModelCase) -> Engine:
    """The float32 model (the same pre-processed file the int8 variants start from), all graph
    optimizations, intra-op threads = case.threads."""
    watch = Stopwatch()
    with tempfile.TemporaryDirectory() as tmp:
        path = _preprocessed(case, tmp)
        feed, sess = input_name(path), _session(path, case.threads)
    x = case.inputs[0]
    return Engine(
        "ORT fp32", "fp32", lambda: sess.run(None, {feed: x}),
        lambda inp: first_output(sess.run(None, {feed: inp})[0]),
        threads=str(sess.get_session_options().intra_op_num_threads), compile_s=watch(),
        variant="ORT_ENABLE_ALL")


def ort_int8(case: ModelCase, references) -> Engine:
    """The fastest accurate ORT int8 variant; references: fp32 outputs of case.inputs."""
    watch = Stopwatch()
    x = case.inputs[0]
    with tempfile.TemporaryDirectory() as tmp:
        if case.quantized:  # the user's quantization, as ONNX Runtime runs the file
            feed, variants = input_name(case.onnx_path), {"the file's quantization": case.onnx_path}
        else:
            fp32 = _preprocessed(case, tmp)
            feed, variants = input_name(fp32), _variants(case, fp32, tmp)
        sessions, cosines = {}, {}
        for name, path in variants.items():
            sess = _session(path, case.threads)
            outs = [sess.run(None, {feed: i})[0] for i in case.inputs]
            sessions[name] = sess
            cosines[name] = float(np.mean([cosine(o, r) for o, r in zip(outs, references)]))
    times = interleaved({n: (lambda s=s: s.run(None, {feed: x})) for n, s in
                         sessions.items()}, rounds=8, warmup=2)
    best = fastest_accurate(times, cosines)
    sess = sessions[best]
    return Engine(
        "ORT int8", "int8", lambda: sess.run(None, {feed: x}),
        lambda inp: first_output(sess.run(None, {feed: inp})[0]),
        threads=str(sess.get_session_options().intra_op_num_threads), compile_s=watch(),
        variant=best, extra={"variants": {n: {"min_ms": times[n].min_ms, "cosine": cosines[n]}
                                          for n in sessions}})
