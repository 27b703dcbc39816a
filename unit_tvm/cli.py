"""`unit-tvm` command line: intrinsics, peak, inspect, bench-op, bench-gpu, bench-model, compile,
run, profile, reproduce, fuzz, demo."""

import argparse
import json
import os
import sys

from . import intrinsics, ops
from .cli_llm import cmd_bench_llm
from .cli_models import cmd_bench_model, cmd_compile, cmd_profile, cmd_reproduce, cmd_run
from .fleet.cli import add_rpc_arguments, runner_from_args
from .inspector import explain, inspect
from .peak import peak
from .relax.quantization.ptq import ATTENTION
from .runner import LocalRunner, prepare_host
from .target import ISA_LEVELS, as_target, host
from .testing import ZOO_MODELS


def _cmd_intrinsics(args):
    target = host()
    rows = []
    for i in intrinsics.all():
        missing = i.missing_features(target)
        feature = " | ".join("+".join(alt) for alt in i.requires)
        rows.append({
            "name": i.name, "isa": feature,
            "dtypes": f"{','.join(i.input_dtypes)}->{i.output_dtype}",
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
    runner = runner_from_args(args)
    target = (runner or LocalRunner()).target()
    cores = int(target.attrs.get("num-cores", 1))
    names = [args.intrinsic] if args.intrinsic else [i.name for i in intrinsics.for_target(target)]
    threads = [args.threads] if args.threads else sorted({1, cores})
    rows = []
    for name in names:
        intrinsics.require(name, target)
        for t in threads:
            rows.append(peak(name, t, target, runner))
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(f"{r['intrinsic']:<18} {r['threads']} thread(s): {r['gops']:8.1f} GOPS "
                  f"(register block {r['block']}, best of 7 runs)")
    return 0


# op name -> (builder, shape parameter names, layouts)
def _inspect_ops():
    def conv2d(layout, p, a, b, acc, stride, dilation, groups):
        if layout == "nchw":
            return ops.conv2d_nchw(p["C"], p["H"], p["K"], p["R"], stride, dilation, groups, a, b)
        if layout == "nhwc":
            return ops.conv2d_nhwc(p["C"], p["H"], p["K"], p["R"], a, b)
        return ops.conv2d_nchwc(1, p["C"], p["H"], p["H"], p["K"], p["R"], p["R"], stride,
                                dilation, a_dtype=a, b_dtype=b, acc=acc)

    return {
        "dense": (lambda lay, p, a, b, acc, *_: ops.dense(p["M"], p["N"], p["K"], a, b, acc),
                  "M N K"),
        "matmul": (lambda lay, p, a, b, acc, *_: ops.matmul_bn(p["M"], p["N"], p["K"], a, b, acc),
                   "M N K"),
        "batch_matmul": (lambda lay, p, a, b, acc, *_: ops.batch_matmul(
            p["B"], p["M"], p["N"], p["K"], a, b, acc), "B M N K"),
        "conv1d": (lambda lay, p, a, b, acc, *_: ops.conv1d_ncw(p["C"], p["W"], p["K"], p["S"],
                                                                 a, b),
                   "C W K S"),
        "conv2d": (conv2d, "C H K R"),
        "conv3d": (lambda lay, p, a, b, acc, *_: ops.conv3d_ncdhw(p["C"], p["D"], p["K"], p["R"],
                                                                   a, b),
                   "C D K R"),
    }


def _cmd_inspect(args):
    builder, names = _inspect_ops()[args.op]
    values = [int(v) for v in args.shape]
    names = names.split()
    if len(values) != len(names):
        raise ValueError(f"{args.op} takes shape {' '.join(names)}, got {len(values)} numbers")
    a, b, acc = args.dtypes.split(",")
    op = builder(args.layout, dict(zip(names, values)), a, b, acc, args.stride, args.dilation,
                 args.groups)
    report = []
    for intrin in intrinsics.all():
        found = inspect(op, intrin)
        report.append({"intrinsic": intrin.name, "mappings": [str(m) for m in found],
                       "reason": None if found else explain(op, intrin)})
    if args.json:
        print(json.dumps({"op": op.op.name, "shape": dict(zip(names, values)), "report": report},
                         indent=1))
        return 0
    print(f"{args.op} ({args.layout}) {dict(zip(names, values))} {a} x {b} -> {acc}")
    for r in report:
        if r["mappings"]:
            print(f"\n{r['intrinsic']}: {len(r['mappings'])} mapping(s), best first")
            for m in r["mappings"][: args.top]:
                print("  " + m.replace("\n", "\n  "))
        else:
            print(f"\n{r['intrinsic']}: no mapping. {r['reason']}")
    return 0


def _cmd_bench_op(args):
    from .bench import op_fp32, op_level  # CLI start-up: each subcommand loads its own module

    quiet = args.json
    if args.dtype == "float32":
        rows, meta = op_fp32.run(quick=args.quick, trials=args.trials, database=args.database,
                                 log=(lambda *a: None) if quiet else print, only=args.only)
        paths = op_level.write_outputs(rows, meta, args.out, name="bench_ops_fp32",
                                       baseline="PyTorch fp32")
        print(json.dumps({"meta": meta, "rows": rows}, indent=1) if quiet
              else "wrote " + ", ".join(paths))
        return 0
    rows, meta = op_level.run(quick=args.quick, with_tvm_default=not args.no_tvm,
                              with_torch=not args.no_torch, trials=args.trials,
                              database=args.database, log=(lambda *a: None) if quiet else print,
                              progress=False if quiet else None, only=args.only,
                              runner=runner_from_args(args))
    paths = op_level.write_outputs(rows, meta, args.out)
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=1))
    else:
        print("wrote " + ", ".join(paths))
    return 0


