"""`unit-tvm bench-model --target cuda`: whole zoo models in fp16 on one NVIDIA GPU.

Engines, all on the same GPU and inputs, batch 1: unit-tvm (unit_tvm.compile for CUDA: the
tensorized fp16 convs and dense layers, the rest TVM's own GPU pipeline), unit-tvm int8 (the same
with quantize: s8 wmma, calibrated on 4 inputs), TVM's own GPU build of
the same fp16 NHWC model (no unit-tvm pass: legalization, fusion, dlight; both TVM builds with
their static regions as CUDA graphs), PyTorch fp16 eager
(cuDNN, channels_last for convnets) and the same PyTorch model replayed as a CUDA graph (no Python
or dispatcher cost between kernels). Every engine is timed the same way: interleaved rounds, each
20 back-to-back calls then a device synchronize, min and median of the per-call means. Accuracy:
cosine similarity and max abs error of each engine's output against PyTorch fp32 on the GPU.
"""

import math
import time
from dataclasses import asdict, dataclass

import numpy as np

from .engines import cosine
from ..timing import interleaved
from ..compiler import compile as unit_compile
from ..compiler import compile_cuda_graph
from ..relax.gpu.pipeline import default_gpu_schedule, to_fp16_nhwc
from .. import frontends
from ..target import cuda_target

CALLS_PER_ROUND = 20


@dataclass
class EngineResult:
    """One engine on one model: per-call latency and agreement with PyTorch fp32."""

    engine: str
    min_ms: float = math.nan
    median_ms: float = math.nan
    cosine: float = math.nan
    max_abs_err: float = math.nan
    compile_s: float = math.nan
    error: str = ""


