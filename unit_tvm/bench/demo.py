"""The main job (`make run`): host, its instructions and their peaks, then one int8 GEMM and one
int8 conv2d tensorized with the best tile instruction (AMX) and the best vector instruction
(VNNI) the host has, default breakpoints and tuned, timed and checked against numpy."""

import time

import numpy as np
import tvm

from .. import intrinsics, lowering, measure, ops
from ..build import build as unit_build
from ..build import prepare_op
from ..peak import host_threads, peak
from ..rewriter import schedule
from ..target import host
from ..testing import reference
from ..timing import evaluator_rounds
from ..tuner import Database, default_path, tune
from .op_level import candidates


def _time(lib, arrays, expected, n_ops, out_shape):
    dev = tvm.cpu()
    args = measure.to_device(list(arrays) + [np.zeros(out_shape, "int32")], dev)
    secs = min(evaluator_rounds(lib, args, dev))
    ok = np.array_equal(args[-1].numpy().astype(np.int64), expected)
    return n_ops / secs / 1e9, secs, ok


def _run_kernel(title, op, intrin, arrays, expected, n_ops, peak_gops, target, database, log):
    """Default breakpoints, then tuned (or read from the database), each checked against numpy."""
    tensors = [*op.op.input_tensors, op]
    shape = [int(s) for s in op.shape]
    rows = []
    for label in ("default", "tuned"):
        t0 = time.time()
        if label == "default":
            lib = unit_build(tensors, target, intrinsic=intrin)
            prep_s = time.time() - t0
            note = f"build {prep_s:4.1f}s"
        else:
            prepared = prepare_op(op, intrin, target=target)
            result = tune(prepared, intrin, target, database=database, progress=False)
            sch = schedule(prepared, intrin, result.config, target)
            lib = lowering.build(sch.mod, target)
            note = ("from database, 0 measured" if result.from_database else
                    f"tuned {result.seconds:4.1f}s, {result.measured} measured")
        gops, secs, ok = _time(lib, arrays, expected, n_ops, shape)
        log(f"  {title:<36} {label:<7} {gops:8.1f} GOPS {100 * gops / peak_gops:5.1f}% of peak "
            f"{secs * 1e3:7.3f} ms  {note:<28} numpy: {'exact match' if ok else 'MISMATCH'}")
        rows.append({"name": title, "config": label, "gops": gops,
                     "percent_of_peak": 100 * gops / peak_gops, "ms": secs * 1e3,
                     "correct": bool(ok), "note": note})
    return rows


def main(log=print):
    """Run the main job; returns a dict of what was printed. Exit status 1 on a wrong result."""
    target = host()
    threads = host_threads()
    log(f"host target: {target}")
    log(f"worker threads: {threads}")
    log("")
    log("instructions on this host (peak measured by a TVM-generated register-blocked kernel):")
    peaks = {}
    for intrin in intrinsics.all():
        missing = intrin.missing_features(target)
        if missing:
            log(f"  {intrin.name:<18} not usable: missing {', '.join(missing)}")
            continue
        p1 = peak(intrin, 1, target)["gops"]
        pn = peak(intrin, threads, target)["gops"]
        peaks[intrin.name] = {"1": p1, str(threads): pn}
        log(f"  {intrin.name:<18} usable   peak {p1:7.1f} GOPS on 1 thread, "
            f"{pn:7.1f} GOPS on {threads} threads")
    log("")

    database = Database(default_path())
    m = n = k = 1024
    c, hw, kk = 64, 56, 64
    families = candidates("conv", (c, hw, kk, 3, 1), target)
    if not families:
        log("no int8 dot-product instruction on this host; nothing to tensorize")
        return {"peaks": peaks, "kernels": []}
    rng = np.random.default_rng(0)
    results = []
    a = rng.integers(0, 256, (m, k)).astype("uint8")
    b = rng.integers(-128, 128, (n, k)).astype("int8")
    data = rng.integers(0, 256, (1, c, hw, hw)).astype("uint8")
    weight = rng.integers(-128, 128, (kk, c, 3, 3)).astype("int8")
    conv_expected = reference.conv2d_nchw(data, weight)
    dense_expected = reference.dense(a, b)
    oh = hw - 2
    for intrin, x, y in families:
        lo, hi = intrin.operand_ranges.get("a", (0, 255))
        if (lo, hi) != (0, 255) or c % x:
            continue  # the demo's conv is NCHW[x]c: whole channel blocks only
        peak_gops = peaks[intrin.name][str(threads)]
        log(f"tensorized with {intrin.name}, {threads} threads, time = min of 5 runs, "
            f"tuning database {database.path}:")
        results += _run_kernel(
            "GEMM 1024^3 u8*s8->s32", ops.dense_packed(m, n, k, y, x), intrin,
            [a, reference.pack_dense_weight(b, y, x)], dense_expected,
            2 * m * n * k, peak_gops, target, database, log)
        results += _run_kernel(
            f"conv2d 64->64 3x3 56x56 NCHW{x}c", ops.conv2d_nchwc(1, c, hw, hw, kk, 3, 3, x=x, y=y),
            intrin, [reference.pack_nchwc(data, x), reference.pack_kcrs(weight, y, x)],
            np.ascontiguousarray(
                conv_expected.reshape(1, kk // y, y, oh, oh).transpose(0, 1, 3, 4, 2)),
            2 * kk * c * 9 * oh * oh, peak_gops, target, database, log)
        log("")
    return {"peaks": peaks, "kernels": results}
