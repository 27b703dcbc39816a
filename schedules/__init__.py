"""Strategies that organise the loops around a tensorized core (cpu, gpu)."""

from ..target import is_gpu
from . import cpu, gpu


def for_target(target):
    """The strategy module for a tvm.target.Target: gpu for CUDA, cpu otherwise.

    Every strategy offers default(prepared, target), space(prepared, target),
    features(config, prepared, target), from_key(dict) and its Config's key().
    """
    return gpu if is_gpu(target) else cpu