def _torch_engines(module, x):
    """{name: callable() -> torch tensor} for PyTorch fp16 eager and as a CUDA graph."""
    import torch

    conv = x.dim() == 4
    fmt = torch.channels_last if conv else torch.contiguous_format
    model = module.cuda().half().to(memory_format=fmt)
    xh = x.cuda().half().contiguous(memory_format=fmt)
    torch.backends.cudnn.benchmark = True

    def eager():
        return model(xh)

    with torch.inference_mode():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up (and cuDNN's algorithm search) off-graph
            for _ in range(3):
                eager()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = eager()

    def replay():
        graph.replay()
        return static_out

    return {"pytorch_fp16": eager, "pytorch_fp16_cudagraph": replay}


def _tvm_engine(mod, target, x_np, unit, database, tune, trials, quantize=None):
    """(callable() -> tvm tensor, compile seconds): the fp16 model built by unit-tvm (int8 with
    `quantize`) or by TVM's own GPU pipeline alone."""
    from tvm import relax


    t0 = time.time()
    if unit:
        ex = unit_compile(mod, target, database=database, tune=tune, trials=trials,
                          quantize=quantize)
    else:
        ex = compile_cuda_graph(default_gpu_schedule(to_fp16_nhwc(mod), target), target)
    seconds = time.time() - t0
    import tvm

    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    x = tvm.runtime.tensor(x_np, dev)
    fn = vm["main"]

    def call():
        out = fn(x)
        return out if hasattr(out, "numpy") else out[0]  # the frontends return a tuple

    return call, seconds


def _slot(fn, sync):
    """One timed slot: CALLS_PER_ROUND back-to-back calls, then the device synchronized (the
    per-call time is the slot's over CALLS_PER_ROUND)."""
    def run_slot():
        for _ in range(CALLS_PER_ROUND):
            fn()
        sync()
    return run_slot


def _numpy(out):
    return out.float().cpu().numpy() if hasattr(out, "cpu") else out.numpy().astype(np.float32)


def run_model(name, *, rounds=10, database=None, tune=False, trials=None, log=print):
    """EngineResults of every engine on zoo model `name` (fp16, batch 1, the first CUDA GPU)."""
    import torch
    import tvm

    from ..testing import zoo  # torch (optional extra)

    module, shape = zoo.get(name)
    x = torch.from_numpy(zoo.inputs(shape, 1)[0])
    with torch.no_grad():
        reference = module.cuda()(x.cuda()).float().cpu().numpy()
    mod = frontends.from_torch(module.cpu(), [x])
    dev = tvm.cuda(0)
    target = cuda_target(dev)
    calls, results = {}, {}
    int8 = {"calibration_data": zoo.inputs(shape, 4)}
    for engine, unit, quantize in (("unit_tvm_fp16", True, None), ("unit_tvm_int8", True, int8),
                                   ("tvm_fp16", False, None)):
        try:
            calls[engine], secs = _tvm_engine(mod, target, x.numpy(), unit, database, tune,
                                              trials, quantize)
            results[engine] = EngineResult(engine, compile_s=secs)
        except Exception as e:  # noqa: BLE001 - a failing engine is reported, not fatal
            results[engine] = EngineResult(engine, error=f"{type(e).__name__}: {e}"[:400])
            log(f"  {engine}: {results[engine].error}")
    for engine, fn in _torch_engines(module, x).items():
        calls[engine], results[engine] = fn, EngineResult(engine)
    syncs = {e: (torch.cuda.synchronize if e.startswith("pytorch") else dev.sync) for e in calls}
    with torch.inference_mode():
        for engine, fn in calls.items():
            out = _numpy(fn())
            results[engine].cosine = cosine(out, reference)
            results[engine].max_abs_err = float(np.abs(out - reference).max())
        # the project's protocol (unit_tvm.timing: rotating interleaved rounds, min and median)
        timed = interleaved({e: _slot(fn, syncs[e]) for e, fn in calls.items()}, rounds=rounds,
                            per_slot=1, warmup=1)
    for engine, t in timed.items():
        results[engine].min_ms = t.min_ms / CALLS_PER_ROUND
        results[engine].median_ms = t.median_ms / CALLS_PER_ROUND
    for r in results.values():
        log(f"  {r.engine:<24} min {r.min_ms:8.3f} ms  median {r.median_ms:8.3f} ms  "
            f"cos {r.cosine:.5f}  {r.error}")
    return {"model": name, "engines": {k: asdict(v) for k, v in results.items()}}


def speedups(result):
    """unit-tvm fp16's speedup (min latency) over each other engine and over the fastest
    PyTorch variant; unit-tvm int8's over that too ("int8_best_pytorch")."""
    eng = result["engines"]
    ours = eng.get("unit_tvm_fp16", {}).get("min_ms", math.nan)
    others = {k: v["min_ms"] for k, v in eng.items() if k != "unit_tvm_fp16"
              and not math.isnan(v["min_ms"])}
    out = {k: v / ours for k, v in others.items()}
    pytorch = [v for k, v in others.items() if k.startswith("pytorch")]
    if pytorch:
        out["best_pytorch"] = min(pytorch) / ours
        if "unit_tvm_int8" in others:
            out["int8_best_pytorch"] = min(pytorch) / others["unit_tvm_int8"]
    return out


def run(models, *, rounds=10, database=None, tune=False, trials=None, log=print):
    """Results per model and the geomean speedup over the best PyTorch fp16 variant."""
    import tvm

    results = []
    for name in models:
        log(f"{name}:")
        results.append(run_model(name, rounds=rounds, database=database, tune=tune,
                                 trials=trials, log=log))
        results[-1]["speedups"] = speedups(results[-1])
        log("  speedups: " + ", ".join(f"{k} {v:.2f}x" for k, v in
                                        results[-1]["speedups"].items()))
    ratios = [r["speedups"].get("best_pytorch") for r in results]
    ratios = [v for v in ratios if v and not math.isnan(v)]
    meta = {"device": str(tvm.cuda(0).device_name), "rounds": rounds,
            "calls_per_round": CALLS_PER_ROUND, "statistic": "min of per-round means",
            "geomean_vs_best_pytorch_fp16": (math.exp(sum(map(math.log, ratios)) / len(ratios))
                                             if ratios else None)}
    return results, meta
