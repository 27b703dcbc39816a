"""Operands of built kernels: random arrays per dtype, their numpy dtype, on a device (timing:
unit_tvm.timing)."""

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
