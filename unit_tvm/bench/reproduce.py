"""`unit-tvm reproduce FIG`: the UNIT paper's experiments on whatever hardware is at hand (this
host, or a fleet through an RPC tracker), each writing CSV/JSON and a plot like the figure.

fig8   end-to-end int8 CNNs and BERT against the other engines (bench-model)
fig9   end-to-end fp16 on Tensor Cores against PyTorch / cuDNN (needs a CUDA GPU here)
fig10  UNIT Table I per layer against PyTorch int8 (bench-op --only conv)
fig11  the CPU ablation: parallel only, + unroll, + tuned breakpoints, each against PyTorch
       int8, and where in the tuning order each layer's best config was found
fig12  int8 models on ARM DOT / I8MM: compiled for aarch64, run under qemu, the instructions
       of one inference counted against TVM's own int8 and fp32 builds (needs qemu-aarch64 and
       the aarch64 Python: `make test` sets them up as root)
fig13  ResNet-18 with every conv 3D, per layer against PyTorch int8 Conv3d (bench-op --only
       conv3d)
fig11-gpu  the GPU ablation on Table I in fp16: 1x1 fragments, + p x p window, + fused H/W,
       + split-K, + 16-byte copies into padded shared rows, + implicit GEMM, + cp.async
       pipeline, + block epilogue, tuned, each against cuDNN (needs a CUDA GPU here)
"""

import csv
import json
import math
import os
from dataclasses import asdict, dataclass

import numpy as np
import tvm

from .. import lowering
from ..build import prepare_op
from ..prepare import placeholders_of
from ..rewriter import schedule
from ..runner import LocalRunner
from ..schedules.cpu import CpuConfig, default
from ..testing.workloads import ops_count, workload_op, workloads
from ..tuner import tune
from . import op_level
from . import gpu_model
from . import gpu_ops
from ..cross import arm_python
from . import arm_counts

FIG8_MODELS = ("resnet18", "resnet50", "mobilenet_v2", "inception_v3", "bert_base")
FIG9_MODELS = ("resnet18", "resnet50", "mobilenet_v2", "bert_base")
ROUNDS = 3  # interleaved timing rounds of the ablation's steps


class NotHere(RuntimeError):
    """The figure cannot be measured with what this run has (no GPU, a fleet where the
    engines cannot go); the CLI exits 2 with the reason."""


@dataclass(frozen=True)
class AblationRow:
    """One Table I layer of Fig. 11: GOPS of each step and of PyTorch int8."""

    layer: str
    shape: str  # C x H x K x R x stride
    intrinsic: str
    gops_parallel: float  # first breakpoint only: fused parallel loops, nothing unrolled
    gops_unroll: float  # + the default register tile (second breakpoint)
    gops_tuned: float  # + the tuner's breakpoints
    gops_torch: float  # PyTorch int8 (oneDNN) on the same device; nan where it is absent
    best_rank: int  # 1-based position of the kept config in the tuner's measuring order
    measured: int  # configs the tuner measured

    def speedups(self) -> tuple:
        """(parallel, unroll, tuned) over PyTorch int8."""
        return tuple(g / self.gops_torch for g in (self.gops_parallel, self.gops_unroll,
                                                     self.gops_tuned))


def ablation(*, trials=None, runner=None, quick=False, log=print) -> list:
    """Fig. 11 (CPU) rows for Table I, measured on the runner's device (default: this host).
    The tuner starts from nothing (no database), so its measuring order is the real one."""
    runner = runner or LocalRunner()
    target = runner.target()
    threads = int(target.attrs.get("num-cores", 1))
    rng = np.random.default_rng(0)
    rows = []
    for label, kind, p in workloads(quick, "conv"):
        found = op_level.candidates(kind, p, target)
        if not found:
            log(f"{label}: no int8 instruction on {target}")
            continue
        intrin = found[0][0]
        op = workload_op(kind, p, intrin)
        tensors = [*placeholders_of(op), op]
        prepared = prepare_op(op, intrin, target=target)
        res = tune(prepared, intrin, target, trials=trials, runner=runner, progress=False)
        base = default(prepared, target)
        steps = (CpuConfig(parallel=base.parallel), base, res.config)
        n_ops = ops_count(kind, p)
        libs = [lowering.build(schedule(prepared, intrin, c, target).mod, target)
                for c in steps]
        best = [math.inf] * len(libs)
        for _ in range(ROUNDS):  # in turn, so a burst of load does not fall on one step only
            for i, lib in enumerate(libs):
                best[i] = min(best[i], op_level.time_kernel(lib, tensors, rng, 10, 3, runner))
        gops = [n_ops / t / 1e9 for t in best]
        torch_s = op_level.torch_seconds(kind, p, threads, runner)
        order = [key for key, _ in res.history]
        rank = order.index(res.config.key()) + 1 if res.config.key() in order else 0
        row = AblationRow(label, "x".join(map(str, p)), intrin.name, *gops,
                          n_ops / torch_s / 1e9 if torch_s else math.nan, rank, res.measured)
        rows.append(row)
        log(f"{label:<4} {intrin.name:<17} parallel {gops[0]:7.1f}  +unroll {gops[1]:7.1f}  "
            f"+tuned {gops[2]:7.1f}  torch {row.gops_torch:7.1f} GOPS  best config measured "
            f"{rank} of {res.measured}")
    return rows


