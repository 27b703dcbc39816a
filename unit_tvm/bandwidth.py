"""The host's measured memory bandwidth, with TVM kernels: a parallel copy (what `profile`
compares each kernel's traffic with) and a read of a buffer larger than any cache (the bound of
a kernel that streams its operands once: an LLM's decode step reads every weight per token)."""

import numpy as np
import tvm
from tvm import s_tir, te

from . import lowering
from .runner import prepare_host
from .target import as_target
from .timing import evaluator_rounds

_LANES = 16  # float32 lanes of one accumulator row: 64 bytes per add, far from the ALU bound


def copy_bandwidth(target=None, mbytes: int = 64) -> float:
    """GB/s (read + write) of a parallel vectorised fp32 copy of `mbytes` MB."""
    n = mbytes * (1 << 20) // 4
    a = te.placeholder((n // 64, 64), "float32", name="a")
    b = te.compute(a.shape, lambda i, j: a[i, j], name="b")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    i, j = sch.get_loops(sch.get_sblock("b"))
    sch.parallel(i)
    sch.vectorize(j)
    lib = lowering.build(sch.mod, as_target(target))
    dev = tvm.cpu()
    shape = (n // 64, 64)
    args = [tvm.runtime.tensor(np.ones(shape, np.float32), dev),
            tvm.runtime.tensor(np.zeros(shape, np.float32), dev)]
    secs = min(evaluator_rounds(lib, args, dev, number=3, repeat=5))
    return 2 * 4 * n / secs / 1e9


def _sum_kernel(rows: int, depth: int, target):
    """out[r, v] = sum_k a[r, k, v]: each row streamed once, rows split over the threads."""
    a = te.placeholder((rows, depth, _LANES), "float32", name="a")
    k = te.reduce_axis((0, depth), name="k")
    out = te.compute((rows, _LANES), lambda r, v: te.sum(a[r, k, v], axis=k), name="out")
    sch = s_tir.Schedule(te.create_prim_func([a, out]))
    block = sch.get_sblock("out")
    r, v, kk = sch.get_loops(block)
    sch.reorder(r, kk, v)
    sch.parallel(r)
    sch.vectorize(v)
    return lowering.build(sch.mod, target)


def read_bandwidth(target=None, megabytes: int = 512, repeat: int = 5) -> float:
    """GB/s of the fastest of `repeat` full reads of a `megabytes` buffer (larger than any
    cache), with the thread count unit-tvm's kernels use."""
    target = as_target(target)
    prepare_host()
    rows = 64  # a multiple of any thread count up to 64
    depth = megabytes * (1 << 20) // (rows * _LANES * 4)
    lib = _sum_kernel(rows, depth, target)
    dev = tvm.cpu()
    a = tvm.runtime.tensor(np.ones((rows, depth, _LANES), np.float32), dev)
    out = tvm.runtime.tensor(np.zeros((rows, _LANES), np.float32), dev)
    seconds = min(evaluator_rounds(lib, [a, out], dev, number=1, repeat=repeat))
    return rows * depth * _LANES * 4 / seconds / 1e9