def _cmd_bench_gpu(args):
    from .bench import gpu_ops  # CLI start-up

    quiet = args.json
    rows, meta = gpu_ops.run(dtype=args.dtype, quick=args.quick, trials=args.trials,
                             database=args.database, log=(lambda *a: None) if quiet else print,
                             progress=False if quiet else None)
    if args.out:
        gpu_ops.write_outputs(rows, meta, args.out)
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=1))
    else:
        print(f"geomean vs cuDNN fp16: {meta['geomean_vs_cudnn']}")
    return 0


def _cmd_demo(args):
    from .bench import demo  # CLI start-up

    if args.json:
        out = demo.main(log=lambda *a: None)
        print(json.dumps(out, indent=1))
    else:
        out = demo.main()
    return 0 if all(k["correct"] for k in out["kernels"]) else 1


def _cmd_fuzz(args):
    from . import fuzz  # CLI start-up

    kinds = tuple(args.kinds) if args.kinds else fuzz.KINDS
    if args.case is not None:  # one case, in this process: the reproduction of a finding
        result = fuzz.run_case(fuzz.make_case(args.seed, args.case, kinds),
                               emulate=args.emulate or "")
        print(fuzz.result_line(result))
        if result.detail and result.outcome not in fuzz.FAILURES:
            print(f"       {result.detail}")
        return 1 if result.outcome in fuzz.FAILURES else 0
    log = (lambda r: None) if args.quiet else (lambda r: print(fuzz.result_line(r), flush=True))
    report = fuzz.fuzz(args.cases, args.seed, kinds, first=args.first, workers=args.workers,
                       timeout=args.timeout, on_result=log, emulate=args.emulate or "")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.as_json(), f, indent=1)
    print(fuzz.table(report))
    return 1 if report.failures else 0


def _attention_arg(p, prefix=""):
    p.add_argument("--attention", choices=ATTENTION,
                   help=prefix + "how attention's activation x activation matmuls run (default: "
                   "long attention fused in int8 where the CPU has VNNI, the other matmuls in "
                   "bf16 where the target has a bf16 dot product, else fp32)")


def _tuning_args(p, unit):
    """--trials and --database, shared by the benchmark commands."""
    p.add_argument("--trials", type=int, help=f"most candidates measured {unit}")
    p.add_argument("--database", help="tuning database (default: $UNIT_TVM_DATABASE or "
                   "~/.cache/unit-tvm/tuning.jsonl)")


