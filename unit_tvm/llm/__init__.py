"""Decoder LLMs (Llama / Qwen2 / Mistral shapes) with a key/value cache: `compile` a Hugging
Face model, then `generate` text with the returned DecoderLM."""

from .build import compile  # noqa: A004 - unit_tvm.llm.compile is the public name
from .config import DecoderConfig
from .runtime import DecoderLM, StepOutput

__all__ = ["compile", "DecoderConfig", "DecoderLM", "StepOutput"]
