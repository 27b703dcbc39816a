"""End-to-end benchmark (`unit-tvm bench-model`, scripts/bench_e2e.py): batch-1 latency and int8
accuracy of a model compiled by unit-tvm against TVM and against PyTorch and ONNX Runtime int8.

Engines (same weights, same calibration inputs, same thread count):
- unit-tvm int8: unit_tvm.relax.quantize + UnitTensorize (tuned, configs kept in the database);
- TVM int8: the same quantized model, TVM's default schedules (no tensorize);
- TVM fp32: the fp32 model through tvm.compile;
- PyTorch int8: FX graph-mode post-training quantization, x86 backend (oneDNN / fbgemm); PT2E
  and X86InductorQuantizer are not shipped with torch 2.13 (they moved to torchao);
- ONNX Runtime int8: onnxruntime.quantization.quantize_static (QDQ, per-channel weights) of the
  exported fp32 model.
With --bf16 (BF16_ENGINES), also:
- unit-tvm bf16: unit_tvm.relax.quantize(dtype="bfloat16") + UnitTensorize (AMX-BF16 tdpbf16ps
  or AVX512-BF16 vdpbf16ps, float32 accumulation);
- PyTorch bf16: the module converted to bfloat16, channels_last for images (oneDNN bf16 with
  AMX; 2.3x faster here than the fp32 module under torch.autocast, which casts per op).
Accuracy: each int8 engine's outputs vs PyTorch fp32 on the same N inputs: mean cosine
similarity and top-1 agreement (argmax of the last axis per row: per image, or per token for
BERT). Latency: minimum over repeats after warm-up.
"""

import csv
import json
import os
import tempfile
import time

import numpy as np
import tvm
from tvm import relax

from . import frontends, zoo
from .compiler import build_relax
from .peak import host_threads
from .target import host
from .tuner import Database, default_path

ENGINES = ("unit-tvm int8", "TVM int8", "TVM fp32", "PyTorch int8", "ORT int8")
BF16_ENGINES = ("unit-tvm bf16", "PyTorch bf16")


def _tvm_latency(ex, x, repeat, number):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    arg = tvm.runtime.tensor(x, tvm.cpu())
    vm["main"](arg)
    timer = vm.time_evaluator("main", tvm.cpu(), number=number, repeat=repeat)
    return min(timer(arg).results), vm


def _tvm_outputs(vm, xs):
    outs = []
    for x in xs:
        out = vm["main"](tvm.runtime.tensor(x, tvm.cpu()))
        outs.append((out[0] if hasattr(out, "__getitem__") and not hasattr(out, "numpy") else out)
                    .numpy())
    return outs


def _torch_int8(model, cal, threads):
    import torch
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    torch.set_num_threads(threads)
    torch.backends.quantized.engine = "x86"
    example = (torch.tensor(cal[0]),)
    prepared = prepare_fx(model, get_default_qconfig_mapping("x86"), example)
    with torch.no_grad():
        for c in cal:
            prepared(torch.tensor(c))
    return convert_fx(prepared)


def _time_torch(model, x, repeat):
    import torch

    t = torch.tensor(x)
    with torch.inference_mode():
        for _ in range(2):
            model(t)
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            model(t)
            best = min(best, time.perf_counter() - t0)
    return best


