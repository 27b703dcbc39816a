"""Index expressions of te.compute bodies: which loops they use, their values, and exact facts
about how they move inside one instruction tile; and the row-major ravel / unravel of an index
that reads a tensor of one shape as another (a view's batch axes, a flattened head index).

The Inspector's claims that decide correctness (an operand is one value across a tile's lanes;
a tile's reads are one dense block) are decided here over *every* tile of the loop, with numpy,
never on a few sample tiles: a grouped conv's data[f // 35 * 8 + rc] is constant on the first
tile of 16 lanes and not on the third.
"""

from typing import NamedTuple

import numpy as np

_BINARY = ("Add", "Sub", "Mul", "Div", "Mod", "FloorDiv", "FloorMod", "Min", "Max")
# most points an exact check enumerates before it answers conservatively
MAX_POINTS = 1 << 22


class TileMovement(NamedTuple):
    """How an operand moves inside the tiles of one loop (see tile_offsets)."""

    offsets: np.ndarray  # [tile, t, *other loops]: element address minus the tile origin's
    per_dim: list  # per index dimension: the same for that index alone (None: loop not used)
    real: np.ndarray  # same shape: False past the loop's extent (those are 0 above)


class NotAffine(ValueError):
    """An index expression uses something other than integer arithmetic on loop variables."""


def ravel(index, dims):
    """The row-major flat index of `index` (ints or TIR expressions) over `dims`."""
    flat = None
    for i, n in zip(index, dims):
        flat = i if flat is None else flat * int(n) + i
    return 0 if flat is None else flat


def unravel(flat, dims) -> list:
    """The row-major index over `dims` of the flat index `flat`, which lies within their
    product (an int or a TIR expression: // and % are TVM's floor division and modulo; the
    outermost index is the quotient left, no modulo needed)."""
    out = []
    for n in reversed(dims[1:]):
        out.append(flat % int(n))
        flat = flat // int(n)
    return [flat, *reversed(out)] if len(dims) else []


def vars_in(e) -> set:
    """Names of the loop variables an index expression uses."""
    name = type(e).__name__
    if name == "Var":
        return {e.name}
    if name in _BINARY:
        return vars_in(e.a) | vars_in(e.b)
    if name == "Cast":
        return vars_in(e.value)
    return set()


def _trunc_div(a, b):
    q = np.abs(a) // np.abs(b)
    return np.where((np.asarray(a) < 0) != (np.asarray(b) < 0), -q, q)


_OPS = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
    "FloorDiv": lambda a, b: a // b, "FloorMod": lambda a, b: a % b,
    "Div": _trunc_div, "Mod": lambda a, b: a - _trunc_div(a, b) * b,
    "Min": np.minimum, "Max": np.maximum,
}


def evaluate(e, env):
    """Value of an index expression; env maps variable names to ints or numpy int arrays
    (broadcast together). Missing variables are 0. NotAffine for anything but integer
    arithmetic."""
    name = type(e).__name__
    if name == "Var":
        return env.get(e.name, 0)
    if name == "IntImm":
        return int(e.value)
    if name == "Cast":
        return evaluate(e.value, env)
    if name in _OPS:
        return _OPS[name](evaluate(e.a, env), evaluate(e.b, env))
    raise NotAffine(f"index expression {e} is not affine arithmetic")


def address(indices, shape, env):
    """Row-major element offset of indices into a tensor of `shape` (ints or arrays)."""
    addr = 0
    for idx, ext in zip(indices, shape):
        addr = addr * int(ext) + evaluate(idx, env)
    return addr


def unit_stride_dim(indices, loop):
    """The dimension whose index steps by exactly 1 when `loop` goes 0 -> 1, or None."""
    for d, idx in enumerate(indices):
        if loop in vars_in(idx):
            try:
                if evaluate(idx, {loop: 1}) - evaluate(idx, {loop: 0}) == 1:
                    return d
            except NotAffine:
                continue
    return None


def separable(e, loop) -> bool:
    """Whether e = f(loop) + g(other loops): then how e moves with `loop` does not depend on
    the other loops' values (h * 2 + r is; (h + r) // 2 and h * r are not)."""
    used = vars_in(e)
    if loop not in used or used == {loop}:
        return True
    name = type(e).__name__
    if name == "Cast":
        return separable(e.value, loop)
    if name in ("Add", "Sub"):
        return separable(e.a, loop) and separable(e.b, loop)
    if name == "Mul":
        const = [x for x in (e.a, e.b) if type(x).__name__ == "IntImm"]
        return bool(const) and all(separable(x, loop) for x in (e.a, e.b))
    return False


def tile_offsets(indices, shape, loop, ext, extents):
    """Exact movement of an operand inside every tile of `ext` iterations of `loop`.

    Returns a TileMovement: offsets[tile, t, ...] is the operand's element address at
    loop = tile * ext + t minus the address at the tile's origin, for every value of the other
    loops that changes it (those sharing a non-separable index with `loop`; the trailing axes);
    per_dim[d] is the same for dimension d's index alone. Positions past the loop's extent
    (`extents[loop]`, the real one) are 0. None when that is more points than MAX_POINTS (the
    caller then assumes the worst)."""
    n_tiles = -(-extents[loop] // ext)
    others = sorted({v for idx in indices if loop in vars_in(idx) and not separable(idx, loop)
                     for v in vars_in(idx)} - {loop})
    points = n_tiles * ext
    for v in others:
        points *= extents[v]
    if points > MAX_POINTS:
        return None
    grid = np.ogrid[tuple(slice(0, extents[v]) for v in others)] if others else []
    pos = np.arange(n_tiles * ext).reshape((n_tiles, ext) + (1,) * len(others))
    real = pos < extents[loop]
    pos = np.minimum(pos, extents[loop] - 1)
    env = {v: g.reshape((1, 1) + g.shape) for v, g in zip(others, grid)}
    per_dim = []
    for idx in indices:
        if loop not in vars_in(idx):
            per_dim.append(None)
            continue
        value = np.asarray(evaluate(idx, {**env, loop: pos}), dtype=np.int64)
        origin = np.asarray(evaluate(idx, {**env, loop: pos[:, :1]}), dtype=np.int64)
        per_dim.append(np.where(real, value - origin, 0))
    offsets = np.zeros((), np.int64)
    stride = 1
    for d in reversed(range(len(indices))):
        if per_dim[d] is not None:
            offsets = offsets + per_dim[d] * stride
        stride *= int(shape[d])
    full = np.broadcast_shapes(pos.shape, *(g.shape for g in env.values()))
    return TileMovement(np.broadcast_to(offsets, full), per_dim, np.broadcast_to(real, full))


def bounds(idx, extents):
    """(smallest, largest) value of an index expression over loops in [0, extent) (exact, by
    enumeration); NotAffine when it cannot be evaluated or has too many points."""
    used = sorted(vars_in(idx))
    points = 1
    for v in used:
        points *= extents[v]
    if points > MAX_POINTS:
        raise NotAffine(f"index {idx} spans {points} points")
    grid = np.ogrid[tuple(slice(0, extents[v]) for v in used)] if used else []
    value = np.asarray(evaluate(idx, dict(zip(used, grid))))
    return int(value.min()), int(value.max())
