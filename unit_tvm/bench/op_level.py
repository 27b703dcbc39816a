"""Op benchmark (`unit-tvm bench-op`): UNIT Table I convs and GEMMs.

For each workload every usable int8 instruction family (each AMX tdpbusd form whose padded
reduction wastes little, the best vector dot product) is tuned in the layout it reads (NCHW[x]c
data, KCRS[x/4]c[y]k[4]c weights, pre-packed and channel-padded as a graph pass would; for AMX on
a 3x3 window, NHWC data read through an im2col buffer of the window's columns built inside the
timed kernel; 1x1 stride-1 convs as one row of pixels, the same bytes; GOPS count the real
channels), and the fastest is reported. Columns: unit-tvm tuned, unit-tvm default breakpoints,
TVM without tensorize (default schedule), PyTorch int8 (torch.ao quantized Conv2d / Linear, x86
backend = oneDNN, channels_last, same thread count). Every engine is warmed up; unit-tvm and
PyTorch are timed in interleaved rounds and each time is the minimum over them. unit-tvm's
outputs are checked against TVM's default build by the tuner before they are timed.
"""

import csv
import json
import math
import os

import numpy as np
import tvm
from tvm import te

from .. import intrinsics, lowering, measure, selection
from ..build import prepare_op
from ..peak import peak
from ..prepare import placeholders_of
from ..schedules.padding_taps import skip_padding_taps
from ..rewriter import schedule
from ..runner import LocalRunner
from ..testing.workloads import form, ops_count, workload_op, workloads
from ..timing import call_rounds
from ..tuner import Database, default_path, tune

ROUNDS = 3  # interleaved timing rounds per workload (unit-tvm tuned, default, PyTorch)


def int8_instructions(target):
    """The u8 x s8 dot-product instructions `target` runs (registry order), each tried in the
    packed layout it reads directly (Intrinsic.channel_blocks); lanewise ones aside: they have
    no channel reduction."""
    return [i for i in intrinsics.for_target(target)
            if i.input_dtypes == ("uint8", "int8") and not i.lanewise]


def candidates(kind, p, target):
    """[(Intrinsic, x, y)] raced for a workload on target (selection.worth_racing): each form
    of the tile instruction whose reduction (the channels, or the folded window times the
    channels, see `form`) pads within selection.RACE_WASTE, and the first vector one."""
    columns = {"conv": p[2], "conv3d": p[3]}.get(kind, p[1])
    usable = []
    for intrin in int8_instructions(target):
        x, y = intrin.channel_blocks
        if columns % y:
            continue  # the packed layouts here do not pad output channels
        layout = form(kind, p, intrin)
        reduce = p[2] if layout == "gemm" else p[0] * p[3] if layout == "folded" else p[0]
        if kind == "conv3d" and intrin.tile:
            continue  # AMX would need the window folded in 3D: not built
        usable.append(selection.Candidate(intrin, selection.channel_waste(intrin, reduce,
                                                                          columns)))
    return [(c.intrinsic, *c.intrinsic.channel_blocks) for c in selection.worth_racing(usable)]


