"""Model benchmark (`unit-tvm bench-model`): latency (batch 1 unless asked) and accuracy of
unit-tvm against the engines a user of this CPU would otherwise pick, all in one process, one
timing protocol.
A model is a zoo name or an ONNX file; from a file, the engines that start from ONNX (unit-tvm,
TVM, OpenVINO, ONNX Runtime) run it and the PyTorch ones are skipped, and fp32 references come
from ONNX Runtime.

Engines (same weights, same calibration inputs, same thread count, read back from each):
unit-tvm int8 (and bf16), OpenVINO + NNCF int8, ONNX Runtime int8 (its fastest accurate
variant), PyTorch PT2E int8 (X86InductorQuantizer + inductor), PyTorch FX int8, TVM int8 and
fp32 (default schedules; minutes per model, timed with fewer calls). "Strongest" is the fastest
int8 engine other than unit-tvm whose outputs keep cosine >= 0.99 to fp32; the fp32 engines
(PyTorch eager, TVM) are what int8 gains over.
"""

import os
from dataclasses import asdict

import numpy as np

from ..peak import host_threads
from ..target import isa_level
from ..testing import zoo
from . import engine_openvino, engine_ort, engine_torch, engine_tvm
from .engines import Engine, ModelCase, accuracy, isa_obedience
from ..timing import interleaved
from ..sources import onnx_input

# name -> (builder, takes the fp32 references)
BUILDERS = {
    "unit-tvm int8": (engine_tvm.unit_tvm_int8, False),
    "OpenVINO int8": (engine_openvino.openvino_int8, True),
    "ORT int8": (engine_ort.ort_int8, True),
    "PyTorch PT2E int8": (engine_torch.torch_pt2e_int8, True),
    "PyTorch int8": (engine_torch.torch_fx_int8, False),
    "PyTorch fp32": (engine_torch.torch_fp32, False),
    "TVM int8": (engine_tvm.tvm_int8, False),
    "TVM fp32": (engine_tvm.tvm_fp32, False),
    "unit-tvm bf16": (engine_tvm.unit_tvm_bf16, False),
    "PyTorch bf16": (engine_torch.torch_bf16, False),
    "unit-tvm fp32": (engine_tvm.unit_tvm_fp32, False),
    "PyTorch inductor fp32": (engine_torch.torch_inductor_fp32, False),
    "OpenVINO fp32": (engine_openvino.openvino_fp32, False),
    "ORT fp32": (engine_ort.ort_fp32, False),
}
BF16_ENGINES = ("unit-tvm bf16", "PyTorch bf16")
# bench-model --fp32: the float32 table (every engine in float32, same protocol)
FP32_ENGINES = ("unit-tvm fp32", "PyTorch fp32", "PyTorch inductor fp32", "OpenVINO fp32",
                "ORT fp32")
ENGINES = tuple(k for k in BUILDERS if k not in BF16_ENGINES
                and (k not in FP32_ENGINES or k == "PyTorch fp32"))
SLOW = ("TVM int8", "TVM fp32")  # untensorized: seconds per call
TORCH_ONLY = ("PyTorch PT2E int8", "PyTorch int8", "PyTorch fp32", "PyTorch bf16",
              "PyTorch inductor fp32")
MIN_COSINE = 0.99
# Inputs for the accuracy check (calibration uses others). Top-1 agreement needs many: a random-
# weight encoder gives every token of a sequence the same argmax hidden unit, so each input is
# one near-tied decision, and on BERT 8 inputs ranked the engines differently from 40.
ACCURACY_INPUTS = 32


def make_case(name, n_inputs=ACCURACY_INPUTS, n_calibration=4, threads=None, batch=1,
              **options) -> ModelCase:
    """The zoo model `name` (or the ONNX file `name`) with its calibration and accuracy inputs:
    fixed-seed normal samples of its input shape; a zoo model's batch is `batch` (its case is
    named e.g. resnet50_b8; an ONNX file runs at the shape it was exported with)."""
    threads = threads or host_threads()
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    if name.endswith(".onnx"):
        if batch != 1:
            raise ValueError(f"{name}: --batch applies to zoo models; an ONNX file runs at the "
                             "shape it was exported with")

        engine_ort.check_single_float_input(name)
        _, shape = onnx_input(name)
        quantized = engine_ort.is_quantized(name)
        # imported into Relax when a TVM engine is built (engine_tvm.relax_module): a file
        # TVM's ONNX frontend cannot read fails those engines, not OpenVINO's and ORT's
        return ModelCase(os.path.basename(name), None, shape,
                         zoo.inputs(shape, n_calibration, seed=1),
                         zoo.inputs(shape, n_inputs, seed=2), threads, options, onnx_path=name,
                         quantized=quantized)
    model, shape = zoo.get(name)
    if batch != 1:
        name, shape = f"{name}_b{batch}", (batch, *shape[1:])
    return ModelCase(name, model, shape, zoo.inputs(shape, n_calibration, seed=1),
                     zoo.inputs(shape, n_inputs, seed=2), threads, options)


