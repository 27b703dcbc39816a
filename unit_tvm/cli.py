"""`unit-tvm` command line: intrinsics, peak, demo (the main job)."""

import argparse
import json
import sys


def _cmd_intrinsics(args):
    from . import intrinsics
    from .target import as_target, host

    target = host()
    rows = []
    for i in intrinsics.all():
        missing = i.missing_features(target)
        feature = " | ".join("+".join(alt) for alt in i.requires)
        rows.append({
            "name": i.name, "isa": feature, "dtypes": f"{','.join(i.input_dtypes)}->{i.output_dtype}",
            "shape": f"{i.lanes} x {i.reduction_width}", "usable": not missing,
            "missing": ", ".join(missing),
        })
    if args.json:
        print(json.dumps({"target": str(as_target(target)), "intrinsics": rows}, indent=1))
        return 0
    print(f"{'name':<18} {'ISA feature':<28} {'dtypes':<28} {'lanes x width':<14} usable here")
    for r in rows:
        usable = "yes" if r["usable"] else f"no (missing {r['missing']})"
        print(f"{r['name']:<18} {r['isa']:<28} {r['dtypes']:<28} {r['shape']:<14} {usable}")
    return 0


def _cmd_peak(args):
    from . import intrinsics
    from .peak import host_threads, peak
    from .target import host

    target = host()
    names = [args.intrinsic] if args.intrinsic else [i.name for i in intrinsics.for_target(target)]
    threads = [args.threads] if args.threads else sorted({1, host_threads()})
    rows = []
    for name in names:
        intrinsics.require(name, target)
        for t in threads:
            rows.append(peak(name, t, target))
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(f"{r['intrinsic']:<18} {r['threads']} thread(s): {r['gops']:8.1f} GOPS "
                  f"(register block {r['block']}, best of 7 runs)")
    return 0


def _cmd_demo(args):
    from . import demo

    if args.json:
        out = demo.main(log=lambda *a: None)
        print(json.dumps(out, indent=1))
    else:
        out = demo.main()
    return 0 if all(k["correct"] for k in out["kernels"]) else 1


def main(argv=None):
    """Entry point of the `unit-tvm` console script."""
    parser = argparse.ArgumentParser(prog="unit-tvm", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("intrinsics", help="table of registered instructions and host support")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_cmd_intrinsics)
    p = sub.add_parser("peak", help="measured peak GOPS of instructions on this host")
    p.add_argument("--intrinsic", help="one instruction (default: every usable one)")
    p.add_argument("--threads", type=int, help="thread count (default: 1 and all)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_cmd_peak)
    p = sub.add_parser("demo", help="the main job: peaks, then a tensorized GEMM and conv2d")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_cmd_demo)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (KeyError, ValueError) as e:
        print(f"unit-tvm: error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