def kernel_func(kind, p, prepared, intrin, config, target):
    """The workload's tensorized PrimFunc with `config` (None: the default). A ResNet-18-3D
    layer skips the depth taps that read only its padding frames, as the graph pass does for
    a conv3d whose input zero point is 0 (PyTorch's baseline input has zero point 0 too):
    its input is pre-padded with zeros, so those taps add nothing (schedules/padding_taps.py)."""
    func = schedule(prepared, intrin, config, target).mod["main"]
    if kind == "conv3d":
        _, d, _, _, r, _ = p
        func = skip_padding_taps(func, "data", 2, r // 2, r // 2 + d, per_update=True)
    return func


def build_kernel(kind, p, prepared, intrin, config, target):
    """kernel_func, built for target."""
    func = kernel_func(kind, p, prepared, intrin, config, target)
    return lowering.build(tvm.IRModule({"main": func}), target)


def time_kernel(lib, tensors, rng, number, repeat, runner):
    """Seconds per call of a built kernel on random operands for `tensors` (min of repeats),
    on the runner's device."""
    arrays = [measure.random_array(t.shape, t.dtype, rng) for t in tensors[:-1]]
    arrays.append(np.zeros([int(s) for s in tensors[-1].shape], str(tensors[-1].dtype)))
    (m,) = runner.measure([lib], arrays, number=number, repeat=repeat)
    if not m.ok:
        raise RuntimeError(f"a benchmark kernel failed on {m.server}: {m.error}")
    return m.seconds


def torch_int8_op(kind, p):
    """(module, input) of PyTorch's quantized op for a workload (x86 backend)."""
    import torch
    import torch.ao.nn.quantized as nnq

    def weight(shape):
        k = shape[0]
        return torch.quantize_per_channel(torch.randn(*shape), torch.rand(k) * 0.01 + 0.001,
                                          torch.zeros(k, dtype=torch.long), 0, torch.qint8)

    if kind == "conv3d":
        c, d, h, k, r, stride = p
        mod = nnq.Conv3d(c, k, r, stride=stride, padding=r // 2)
        mod.set_weight_bias(weight((k, c, r, r, r)), None)
        x = torch.quantize_per_tensor(torch.rand(1, c, d, h, h), 0.01, 0, torch.quint8)
        return mod, x.contiguous(memory_format=torch.channels_last_3d)
    if kind == "conv":
        c, h, k, r, s = p
        mod = nnq.Conv2d(c, k, r, stride=s)
        mod.set_weight_bias(weight((k, c, r, r)), None)
        x = torch.quantize_per_tensor(torch.rand(1, c, h, h), 0.01, 0, torch.quint8)
        return mod, x.contiguous(memory_format=torch.channels_last)
    m, n, kk = p
    mod = nnq.Linear(kk, n)
    mod.set_weight_bias(weight((n, kk)), None)
    return mod, torch.quantize_per_tensor(torch.rand(m, kk), 0.01, 0, torch.quint8)


def time_torch(kind, p, threads, repeat):
    """Seconds of PyTorch's int8 op (oneDNN via the x86 quantized backend), min of repeats."""
    import torch

    torch.set_num_threads(threads)
    torch.backends.quantized.engine = "x86"
    mod, x = torch_int8_op(kind, p)
    with torch.inference_mode():
        return min(call_rounds(lambda: mod(x), repeat))


def run(quick=False, with_tvm_default=True, with_torch=True, trials=None, database=None,
        log=print, progress=None, only=None, runner=None):
    """Run the benchmark; returns (rows, meta). runner: where kernels (and PyTorch) run:
    this host by default, or the servers of a unit_tvm.fleet.RpcRunner."""
    runner = runner or LocalRunner()
    target = runner.target()
    threads = int(target.attrs.get("num-cores", 1))
    usable = int8_instructions(target)
    if not usable:
        where = "this host" if isinstance(runner, LocalRunner) else runner
        raise ValueError(f"{where} has no int8 dot-product instruction")
    database = Database(database or default_path())
    peaks = {i.name: peak(i, threads, target, runner)["gops"] for i in usable}
    meta = {"target": str(target), "threads": threads, "peaks_gops": peaks,
            "database": database.path, "device": runner.name,
            "timing": f"min over {ROUNDS} interleaved rounds of repeats, each engine warmed up"}
    for name, g in peaks.items():
        log(f"{name} peak on {threads} threads: {g:.1f} GOPS (measured now)")
    header = (f"{'workload':<22} {'instr':<13} {'tuned':>8} {'default':>8} {'tvm':>7} "
              f"{'torch':>8}  {'%peak':>6} {'xTorch':>7} {'tune s':>7}")
    log(header)
    rows = []
    rng = np.random.default_rng(0)
    for label, kind, p in workloads(quick, only):
        n_ops = ops_count(kind, p)
        number = 3 if n_ops > 2e10 else 10
        best = None
        tune_s = 0.0
        for intrin, _, _ in candidates(kind, p, target):
            op = workload_op(kind, p, intrin)
            tensors = [*placeholders_of(op), op]
            try:
                prepared = prepare_op(op, intrin, target=target)
                res = tune(prepared, intrin, target, trials=trials, database=database,
                           progress=progress, runner=runner)
            except (ValueError, RuntimeError) as e:
                log(f"  {label}: {intrin.name} skipped: {str(e).splitlines()[0]}")
                continue
            tune_s += res.seconds
            lib = build_kernel(kind, p, prepared, intrin, res.config, target)
            secs = time_kernel(lib, tensors, rng, number, 7, runner)
            if best is None or secs < best[0]:
                best = (secs, intrin, prepared, tensors, res)
        _, intrin, prepared, tensors, res = best
        libs = [build_kernel(kind, p, prepared, intrin, config, target)
                for config in (res.config, None)]
        t_tuned, t_default, t_torch = interleaved_seconds(kind, p, libs, tensors, rng, number,
                                                          threads, runner, with_torch)
        t_tvm = None
        if with_tvm_default:
            plain = tvm.tirx.build(te.create_prim_func(tensors), target=target)
            t_tvm = time_kernel(plain, tensors, rng, 1, 1 if n_ops > 5e9 else 3, runner)
        g = lambda t: None if t is None else n_ops / t / 1e9  # noqa: E731
        row = {"workload": label, "kind": kind, "shape": list(p), "intrinsic": intrin.name,
               "gops_tuned": g(t_tuned), "gops_default": g(t_default), "gops_tvm": g(t_tvm),
               "gops_torch": g(t_torch), "percent_of_peak": 100 * g(t_tuned) / peaks[intrin.name],
               "speedup_vs_torch": t_torch / t_tuned if t_torch else None,
               "tuning_seconds": tune_s, "from_database": res.from_database,
               "config": res.config.key()}
        rows.append(row)
        fmt = lambda v, w: f"{v:>{w}.1f}" if v is not None else f"{'-':>{w}}"  # noqa: E731
        log(f"{label:<22} {intrin.name:<13} {fmt(row['gops_tuned'], 8)} "
            f"{fmt(row['gops_default'], 8)} {fmt(row['gops_tvm'], 7)} {fmt(row['gops_torch'], 8)}  "
            f"{row['percent_of_peak']:6.1f} {fmt(row['speedup_vs_torch'], 7)} {tune_s:7.1f}"
            + ("  (db)" if res.from_database else ""))
    for kind, name in (("conv", "Table I"), ("conv3d", "ResNet-18-3D")):
        ups = [r["speedup_vs_torch"] for r in rows if r["kind"] == kind and r["speedup_vs_torch"]]
        if ups:
            meta[f"{kind}_geomean_speedup_vs_torch"] = float(np.exp(np.mean(np.log(ups))))
            log(f"{name} geomean speedup over PyTorch int8: "
                f"{meta[f'{kind}_geomean_speedup_vs_torch']:.2f}x")
    return rows, meta


def interleaved_seconds(kind, p, libs, tensors, rng, number, threads, runner, with_torch,
                        torch_time=None):
    """(tuned, default, PyTorch) seconds: unit-tvm's kernels and PyTorch's op timed in turn for
    ROUNDS rounds, the minimum of each (a burst of noise on a shared machine hits all alike);
    PyTorch's is None when it is not run or absent. torch_time: (kind, p, threads) -> seconds
    of PyTorch's op (default: its int8 op, torch_seconds)."""
    best = [math.inf, math.inf]
    torch_best = math.inf if with_torch else None
    for _ in range(ROUNDS):
        for i, lib in enumerate(libs):
            best[i] = min(best[i], time_kernel(lib, tensors, rng, number, 3, runner))
        if torch_best is not None:
            t = (torch_time(kind, p, threads) if torch_time
                 else torch_seconds(kind, p, threads, runner, repeat=3))
            torch_best = None if t is None else min(torch_best, t)
    return best[0], best[1], torch_best


def torch_seconds(kind, p, threads, runner, repeat=7):
    """PyTorch's int8 op on the device the kernels run on (None where PyTorch is absent)."""
    if isinstance(runner, LocalRunner):
        return time_torch(kind, p, threads, repeat)
    return runner.torch_int8_seconds(kind, p, threads, repeat)


def write_csv(path, rows):
    """Benchmark rows as CSV (shape as AxBxC, config as JSON, both last); the path."""
    with open(path, "w", newline="") as f:
        fields = [k for k in rows[0] if k not in ("config", "shape")] + ["shape", "config"]
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({**r, "shape": "x".join(map(str, r["shape"])),
                        "config": json.dumps(r["config"])})
    return path


def write_outputs(rows, meta, out_dir, name="bench_ops", baseline="PyTorch int8"):
    """CSV, JSON and a PNG bar chart (speedup over `baseline`, PyTorch, per workload) in
    out_dir, as NAME.csv / .json / .png."""
    os.makedirs(out_dir, exist_ok=True)
    csv_path = write_csv(os.path.join(out_dir, f"{name}.csv"), rows)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    paths = [csv_path]
    speedups = [(r["workload"], r["speedup_vs_torch"]) for r in rows if r["speedup_vs_torch"]]
    if speedups:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(max(6, len(speedups) * 0.6), 3.5))
        names, vals = zip(*speedups)
        ax.bar(range(len(vals)), vals, color=["tab:blue" if v >= 1 else "tab:red" for v in vals])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(vals)))
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(f"speedup over {baseline}")
        ax.set_title(f"unit-tvm tuned ({meta['threads']} threads) vs {baseline} (oneDNN)")
        fig.tight_layout()
        png = os.path.join(out_dir, f"{name}.png")
        fig.savefig(png, dpi=120)
        paths.append(png)
    return paths