def _references(case):
    """fp32 outputs of case.inputs: the torch module's, or ONNX Runtime's for an ONNX file (for
    a file that arrives quantized, ONNX Runtime running its quantization: no fp32 model is
    there to compare with)."""
    if case.onnx_path:
        return engine_ort.fp32_outputs(case)
    import torch

    torch.set_num_threads(case.threads)
    with torch.no_grad():
        return [case.model(torch.tensor(x)).numpy() for x in case.inputs]


def strongest(engines: dict, precision: str = "int8") -> str:
    """The fastest `precision` engine other than unit-tvm that keeps cosine >= MIN_COSINE,
    or ''."""
    rivals = [n for n, e in engines.items() if e["precision"] == precision
              and not n.startswith("unit-tvm") and n not in SLOW
              and (e["cosine"] or 0) >= MIN_COSINE]
    return min(rivals, key=lambda n: engines[n]["min_ms"]) if rivals else ""


def run_model(name, *, engines=ENGINES, n_inputs=ACCURACY_INPUTS, rounds=10, log=print,
              batch=1, **options) -> dict:
    """Build every engine, check its accuracy, time them interleaved; a plain-data result."""
    case = make_case(name, n_inputs, batch=batch, **options)
    refs = _references(case)
    if case.quantized:
        log(f"  {case.name}: arrives quantized (QDQ or QOperator): every engine runs its "
            f"quantization; the reference is ONNX Runtime running the file")
    # the inputs are shared by every engine: one that writes into them (OpenVINO does, into
    # arrays it is handed) must fail loudly rather than change the others' inputs
    for x in case.inputs + case.calibration:
        x.setflags(write=False)
    built: dict[str, Engine] = {}
    for engine in engines:
        if case.model is None and engine in TORCH_ONLY:
            log(f"  {case.name:<13} {engine:<18} skipped: it starts from a torch module, the "
                f"model is an ONNX file")
            continue
        builder, wants_refs = BUILDERS[engine]
        try:
            built[engine] = builder(case, refs) if wants_refs else builder(case)
        except Exception as e:  # noqa: BLE001 - one engine failing must not lose the others
            log(f"  {case.name:<13} {engine:<18} failed: {type(e).__name__}: {str(e)[:200]}")
    fast = {n: e.call for n, e in built.items() if n not in SLOW}
    times = interleaved(fast, rounds=rounds) if fast else {}
    for n in built:
        if n in SLOW:
            times.update(interleaved({n: built[n].call}, rounds=1, per_slot=1, warmup=1))
    result = {"model": case.name, "threads": case.threads, "accuracy_inputs": len(case.inputs),
              "engines": {}}
    for n, e in built.items():
        check = case.inputs if n not in SLOW else case.inputs[:2]
        cos, top1 = accuracy([e.infer(x) for x in check], refs[:len(check)])
        result["engines"][n] = {**asdict(times[n]), "cosine": cos, "top1_agreement": top1,
                                "precision": e.precision, "threads": e.threads,
                                "compile_s": e.compile_s, "variant": e.variant,
                                "extra": e.extra, "isa": isa_obedience(n, isa_level())}
        held = result["engines"][n]["isa"] and f"  [isa {isa_level()}: " \
            f"{result['engines'][n]['isa']}]"
        log(f"  {case.name:<13} {n:<18} {times[n]}  cos {cos:.5f} top1 {top1:.2f}  "
            f"threads {e.threads}  compile {e.compile_s:.0f}s  {e.variant}{held}")
    _speedups(result, log)
    return result


def _speedups(result, log):
    e = result["engines"]
    result["strongest"] = strongest(e)
    result["strongest_fp32"] = strongest(e, "fp32")
    for ours, key in (("unit-tvm int8", "speedup"), ("unit-tvm bf16", "bf16_speedup"),
                      ("unit-tvm fp32", "fp32_speedup")):
        if ours not in e:
            continue
        base = e[ours]["min_ms"]
        result[key] = {k: v["min_ms"] / base for k, v in e.items()
                       if not k.startswith("unit-tvm") and v["precision"] in (
                           e[ours]["precision"], "fp32")}
        rival = {"speedup": "strongest", "fp32_speedup": "strongest_fp32"}.get(key)
        if rival and result[rival]:
            result["vs_" + rival] = result[key][result[rival]]
        log(f"  {ours}: " + ", ".join(f"{v:.2f}x vs {k}" for k, v in result[key].items())
            + (f"; strongest: {result[rival]}" if rival else ""))


def geomean(values) -> float:
    """Geometric mean (nan for none)."""
    values = [v for v in values if v]
    return float(np.exp(np.mean(np.log(values)))) if values else float("nan")


def geomean_speedups(results, key="speedup") -> dict:
    """{engine: geometric mean of unit-tvm's speedup over it} across models, plus 'strongest'."""
    out = {}
    engines = {k for r in results for k in r.get(key, {})}
    for engine in sorted(engines):
        out[engine] = geomean([r[key][engine] for r in results if engine in r.get(key, {})])
    rival = {"speedup": "vs_strongest", "fp32_speedup": "vs_strongest_fp32"}.get(key)
    if rival and any(r.get(rival) for r in results):
        out["strongest"] = geomean([r.get(rival) for r in results])
    return out