def _restrict_isa(level):
    """--isa: before any target is made, for unit-tvm and the oneDNN-based engines alike."""


    if level is None:
        return
    if level.lower() not in ISA_LEVELS:
        raise ValueError(f"--isa {level}: not one of {', '.join(ISA_LEVELS)}")
    os.environ["UNIT_TVM_ISA"] = level.lower()
    if level.lower() != "native":
        os.environ["ONEDNN_MAX_CPU_ISA"] = level.upper()
    if level.lower().startswith("avx2"):  # PyTorch's own vectorised kernels (and inductor's)
        os.environ["ATEN_CPU_CAPABILITY"] = "avx2"


def _add_op_commands(sub):
    """intrinsics, peak, inspect, bench-op, bench-gpu: single operations and instructions."""
    p = sub.add_parser("intrinsics", help="table of registered instructions and host support")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_cmd_intrinsics)
    p = sub.add_parser("peak", help="measured peak GOPS of instructions on this host")
    p.add_argument("--intrinsic", help="one instruction (default: every usable one)")
    p.add_argument("--threads", type=int, help="thread count (default: 1 and all)")
    p.add_argument("--json", action="store_true")
    add_rpc_arguments(p)
    p.set_defaults(fn=_cmd_peak)
    p = sub.add_parser("inspect", help="which instructions fit an operation, through which loops")
    p.add_argument("op", choices=sorted(_inspect_ops()))
    p.add_argument("shape", nargs="+", help="dense/matmul: M N K; batch_matmul: B M N K; "
                   "conv1d: C W K S; conv2d: C H K R (square); conv3d: C D K R")
    p.add_argument("--layout", choices=["nchw", "nhwc", "nchwc"], default="nchw",
                   help="conv2d data layout (nchwc packs 4 input / 16 output channels)")
    p.add_argument("--dtypes", default="uint8,int8,int32", help="A,B,accumulator dtypes")
    p.add_argument("--stride", type=int, default=1)
    p.add_argument("--dilation", type=int, default=1)
    p.add_argument("--groups", type=int, default=1)
    p.add_argument("--top", type=int, default=3, help="mappings shown per instruction")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_cmd_inspect)
    p = sub.add_parser("bench-op", help="Table I convs and GEMMs vs TVM and PyTorch int8")
    p.add_argument("--quick", action="store_true", help="4 convs and one GEMM")
    p.add_argument("--only", choices=("conv", "gemm", "conv3d"),
                   help="Table I convs, the GEMMs, or the ResNet-18-3D convs (UNIT Fig. 13)")
    p.add_argument("--no-tvm", action="store_true", help="skip TVM's untensorized build")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    p.add_argument("--dtype", choices=("int8", "float32"), default="int8",
                   help="float32: on the float32 multiply-add vs PyTorch fp32 (the default "
                   "configs' and the tuned ones' %% of its peak)")
    _tuning_args(p, "per workload")
    p.add_argument("--out", default="bench_out", help="folder for CSV/JSON/PNG")
    p.add_argument("--json", action="store_true")
    add_rpc_arguments(p)
    p.set_defaults(fn=_cmd_bench_op)
    p = sub.add_parser("bench-gpu", help="Table I convs on Tensor Cores vs cuDNN (needs a GPU)")
    p.add_argument("--dtype", default="float16", help="float16 (vs cuDNN fp16) or int8")
    p.add_argument("--quick", action="store_true", help="the first 4 layers")
    _tuning_args(p, "per layer")
    p.add_argument("--out", help="folder for bench_gpu_DTYPE.json and .csv")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_cmd_bench_gpu)


def _batch_arg(p):
    p.add_argument("--batch", type=int, default=1,
                   help="a zoo model's batch size (default 1; an ONNX file keeps its own)")


