"""GPU op benchmark (`unit-tvm bench-gpu`): UNIT Table I on Tensor Cores.

Each Table I layer (batch 1, NHWC, fp16 x fp16 -> fp32 by default, or int8 x int8 -> int32),
written in the form the model path would choose (relax/gpu/conv.py: direct, or one GEMM over the
fused output rows), goes through the same Inspector, preparation and Rewriter as on CPU, with the
GPU strategy (schedules/gpu.py) tuned on the GPU over p, warps, k_step, split-K, spatial fusion
and implicit preparation. Every candidate is checked against TVM's default CPU build before it is
timed. Baseline: PyTorch's
cuDNN conv2d in fp16, channels_last, when torch sees the GPU, launched from Python and replayed
as a CUDA graph; the ratio is against the faster of the two. TVM's own GPU build of the same op
(its dlight default schedules, no tensorize, on the conv as written) is timed too. Every engine
is timed the same way: rounds of 20 back-to-back calls, per-call mean per round, min (reported)
and median over rounds.
Needs a CUDA GPU; without one it stops with an error that says so.
"""

import json
import math
import os
import statistics
import time
from typing import NamedTuple

import numpy as np
import tvm
from tvm import te
from tvm.s_tir import dlight

from .. import intrinsics, lowering, measure, ops
from ..prepare import prepare
from ..relax.gpu import conv as gpu_conv
from ..rewriter import schedule
from ..schedules import gpu
from ..target import cuda_target
from ..testing.workloads import TABLE_I
from ..timing import call_rounds, evaluator_rounds
from ..tuner import Database, default_path, tune
from ..tuner.search import device_for
from .op_level import write_csv

DTYPES = {"float16": ("cuda.wmma.f16f32", "float32"), "int8": ("cuda.wmma.s8s32", "int32")}


class TorchTimes(NamedTuple):
    """PyTorch cuDNN conv2d seconds per call: launched from Python, and replayed as a CUDA graph
    (no Python or dispatcher cost: what a latency-minded PyTorch user deploys)."""

    eager_min: float
    eager_median: float
    graph_min: float
    graph_median: float


def tvm_default_build(op, target):
    """TVM's own GPU kernel for a te op: its dlight default schedules (matmul-like ones, else
    the fallback), built for target; None when none of them schedules it."""
    mod = tvm.IRModule({"main": te.create_prim_func([*op.op.input_tensors, op])})
    with target:
        mod = dlight.ApplyDefaultSchedule(dlight.gpu.Matmul(), dlight.gpu.GEMV(),
                                          dlight.gpu.Reduction(), dlight.gpu.GeneralReduction(),
                                          dlight.gpu.Fallback())(mod)
    try:
        return tvm.tirx.build(mod, target=target)
    except Exception:  # noqa: BLE001 - a baseline TVM cannot build is reported as missing
        return None


def time_torch_cudnn(c, h, k, r, stride, repeat, padding=0):
    """TorchTimes of PyTorch's fp16 conv2d (cuDNN, channels_last), or None without torch CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cudnn.benchmark = True
    conv = torch.nn.Conv2d(c, k, r, stride=stride, padding=padding, bias=False).cuda().half()
    conv = conv.to(memory_format=torch.channels_last)
    x = torch.randn(1, c, h, h, device="cuda", dtype=torch.half)
    x = x.contiguous(memory_format=torch.channels_last)
    return _torch_times(torch, lambda: conv(x), repeat)


def time_torch_matmul(batch, m, n, k, repeat):
    """TorchTimes of PyTorch's fp16 matmul A[batch..., m, k] x B[batch..., k, n] (cuBLAS), or
    None without torch CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    a = torch.randn(*batch, m, k, device="cuda", dtype=torch.half)
    b = torch.randn(*batch, k, n, device="cuda", dtype=torch.half)
    return _torch_times(torch, lambda: torch.matmul(a, b), repeat)


def _torch_times(torch, call, repeat):
    """TorchTimes of `call` run eagerly and replayed as a CUDA graph, rounds of 20 calls."""
    sync = torch.cuda.synchronize
    with torch.inference_mode():
        for _ in range(5):
            call()
        eager = call_rounds(call, repeat, number=20, sync=sync, warmup=0)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up on a side stream, as graph capture requires
            call()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            call()
        replayed = call_rounds(graph.replay, repeat, number=20, sync=sync, warmup=0)
    return TorchTimes(min(eager), statistics.median(eager), min(replayed),
                      statistics.median(replayed))


class LayerCase(NamedTuple):
    """One Table I layer as bench-gpu runs it: the form chosen, its Prepared graph and arguments,
    and the conv as written (te tensors and arguments: TVM's baseline)."""

    form: str
    prepared: object
    args: list
    direct: list
    direct_args: list


