"""Tensor operations written with te.compute: the workloads of make run, tests and benchmarks.

Nothing here is special to the Inspector: it accepts any te.compute; these are just the layouts
a quantized model uses (activations u8, weights s8, NCHW[x]c / KCRS[y]k[x]c packing).
"""

from tvm import te


def dense_packed(m, n, k, lanes=16, width=4, a_dtype="uint8", b_dtype="int8", acc="int32"):
    """C[i, j] = sum_k A[i, k] * B[j, k] with B packed as [n/lanes, k/width, lanes, width]."""
    a = te.placeholder((m, k), a_dtype, name="A")
    b = te.placeholder((n // lanes, k // width, lanes, width), b_dtype, name="B")
    r = te.reduce_axis((0, k), name="k")
    return te.compute(
        (m, n),
        lambda i, j: te.sum(
            a[i, r].astype(acc) * b[j // lanes, r // width, j % lanes, r % width].astype(acc),
            axis=r),
        name="dense",
    )


def dense(m, n, k, a_dtype="uint8", b_dtype="int8", acc="int32"):
    """C[i, j] = sum_k A[i, k] * B[j, k] (B row-major [n, k], as in nn.Linear)."""
    a = te.placeholder((m, k), a_dtype, name="A")
    b = te.placeholder((n, k), b_dtype, name="B")
    r = te.reduce_axis((0, k), name="k")
    return te.compute((m, n), lambda i, j: te.sum(a[i, r].astype(acc) * b[j, r].astype(acc),
                                                  axis=r), name="dense")


def conv2d_nchwc(n, c, h, w, k, r, s, stride=1, dilation=1, x=4, y=16,
                 a_dtype="uint8", b_dtype="int8", acc="int32"):
    """conv2d, data NCHW[x]c, kernel KCRS[y]k[x]c, output NCHW[y]c, no padding.

    data: [n, c/x, h, w, x]; kernel: [k/y, c/x, r, s, y, x]; out: [n, k/y, oh, ow, y].
    """
    oh = (h - (r - 1) * dilation - 1) // stride + 1
    ow = (w - (s - 1) * dilation - 1) // stride + 1
    data = te.placeholder((n, c // x, h, w, x), a_dtype, name="data")
    kern = te.placeholder((k // y, c // x, r, s, y, x), b_dtype, name="kernel")
    rc = te.reduce_axis((0, c), name="rc")
    rr = te.reduce_axis((0, r), name="rr")
    rs = te.reduce_axis((0, s), name="rs")
    return te.compute(
        (n, k // y, oh, ow, y),
        lambda b, ko, i, j, ki: te.sum(
            data[b, rc // x, i * stride + rr * dilation, j * stride + rs * dilation, rc % x]
            .astype(acc)
            * kern[ko, rc // x, rr, rs, ki, rc % x].astype(acc),
            axis=[rc, rr, rs]),
        name="conv2d_nchwc",
    )
