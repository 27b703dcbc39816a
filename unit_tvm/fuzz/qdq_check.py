"""Run one model case (model_cases.py) as a file that arrives quantized (kind "qdq"): export it
to ONNX, quantize the file with ONNX Runtime's quantize_static (QDQ pairs, uint8 or int8
activations, int8 weights per tensor or per channel; or its QOperator ops, which
onnx_qoperator.py reads as QDQ) or with NNCF (its own placement of the pairs, a scale per
channel on some activations), compile the file with `unit_tvm.compile` and no calibration
(quantization/qdq.py takes the file's scales), and compare with ONNX Runtime running the same file.

The two need not agree bit for bit: unit-tvm computes an activation between pairs (a sigmoid
gate, a hardswish) in float32 where the file rounds it to its pair's grid, and a scale per
channel on an activation becomes one per tensor. Both stay near the float32 model, so
`model_check.judge` decides with ONNX Runtime in the place of TVM's build, over all inputs at
once: an output is wrong when it is far from ONNX Runtime's and further from the float32 model
than ONNX Runtime's is by more than QDQ_SHARE (a dropped clamp, a lost term, a wrong scale).
"""

import tempfile
import time
from pathlib import Path

import numpy as np

from .model_check import judge, model_and_reference, run_outputs
from .outcome import CaseResult, failed, quiet
from .. import frontends
from ..onnx_qoperator import qoperator_as_qdq
from ..target import host
from ..compiler import compile as unit_compile

_INPUT = "input0"  # frontends.export_onnx's name for the model's input
# two int8 executions of one file round differently (an activation in float32 or on its pair's
# grid): on single inputs of these small models unit-tvm's distance from the float32 model was
# 0.5-1.37x ONNX Runtime's, over eight inputs 0.90-0.97x; a dropped clamp gave 12x
QDQ_SHARE = 0.5
INPUTS = 4


def _stacked(runs: list) -> list:
    """Per model output, the outputs of every input in one array."""
    return [np.stack([run[i] for run in runs]) for i in range(len(runs[0]))]


def _quantized_file(model, calibration, folder: Path, quantizer: str, dedicated=False) -> str:
    """The model as a quantized ONNX file, calibrated on `calibration`: quantizer "ort",
    "ort_per_channel" or "ort_s8s8" (ONNX Runtime's quantize_static, QDQ: uint8 activations
    with weights per tensor or per channel, or int8 activations), "ort_qoperator" (its
    QOperator format: QLinearConv, QGemm...) or "nncf" (NNCF's post-training quantization);
    dedicated: ONNX Runtime's DedicatedQDQPair (a DequantizeLinear per reader)."""
    import onnx
    import torch


    fp32 = frontends.export_onnx(model, [torch.tensor(calibration[0])], str(folder / "f.onnx"))
    path = str(folder / "qdq.onnx")
    if quantizer == "nncf":
        import nncf

        dataset = nncf.Dataset(calibration, lambda x: {_INPUT: x})
        onnx.save(nncf.quantize(onnx.load(fp32), dataset, subset_size=len(calibration)), path)
        return path
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = iter([{_INPUT: x} for x in calibration])

        def get_next(self):
            return next(self.samples, None)

    signed = quantizer == "ort_s8s8"  # ONNX Runtime's recommended QDQ format on x86
    quantize_static(fp32, path, Reader(), per_channel=quantizer != "ort",
                    quant_format=QuantFormat.QOperator if quantizer == "ort_qoperator"
                    else QuantFormat.QDQ,
                    activation_type=QuantType.QInt8 if signed else QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                    extra_options={"DedicatedQDQPair": bool(dedicated)})
    return path


def _onnx_runtime(path: str, inputs) -> list:
    import onnxruntime as ort

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return [session.run(None, {_INPUT: x}) for x in inputs]


def run_qdq_case(case, target=None) -> CaseResult:
    """Quantize the case's model with its quantizer, compile the file with unit-tvm and compare
    with ONNX Runtime running it. Exceptions are classified, never raised."""
    import onnx

    t0 = time.time()
    target = target or host()
    base = dict(index=case.index, kind=case.kind, description=case.describe(),
                reproduce=case.reproduce())
    params = dict(case.params)
    quantizer, dedicated = params.pop("quantizer"), params.pop("dedicated", 0)
    with tempfile.TemporaryDirectory() as folder:
        try:
            model, calibration, inputs, reference = model_and_reference(case, params, INPUTS)
            with quiet():
                path = _quantized_file(model, calibration, Path(folder), quantizer, dedicated)
                expected = _onnx_runtime(path, inputs)
                file = onnx.load(path)
        except Exception as e:  # noqa: BLE001 - the export or ONNX Runtime fails: not ours
            return failed(base, "invalid", e, t0)
    report = []
    try:
        with quiet():
            file = qoperator_as_qdq(file)  # unit-tvm's (frontends.from_onnx does it too)
            try:
                mod = frontends.from_onnx(file)
            except Exception as e:  # noqa: BLE001 - TVM's importer refuses the file
                return failed(base, "invalid", e, t0)
            got = run_outputs(unit_compile(mod, target=target, report=report), inputs)
    except Exception as e:  # noqa: BLE001 - every failure of unit-tvm is a finding
        return failed(base, "crash", e, t0)
    diff = judge(_stacked(got), _stacked(expected), _stacked(reference),
                 baseline="ONNX Runtime", share=QDQ_SHARE)
    used = sorted({instr for _, instr, _ in report if instr})
    outcome = "wrong" if diff else ("tensorized-correct" if used else "fallback-correct")
    return CaseResult(**base, outcome=outcome, intrinsic=",".join(used), detail=diff,
                      seconds=time.time() - t0)
