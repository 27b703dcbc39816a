"""unit_tvm.llm.compile: a Hugging Face decoder -> a DecoderLM whose step functions are built by
unit_tvm.compile (float32 matmuls on the host's multiply-add instruction, or int8 ones on its
int8 instruction, attention and the rest on TVM's schedules)."""

from .. import compiler
from . import calibration, config as config_mod, weights as weights_mod
from .graph import PER_TOKEN, head_module, step_module
from .runtime import DecoderLM

QUANTIZE_KEYS = ("calibration_data", "activations")
ACTIVATIONS = ("per_token", "per_tensor")  # the first is the default


def _activations(quantize: dict | None) -> str:
    """How the int8 form quantizes activations: quantize's "activations", or the default."""
    return (quantize or {}).get("activations", ACTIVATIONS[0])
DEFAULT_PREFILL = (128,)


def _check(quantize, context, prefill_lengths):
    if quantize is not None and not isinstance(quantize, dict):
        raise TypeError(f"unit_tvm.llm.compile: quantize must be None or a dict, "
                        f"got {type(quantize).__name__}")
    unknown = set(quantize or {}) - set(QUANTIZE_KEYS)
    if unknown:
        raise TypeError(f"unit_tvm.llm.compile: unknown quantize keys {sorted(unknown)} "
                        f"(known: {QUANTIZE_KEYS})")
    activations = _activations(quantize)
    if activations not in ACTIVATIONS:
        raise ValueError(f"unit_tvm.llm.compile: activations must be one of {ACTIVATIONS}, "
                         f"got {activations!r}")
    if not isinstance(context, int) or context < 2:
        raise ValueError(f"context must be an int >= 2, got {context!r}")
    if any(not isinstance(t, int) or t < 2 for t in prefill_lengths):
        raise ValueError(f"prefill_lengths must be ints >= 2, got {prefill_lengths!r}")


def compile(model, quantize: dict | None = None, *, target=None,  # noqa: A001
            context: int = 1024, prefill_lengths=DEFAULT_PREFILL, rope_layout: str = "half",
            database=None, tune: bool = False, trials: int | None = None,
            report: list | None = None) -> DecoderLM:
    """Compile a Hugging Face LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM.

    quantize: None computes in float32; a dict quantizes every matmul with a weight to int8,
    weights per output channel, activations as {"activations": ...} says: "per_token" (the
    default: each token's row scaled to [-127, 127] at run time) or "per_tensor" (one uint8
    scale per input, observed on {"calibration_data": [token id arrays]}, random prompts by
    default).
    context: cache positions (prompt + generated tokens); prefill_lengths: the prompt chunk
    lengths compiled besides the one-token decode step (those longer than context are
    dropped). rope_layout: "half" (Hugging Face's) or "interleaved" (pairs 2i, 2i+1: weights
    laid out as in Meta's original checkpoints). database / tune / trials / report: as
    unit_tvm.compile, for every step function.
    """
    prefill_lengths = tuple(prefill_lengths)
    _check(quantize, context, prefill_lengths)
    cfg = config_mod.from_hf(model, rope_layout)
    if cfg.sliding_window is not None and context > cfg.sliding_window:
        # within the window, sliding-window attention is full attention; past it, it is not
        raise ValueError(f"unit_tvm.llm: context {context} exceeds the model's sliding window "
                         f"of {cfg.sliding_window} (sliding-window attention is not built)")
    weights = weights_mod.from_hf(model)
    act_q = None
    if quantize is not None and _activations(quantize) == "per_token":
        act_q = dict.fromkeys(weights_mod.input_names(cfg.layers), PER_TOKEN)
    elif quantize is not None:
        prompts = quantize.get("calibration_data") or calibration.default_prompts(
            cfg.vocab, min(64, context))
        act_q = calibration.activation_quantization(model, prompts)
    lengths = sorted({1, *(t for t in prefill_lengths if t <= context)})
    executables = {}
    for tokens in lengths:
        mod = step_module(cfg, weights, tokens, context, act_q, target)
        executables[tokens] = compiler.compile(mod, target, database=database, tune=tune,
                                               trials=trials, report=report)
        del mod  # its float32 constants: the next step's module is built next
    head = compiler.compile(head_module(cfg, weights, act_q, target), target,
                            database=database, tune=tune, trials=trials, report=report)
    return DecoderLM(cfg, weights.embed, executables, head, context)
