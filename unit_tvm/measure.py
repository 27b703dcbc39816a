"""Running and timing built kernels: random operands per dtype, TVM's time_evaluator, GOPS."""

import ml_dtypes
import numpy as np
import tvm

_INT_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "int32": (-1000, 1000), "uint32": (0, 1000)}


def numpy_dtype(dtype):
    """numpy dtype for a TVM dtype string (bfloat16 via ml_dtypes)."""
    dtype = str(dtype)
    return ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)


def random_array(shape, dtype, rng, value_range=None, extremes=True):
    """Random numpy array of a TVM dtype; integer arrays also contain both ends of their range."""
    dtype = str(dtype)
    shape = tuple(int(s) for s in shape)
    if dtype in _INT_RANGES or value_range is not None and "int" in dtype:
        lo, hi = value_range or _INT_RANGES[dtype]
        arr = rng.integers(lo, hi + 1, size=shape).astype(dtype)
        flat = arr.reshape(-1)
        if extremes and flat.size >= 2:
            flat[0], flat[-1] = lo, hi
            if flat.size >= 4 and lo < 0 <= hi:
                flat[1] = 0
        return arr
    return rng.standard_normal(shape).astype(numpy_dtype(dtype))


def to_device(arrays, dev):
    """numpy arrays -> tvm runtime tensors on dev."""
    return [tvm.runtime.tensor(a, dev) for a in arrays]


def round_seconds(lib, args, dev, *, number=10, repeat=5, func="main"):
    """Per-call seconds of each of `repeat` rounds of `number` calls (after one warm-up call)."""
    lib(*args)
    timer = lib.time_evaluator(func, dev, number=number, repeat=repeat)
    return list(timer(*args).results)


def best_seconds(lib, args, dev, *, number=10, repeat=5, func="main"):
    """Minimum over `repeat` runs of the mean time of `number` calls (after one warm-up call)."""
    return min(round_seconds(lib, args, dev, number=number, repeat=repeat, func=func))
