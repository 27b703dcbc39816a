"""A dlight rule for reductions over a small window per output: depthwise convs, pooling.

TVM's GeneralReduction rule gives every output element a thread block and spreads its
reduction over the block's threads; for a depthwise 3x3 conv that is 256 threads summing 9
products, one block per output pixel and channel (mobilenet_v2's first depthwise conv ran
360 us on an H200, 57% of the model in its depthwise convs). Here each thread computes whole
outputs with the window's loop unrolled, consecutive threads on consecutive outputs (the
channels, innermost in NHWC, so the reads coalesce), and the fused elementwise ops after the
reduction run in the same thread on its result.
"""

import math

from tvm import s_tir, tirx
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline

# products summed per output at most (a 7x7 window is 49)
MAX_WINDOW = 64
# outputs at least: below, the reduction rules' threads per output pay off
MIN_OUTPUTS = 4096
THREADS = 256


def _extent(loops, sch):
    extents = [sch.get(loop).extent for loop in loops]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        return None
    return math.prod(int(e) for e in extents)


class WindowReduction(GPUScheduleRule):
    """One thread per output for a PrimFunc whose single reduction sums at most MAX_WINDOW
    values into each of at least MIN_OUTPUTS outputs; its elementwise consumers computed by the
    same thread. Other functions are left to the rules after it (None)."""

    def apply(self, func, target, _tunable):  # noqa: D102 - dlight's interface
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        infos = try_inline(sch, infos)
        reductions = [b for b in infos if b.is_reduction()]
        if len(reductions) != 1 or infos[0] is not reductions[0]:
            return None  # a producer that could not be inlined, or several reductions
        red = reductions[0]
        kinds = red.dom_kind()
        if "O" in kinds or any(not b.is_injective() for b in infos[1:]):
            return None
        loops = sch.get_loops(red.block_rv)
        spatial = [lp for lp, k in zip(loops, kinds) if k == "S"]
        window = [lp for lp, k in zip(loops, kinds) if k == "R"]
        outputs, products = _extent(spatial, sch), _extent(window, sch)
        if not spatial or outputs is None or products is None:
            return None
        if products > MAX_WINDOW or outputs < MIN_OUTPUTS:
            return None
        sch.reorder(*spatial, *window)
        bx, tx = sch.split(sch.fuse(*spatial), [None, THREADS])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        for loop in window:
            sch.unroll(loop)
        # the sum in a register, written once per output after its window (through the
        # consumers where there are any)
        consumers = [b.block_rv for b in infos[1:]]
        if consumers:
            sch.set_scope(red.block_rv, 0, "local")
        else:  # the function's output: a copy from the register
            consumers = [sch.cache_write(red.block_rv, 0, "local")]
        for consumer in consumers:
            sch.reverse_compute_at(consumer, tx, preserve_unit_loops=True)
        sch.decompose_reduction(red.block_rv, window[0])
        return sch