def layer_form(layer, dtype, intrin):
    """(geometry, form, te tensors, Prepared) of a layer (C, H, K, R, stride[, padding]) as the
    model path writes it: a Table I layer's input handed over padded, a model's padding
    supplied by the gemm form's gather (the direct form reads its input padded beforehand)."""
    c, h, k, r, s = layer[:5]
    pad = layer[5] if len(layer) > 5 else 0
    frag = gpu.fragment_of(intrin)
    g = gpu_conv.ConvGeometry(1, h + 2 * pad, h + 2 * pad, c, k, r, r, (s, s),
                              padding=(pad,) * 4)
    form = gpu_conv.choose_form(g, frag)
    if form == "direct":
        g = g.without_padding()
    tensors = gpu_conv.te_for_form(g, form, dtype, DTYPES[dtype][1], frag)
    prepared = prepare(tensors[-1], intrin, params=tensors[:-1], **gpu.prepare_options(None))
    return g, form, tensors, prepared


def layer_case(c, h, k, r, s, dtype, intrin, dev, rng) -> LayerCase:
    """A Table I layer (C, H, K, R, stride) in its chosen form, with random arguments on dev (the
    same input and weight values in both forms)."""
    acc, frag = DTYPES[dtype][1], gpu.fragment_of(intrin)
    g, form, tensors, prepared = layer_form((c, h, k, r, s), dtype, intrin)
    direct = gpu_conv.direct_te(g, dtype, acc)
    data, hwio = (measure.random_array(t.shape, t.dtype, rng) for t in direct[:2])
    weight = hwio if form == "direct" else gpu_conv.gemm_weight(hwio, frag)

    def out(t):
        return np.zeros([int(x) for x in t.shape], acc)

    return LayerCase(form, prepared, measure.to_device([data, weight, out(tensors[-1])], dev),
                     direct, measure.to_device([data, hwio, out(direct[-1])], dev))


def _row(i, layer, case, secs_rounds, tvm_rounds, torch_t, config, seconds, from_database):
    c, h, k, r, s = layer
    secs, secs_median = min(secs_rounds), statistics.median(secs_rounds)
    o = (h - r) // s + 1
    gop = 2 * o * o * k * c * r * r / 1e9
    # the baseline is PyTorch's faster way to run the same conv (usually the CUDA graph)
    best = min(torch_t.eager_min, torch_t.graph_min) if torch_t else None
    return {"workload": f"L{i}", "shape": [c, h, k, r, s], "form": case.form,
            "gops": gop / secs, "ms": secs * 1e3, "ms_median": secs_median * 1e3,
            "cudnn_eager_ms": torch_t.eager_min * 1e3 if torch_t else None,
            "cudnn_graph_ms": torch_t.graph_min * 1e3 if torch_t else None,
            "cudnn_graph_median_ms": torch_t.graph_median * 1e3 if torch_t else None,
            "tvm_ms": min(tvm_rounds) * 1e3 if tvm_rounds else None,
            "speedup_vs_tvm": min(tvm_rounds) / secs if tvm_rounds else None,
            "speedup_vs_cudnn": best / secs if best else None,
            "tuning_s": seconds, "from_database": from_database, "config": config.key()}


