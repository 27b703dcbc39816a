"""Where a step's time goes (the decode step, or a prefill chunk): each kernel timed on its real
arguments (first call of each, as in the step: the weights come from memory, not from a cache
warmed by a repeat), with the bytes it reads and writes as GB/s and % of the read bandwidth."""

from typing import NamedTuple

import numpy as np

from ..timing import CallTimer
from .runtime import DecoderLM


class KernelCost(NamedTuple):
    """One kernel's share of a decode step."""

    name: str
    calls: int  # per step
    us: float  # per step (all its calls), the least over the profiled steps
    share: float  # of the summed kernel time
    gbs: float  # its arguments' bytes per second
    bandwidth_share: float  # gbs / the read bandwidth


def decode_profile(lm: DecoderLM, bandwidth_gbs: float, depth: int = 16,
                   steps: int = 3) -> list[KernelCost]:
    """KernelCost per kernel of `lm`'s decode step after a `depth`-token prompt, largest first
    (the least of `steps` steps per kernel)."""
    return step_profile(lm, 1, bandwidth_gbs, depth, steps)


def step_profile(lm: DecoderLM, tokens: int, bandwidth_gbs: float, depth: int = 16,
                 steps: int = 3) -> list[KernelCost]:
    """KernelCost per kernel of `lm`'s step of `tokens` tokens (1: decode; a compiled prefill
    chunk length) after a `depth`-token prompt, largest first (the least of `steps` steps per
    kernel, each from the same cache)."""
    if tokens not in lm.step_lengths:
        raise ValueError(f"no step of {tokens} tokens: compiled {lm.step_lengths}")
    ids = np.arange(depth + tokens) % lm.config.vocab
    # the step's kernels, and the LM head's (run after the step: decode, a prompt's last chunk)
    vms = {"": lm.step_vm(tokens), "lm_head/": lm.head_vm()}
    best: dict[str, tuple[float, int, int]] = {}
    for _ in range(steps):
        lm.reset()
        if depth:
            lm.prefill(ids[:depth])
        recorders = {prefix: CallTimer(1) for prefix in vms}
        for prefix, vm in vms.items():
            vm.set_instrument(recorders[prefix])
        try:
            lm.prefill(ids[depth:]) if tokens > 1 else lm.decode(int(ids[depth]))
        finally:
            for vm in vms.values():
                vm.set_instrument(None)
        for prefix, recorder in recorders.items():
            for sym, secs in recorder.firsts.items():
                old = best.get(prefix + sym)
                nbytes = recorder.nbytes[sym] * recorder.calls[sym]
                if old is None or secs < old[0]:
                    best[prefix + sym] = (secs, recorder.calls[sym], nbytes)
    total = sum(s for s, _, _ in best.values()) or 1.0
    costs = [KernelCost(sym, calls, 1e6 * s, s / total, nbytes / s / 1e9,
                        nbytes / s / 1e9 / bandwidth_gbs)
             for sym, (s, calls, nbytes) in best.items()]
    return sorted(costs, key=lambda c: -c.us)


def table(costs: list[KernelCost], top: int = 8) -> str:
    """The largest `top` kernels as text."""
    lines = [f"{'kernel':<44}{'calls':>6}{'us/step':>10}{'share':>8}{'GB/s':>8}{'% bw':>7}"]
    for c in costs[:top]:
        lines.append(f"{c.name[:43]:<44}{c.calls:>6}{c.us:>10.0f}{100 * c.share:>7.1f}%"
                     f"{c.gbs:>8.1f}{100 * c.bandwidth_share:>6.0f}%")
    return "\n".join(lines)
