"""Writing model-benchmark results: JSON (everything), CSV (one row per model and engine) and
a PNG of unit-tvm's speedup over every engine per model (like UNIT's Fig. 8)."""

import csv
import json
import os

from .model import geomean_speedups

CSV_FIELDS = ("model", "engine", "min_ms", "median_ms", "calls", "cosine", "top1_agreement",
              "threads", "compile_s", "variant")


def write_outputs(results, out_dir, host_info=None) -> list:
    """The paths written under out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bench_model.json"), "w") as f:
        json.dump({"host": host_info or {}, "results": results,
                   "geomean_speedup": geomean_speedups(results),
                   "geomean_bf16_speedup": geomean_speedups(results, "bf16_speedup"),
                   "geomean_fp32_speedup": geomean_speedups(results, "fp32_speedup")}, f,
                  indent=1, default=str)
    csv_path = os.path.join(out_dir, "bench_model.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in results:
            for engine, v in r["engines"].items():
                w.writerow([r["model"], engine] + [v.get(k) for k in CSV_FIELDS[2:]])
    paths = [csv_path, os.path.join(out_dir, "bench_model.json")]
    png = _plot(results, os.path.join(out_dir, "bench_model.png"))
    return paths + ([png] if png else [])


def _plot(results, path):
    rows = [r for r in results if r.get("speedup")]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = sorted({k for r in rows for k in r["speedup"]})
    width = 0.8 / max(1, len(engines))
    fig, ax = plt.subplots(figsize=(max(5, len(rows) * 1.6), 3.4))
    for i, engine in enumerate(engines):
        xs = [j + i * width for j, r in enumerate(rows) if engine in r["speedup"]]
        ys = [r["speedup"][engine] for r in rows if engine in r["speedup"]]
        ax.bar(xs, ys, width, label=engine)
    ax.set_xticks([j + width * (len(engines) - 1) / 2 for j in range(len(rows))])
    ax.set_xticklabels([r["model"] for r in rows])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("unit-tvm int8 speedup")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("batch 1, min of single calls, interleaved")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def summary(results) -> str:
    """The lines printed after the per-engine log: geomeans and the strongest rival per model."""
    lines = []
    for r in results:
        if r.get("strongest") and "vs_strongest" in r:  # not when unit-tvm was left out
            ours, theirs = r["engines"]["unit-tvm int8"], r["engines"][r["strongest"]]
            lines.append(f"{r['model']}: strongest other int8 engine {r['strongest']}, "
                         f"unit-tvm {r['vs_strongest']:.2f}x; cosine {ours['cosine']:.5f} vs "
                         f"{theirs['cosine']:.5f}, top-1 {ours['top1_agreement']:.3f} vs "
                         f"{theirs['top1_agreement']:.3f} over {r.get('accuracy_inputs')} inputs")
    geo = geomean_speedups(results)
    if len(results) > 1 and geo:
        lines.append("geomean speedup of unit-tvm int8: " + ", ".join(
            f"{v:.2f}x over {k}" for k, v in geo.items()))
    for r in results:
        if r.get("strongest_fp32") and "vs_strongest_fp32" in r:
            ours, theirs = r["engines"]["unit-tvm fp32"], r["engines"][r["strongest_fp32"]]
            lines.append(f"{r['model']}: strongest other fp32 engine {r['strongest_fp32']}, "
                         f"unit-tvm fp32 {r['vs_strongest_fp32']:.2f}x; cosine "
                         f"{ours['cosine']:.7f} vs {theirs['cosine']:.7f}")
    for key, label in (("bf16_speedup", "bf16"), ("fp32_speedup", "fp32")):
        geo_other = geomean_speedups(results, key)
        if len(results) > 1 and geo_other:
            lines.append(f"geomean speedup of unit-tvm {label}: " + ", ".join(
                f"{v:.2f}x over {k}" for k, v in geo_other.items()))
    return "\n".join(lines)
