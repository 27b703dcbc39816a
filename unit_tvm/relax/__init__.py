"""Graph level: post-training quantization and the UnitTensorize pass for Relax models."""

from .quantize import find_chains, quantize, recipes
from .tensorize import UnitTensorize

__all__ = ["quantize", "UnitTensorize", "recipes", "find_chains"]
