"""Graph level: post-training quantization and the UnitTensorize pass for Relax models."""

from .chains import find_chains
from .quantize import quantize, recipes
from .tensorize import UnitTensorize

__all__ = ["quantize", "UnitTensorize", "recipes", "find_chains"]