def run(dtype="float16", quick=False, trials=None, database=None, repeat=7, log=print,
        progress=None):
    """Rows of the benchmark (one per Table I layer) and a meta dict."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, not {dtype!r}")
    intrin_name, acc = DTYPES[dtype]
    intrin = intrinsics.get(intrin_name)
    dev = device_for(tvm.target.Target({"kind": "cuda", "arch": "sm_80"}))
    target = cuda_target(dev)
    db = Database(database or default_path())
    rng = np.random.default_rng(0)
    rows = []
    for i, (c, h, k, r, s) in enumerate(TABLE_I[:4] if quick else TABLE_I, 1):
        case = layer_case(c, h, k, r, s, dtype, intrin, dev, rng)
        t0 = time.time()
        result = tune(case.prepared, intrin, target, trials=trials, database=db,
                      progress=progress)
        seconds = time.time() - t0
        lib = lowering.build(schedule(case.prepared, intrin, result.config, target).mod,
                             target=target)
        rounds = evaluator_rounds(lib, case.args, dev, number=20, repeat=repeat)
        plain = tvm_default_build(case.direct[-1], target)
        tvm_rounds = (evaluator_rounds(plain, case.direct_args, dev, number=20,
                                            repeat=repeat) if plain is not None else None)
        torch_t = time_torch_cudnn(c, h, k, r, s, repeat) if dtype == "float16" else None
        row = _row(i, (c, h, k, r, s), case, rounds, tvm_rounds, torch_t, result.config,
                   seconds, result.from_database)
        rows.append(row)
        log(f"L{i:<3} C={c:<5} H={h:<3} K={k:<4} R={r} s={s} {case.form:<6}: "
            f"{row['gops']:8.0f} GOPS {row['ms']:.4f} ms (median {row['ms_median']:.4f})  "
            f"cuDNN eager {row['cudnn_eager_ms'] or float('nan'):.4f} graph "
            f"{row['cudnn_graph_ms'] or float('nan'):.4f} ms  "
            f"x{row['speedup_vs_cudnn'] or float('nan'):.2f}  TVM "
            f"{row['tvm_ms'] or float('nan'):.4f} ms  tuned {seconds:.0f}s")
    ratios = [r["speedup_vs_cudnn"] for r in rows if r["speedup_vs_cudnn"]]
    meta = {"device": str(dev.device_name), "arch": str(target.attrs["arch"]), "dtype": dtype,
            "intrinsic": intrin_name, "repeat": repeat, "statistic": "min of 20-call means",
            "geomean_vs_cudnn": (math.exp(sum(map(math.log, ratios)) / len(ratios))
                                 if ratios else None)}
    return rows, meta


# UNIT's GPU ablation (Fig. 11): each step adds one of the strategy's ideas to the one before
ABLATION = ("1x1 fragments", "+ p x p window", "+ fused H/W", "+ split-K", "+ 16B copies",
            "+ implicit GEMM", "+ cp.async pipeline", "+ block epilogue", "tuned")


def ablation_configs(prepared, tuned):
    """The configs of ABLATION for a Prepared conv, each fitted to it (a factor that does not
    divide its loop shrinks: on a layer whose output row is one fragment the window cannot
    apply, and that step equals the one before), the tuned one last."""
    m, n, k = gpu.tiles(prepared)
    # the first steps gather in a pass of their own and copy one element per thread
    element = {"vector_copy": False, "implicit": False}
    steps = (gpu.GpuConfig(p=1, fuse_spatial=False, **element),
             gpu.GpuConfig(p=2, fuse_spatial=False, **element),
             gpu.GpuConfig(p=2, fuse_spatial=True, **element),
             gpu.GpuConfig(p=2, split_k=4, **element),
             gpu.GpuConfig(p=2, split_k=4, implicit=False),
             gpu.GpuConfig(p=2, split_k=4, implicit=True),
             gpu.GpuConfig(p=2, split_k=4, implicit=True, pipeline=True),
             gpu.GpuConfig(p=2, split_k=4, implicit=True, pipeline=True, block_epilogue=True))
    return [gpu.fit(c, m, n, k) for c in steps] + [tuned]


def ablation(quick=False, trials=None, database=None, repeat=7, log=print):
    """Rows of the GPU ablation over Table I in fp16 (ms per step and cuDNN's best); needs a
    CUDA GPU (RuntimeError naming the alternatives otherwise)."""
    intrin = intrinsics.get(DTYPES["float16"][0])
    dev = device_for(tvm.target.Target({"kind": "cuda", "arch": "sm_80"}))
    target = cuda_target(dev)
    db, rng, rows = Database(database or default_path()), np.random.default_rng(0), []
    for i, (c, h, k, r, s) in enumerate(TABLE_I[:4] if quick else TABLE_I, 1):
        op = ops.conv2d_nhwc(c, h, k, r, "float16", "float16", "float32", stride=s)
        prepared = prepare(op, intrin, **gpu.prepare_options(target))
        tuned = tune(prepared, intrin, target, trials=trials, database=db, progress=False)
        arrays = [measure.random_array(t.shape, t.dtype, rng) for t in prepared.tensors[:-1]]
        arrays.append(np.zeros([int(x) for x in op.shape], "float32"))
        args = measure.to_device(arrays, dev)
        ms = []
        for config in ablation_configs(prepared, tuned.config):
            lib = lowering.build(schedule(prepared, intrin, config, target).mod, target)
            ms.append(min(evaluator_rounds(lib, args, dev, number=20, repeat=repeat)) * 1e3)
        torch_t = time_torch_cudnn(c, h, k, r, s, repeat)
        row = {"workload": f"L{i}", "shape": [c, h, k, r, s], "cudnn_ms": 1e3 * min(
            torch_t.eager_min, torch_t.graph_min), **dict(zip(ABLATION, ms)),
               "config": tuned.config.key()}
        rows.append(row)
        log(f"L{i:<3} " + "  ".join(f"{name} {v:.4f}" for name, v in zip(ABLATION, ms))
            + f"  cuDNN {row['cudnn_ms']:.4f} ms")
    return rows, {"device": str(dev.device_name), "arch": str(target.attrs["arch"]),
                  "steps": list(ABLATION)}


def write_outputs(rows, meta, out_dir):
    """bench_gpu_DTYPE.json (meta and rows) and bench_gpu_DTYPE.csv in out_dir; their paths."""
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"bench_gpu_{meta['dtype']}")
    with open(stem + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return [stem + ".json", write_csv(stem + ".csv", rows)]