def ablation_summary(rows) -> dict:
    """Geomean speedups over PyTorch per step, and the share of layers whose kept config was
    the first measured (the default) and within the first 8."""
    with_torch = [r for r in rows if math.isfinite(r.gops_torch)]
    out = {"layers": len(rows),
           "best_first": sum(r.best_rank == 1 for r in rows) / max(len(rows), 1),
           "best_within_8": sum(1 <= r.best_rank <= 8 for r in rows) / max(len(rows), 1)}
    for i, step in enumerate(("parallel", "unroll", "tuned")):
        if with_torch:
            out[f"geomean_{step}_vs_torch"] = float(np.exp(np.mean(
                [np.log(r.speedups()[i]) for r in with_torch])))
    return out


def write_ablation(rows, summary, meta, out_dir) -> list:
    """fig11.csv, fig11.json and fig11.png (speedup over PyTorch int8 per layer and step)."""
    os.makedirs(out_dir, exist_ok=True)
    csv_path = os.path.join(out_dir, "fig11.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(AblationRow.__dataclass_fields__))
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))
    json_path = os.path.join(out_dir, "fig11.json")
    with open(json_path, "w") as f:
        json.dump({"meta": meta, "summary": summary, "rows": [asdict(r) for r in rows]}, f,
                  indent=1)
    paths = [csv_path, json_path]
    plotted = [r for r in rows if math.isfinite(r.gops_torch)]
    if plotted:
        paths.append(_plot_ablation(plotted, os.path.join(out_dir, "fig11.png")))
    return paths


def _plot_ablation(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.7), 3.5))
    width = 0.27
    for i, step in enumerate(("parallel only", "+ unroll", "+ tuned")):
        ax.bar([j + i * width for j in range(len(rows))], [r.speedups()[i] for r in rows],
               width, label=step)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + width for j in range(len(rows))])
    ax.set_xticklabels([r.layer for r in rows], fontsize=8)
    ax.set_ylabel("speedup over PyTorch int8")
    ax.set_title("CPU ablation (UNIT Fig. 11)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run(fig: str, out_dir: str, *, runner=None, trials=None, database=None, quick=False,
        log=print) -> list:
    """Measure one figure; the paths written under out_dir/FIG. NotHere when it cannot be
    measured with this run's hardware."""
    out = os.path.join(out_dir, fig)
    device = runner.name if runner is not None else "local"
    if fig == "fig11":
        rows = ablation(trials=trials, runner=runner, quick=quick, log=log)
        summary = ablation_summary(rows)
        log(json.dumps(summary))
        target = (runner or LocalRunner()).target()
        return write_ablation(rows, summary, {"target": str(target), "device": device}, out)
    if fig in ("fig10", "fig13"):
        rows, meta = op_level.run(quick=quick, with_tvm_default=False, trials=trials,
                                  database=database, log=log, progress=False,
                                  only="conv" if fig == "fig10" else "conv3d", runner=runner)
        return op_level.write_outputs(rows, meta, out, name=fig)
    if fig == "fig8":
        return _fig8(out, runner, trials, database, quick, log)
    if fig == "fig9":
        return _fig9(out, runner, trials, database, quick, log)
    if fig == "fig11-gpu":
        return _fig11_gpu(out, runner, trials, database, quick, log)
    if fig == "fig12":
        return _fig12(out, runner, quick, log)
    raise ValueError(f"unknown figure {fig!r}; one of {', '.join(FIGURES)}")


def _fig8(out, runner, trials, database, quick, log):
    from . import model, report  # the engines import torch (optional extra)

    results = []
    for name in FIG8_MODELS[:2] if quick else FIG8_MODELS:
        log(f"{name}:")
        if runner is None:
            results.append(model.run_model(name, log=log, trials=trials, database=database,
                                           tune=True))
        else:  # every engine runs on the server, in one process there
            results.append(runner.bench_model(name, engines=model.ENGINES, trials=trials,
                                              tune=True))
    where = (runner or LocalRunner()).target()
    return report.write_outputs(results, out, {"target": str(where)})


def _require_gpu(what, runner):
    """NotHere unless this machine has a CUDA GPU and no fleet was asked for."""
    if runner is not None or not tvm.cuda(0).exist:
        raise NotHere(f"{what} and needs a CUDA GPU on this machine (none found)")


def _fig9(out, runner, trials, database, quick, log):

    _require_gpu("fig9 measures fp16 models on Tensor Cores", runner)
    models = FIG9_MODELS[:1] if quick else FIG9_MODELS
    results, meta = gpu_model.run(models, database=database, tune=True, trials=trials, log=log)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "fig9.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1, default=str)
    return [path]


def _fig11_gpu(out, runner, trials, database, quick, log):

    _require_gpu("fig11-gpu times Tensor Core kernels", runner)
    rows, meta = gpu_ops.ablation(quick=quick, trials=trials, database=database, log=log)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "fig11-gpu.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return [path, op_level.write_csv(os.path.join(out, "fig11-gpu.csv"), rows)]


def _fig12(out, runner, quick, log):

    absent = arm_python.missing()
    if runner is not None or absent:
        raise NotHere("fig12 runs aarch64 models under qemu on this machine" + (
            f"; missing {'; '.join(absent)}" if absent else ", not on a fleet"))
    models = arm_counts.MODELS[:1] if quick else arm_counts.MODELS
    return arm_counts.write_outputs(arm_counts.run(models, log=log), out)


FIGURES = ("fig8", "fig9", "fig10", "fig11", "fig11-gpu", "fig12", "fig13")
