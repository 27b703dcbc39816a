"""UNIT Fig. 12 on counts: whole models compiled for aarch64, executed under qemu, and the
instructions one inference executes counted (timings under qemu mean nothing; counts do).

Per model, four builds of the same weights run the same input:
- unit-tvm int8, I8MM server (+dotprod +i8mm: Graviton 3/4, Neoverse V1/N2/V2): smmla / sdot;
- unit-tvm int8, DotProd server (+dotprod only: Graviton 2, Neoverse N1): sdot;
- TVM int8: the same quantized model without UnitTensorize (TVM's code generation, LLVM's NEON
  auto-vectorisation; what TVM does with int8 on ARM);
- TVM fp32: the fp32 model with the same default CPU schedule.
Each row gives the instructions per inference, the dot / matrix instructions and the
multiply-adds they performed against the model's, and the output's cosine to PyTorch fp32.
"""

import csv
import json
import os
from dataclasses import asdict, dataclass

import numpy as np

from ..cross import aarch64, arm_python
from .engines import cosine
from ..compiler import build_relax
from .. import frontends
from ..relax import quantize
from ..relax.core.graph import model_macs
from ..compiler import compile as unit_compile

MODELS = ("resnet18", "mobilenet_v2", "bert_layer")
BUILDS = ("unit-tvm int8 (i8mm)", "unit-tvm int8 (dotprod)", "TVM int8", "TVM fp32")


@dataclass(frozen=True)
class CountRow:
    """One build of one model, one inference under qemu."""

    model: str
    build: str
    instructions: int  # every aarch64 instruction of one inference
    smmla: int
    sdot: int
    udot: int
    instruction_macs: int  # multiply-adds the dot / matrix instructions did (padding included)
    model_macs: int  # multiply-adds of the model's convolutions and matrix products
    tensorized_ops: str  # "k/n": quantized ops on an instruction, of those quantized
    cosine_fp32: float  # output against PyTorch fp32

    @property
    def mac_share(self) -> float:
        """instruction_macs / model_macs: 1.0 and above when every multiply-add ran on them."""
        return self.instruction_macs / self.model_macs


def _executables(mod, qmod):
    """{build name: (relax Executable for aarch64, tensorized_ops)} of one model."""
    out = {}
    for name, target in ((BUILDS[0], aarch64.TARGET), (BUILDS[1], aarch64.DOTPROD_TARGET)):
        report = []
        ex = unit_compile(qmod, target=target, report=report)
        done = sum(1 for row in report if row[1])
        out[name] = (ex, f"{done}/{len(report)}")
    target = aarch64.target()
    out[BUILDS[2]] = (build_relax(qmod, target), "0")
    out[BUILDS[3]] = (build_relax(mod, target), "-")
    return out


def count_model(name: str, log=print) -> list:
    """The CountRows of one zoo model (every build, one inference each under qemu)."""
    import torch

    from ..testing import zoo  # torch (optional extra)

    module, shape = zoo.get(name)
    x = zoo.inputs(shape, 1, seed=7)[0]
    mod = frontends.from_torch(module, [torch.from_numpy(x)])
    with torch.no_grad():
        fp32 = module(torch.from_numpy(x)).numpy()
    macs = model_macs(mod)
    qmod = quantize(mod, calibration_data=zoo.inputs(shape, 4), target=aarch64.TARGET)
    rows = []
    for build, (ex, ops) in _executables(mod, qmod).items():
        run = arm_python.run_model(ex, [x], count=True)
        c = run.counts
        rows.append(CountRow(name, build, c.instructions, c.executed.get("smmla", 0),
                             c.executed.get("sdot", 0), c.executed.get("udot", 0),
                             c.tensorized_macs, macs, ops, cosine(run.outputs[0], fp32)))
        r = rows[-1]
        log(f"{name:13s} {build:24s} {c.instructions / 1e6:9.1f} M instructions, "
            f"smmla {r.smmla / 1e6:.2f} M, sdot {r.sdot / 1e6:.2f} M, MACs on them "
            f"{r.mac_share:.2f}x the model's, cosine {r.cosine_fp32:.4f}")
    return rows


def run(models=MODELS, log=print) -> list:
    """CountRows of every model (FileNotFoundError naming what is missing to run aarch64)."""
    absent = arm_python.missing()
    if absent:
        raise FileNotFoundError(f"cannot run aarch64 models here: missing {'; '.join(absent)}")
    return [row for name in models for row in count_model(name, log)]


def write_outputs(rows, out_dir) -> list:
    """fig12.csv, fig12.json and fig12.png (instructions per inference relative to TVM int8)."""
    os.makedirs(out_dir, exist_ok=True)
    csv_path = os.path.join(out_dir, "fig12.csv")
    fields = list(CountRow.__dataclass_fields__) + ["mac_share"]
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(fields)
        for r in rows:
            w.writerow([*asdict(r).values(), f"{r.mac_share:.4f}"])
    json_path = os.path.join(out_dir, "fig12.json")
    with open(json_path, "w") as f:
        json.dump({"target": aarch64.TARGET, "rows": [asdict(r) for r in rows]}, f, indent=1)
    return [csv_path, json_path, _plot(rows, os.path.join(out_dir, "fig12.png"))]


def _plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r.model for r in rows))
    base = {r.model: r.instructions for r in rows if r.build == "TVM int8"}
    fig, ax = plt.subplots(figsize=(8, 3.5))
    width = 0.8 / len(BUILDS)
    for i, build in enumerate(BUILDS):
        vals = [next((base[m] / r.instructions for r in rows
                      if r.model == m and r.build == build), 0.0) for m in models]
        ax.bar(np.arange(len(models)) + i * width, vals, width, label=build)
    ax.set_xticks(np.arange(len(models)) + width * (len(BUILDS) - 1) / 2, models)
    ax.set_ylabel("TVM int8 instructions / build's")
    ax.set_title("aarch64, one inference under qemu: fewer instructions = higher bar")
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
