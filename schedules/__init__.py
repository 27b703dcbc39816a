"""Strategies that organise the loops around a tensorized core (cpu, gpu); each module matches
the `Strategy` protocol of schedules/base.py."""

import tvm

from ..target import is_gpu
from . import cpu, gpu
from .base import Config, Strategy


def for_target(target: tvm.target.Target) -> Strategy:
    """The strategy for a tvm.target.Target: gpu for CUDA, cpu otherwise."""
    return gpu if is_gpu(target) else cpu


__all__ = ["Config", "Strategy", "cpu", "for_target", "gpu"]
