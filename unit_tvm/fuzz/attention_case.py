"""Run one attention case (model_cases.attention_params): the layer quantized with quantize's
default attention (long attention one fused kernel, int8 where relax/cpu/attention_check.py
allows, else bf16; shorter attention as separate kernels), tensorized and built, against the
same layer quantized with float32 attention and built by TVM (model_check.run_model_case).

Both quantize the projections alike; the fused kernels' rounding adds to that (the int8
kernel's stays within the guard's cosine of 0.999 on the calibration inputs), while an operand
read through a wrong view, a head or a token out of place, is as far off as the values are.
"""

import contextlib

from .model_check import Comparison, run_model_case
from ..schedules import cpu_attention

# how far the default attention may move the layer from the one with float32 attention
# (relative L2): as far as quantizing the projections moved it, and at least 0.1 (the int8
# kernel's guard allows 0.045 on the attention's own output). Over the first 60 cases of seed
# 0 on Zen 5: at most 1.34 times that and 0.047; a head or token out of place is ~1.
ATTENTION_SHARE = 1.0
ATTENTION_FLOOR = 0.1


@contextlib.contextmanager
def _size_policy(case):
    """cpu_attention.MIN_SCORES_BYTES at 0 inside where the case lifts it (fuse_any_size): the
    policy is about speed, and most drawn sizes are below it."""

    kept = cpu_attention.MIN_SCORES_BYTES
    cpu_attention.MIN_SCORES_BYTES = 0 if case.param("fuse_any_size") else kept
    try:
        yield
    finally:
        cpu_attention.MIN_SCORES_BYTES = kept


FLOAT_ATTENTION = Comparison("float32 attention", "fp32", ATTENTION_SHARE, ATTENTION_FLOOR,
                             _size_policy)


def run_attention_case(case, target=None):
    """model_check.run_model_case against the layer with float32 attention (a CaseResult)."""
    return run_model_case(case, target, FLOAT_ATTENTION)
