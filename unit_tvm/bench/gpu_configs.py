"""`python -m unit_tvm.bench.gpu_configs`: model layers under a fixed list of GPU configs.

The evidence for the GPU strategy's default rule (schedules/gpu.py `default`): every layer of
Table I, every distinct conv of ResNet-18 (`--layers resnet18`, padded as the model pads them
and weighed by how often it runs each) or BERT-base's matmuls (`--layers bert`: dense layers
and attention's batched matmuls at 128 tokens), in the form the model path chooses, built under
each named config of CANDIDATES (each fitted to the layer) and a sample of the tuning space,
every kernel checked against TVM's CPU build and timed the same way (rounds of 20 calls, min of
the per-round means), beside PyTorch's fp16 op (cuDNN's conv, cuBLAS's matmul: the faster of
eager and CUDA graph). The
kernels are built in parallel processes (a device machine has many cores and nvcc takes seconds
per kernel), then loaded and timed one after the other on the GPU. Writes gpu_configs.json
(one row per layer and config) and prints per config its geomean against the legacy default
and against cuDNN, and the layers' summed time against cuDNN's.
"""

import argparse
import json
import math
import multiprocessing
import os
import random
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from ..schedules import gpu
from ..testing.workloads import MatmulShape
from .. import intrinsics
from ..prepare import prepare
from ..relax.gpu import pipeline as gpu_pass
from ..relax.gpu import bmm as gpu_bmm
from .gpu_ops import layer_form
from .gpu_ops import time_torch_cudnn, time_torch_matmul
from ..tuner.search import candidate_module
from ..target import cuda_target
from ..tuner.search import _inputs, reference_output
from ..runner import run_checked
from ..testing.workloads import BERT_MATMULS, RESNET18_CONVS, TABLE_I

INTRIN = "cuda.wmma.f16f32"


def _fixed(**knobs):
    return lambda prepared: gpu.fit(gpu.GpuConfig(**knobs), *gpu.tiles(prepared))


