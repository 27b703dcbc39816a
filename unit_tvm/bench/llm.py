"""bench-llm: text generation with a decoder LLM, batch 1 — prefill and decode tokens/s of
unit-tvm int8 against llama.cpp and OpenVINO GenAI (both reading a Q8_0 / Q4_0 GGUF file written
from the same weights), with every engine's workloads interleaved round by round, and decode's
effective GB/s against the host's measured read bandwidth."""

import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..timing import quiesce

# (name, prompt tokens, generated tokens): llama-bench's pp / tg, and decode at a depth
WORKLOADS = (("pp128", 128, 0), ("pp512", 512, 0), ("tg128", 1, 128), ("tg128@512", 512, 128))


class StepEngine:
    """An engine driven a step at a time: `prefill(ids)` from an empty cache, then
    `decode(token)` per generated token; `rate` times them."""

    def prefill(self, ids: np.ndarray) -> None:
        raise NotImplementedError

    def decode(self, token: int) -> None:
        raise NotImplementedError

    def rate(self, prompt: np.ndarray, generated: int) -> float:
        """Tokens/s of one run: the prompt's prefill, or (generated > 0) the decode steps
        after it."""
        if not generated:
            t0 = time.perf_counter()
            self.prefill(prompt)
            return len(prompt) / (time.perf_counter() - t0)
        self.prefill(prompt)
        token = int(prompt[-1])
        t0 = time.perf_counter()
        for i in range(generated):
            self.decode((token + i) % 256)
        return generated / (time.perf_counter() - t0)


class UnitTvmEngine(StepEngine):
    """unit_tvm.llm's DecoderLM as a benchmark engine."""

    def __init__(self, name, lm, weight_bytes: float):
        self.name, self.lm, self.weight_bytes = name, lm, weight_bytes

    def prefill(self, ids) -> None:
        self.lm.reset()
        self.lm.prefill(ids)

    def decode(self, token: int) -> None:
        self.lm.decode(token)


class LlamaCppEngine(StepEngine):
    """llama.cpp through llama-cpp-python, fed token ids (its thread counts set explicitly)."""

    def __init__(self, name, path, threads: int, context: int, weight_bytes: float):
        from contextlib import nullcontext

        from llama_cpp import Llama  # the benchmark extra

        from . import llama_buffers

        buffers = nullcontext()
        if not llama_buffers.extra_buffers_run(path, threads):
            print(f"{name}: llama.cpp's AMX weight buffers crash on this host "
                  "(ggml-org/llama.cpp#20824): loaded without extra buffer types",
                  file=sys.stderr)
            name, buffers = f"{name} no AMX", llama_buffers.without_extra_buffers()
        self.name, self.weight_bytes = name, weight_bytes
        with buffers:
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


class OpenVinoGenAiEngine:
    """OpenVINO GenAI's LLMPipeline on a GGUF file (it keeps Q8_0's int8 weights per block of 32,
    Q4_0's int4), greedy, fed token ids. GenAI generates on its own, so a run is one `generate`
    call: prefill = a prompt and one new token, timed whole; decode = `generated` tokens after
    the prompt, timed whole, less the first token's latency as GenAI reports it."""

    def __init__(self, name: str, path: Path, threads: int, weight_bytes: float):
        import openvino_genai  # the benchmark extra

        self.name, self.weight_bytes = name, weight_bytes
        self.pipe = openvino_genai.LLMPipeline(str(path), "CPU", INFERENCE_NUM_THREADS=threads)

    def generate(self, prompt: np.ndarray, new_tokens: int) -> tuple:
        """(GenAI's result, seconds of the whole call): `new_tokens` greedy tokens after
        `prompt`, the end-of-text token ignored."""
        import openvino as ov
        import openvino_genai

        config = openvino_genai.GenerationConfig()
        config.max_new_tokens, config.min_new_tokens = new_tokens, new_tokens
        config.ignore_eos, config.do_sample = True, False
        ids = np.asarray(prompt, np.int64)[None, :]
        inputs = openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        t0 = time.perf_counter()
        result = self.pipe.generate(inputs, config)
        return result, time.perf_counter() - t0

    def rate(self, prompt: np.ndarray, generated: int) -> float:
        if not generated:
            return len(prompt) / self.generate(prompt, 1)[1]
        result, seconds = self.generate(prompt, generated)
        first = result.perf_metrics.get_ttft().mean / 1e3  # ms
        return (generated - 1) / (seconds - first)


