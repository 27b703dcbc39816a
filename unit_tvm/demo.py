"""The main job (`make run`): host, its instructions and their peaks, then one int8 GEMM and one
int8 conv2d tensorized with the best host instruction, timed and checked against numpy."""

import time

import numpy as np
import tvm

from . import intrinsics, measure, ops, reference
from .peak import host_threads, peak
from .rewriter import rewrite
from .target import host

INT8_PREFERENCE = ("x86.vpdpbusd", "x86.vpdpbusd.256", "x86.vpmaddubsw")


def best_int8_instruction(target=None):
    """The fastest u8 x s8 instruction the host can execute, or None."""
    usable = {i.name for i in intrinsics.for_target(target)}
    for name in INT8_PREFERENCE:
        if name in usable:
            return intrinsics.get(name)
    return None


def _run_kernel(title, op, intrin, arrays, expected, n_ops, peak_gops, target, log):
    dev = tvm.cpu()
    t0 = time.time()
    sch = rewrite(op, intrin, target=target)
    lib = tvm.tirx.build(sch.mod, target=target)
    build_s = time.time() - t0
    out = np.zeros([int(s) for s in op.shape], "int32")
    args = measure.to_device(list(arrays) + [out], dev)
    secs = measure.best_seconds(lib, args, dev)
    ok = np.array_equal(args[-1].numpy().astype(np.int64), expected)
    gops = n_ops / secs / 1e9
    log(f"  {title:<38} {gops:8.1f} GOPS  {100 * gops / peak_gops:5.1f}% of peak  "
        f"{secs * 1e3:8.3f} ms (min of 5)  build {build_s:4.1f}s  check vs numpy: "
        f"{'exact match' if ok else 'MISMATCH'}")
    return {"name": title, "gops": gops, "percent_of_peak": 100 * gops / peak_gops,
            "ms": secs * 1e3, "correct": bool(ok)}


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
    intrin = best_int8_instruction(target)
    if intrin is None:
        log("no int8 dot-product instruction on this host; nothing to tensorize")
        return {"peaks": peaks, "kernels": []}
    peak_gops = peaks[intrin.name][str(threads)]
    lanes, width = intrin.lanes, intrin.reduction_width
    lo, hi = intrin.operand_ranges.get("a", (0, 255))
    log(f"tensorized with {intrin.name} ({lanes} lanes x {width}), {threads} threads:")
    rng = np.random.default_rng(0)
    results = []

    m = n = k = 1024
    a = rng.integers(lo, hi + 1, (m, k)).astype("uint8")
    b = rng.integers(-128, 128, (n, k)).astype("int8")
    results.append(_run_kernel(
        "GEMM 1024x1024x1024 u8*s8->s32", ops.dense_packed(m, n, k, lanes, width), intrin,
        [a, reference.pack_dense_weight(b, lanes, width)], reference.dense(a, b),
        2 * m * n * k, peak_gops, target, log))

    c, hw, kk = 64, 56, 64
    data = rng.integers(lo, hi + 1, (1, c, hw, hw)).astype("uint8")
    weight = rng.integers(-128, 128, (kk, c, 3, 3)).astype("int8")
    expected = reference.conv2d_nchw(data, weight)
    oh = hw - 2
    results.append(_run_kernel(
        "conv2d 64->64 3x3 56x56 (NCHW4c) u8*s8", ops.conv2d_nchwc(1, c, hw, hw, kk, 3, 3,
                                                                     x=width, y=lanes), intrin,
        [reference.pack_nchwc(data, width), reference.pack_kcrs(weight, lanes, width)],
        np.ascontiguousarray(expected.reshape(1, kk // lanes, lanes, oh, oh).transpose(0, 1, 3, 4, 2)),
        2 * kk * c * 9 * oh * oh, peak_gops, target, log))
    return {"peaks": peaks, "kernels": results}