def _legacy(prepared):
    """The default until 2026-11-27: 2x2 warps of 2x2 fragments, k_step 2, the gather and the
    output copy as kernels of their own, fitted to M before pairing."""
    m, n, k = gpu.tiles(prepared)
    rows = prepared.original_mapping.loops[0]
    unpaired = -(-(rows.op_extent + rows.padding) // rows.intrin_extent)
    return gpu.fit(gpu.fit(gpu.GpuConfig(), unpaired, n, k), m, n, k)


def _neighbour(change):
    def config(prepared):
        return gpu.fit(change(gpu.default(prepared)), *gpu.tiles(prepared))
    return config


# name -> config of a Prepared layer: the former default, today's and its neighbours (the
# tuner's seeds: what the next GPU session checks the rule with), then corners of the space
# that won layers before (P: cp.async pipeline, I: implicit preparation, E: block epilogue, g:
# slices of K across blocks, sk: slices in the block)
CANDIDATES = {
    "legacy": _legacy,
    "default": gpu.default,
    **{f"default, {name}": _neighbour(change) for name, change in gpu.NEIGHBOURS.items()},
    "p1 2x2 k1 sk4 P": _fixed(p=1, k_step=1, split_k=4, pipeline=True),
    "p2 2x1 k3 IPE": _fixed(p=2, warps_n=1, k_step=3, implicit=True, pipeline=True,
                            block_epilogue=True),
    "p1 1x1 k1 sk3 g6 IP": _fixed(p=1, warps_m=1, warps_n=1, k_step=1, split_k=3,
                                  grid_split_k=6, implicit=True, pipeline=True),
}


def prepared_layer(layer, dtype="float16"):
    """The Prepared graph of a layer in the model path's form: a conv (C, H, K, R, stride[,
    padding]) as gpu_ops.layer_form writes it, a workloads.MatmulShape as the GPU pass's dense
    or batched matmul te."""

    intrin = intrinsics.get(INTRIN)
    if not isinstance(layer, MatmulShape):
        return layer_form(layer, dtype, intrin)[3]
    acc = gpu_pass.ACCUMULATE[dtype]
    tensors = (gpu_pass.dense_te(layer.m, layer.n, layer.k, dtype, acc) if not layer.batch else
               gpu_bmm.batch_matmul_te(gpu_bmm.BatchedShape(layer.batch, layer.m, layer.n,
                                                            layer.k), dtype, acc))
    return prepare(tensors[-1], intrin, params=tensors[:-1], **gpu.prepare_options(None))


def _shape(layer):
    """A layer's shape as the rows record it."""
    if isinstance(layer, MatmulShape):
        return [*layer.batch, layer.m, layer.n, layer.k]
    return list(layer[:6])


def _count(layer):
    """How often the model runs the layer (1 for Table I)."""
    if isinstance(layer, MatmulShape):
        return layer.count
    return layer[6] if len(layer) > 6 else 1


def _baseline_ms(layer, repeat):
    """PyTorch's fp16 time of the layer (the faster of eager and CUDA graph), NaN without it."""

    if isinstance(layer, MatmulShape):
        times = time_torch_matmul(layer.batch, layer.m, layer.n, layer.k, repeat)
    else:
        times = time_torch_cudnn(*layer[:5], repeat, *layer[5:6])
    return min(times.eager_min, times.graph_min) * 1e3 if times else math.nan


def _module(layer, key, arch):
    """The built kernel of a layer under the config `key`, for `arch` (as the tuner builds its
    candidates)."""
    import tvm


    return candidate_module(prepared_layer(layer), intrinsics.get(INTRIN),
                            gpu.GpuConfig.from_key(key),
                            tvm.target.Target({"kind": "cuda", "arch": arch}))


def _build(job):
    """(layer, config key, arch, path) -> (path, None) or (None, error): one kernel exported
    (an error starting "export" when only the export failed: no host compiler)."""
    layer, key, arch, path = job
    try:
        lib = _module(layer, key, arch)
    except Exception as e:  # noqa: BLE001 - a config that does not build is a result
        return None, f"{type(e).__name__}: {e}"[:300]
    try:
        lib.export_library(path)
    except Exception as e:  # noqa: BLE001 - built, but this machine cannot link it
        return None, f"export: {type(e).__name__}: {e}"[:300]
    return path, None


def _jobs(layers, names, arch, folder, sample=0):
    """Distinct (layer, fitted config) builds and the (layer index, name) -> job index map; with
    `sample`, that many more configs per layer drawn from the tuning space (named "s<j>")."""
    jobs, index, where = [], {}, {}
    for i, layer in enumerate(layers):
        prepared = prepared_layer(layer)
        configs = [(name, CANDIDATES[name](prepared)) for name in names]
        space = gpu.space(prepared)
        drawn = random.Random(i).sample(space, min(sample, len(space)))
        configs += [(f"s{j}", c) for j, c in enumerate(drawn)]
        for name, config in configs:
            ident = (i, json.dumps(config.key(), sort_keys=True))
            if ident not in index:
                index[ident] = len(jobs)
                jobs.append((layer, config.key(), arch, os.path.join(folder, f"k{len(jobs)}.so")))
            where[(i, name)] = index[ident]
    return jobs, where


def build_all(layers, names, arch, folder, workers=None, sample=0, log=print):
    """(jobs, (layer index, name) -> job index, [(path, error)] per job): every distinct kernel
    built for `arch` into `folder` by `workers` processes."""
    workers = workers or max(1, min(16, os.cpu_count() or 1) - 1)
    jobs, where = _jobs(layers, names, arch, folder, sample)
    t0 = time.time()
    ctx = multiprocessing.get_context("spawn")  # a fresh TVM per worker, no forked pools
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        built = list(pool.map(_build, jobs))
    log(f"built {len(jobs)} kernels in {time.time() - t0:.0f}s on {workers} processes")
    return jobs, where, built


def run(layers, names=None, workers=None, repeat=7, sample=0, log=print):
    """Rows {layer, config, key, ms, error, cudnn_ms} of every layer under every named config."""
    import tvm


    names = names or list(CANDIDATES)
    dev = tvm.cuda(0)
    target = cuda_target(dev)
    with tempfile.TemporaryDirectory() as folder:
        jobs, where, built = build_all(layers, names, str(target.attrs["arch"]), folder, workers,
                                       sample, log)
        rows, timed = [], {}
        rng = np.random.default_rng(0)
        for i, layer in enumerate(layers):
            prepared = prepared_layer(layer)
            arrays = _inputs(prepared, intrinsics.get(INTRIN), rng)
            expected = reference_output(prepared, arrays, target)
            cudnn = _baseline_ms(layer, repeat)
            mine = [name for (li, name) in where if li == i]
            for name in mine:
                j = where[(i, name)]
                if name not in names and (built[j][1] or "").startswith("export"):
                    continue  # no host compiler: the sample is not built again one by one
                if j not in timed:
                    timed[j] = _time(jobs[j], built[j], dev, arrays, expected, repeat)
                ms, error = timed[j]
                rows.append({"layer": f"L{i + 1}", "shape": _shape(layer), "config": name,
                             "key": jobs[j][1], "ms": ms, "error": error, "cudnn_ms": cudnn,
                             "count": _count(layer)})
            log(f"L{i + 1:<3} cuDNN {cudnn:.4f}  " + "  ".join(
                f"{r['config']} {r['ms']:.4f}" for r in rows if r["layer"] == f"L{i + 1}"
                and r["config"] in names))
    return rows


def _time(job, built, dev, arrays, expected, repeat):
    """(ms, error) of one built kernel (built again here where only its export failed):
    checked, then rounds of 20 calls, min."""
    import tvm


    path, error = built
    try:
        if path is not None:
            lib = tvm.runtime.load_module(path)
        elif error.startswith("export"):
            lib = _module(*job[:3])
        else:
            return math.nan, error
        return run_checked(lib, dev, arrays, expected, 20, repeat) * 1e3, ""
    except Exception as e:  # noqa: BLE001 - a wrong or failing kernel is a result
        return math.nan, f"{type(e).__name__}: {e}"[:300]


def summary(rows, log=print):
    """Per config: layers that ran, geomean speedup over `legacy` and over cuDNN."""
    by = {}
    for r in rows:
        if r["config"] in CANDIDATES:
            by.setdefault(r["config"], {})[r["layer"]] = r
    legacy = by.get("legacy", {})
    out = {}
    for name, layers in by.items():
        ok = {k: v for k, v in layers.items() if not math.isnan(v["ms"])}
        vs_legacy = [legacy[k]["ms"] / v["ms"] for k, v in ok.items()
                     if k in legacy and not math.isnan(legacy[k]["ms"])]
        vs_cudnn = [v["cudnn_ms"] / v["ms"] for v in ok.values() if not math.isnan(v["cudnn_ms"])]
        # a model's layers weighed by how often it runs them: its convs' time against cuDNN's
        total = sum(v.get("count", 1) * v["ms"] for v in ok.values())
        cudnn = sum(v.get("count", 1) * v["cudnn_ms"] for v in ok.values())
        out[name] = {"ran": len(ok), "of": len(layers), "vs_legacy": _geomean(vs_legacy),
                     "vs_cudnn": _geomean(vs_cudnn), "total_ms": total,
                     "total_vs_cudnn": cudnn / total if total else math.nan}
        log(f"{name:<28} ran {len(ok):>2}/{len(layers):<2} vs legacy "
            f"{out[name]['vs_legacy']:.2f}x  vs cuDNN {out[name]['vs_cudnn']:.2f}x  "
            f"sum {total:.4f} ms ({out[name]['total_vs_cudnn']:.2f}x cuDNN's sum)")
    best = {}
    for r in rows:
        if not math.isnan(r["ms"]) and r["ms"] < best.get(r["layer"], (math.inf,))[0]:
            best[r["layer"]] = (r["ms"], r["config"], r["cudnn_ms"])
    ratios = [c / ms for ms, _, c in best.values() if not math.isnan(c)]
    log("best per layer: " + ", ".join(f"{k} {v[1]} {v[0]:.4f}" for k, v in best.items()))
    log(f"best per layer vs cuDNN: {_geomean(ratios):.2f}x")
    return out


def _geomean(values):
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def main(argv=None):
    """Command line: --layers table1|resnet18|bert, --quick (the first four), --workers,
    --out."""

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", choices=("table1", "resnet18", "bert"), default="table1",
                    help="Table I, ResNet-18's distinct convs or BERT-base's matmuls (the "
                         "models' layers weighed by their count)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--sample", type=int, default=0,
                    help="configs per layer drawn from the tuning space besides the named ones")
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    layers = {"table1": TABLE_I, "resnet18": RESNET18_CONVS, "bert": BERT_MATMULS}[args.layers]
    rows = run(layers[:4] if args.quick else layers, workers=args.workers,
               repeat=args.repeat, sample=args.sample)
    os.makedirs(args.out, exist_ok=True)
    stem = "gpu_configs" if args.layers == "table1" else f"gpu_configs_{args.layers}"
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump({"rows": rows, "summary": summary(rows)}, f, indent=1)


if __name__ == "__main__":
    main()