def measure(engines, vocab: int, rounds: int = 3, workloads=WORKLOADS, seed: int = 0) -> dict:
    """{workload: {engine name: Rate}}: each round runs every workload on every engine, the
    engines' order rotated; each engine warmed up once per workload first."""
    rng = np.random.default_rng(seed)
    prompts = {w: rng.integers(0, vocab, n) for w, n, _ in workloads}
    for w, _, gen in workloads:
        for e in engines:
            e.rate(prompts[w], min(gen, 4))
    samples = {w: {e.name: [] for e in engines} for w, _, _ in workloads}
    for r in range(rounds):
        order = engines[r % len(engines):] + engines[:r % len(engines)]
        for w, _, gen in workloads:
            for e in order:
                quiesce()  # the other engine's worker threads stop spinning first
                samples[w][e.name].append(e.rate(prompts[w], gen))
    return {w: {n: Rate(statistics.median(s), max(s), len(s)) for n, s in by.items()}
            for w, by in samples.items()}


def gguf_engines(model, qtypes: Sequence[str], threads: int, context: int,
                 folder: str | None = None, genai: Sequence[str] = ()) -> list:
    """llama.cpp engines over GGUF files of `model` in each of `qtypes`, and OpenVINO GenAI
    engines over the same files for each of `genai`."""
    from . import gguf_export, llama_isa
    from .engines import isa_obedience
    from ..llm.config import from_hf
    from ..target import isa_level

    cfg = from_hf(model)
    folder = Path(folder or tempfile.mkdtemp(prefix="unit_tvm_gguf_"))
    folder.mkdir(parents=True, exist_ok=True)  # a --gguf-dir not made yet
    per_weight = {"q8_0": 34 / 32, "q4_0": 18 / 32}  # bytes per weight with the block scale
    engines: list = []
    level = isa_level()
    if genai and llama_isa.is_held(level):
        print(f"OpenVINO GenAI left out at ISA level {level}: "
              f"{isa_obedience('OpenVINO GenAI', level)}", file=sys.stderr)
        genai = ()
    if qtypes:  # before llama_cpp is imported: the build held to --isa, where it holds back
        llama_isa.use_build_for(level)
    paths = {}
    for qt in dict.fromkeys((*qtypes, *genai)):
        paths[qt] = gguf_export.write(model, folder / f"model-{qt}.gguf", qt)
    for qt in qtypes:
        engines.append(LlamaCppEngine(f"llama.cpp {qt.upper()}", paths[qt], threads, context,
                                      cfg.weight_bytes(per_weight[qt])))
    for qt in genai:
        engines.append(OpenVinoGenAiEngine(f"OpenVINO GenAI {qt.upper()}", paths[qt], threads,
                                           cfg.weight_bytes(per_weight[qt])))
    return engines


def table(rates: dict, engines, bandwidth_gbs: float, references=()) -> str:
    """The results as text: tokens/s (median of the rounds, best in brackets), the first
    engine's ratio to each of `references`, and decode's GB/s of weights read and its % of
    the read bandwidth."""
    names = [e.name for e in engines]
    refs = [r for r in references if r in names]
    lines = ["workload     " + "".join(f"{n:>24}" for n in names)
             + "".join(f"   {names[0]} / {r}" for r in refs)]
    for w, by in rates.items():
        cells = "".join(f"{by[n].median:>15.1f} ({by[n].best:6.1f})" for n in names)
        ratios = "".join(f"{by[names[0]].median / by[r].median:>{len(names[0]) + len(r) + 6}.2f}x"
                         for r in refs)
        lines.append(f"{w:<13}{cells}{ratios}")
    lines.append(f"decode weights read per token, GB/s at tg128's median (read bandwidth "
                 f"{bandwidth_gbs:.1f} GB/s):")
    for e in engines:
        gbs = e.weight_bytes * rates["tg128"][e.name].median / 1e9 if "tg128" in rates else 0
        lines.append(f"  {e.name:<22} {e.weight_bytes / 1e9:6.2f} GB/token  {gbs:6.1f} GB/s  "
                     f"{100 * gbs / bandwidth_gbs:5.1f}%")
    return "\n".join(lines)
