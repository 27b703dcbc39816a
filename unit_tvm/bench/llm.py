"""bench-llm: text generation with a decoder LLM, batch 1 — prefill and decode tokens/s of
unit-tvm int8 against llama.cpp (Q8_0 / Q4_0 GGUF written from the same weights), with every
engine's workloads interleaved round by round, and decode's effective GB/s against the host's
measured read bandwidth."""

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..timing import quiesce

# (name, prompt tokens, generated tokens): llama-bench's pp / tg, and decode at a depth
WORKLOADS = (("pp128", 128, 0), ("pp512", 512, 0), ("tg128", 1, 128), ("tg128@512", 512, 128))


class UnitTvmEngine:
    """unit_tvm.llm's DecoderLM as a benchmark engine."""

    def __init__(self, name, lm, weight_bytes: float):
        self.name, self.lm, self.weight_bytes = name, lm, weight_bytes

    def prefill(self, ids) -> None:
        self.lm.reset()
        self.lm.prefill(ids)

    def decode(self, token: int) -> None:
        self.lm.decode(token)


class LlamaCppEngine:
    """llama.cpp through llama-cpp-python, fed token ids (its thread counts set explicitly)."""

    def __init__(self, name, path, threads: int, context: int, weight_bytes: float):
        from llama_cpp import Llama  # the benchmark extra

        self.name, self.weight_bytes = name, weight_bytes
        self.llm = Llama(model_path=str(path), n_ctx=context, n_batch=512, n_ubatch=512,
                         n_threads=threads, n_threads_batch=threads, verbose=False)

    def prefill(self, ids) -> None:
        self.llm.reset()
        self.llm.eval([int(t) for t in ids])

    def decode(self, token: int) -> None:
        self.llm.eval([int(token)])


@dataclass(frozen=True)
class Rate:
    """Tokens per second of one engine on one workload, over the rounds."""

    median: float
    best: float
    rounds: int


def _once(engine, prompt: np.ndarray, generated: int) -> float:
    """Tokens/s of one run: the prompt's prefill, or (generated > 0) the decode steps after it."""
    if not generated:
        t0 = time.perf_counter()
        engine.prefill(prompt)
        return len(prompt) / (time.perf_counter() - t0)
    engine.prefill(prompt)
    token = int(prompt[-1])
    t0 = time.perf_counter()
    for i in range(generated):
        engine.decode((token + i) % 256)
    return generated / (time.perf_counter() - t0)


def measure(engines, vocab: int, rounds: int = 3, workloads=WORKLOADS, seed: int = 0) -> dict:
    """{workload: {engine name: Rate}}: each round runs every workload on every engine, the
    engines' order rotated; each engine warmed up once per workload first."""
    rng = np.random.default_rng(seed)
    prompts = {w: rng.integers(0, vocab, n) for w, n, _ in workloads}
    for w, _, gen in workloads:
        for e in engines:
            _once(e, prompts[w], min(gen, 4))
    samples = {w: {e.name: [] for e in engines} for w, _, _ in workloads}
    for r in range(rounds):
        order = engines[r % len(engines):] + engines[:r % len(engines)]
        for w, _, gen in workloads:
            for e in order:
                quiesce()  # the other engine's worker threads stop spinning first
                samples[w][e.name].append(_once(e, prompts[w], gen))
    return {w: {n: Rate(statistics.median(s), max(s), len(s)) for n, s in by.items()}
            for w, by in samples.items()}


def gguf_engines(model, qtypes, threads: int, context: int, folder=None) -> list:
    """llama.cpp engines over GGUF files of `model` in each of `qtypes`."""
    from . import gguf_export
    from ..llm.config import from_hf

    cfg = from_hf(model)
    folder = Path(folder or tempfile.mkdtemp(prefix="unit_tvm_gguf_"))
    per_weight = {"q8_0": 34 / 32, "q4_0": 18 / 32}  # bytes per weight with the block scale
    engines = []
    for qt in qtypes:
        path = gguf_export.write(model, folder / f"model-{qt}.gguf", qt)
        engines.append(LlamaCppEngine(f"llama.cpp {qt.upper()}", path, threads, context,
                                      cfg.weight_bytes(per_weight[qt])))
    return engines


def table(rates: dict, engines, bandwidth_gbs: float, reference: str) -> str:
    """The results as text: tokens/s (median of the rounds, best in brackets), unit-tvm's ratio
    to `reference`, and decode's GB/s of weights read and its % of the read bandwidth."""
    names = [e.name for e in engines]
    ratio_head = f"   unit-tvm/{reference}" if reference else ""  # no baseline: no ratio
    lines = ["workload     " + "".join(f"{n:>24}" for n in names) + ratio_head]
    for w, by in rates.items():
        cells = "".join(f"{by[n].median:>15.1f} ({by[n].best:6.1f})" for n in names)
        ratio = f"   {by[names[0]].median / by[reference].median:.2f}x" if reference in by else ""
        lines.append(f"{w:<13}{cells}{ratio}")
    lines.append(f"decode weights read per token, GB/s at tg128's median (read bandwidth "
                 f"{bandwidth_gbs:.1f} GB/s):")
    for e in engines:
        gbs = e.weight_bytes * rates["tg128"][e.name].median / 1e9 if "tg128" in rates else 0
        lines.append(f"  {e.name:<22} {e.weight_bytes / 1e9:6.2f} GB/token  {gbs:6.1f} GB/s  "
                     f"{100 * gbs / bandwidth_gbs:5.1f}%")
    return "\n".join(lines)