def _ort_int8(model, shape, cal, threads, tmp):
    import onnxruntime as ort
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    fp32 = frontends.export_onnx(model, [__import__("torch").tensor(cal[0])],
                                 os.path.join(tmp, "model.onnx"))
    int8 = os.path.join(tmp, "model.int8.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"input0": c} for c in cal])

        def get_next(self):
            return next(self.it, None)

    quantize_static(fp32, int8, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(int8, opts, providers=["CPUExecutionProvider"])


def _time_ort(sess, x, repeat):
    for _ in range(2):
        sess.run(None, {"input0": x})
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        sess.run(None, {"input0": x})
        best = min(best, time.perf_counter() - t0)
    return best


def _accuracy(outs, refs):
    """(mean cosine similarity, top-1 agreement). Top-1 is the argmax over the last axis, per
    row: per image for classifiers, per token for an encoder's [1, seq, hidden] output."""
    cos, top1 = [], []
    for o, r in zip(outs, refs):
        o, r = np.asarray(o, np.float64), np.asarray(r, np.float64)
        a, b = o.reshape(-1), r.reshape(-1)
        cos.append(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30)))
        rows_o, rows_r = o.reshape(-1, o.shape[-1]), r.reshape(-1, r.shape[-1])
        top1.append(float(np.mean(rows_o.argmax(-1) == rows_r.argmax(-1))))
    return float(np.mean(cos)), float(np.mean(top1))


def run_model(name, *, n_inputs=8, n_calibration=4, trials=None, tune=True, database=None,
              engines=ENGINES, repeat=10, log=print):
    """Benchmark one zoo model; returns a dict of results."""
    import torch

    target = host()
    threads = host_threads()
    torch.set_num_threads(threads)
    model, shape = zoo.get(name)
    cal = zoo.inputs(shape, n_calibration, seed=1)
    xs = zoo.inputs(shape, n_inputs, seed=2)
    with torch.no_grad():
        refs = [model(torch.tensor(x)).numpy() for x in xs]
    database = Database(database or default_path())
    mod = frontends.from_torch(model, [torch.tensor(xs[0])])
    res = {"model": name, "threads": threads, "target": str(target), "engines": {}}
    slow = name in ("resnet50", "inception_v3", "bert_base")

    def record(engine, secs, outs, compile_s):
        cos, top1 = _accuracy(outs, refs) if outs is not None else (None, None)
        res["engines"][engine] = {"ms": secs * 1e3, "cosine": cos, "top1_agreement": top1,
                                  "compile_s": compile_s}
        acc = f"cos {cos:.5f} top1 {top1:.2f}" if cos is not None else ""
        log(f"  {name:<13} {engine:<14} {secs * 1e3:9.2f} ms  {acc}  (compile {compile_s:.1f}s)")

    from .relax import UnitTensorize, quantize

    qmod = None
    if "unit-tvm int8" in engines or "TVM int8" in engines:
        t0 = time.time()
        qmod = quantize(mod, calibration_data=cal, target=target)
        q_s = time.time() - t0
    if "unit-tvm int8" in engines:
        t0 = time.time()
        pass_ = UnitTensorize(target, database=database, tune=tune, trials=trials)
        ex = build_relax(pass_(qmod), target)
        c_s = q_s + time.time() - t0
        res["tensorized_ops"] = [{"op": op, "instruction": i, "reason": r} for op, i, r in pass_.report]
        secs, vm = _tvm_latency(ex, xs[0], repeat, 3)
        record("unit-tvm int8", secs, _tvm_outputs(vm, xs), c_s)
    if "unit-tvm bf16" in engines:
        t0 = time.time()
        pass_ = UnitTensorize(target, database=database, tune=tune, trials=trials)
        ex = build_relax(pass_(quantize(mod, dtype="bfloat16", target=target)), target)
        c_s = time.time() - t0
        res["bf16_ops"] = [{"op": op, "instruction": i, "reason": r} for op, i, r in pass_.report]
        secs, vm = _tvm_latency(ex, xs[0], repeat, 3)
        record("unit-tvm bf16", secs, _tvm_outputs(vm, xs), c_s)
    if "PyTorch bf16" in engines:
        import copy

        images = len(shape) == 4
        fmt = torch.channels_last if images else torch.contiguous_format
        model_bf16 = copy.deepcopy(model).to(torch.bfloat16).to(memory_format=fmt)

        def bf16(x):
            return model_bf16(x.to(torch.bfloat16).contiguous(memory_format=fmt)).float()

        with torch.no_grad():
            outs = [bf16(torch.tensor(x)).numpy() for x in xs]
        record("PyTorch bf16", _time_torch(bf16, xs[0], repeat), outs, 0.0)
    if "TVM int8" in engines:
        t0 = time.time()
        ex = tvm.compile(qmod, target=target)
        c_s = q_s + time.time() - t0
        secs, vm = _tvm_latency(ex, xs[0], 1 if slow else 2, 1)
        record("TVM int8", secs, _tvm_outputs(vm, xs[:2]) if not slow else None, c_s)
    if "TVM fp32" in engines:
        t0 = time.time()
        ex = tvm.compile(mod, target=target)
        c_s = time.time() - t0
        secs, vm = _tvm_latency(ex, xs[0], 1 if slow else 2, 1)
        record("TVM fp32", secs, None, c_s)
    if "PyTorch int8" in engines:
        t0 = time.time()
        qt = _torch_int8(model, cal, threads)
        c_s = time.time() - t0
        with torch.no_grad():
            outs = [qt(torch.tensor(x)).numpy() for x in xs]
        record("PyTorch int8", _time_torch(qt, xs[0], repeat), outs, c_s)
    if "ORT int8" in engines:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.time()
            sess = _ort_int8(model, shape, cal, threads, tmp)
            c_s = time.time() - t0
            outs = [sess.run(None, {"input0": x})[0] for x in xs]
            record("ORT int8", _time_ort(sess, xs[0], repeat), outs, c_s)
    e = res["engines"]
    if "unit-tvm int8" in e:
        base = e["unit-tvm int8"]["ms"]
        res["speedup"] = {k: v["ms"] / base for k, v in e.items()
                          if k != "unit-tvm int8" and k not in BF16_ENGINES}
        log("  " + ", ".join(f"{v:.2f}x vs {k}" for k, v in res["speedup"].items()))
    if "unit-tvm bf16" in e:
        base = e["unit-tvm bf16"]["ms"]
        res["bf16_speedup"] = {k: e[k]["ms"] / base for k in ("PyTorch bf16", "TVM fp32")
                               if k in e}
        log("  unit-tvm bf16: " + ", ".join(f"{v:.2f}x vs {k}"
                                            for k, v in res["bf16_speedup"].items()))
    return res