def _add_model_commands(sub):
    """bench-model, compile, run, profile, reproduce: whole models and the paper's figures."""
    p = sub.add_parser("bench-model", help="latency and int8 accuracy of zoo models and ONNX "
                       "files (batch 1 unless --batch)")
    p.add_argument("models", nargs="+",
                   help="zoo models (" + " ".join(ZOO_MODELS) + ") or .onnx files (one float32 "
                   "input; the PyTorch engines are skipped for them)")
    p.add_argument("--inputs", type=int, help="random inputs for the accuracy check (default: "
                   "bench.model.ACCURACY_INPUTS; top-1 agreement is noisy with few)")
    _tuning_args(p, "per distinct op")
    p.add_argument("--no-tune", action="store_true", help="database or default configs only")
    p.add_argument("--skip", action="append", help="an engine to leave out (repeatable)")
    p.add_argument("--engines", nargs="+", help="only these engines (default: all int8 ones)")
    p.add_argument("--rounds", type=int, default=10,
                   help="interleaved timing rounds (3 timed single calls per engine each)")
    _batch_arg(p)
    p.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: fp16 on the first NVIDIA GPU vs PyTorch fp16 (eager and CUDA "
                   "graph) and TVM's own GPU build")
    p.add_argument("--bf16", action="store_true",
                   help="also unit-tvm bf16 (quantize dtype=bfloat16) and PyTorch bf16 (autocast)")
    p.add_argument("--fp32", action="store_true",
                   help="the float32 table instead: unit-tvm fp32 against PyTorch fp32 (eager "
                   "and inductor), OpenVINO fp32 and ONNX Runtime fp32")
    _attention_arg(p, "unit-tvm int8: ")
    p.add_argument("--out", default="bench_out", help="folder for CSV/JSON/PNG")
    p.add_argument("--json", action="store_true")
    add_rpc_arguments(p)
    p.set_defaults(fn=cmd_bench_model)
    p = sub.add_parser("bench-llm", help="decoder LLM text generation (prefill / decode "
                       "tokens/s, batch 1) vs llama.cpp on the same weights")
    p.add_argument("model", help="an LLM shape of unit_tvm.testing.llm_zoo (llama-3.2-1b, "
                   "qwen2-1b, tiny-llama)")
    p.add_argument("--precisions", nargs="+", default=["int8"], choices=("int8", "fp32"),
                   help="unit-tvm's forms to run (default int8)")
    p.add_argument("--gguf", nargs="*", default=["q8_0"], choices=("q8_0", "q4_0"),
                   help="llama.cpp engines, one per GGUF weight type (default q8_0; none: "
                   "unit-tvm alone)")
    p.add_argument("--genai", nargs="*", default=["q8_0"], choices=("q8_0", "q4_0"),
                   help="OpenVINO GenAI engines on the same GGUF files, one per weight type "
                   "(default q8_0: int8 weights per block of 32; none: left out)")
    p.add_argument("--gguf-dir", help="folder for the GGUF files (default: a temporary one)")
    p.add_argument("--context", type=int, default=1024, help="cache positions (default 1024)")
    p.add_argument("--prefill-lengths", type=int, nargs="+", default=[128],
                   help="prompt chunk lengths compiled (default 128: longer prompts run in "
                   "chunks)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--database", help="tuning database for unit-tvm's kernels")
    p.add_argument("--profile", action="store_true",
                   help="also unit-tvm's decode step and its longest prefill chunk kernel by "
                   "kernel (time, GB/s, %% of the read bandwidth)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_bench_llm)
    p = sub.add_parser("compile", help="compile a model (zoo name, .onnx, torch.export .pt2) "
                       "to one shared library")
    p.add_argument("model", help="zoo name, ONNX file or torch.export program file (.pt2)")
    p.add_argument("-o", "--output", required=True, help="the library to write (.so)")
    p.add_argument("--int8", action="store_true", help="quantize to int8 (CPU targets)")
    p.add_argument("--calibration", help=".npz (or .npy) of calibration inputs for --int8 "
                   "(default: 4 fixed random inputs)")
    p.add_argument("--target", default="cpu",
                   help="cpu (this host), cuda (fp16, Tensor Cores) or a JSON target dict")
    p.add_argument("--arch", default="sm_80", help="CUDA architecture with --target cuda")
    _attention_arg(p, "with --int8: ")
    p.add_argument("--tune", action="store_true", help="tune what the database lacks")
    _tuning_args(p, "per distinct op")
    add_rpc_arguments(p)
    p.set_defaults(fn=cmd_compile)
    p = sub.add_parser("run", help="run a library written by `unit-tvm compile` on .npy inputs")
    p.add_argument("library")
    p.add_argument("--input", nargs="+", required=True, help=".npy file per model input")
    p.add_argument("--output", help="write the (first) output as .npy")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("profile", help="per-kernel time, GOPS and %% of peak of a compiled model")
    p.add_argument("model", help="a zoo model (" + " ".join(ZOO_MODELS) + ") or an .onnx file")
    _batch_arg(p)
    _tuning_args(p, "per distinct op")
    p.add_argument("--tune", action="store_true", help="tune what the database lacks")
    p.add_argument("--repeats", type=int, default=5, help="timed runs of each kernel call")
    p.add_argument("--top", type=int, default=25, help="kernels listed")
    p.add_argument("--fp32", action="store_true", help="the float32 model as compile builds it "
                   "without quantize (each kernel's %% of the float32 multiply-add's peak)")
    _attention_arg(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_profile)
    p = sub.add_parser("reproduce", help="one of the UNIT paper's experiments: CSV + plot")
    p.add_argument("fig", choices=("fig8", "fig9", "fig10", "fig11", "fig11-gpu", "fig12", "fig13"),
                   help="fig8 models vs engines, fig9 fp16 GPU models, fig10 Table I, "
                        "fig11 CPU ablation, fig11-gpu GPU ablation, fig12 aarch64 models "
                        "(instruction counts under qemu), fig13 ResNet-18-3D convs")
    p.add_argument("--out", default="bench_out", help="folder; the figure writes OUT/FIG/")
    p.add_argument("--quick", action="store_true", help="a few layers or models only")
    p.add_argument("--local-fleet", type=int, default=0, metavar="N",
                   help="measure through a tracker and N servers started on this machine")
    p.add_argument("--fleet-threads", type=int, default=1,
                   help="TVM threads per --local-fleet server (they share this machine)")
    _tuning_args(p, "per kernel")
    add_rpc_arguments(p)
    p.set_defaults(fn=cmd_reproduce)



def _add_tool_commands(sub):
    """fuzz and demo."""
    p = sub.add_parser("fuzz",
                       help="differential fuzzer: random te/topi ops, unit_tvm.build vs TVM")
    p.add_argument("--cases", type=int, default=200, help="how many cases (default 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--first", type=int, default=0, help="index of the first case")
    p.add_argument("--case", type=int, help="run only this case, in this process")
    p.add_argument("--kinds", nargs="+", help="kinds of op (default: every op kind); 'model' "
                   "fuzzes whole small models through quantize and the graph passes instead, "
                   "'qdq' the same models quantized by ONNX Runtime into QDQ files, "
                   "'gpu_model' the same models through the GPU path in fp16, 'speech' "
                   "conv1d front ends and torch's transformer layer as 'model' does, "
                   "'attention' attention layers of drawn spellings and sizes through the "
                   "fused kernels, against float32 attention")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    p.add_argument("--emulate", metavar="INSTRUCTION",
                   help="an instruction this CPU lacks (e.g. x86.tdpbusd.x4): compile its kernels "
                   "for a CPU that has it and check their prepared graphs here")
    p.add_argument("--quiet", action="store_true", help="only the summary")
    p.add_argument("--json", metavar="FILE", help="write every case's result to FILE")
    p.set_defaults(fn=_cmd_fuzz)
    p = sub.add_parser("demo", help="the main job: peaks, then a tensorized GEMM and conv2d")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_cmd_demo)


def main(argv=None):
    """Entry point of the `unit-tvm` console script."""
    parser = argparse.ArgumentParser(prog="unit-tvm", description=__doc__)
    parser.add_argument("--isa", help="restrict this CPU to an ISA level, e.g. avx512_core_vnni "
                        "(an AMX server measured as a VNNI-only one) or avx2; also sets "
                        "ONEDNN_MAX_CPU_ISA (and for avx2 ATEN_CPU_CAPABILITY) for the "
                        "baselines; ONNX Runtime cannot be held (bench-model says which engine "
                        "was). Same as UNIT_TVM_ISA")
    sub = parser.add_subparsers(dest="cmd", required=True)
    _add_op_commands(sub)
    _add_model_commands(sub)
    _add_tool_commands(sub)
    args = parser.parse_args(argv)
    try:
        _restrict_isa(args.isa)
        prepare_host()
        return args.fn(args)
    except (KeyError, ValueError, RuntimeError) as e:
        print(f"unit-tvm: error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
