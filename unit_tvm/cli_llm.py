"""Handler of `unit-tvm bench-llm`: a decoder LLM from the zoo compiled by unit_tvm.llm and run
against llama.cpp and OpenVINO GenAI on the same weights (the parser is in unit_tvm.cli)."""

import json

from .peak import host_threads


def _unit_tvm_engines(model, args) -> list:
    from . import llm
    from .bench.llm import UnitTvmEngine

    engines = []
    for precision in args.precisions:
        lm = llm.compile(model, {} if precision == "int8" else None, context=args.context,
                         prefill_lengths=tuple(args.prefill_lengths), database=args.database)
        per_weight = 1 if precision == "int8" else 4
        engines.append(UnitTvmEngine(f"unit-tvm {precision}", lm,
                                     lm.config.weight_bytes(per_weight)))
    return engines


def _print_profiles(engines, bandwidth: float) -> None:
    """Each unit-tvm engine's decode step and longest prefill chunk, kernel by kernel."""
    from .llm.profile import step_profile, table as profile_table

    for e in engines:
        if not e.name.startswith("unit-tvm"):
            continue
        print(f"\n{e.name} decode step, kernels by time (after a 16-token prompt):")
        print(profile_table(step_profile(e.lm, 1, bandwidth)))
        chunk = max(e.lm.step_lengths)
        depth = min(3 * chunk, e.lm.context - chunk)  # pp512's last chunk, where it fits
        if chunk > 1:
            print(f"\n{e.name} prefill chunk of {chunk} tokens, kernels by time (after a "
                  f"{depth}-token prompt):")
            print(profile_table(step_profile(e.lm, chunk, bandwidth, depth=depth)))


def cmd_bench_llm(args):
    """unit-tvm bench-llm MODEL: tokens/s table (and --json)."""
    from .bandwidth import read_bandwidth
    from .bench.engines import isa_obedience
    from .bench.llm import gguf_engines, measure, table
    from .target import isa_level
    from .testing import llm_zoo

    model = llm_zoo.get(args.model)
    threads = host_threads()
    engines = _unit_tvm_engines(model, args)
    if args.gguf or args.genai:
        engines += gguf_engines(model, args.gguf, threads, args.context, args.gguf_dir,
                                args.genai)
    del model  # the engines hold what they need
    bandwidth = read_bandwidth()
    rates = measure(engines, llm_zoo.MODELS[args.model].vocab, rounds=args.rounds)
    references = [e.name for e in engines if not e.name.startswith("unit-tvm")]
    print(f"{args.model}, batch 1, {threads} threads, median tokens/s of {args.rounds} "
          "interleaved rounds (best in brackets)")
    level = isa_level()
    for e in engines:
        if isa_obedience(e.name, level):
            print(f"  {e.name} at ISA level {level}: {isa_obedience(e.name, level)}")
    print(table(rates, engines, bandwidth, references))
    if args.profile:
        _print_profiles(engines, bandwidth)
    if args.json:
        print(json.dumps({"model": args.model, "threads": threads, "bandwidth_gbs": bandwidth,
                          "rates": {w: {n: r._asdict() if hasattr(r, "_asdict") else vars(r)
                                        for n, r in by.items()} for w, by in rates.items()}}))
    return 0
