"""Op benchmark in float32 (`unit-tvm bench-op --dtype float32`): UNIT's Table I convs and the
GEMMs on the float32 multiply-add, against PyTorch fp32 (oneDNN).

Each workload is laid out as the graph pass lays out a float32 conv for the instruction
(NCHW data, KCRS[y]k weights pre-packed, NCHW[y]c output; GEMMs with B packed by column
blocks) and built twice: with the strategy's default config (the analytical register and
cache tiles: schedules/cpu.py) and tuned. GOPS count the real work; % of peak is of the
instruction's peak measured now on the same threads. PyTorch runs the op on NCHW and on
channels_last input and the faster counts. Times are minima over interleaved rounds."""

import math

import numpy as np

from .. import intrinsics, ops
from ..build import prepare_op
from ..peak import peak
from ..prepare import placeholders_of
from ..runner import LocalRunner
from ..schedules import for_target
from ..testing.workloads import ops_count, workloads
from ..timing import call_rounds
from ..tuner import Database, default_path, tune
from .op_level import ROUNDS, build_kernel, interleaved_seconds


def default_config(prepared, target):
    """The strategy's default config for the workload: what its analytical model chose."""
    return for_target(target).default(prepared, target)


def fp32_instruction(target):
    """The widest float32 multiply-add with a broadcast operand `target` runs, or None."""
    return next((i for i in intrinsics.for_target(target)
                 if i.input_dtypes == ("float32", "float32") and i.broadcast_operand
                 and not i.lanewise), None)


def fp32_op(kind, p, intrin):
    """The workload in float32, in the layout the float32 form reads (see module doc)."""
    y = intrin.lanes
    if kind == "conv":
        c, h, k, r, s = p
        return ops.conv2d_nchwc(1, c, h, h, k, r, r, s, x=1, y=y, a_dtype="float32",
                                b_dtype="float32", acc="float32", word=1)
    m, n, k = p
    return ops.dense_packed(m, n, k, y, 1, "float32", "float32", "float32", word=1)


def torch_fp32_seconds(kind, p, threads, repeat=3):
    """PyTorch fp32's time for the workload: the faster of NCHW and channels_last input."""
    import torch

    torch.set_num_threads(threads)
    if kind != "conv":
        m, n, k = p
        a, b = torch.randn(m, k), torch.randn(n, k)
        with torch.inference_mode():
            return min(call_rounds(lambda: torch.nn.functional.linear(a, b), repeat))
    c, h, k, r, s = p
    w, x = torch.randn(k, c, r, r), torch.randn(1, c, h, h)
    best = math.inf
    for fmt in (torch.contiguous_format, torch.channels_last):
        xf, wf = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
        with torch.inference_mode():
            best = min(best, *call_rounds(
                lambda: torch.nn.functional.conv2d(xf, wf, stride=s), repeat))
    return best


def run(quick=False, trials=None, database=None, log=print, only=None):
    """Table I convs and the GEMMs in float32 on this host; returns (rows, meta)."""
    runner = LocalRunner()
    target = runner.target()
    threads = int(target.attrs.get("num-cores", 1))
    intrin = fp32_instruction(target)
    if intrin is None:
        raise ValueError("this host has no float32 multiply-add instruction unit-tvm describes")
    database = Database(database or default_path())
    top = peak(intrin, threads, target)["gops"]
    meta = {"target": str(target), "threads": threads, "instruction": intrin.name,
            "peak_gflops": top, "database": database.path,
            "timing": f"min over {ROUNDS} interleaved rounds of repeats"}
    log(f"{intrin.name} peak on {threads} threads: {top:.1f} GFLOPS (measured now)")
    log(f"{'workload':<22} {'tuned':>8} {'default':>8} {'torch':>8}  {'%pk tuned':>9} "
        f"{'%pk dflt':>8} {'xTorch':>7}")
    rows, rng = [], np.random.default_rng(0)
    for label, kind, p in workloads(quick, only if only != "conv3d" else None):
        n_ops = ops_count(kind, p)
        op = fp32_op(kind, p, intrin)
        tensors = [*placeholders_of(op), op]
        prepared = prepare_op(op, intrin, target=target)
        res = tune(prepared, intrin, target, trials=trials, database=database, runner=runner)
        libs = [build_kernel(kind, p, prepared, intrin, config, target)
                for config in (res.config, None)]
        number = 3 if n_ops > 2e10 else 10
        best = interleaved_seconds(kind, p, libs, tensors, rng, number, threads, runner, True,
                                   torch_fp32_seconds)
        tuned, default, torch_g = (n_ops / t / 1e9 for t in best)
        rows.append({"workload": label, "kind": kind, "shape": list(p),
                     "intrinsic": intrin.name, "gops_tuned": tuned, "gops_default": default,
                     "gops_torch": torch_g, "percent_of_peak": 100 * tuned / top,
                     "percent_of_peak_default": 100 * default / top,
                     "speedup_vs_torch": best[2] / best[0], "tuning_seconds": res.seconds,
                     "from_database": res.from_database, "config": res.config.key(),
                     "default_config": default_config(prepared, target).key()})
        r = rows[-1]
        log(f"{label:<22} {tuned:8.1f} {default:8.1f} {torch_g:8.1f}  "
            f"{r['percent_of_peak']:9.1f} {r['percent_of_peak_default']:8.1f} "
            f"{r['speedup_vs_torch']:7.2f}")
    _summary(rows, meta, log)
    return rows, meta


def _summary(rows, meta, log):
    """Means over the compute-bound convs (Table I) and the tuned-over-default ratio."""
    convs = [r for r in rows if r["kind"] == "conv"]
    if not convs:
        return
    meta["conv_mean_percent_of_peak_default"] = float(np.mean(
        [r["percent_of_peak_default"] for r in convs]))
    meta["conv_mean_percent_of_peak_tuned"] = float(np.mean([r["percent_of_peak"] for r in convs]))
    meta["tuned_over_default"] = float(np.exp(np.mean(
        [np.log(r["gops_tuned"] / r["gops_default"]) for r in rows])))
    meta["geomean_speedup_vs_torch"] = float(np.exp(np.mean(
        [np.log(r["speedup_vs_torch"]) for r in rows])))
    log(f"Table I fp32: mean {meta['conv_mean_percent_of_peak_default']:.1f}% of peak with "
        f"defaults, {meta['conv_mean_percent_of_peak_tuned']:.1f}% tuned; tuned / default "
        f"{meta['tuned_over_default']:.3f}x (geomean); {meta['geomean_speedup_vs_torch']:.2f}x "
        f"PyTorch fp32 (geomean)")
