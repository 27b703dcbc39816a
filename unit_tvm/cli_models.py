"""Handlers of the `unit-tvm` commands that work on whole models: bench-model, compile, run,
profile, reproduce (the parser and the op-level commands are in unit_tvm.cli)."""

import json
import os
import sys
from contextlib import nullcontext

import numpy as np
import tvm

from . import deploy, profile, sources
from .deploy import load
from .fleet import LocalFleet, RpcRunner
from .fleet.cli import runner_from_args
from .target import as_target, host


def cmd_bench_model(args):
    """unit-tvm bench-model: every engine on zoo models, one timing protocol (here, or on a
    fleet server with --rpc-tracker: the whole benchmark runs there, in one process)."""
    from .bench import model, report  # CLI start-up; the engines import torch

    log = (lambda *a: None) if args.json else print
    if args.target == "cuda":
        return _bench_model_gpu(args, log)
    engines = model.FP32_ENGINES if args.fp32 else model.ENGINES
    engines += model.BF16_ENGINES if args.bf16 else ()
    if args.engines:
        engines = tuple(args.engines)
    engines = tuple(e for e in engines if e not in (args.skip or []))
    unknown = sorted(set(engines) - set(model.BUILDERS))
    if unknown:
        raise ValueError(f"unknown engines {unknown}; known: {', '.join(model.BUILDERS)}")
    runner = runner_from_args(args)
    results = []
    for name in args.models:
        log(f"{name}:")
        options = {"n_inputs": args.inputs or model.ACCURACY_INPUTS, "rounds": args.rounds,
                   "trials": args.trials, "tune": not args.no_tune}
        if args.batch != 1:  # (a fleet server of an older unit-tvm knows no batch)
            options["batch"] = args.batch
        if args.attention:
            options["attention"] = args.attention
        if runner is None:
            results.append(model.run_model(name, engines=engines, log=log,
                                           database=args.database, **options))
            continue
        results.append(runner.bench_model(name, engines=engines, **options))
        for engine, e in results[-1]["engines"].items():
            log(f"  {name:<13} {engine:<20} {e['min_ms']:.2f} ms (median {e['median_ms']:.2f})"
                f"  cos {e['cosine']:.5f}  threads {e['threads']}  on {results[-1]['device']}")
    where = {"target": str(runner.target() if runner else host()),
             "device": runner.name if runner else "local"}
    paths = report.write_outputs(results, args.out, where)
    if args.json:
        print(json.dumps({"results": results,
                          "geomean_speedup": model.geomean_speedups(results)}, indent=1,
                         default=str))
    else:
        text = report.summary(results)
        if text:
            print(text)
        print("wrote " + ", ".join(paths))
    return 0


def _bench_model_gpu(args, log):
    """bench-model --target cuda: fp16 on the first GPU vs PyTorch fp16 and TVM's GPU build."""
    from .bench import gpu_model  # CLI start-up

    if not tvm.cuda(0).exist:
        raise RuntimeError("bench-model --target cuda times models on a CUDA GPU and this "
                           "machine has none (unit_tvm.compile still builds for one here)")

    results, meta = gpu_model.run(args.models, rounds=args.rounds, database=args.database,
                                  tune=not args.no_tune, trials=args.trials, log=log)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_model_gpu.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    if args.json:
        print(json.dumps({"meta": meta, "results": results}, indent=1))
    else:
        print(f"geomean vs best PyTorch fp16: {meta['geomean_vs_best_pytorch_fp16']}")
        print(f"wrote {path}")
    return 0


def cmd_compile(args):
    """unit-tvm compile MODEL -o out.so: quantize (--int8), tensorize, export one library."""
    from . import compile as unit_compile  # CLI start-up

    source = sources.model_source(args.model)
    runner = runner_from_args(args)
    target = ((runner.target() if runner else host()) if args.target == "cpu" else
              tvm.target.Target({"kind": "cuda", "arch": args.arch}) if args.target == "cuda"
              else as_target(json.loads(args.target)))
    quantize = None
    if args.attention and not args.int8:
        print("unit-tvm compile: --attention applies to --int8 models", file=sys.stderr)
        return 2
    if args.int8:
        quantize = {"calibration_data": sources.calibration(args.calibration, source.input_shape),
                    "attention": args.attention}
    report = []
    ex = unit_compile(source.mod, target, quantize=quantize, database=args.database,
                      tune=args.tune, trials=args.trials, report=report, runner=runner)
    deploy.export(ex, args.output)
    done = sum(1 for _, instr, _ in report if instr)
    print(f"{source.name}: {done} of {len(report)} compute ops tensorized for {target}")
    for op, instr, reason in report:
        print(f"  {op}: {instr or 'not tensorized: ' + reason}")
    print(f"wrote {args.output} (input shape {list(source.input_shape)}); run it with "
          f"unit-tvm run {args.output} --input x.npy")
    return 0


def cmd_run(args):
    """unit-tvm run out.so --input x.npy [--output y.npy]."""


    model = load(args.library, args.device)
    out = model(*[np.load(p) for p in args.input])
    outs = out if isinstance(out, list) else [out]
    for i, o in enumerate(outs):
        print(f"output {i}: shape {list(o.shape)} dtype {o.dtype} "
              f"first {np.ravel(o)[:5].tolist()}")
    if args.output:
        np.save(args.output, outs[0])
        print(f"wrote {args.output}")
    return 0


def cmd_profile(args):
    """unit-tvm profile MODEL: per-kernel time, GOPS and % of peak of the compiled model."""
    prof = profile.profile_model(args.model, database=args.database, tune=args.tune,
                                 trials=args.trials, repeats=args.repeats,
                                 attention=args.attention, batch=args.batch,
                                 dtype="float32" if args.fp32 else "int8")
    if args.json:
        print(json.dumps({"model": prof.model, "end_to_end_ms": prof.end_to_end_ms,
                          "kernel_ms": prof.kernel_ms, "in_run_ms": prof.in_run_ms,
                          "copy_gbps": prof.copy_gbps,
                          "peaks": prof.peaks, "by_category": profile.by_category(prof),
                          "kernels": [k.__dict__ for k in prof.kernels]}, indent=1))
    else:
        print(profile.table(prof, top=args.top))
    return 0


def cmd_reproduce(args):
    """unit-tvm reproduce FIG: one of the paper's experiments, here or through a tracker."""
    from .bench import reproduce  # CLI start-up

    runner = runner_from_args(args)
    if args.local_fleet and runner is not None:
        raise ValueError("--local-fleet starts its own tracker: leave out --rpc-tracker")
    fleet = (LocalFleet([("local", None)] * args.local_fleet, threads=args.fleet_threads)
             if args.local_fleet else nullcontext())
    with fleet:
        if args.local_fleet:
            runner = RpcRunner(fleet.tracker, "local")
        try:
            paths = reproduce.run(args.fig, args.out, runner=runner, trials=args.trials,
                                  database=args.database, quick=args.quick)
        except reproduce.NotHere as e:
            print(f"unit-tvm reproduce {args.fig}: {e}", file=sys.stderr)
            return 2
    print("wrote " + ", ".join(paths))
    return 0