def geomean_speedups(results, key="speedup"):
    """{engine: geometric mean of unit-tvm int8's speedup over it} across models; with
    key="bf16_speedup", of unit-tvm bf16's."""
    out = {}
    for engine in ENGINES[1:] + BF16_ENGINES[1:]:
        vals = [r[key][engine] for r in results if engine in r.get(key, {})]
        if vals:
            out[engine] = float(np.exp(np.mean(np.log(vals))))
    return out


def write_outputs(results, out_dir):
    """CSV, JSON and a PNG of the speedup over PyTorch int8 per model (like UNIT's Fig. 8)."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bench_e2e.json"), "w") as f:
        json.dump({"results": results, "geomean_speedup": geomean_speedups(results),
                   "geomean_bf16_speedup": geomean_speedups(results, "bf16_speedup")}, f,
                  indent=1)
    csv_path = os.path.join(out_dir, "bench_e2e.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "engine", "ms", "cosine", "top1_agreement", "compile_s"])
        for r in results:
            for engine, v in r["engines"].items():
                w.writerow([r["model"], engine, v["ms"], v["cosine"], v["top1_agreement"],
                            v["compile_s"]])
    paths = [csv_path]
    vals = [(r["model"], r["speedup"].get("PyTorch int8")) for r in results if "speedup" in r]
    vals = [(m, v) for m, v in vals if v]
    if vals:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(max(4, len(vals) * 1.2), 3.2))
        ax.bar([m for m, _ in vals], [v for _, v in vals])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_ylabel("speedup over PyTorch int8")
        ax.set_title("unit-tvm int8, batch 1")
        fig.tight_layout()
        png = os.path.join(out_dir, "bench_e2e.png")
        fig.savefig(png, dpi=120)
        paths.append(png)
    return paths
