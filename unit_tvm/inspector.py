"""Inspector: does an instruction fit a tensor operation, and through which loops? (UNIT §III-B)

Two checks, on any te.compute written by anyone:
1. Compute isomorphism (Algorithm 1): the instruction's expression tree and the operation's must
   have the same shape, the same opcode and dtype at every node (casts included), the same
   reduction combiner; instruction operands bind to operation tensors consistently.
2. Access isomorphism: every injective map f from instruction loops to operation loops of the same
   kind with compatible extents is tried; it is feasible iff for every operand pair (u of the op,
   v of the instruction) S'(u) ⊆ S(v), where S(v) are the instruction loops v's indices use and
   S'(u) the instruction loops whose images u's indices use.
"""

import itertools

import numpy as np
from tvm import te, tirx

from . import checks
from .indexing import NotAffine, evaluate, tile_offsets, unit_stride_dim, vars_in
from .mapping import LoopMatch, Mapping, OperandAccess
from .selection import mapping_waste

_TENSOR_LOAD = "te.tensor_load"
_BINARY = ("Add", "Sub", "Mul", "Div", "Mod", "FloorDiv", "FloorMod", "Min", "Max")
_COMMUTATIVE = ("Add", "Mul", "Min", "Max")


class NoMatch(Exception):
    """Raised internally with the reason a match failed."""


# -- expression helpers ---------------------------------------------------------------------------
def _dtype(e):
    return str(e.ty)


def _kind(e):
    if _is_load(e):
        return "load"
    return type(e).__name__


def _is_load(e):
    return type(e).__name__ == "Call" and getattr(e.op, "name", None) == _TENSOR_LOAD


def _describe(e):
    if _is_load(e):
        return f"read of {e.args[0].op.name} ({e.args[0].dtype})"
    if type(e).__name__ == "Cast":
        return f"cast to {_dtype(e)} of {_describe(e.value)}"
    if type(e).__name__ in ("IntImm", "FloatImm"):
        return f"constant {e.value} ({_dtype(e)})"
    return f"{type(e).__name__} ({_dtype(e)})"


def _reduce_parts(op):
    body = op.body[0]
    if isinstance(body, tirx.Reduce):
        return body, body.source[0]
    return None, body


def _combiner_name(red):
    if red is None:
        return None
    result = red.combiner.result[0]
    ident = red.combiner.identity_element[0]
    return f"{type(result).__name__}(identity {float(ident.value):g})"


def _reducer(red):
    """'sum', 'max', 'min', ... of a Reduce, or 'no reduction'."""
    if red is None:
        return "no reduction"
    kind = type(red.combiner.result[0]).__name__
    return {"Add": "sum"}.get(kind, kind.lower())


# -- 1. compute isomorphism -----------------------------------------------------------------------
def _match_tree(iu, ou, bind, path="root"):
    """Algorithm 1: walk both trees; bind instruction loads to op loads. Raises NoMatch."""
    ik, ok = _kind(iu), _kind(ou)
    if ik == "load":
        if ok != "load":
            raise NoMatch(f"at {path}: the instruction reads operand {iu.args[0].op.name} where "
                          f"the operation has {_describe(ou)}")
        if iu.args[0].dtype != ou.args[0].dtype:
            raise NoMatch(f"at {path}: operand {iu.args[0].op.name} must be {iu.args[0].dtype} but "
                          f"operation tensor {ou.args[0].op.name} is {ou.args[0].dtype}")
        name = iu.args[0].op.name
        tensor = ou.args[0]
        prev = bind.get(name)
        if prev is not None and not prev[0].same_as(tensor):
            raise NoMatch(f"instruction operand {name} would bind two tensors: "
                          f"{prev[0].op.name} and {tensor.op.name}")
        for other, (t, *_rest) in bind.items():
            if other != name and t.same_as(tensor):
                raise NoMatch(f"operation tensor {tensor.op.name} would bind two instruction "
                              f"operands: {other} and {name}")
        bind[name] = (tensor, list(ou.args)[1:], list(iu.args)[1:])
        return
    if ik != ok:
        raise NoMatch(f"at {path}: opcode mismatch, instruction has {_describe(iu)}, operation has "
                      f"{_describe(ou)}")
    if _dtype(iu) != _dtype(ou):
        raise NoMatch(f"at {path}: dtype mismatch in {ik}: instruction {_dtype(iu)}, operation "
                      f"{_dtype(ou)}")
    if ik == "Cast":
        _match_tree(iu.value, ou.value, bind, f"{path}.cast")
        return
    if ik in ("IntImm", "FloatImm"):
        if iu.value != ou.value:
            raise NoMatch(f"at {path}: constant {iu.value} vs {ou.value}")
        return
    if ik in _BINARY:
        try:
            trial = dict(bind)
            _match_tree(iu.a, ou.a, trial, f"{path}.{ik}.lhs")
            _match_tree(iu.b, ou.b, trial, f"{path}.{ik}.rhs")
            bind.clear()
            bind.update(trial)
            return
        except NoMatch as first:
            if ik not in _COMMUTATIVE:
                raise
            # commutative ops also match with their operands swapped (b*a for a*b)
            try:
                trial = dict(bind)
                _match_tree(iu.a, ou.b, trial, f"{path}.{ik}.lhs")
                _match_tree(iu.b, ou.a, trial, f"{path}.{ik}.rhs")
            except NoMatch:
                raise first from None
            bind.clear()
            bind.update(trial)
            return
    raise NoMatch(f"at {path}: unsupported node {ik} in the instruction's semantics")


def compute_isomorphism(op, intrin):
    """Operand binding {intrin operand: (op tensor, op indices, intrin indices)}; NoMatch if
    none."""
    op_red, op_src = _reduce_parts(op)
    in_red, in_src = _reduce_parts(intrin.output.op)
    if (op_red is None) != (in_red is None):
        raise NoMatch("the instruction is a reduction and the operation is not"
                      if in_red is not None
                      else "the operation is a reduction and the instruction is not")
    if op_red is not None and not (type(op_red.condition).__name__ == "IntImm"
                                   and int(op_red.condition.value) == 1):
        raise NoMatch("the operation's reduction has a condition")
    if str(op.output(0).dtype) != intrin.output_dtype:
        raise NoMatch(f"output dtype: instruction accumulates {intrin.output_dtype}, operation "
                      f"produces {op.output(0).dtype}")
    if _combiner_name(op_red) != _combiner_name(in_red):
        raise NoMatch(f"reduction combiner differs: instruction {_combiner_name(in_red)}, "
                      f"operation {_combiner_name(op_red)} ({_reducer(in_red)} is not "
                      f"{_reducer(op_red)})")
    bind = {}
    _match_tree(in_src, op_src, bind)
    missing = [t.op.name for t in intrin.inputs if t.op.name not in bind]
    if missing:
        raise NoMatch(f"instruction operands {missing} are not bound")
    return bind


# -- 2. access isomorphism ------------------------------------------------------------------------
def _op_loops(op):
    loops = [(ax.var.name, int(ax.dom.extent), "S") for ax in op.axis]
    loops += [(ax.var.name, int(ax.dom.extent), "R") for ax in op.reduce_axis]
    return loops


def _alone(index, loop_name):
    """True when `index` mentions no loop but `loop_name` (v, v//c, v%c, v*c, v+c ...)."""
    return vars_in(index) <= {loop_name}


def _paddable(op, loop_name, bind, kind):
    """Whether a loop can be padded to the instruction's multiple.

    Data-parallel loops always can: the extra outputs are dropped, and every operand that reads
    the loop is packed with a bounds guard, so no read leaves its tensor. A reduction loop can when
    every operand index that mentions it mentions no other loop: each operand is then zero-padded
    along those dimensions, padded iterations read only padding and add zero. In an index like
    h + r (a conv window) padding r would read the next real pixel, so r cannot be padded.
    """
    if kind == "S":
        return True
    reads = [idx for _, indices, _ in bind.values() for idx in indices
             if loop_name in vars_in(idx)]
    return bool(reads) and all(_alone(i, loop_name) for i in reads)


def _movement(op_idx, shape, loop, ext, extents):
    """indexing.tile_offsets over every tile of `loop`, or None when it cannot be decided."""
    try:
        return tile_offsets(op_idx, shape, loop, ext, extents)
    except NotAffine:
        return None


def _varies_within_tile(indices, shape, loop, ext, extents):
    """Whether the operand's address changes while `loop` steps inside any instruction tile.

    Judged on values over every tile (indexing.tile_offsets), not on syntax and not on samples:
    a grouped conv reads data[f // kg * cg + rc], one value across 16 lanes of f only when every
    tile of 16 stays inside one group (kg a multiple of 16)."""
    if not any(loop in vars_in(i) for i in indices):
        return False
    moved = _movement(indices, shape, loop, ext, extents)
    return moved is None or bool(np.any(moved.offsets[moved.real]))


def _steps_match(moved, want, row_size, row_stride):
    """(whether the op's address steps like `want` (the dense steps of the instruction's own
    operand) in every tile, the row stride found). Row-strided operands may use any one row
    stride S >= the row's size: op step = row * S + column offset within the row."""
    offsets, real = moved.offsets, moved.real
    want = np.asarray(want, np.int64).reshape((1, -1) + (1,) * (offsets.ndim - 2))
    rows, cols = np.divmod(want, row_size) if row_size else (np.zeros_like(want), want)
    rows, cols = np.broadcast_to(rows, offsets.shape), np.broadcast_to(cols, offsets.shape)
    flat = real & (rows == 0)
    if not np.array_equal(offsets[flat], cols[flat]):
        return False, row_stride
    jump = real & (rows != 0)
    if not jump.any():
        return True, row_stride
    diff, r = offsets[jump] - cols[jump], rows[jump]
    if np.any(diff % r):
        return False, row_stride
    found = np.unique(diff // r)
    if len(found) != 1 or (row_stride is not None and int(found[0]) != row_stride):
        return False, row_stride
    return True, int(found[0])


def _access(intrin, name, bind, f_inv, loop_extent, op_extents):
    """(S'(u) ⊆ S(v) holds?, OperandAccess, reason) for one operand under a loop map."""
    tensor, op_idx, in_idx = bind[name]
    op_shape = [int(s) for s in tensor.shape]
    intrin_tensor = next(t for t in intrin.inputs if t.op.name == name)
    in_shape = [int(s) for s in intrin_tensor.shape]
    s_v = set().union(*[vars_in(i) for i in in_idx]) if in_idx else set()
    s_u = {il for ol, il in f_inv.items()
           if _varies_within_tile(op_idx, op_shape, ol, loop_extent[il], op_extents)}
    if not s_u <= s_v:
        extra = sorted(s_u - s_v)
        return False, None, (f"S'({tensor.op.name}) = {sorted(s_u)} is not a subset of "
                             f"S({name}) = {sorted(s_v)}: {tensor.op.name} would need a different "
                             f"element per step of instruction loop(s) {extra}, but {name} is one "
                             f"value along them")
    # contiguity: along each instruction loop the op address must step exactly like the address
    # in a dense buffer of the instruction operand's shape, in every tile
    row_size = int(np.prod(in_shape[1:])) if name in intrin.strided else 0
    contiguous, strides, row_stride, varying = True, [], None, set()
    for il, op_loop in sorted(((il, ol) for ol, il in f_inv.items()), key=lambda x: x[0]):
        ext = loop_extent[il]
        moved = _movement(op_idx, op_shape, op_loop, ext, op_extents)
        if moved is None:
            contiguous = False
            strides.append(0)
            continue
        if row_size and il in vars_in(in_idx[0]) and unit_stride_dim(op_idx, op_loop) is None:
            # rows that skip elements (a strided conv) are a constant address step, but not a
            # dense block of any dimension, which is what tensorize can bind a tile to
            contiguous = False
        want = [_dense_address(in_idx, in_shape, il, t) for t in range(ext)]
        ok, row_stride = _steps_match(moved, want, row_size, row_stride)
        contiguous = contiguous and ok
        strides.append(int(moved.offsets[(0, 1) + (0,) * (moved.offsets.ndim - 2)])
                       if ext > 1 and op_extents[op_loop] > 1 else 0)
        varying.update(d for d, v in enumerate(moved.per_dim) if v is not None and np.any(v))
    if row_stride is not None and row_stride < row_size:
        contiguous = False  # rows would overlap
    if contiguous and len(varying) > len(in_shape):
        # tensorize binds the instruction's buffer to the trailing dimensions of the op's, one to
        # one: a tile whose rows run on across two op dimensions (a 128-wide reduction over
        # 64-channel blocks) has the right addresses but no such binding
        contiguous = False
    # a loop of extent 1 (a float32 multiply-add's reduction) takes no step within a tile:
    # reading one value along it is no broadcast
    broadcast = tuple(sorted(il for il in s_v - s_u if loop_extent[il] > 1))
    if broadcast:
        contiguous = False
    return True, OperandAccess(tensor.op.name, name, contiguous, broadcast, tuple(strides)), None


def _dense_address(in_idx, in_shape, loop, t):
    """Element offset in the instruction operand's dense buffer when `loop` = t (others 0)."""
    addr = 0
    for idx, ext in zip(in_idx, in_shape):
        addr = addr * ext + int(evaluate(idx, {loop: t}))
    return addr


def _candidates(op, intrin, bind):
    """Yield (Mapping | None, reason) for every injective kind-preserving loop map."""
    op_loops = _op_loops(op)
    in_loops = intrin.loops
    loop_extent = {n: e for n, e, _ in in_loops}
    by_kind = {k: [i for i, lp in enumerate(op_loops) if lp[2] == k] for k in ("S", "R")}
    choices = [by_kind[k] for _, _, k in in_loops]
    op_extents = {n: e for n, e, _ in op_loops}
    for assign in itertools.product(*choices):
        if len(set(assign)) != len(assign):
            continue
        matches, reason = [], None
        for (iname, iext, kind), oi in zip(in_loops, assign):
            oname, oext, _ = op_loops[oi]
            pad = (-oext) % iext
            if pad and not _paddable(op, oname, bind, kind):
                reason = (f"reduction loop {oname} (extent {oext}) is not a multiple of the "
                          f"instruction's {iname} ({iext}) and cannot be zero-padded: an operand "
                          f"index combines it with another loop")
                break
            matches.append(LoopMatch(iname, iext, kind, oname, oi, oext, pad))
        if reason:
            yield None, reason
            continue
        f_inv = {m.op_loop: m.intrin_loop for m in matches}
        accesses = []
        for t in intrin.inputs:
            ok, acc, why = _access(intrin, t.op.name, bind, f_inv, loop_extent, op_extents)
            if not ok:
                reason = why
                break
            accesses.append(acc)
        if reason:
            yield None, reason
            continue
        yield Mapping(intrin.name, op.name, tuple(matches), tuple(accesses)), None


def _as_op(op, fn):
    checks.te_op(op, fn)
    return op.op if isinstance(op, te.Tensor) else op


def rank(mapping, n_loops):
    """Best first: least padded work (the factor padding multiplies the op's work by: 16 rows
    padded onto a 17-wide loop cost less than onto a batch of 1), operands contiguous, innermost
    op loops (the paper's default)."""
    waste = mapping_waste(mapping)
    strided = sum(not a.contiguous for a in mapping.operands)
    depth = sum(n_loops - m.op_index for m in mapping.loops)
    return (round(waste, 6), strided, depth)


def inspect(op, intrinsic) -> list[Mapping]:
    """Every feasible Mapping of `intrinsic` onto `op` (te.Tensor or ComputeOp), best first."""
    op = _as_op(op, "unit_tvm.inspect")
    intrin = checks.intrinsic(intrinsic, "unit_tvm.inspect")
    try:
        bind = compute_isomorphism(op, intrin)
    except NoMatch:
        return []
    found = [m for m, _ in _candidates(op, intrin, bind) if m is not None]
    n = len(_op_loops(op))
    return sorted(found, key=lambda m: rank(m, n))


def explain(op, intrinsic) -> str:
    """Plain-words account of whether `intrinsic` fits `op`, and why not when it does not."""
    op = _as_op(op, "unit_tvm.explain")
    intrin = checks.intrinsic(intrinsic, "unit_tvm.explain")
    try:
        bind = compute_isomorphism(op, intrin)
    except NoMatch as e:
        hint = ""
        if "must be uint8" in str(e) and "is int8" in str(e):
            hint = (" (the data operand must be uint8; for s8 x s8 the Rewriter applies the +128 "
                    "shift with compensation)")
        return f"{intrin.name} does not fit {op.name}: compute mismatch: {e}{hint}"
    found, reasons = [], []
    for m, why in _candidates(op, intrin, bind):
        (found if m else reasons).append(m or why)
    if found:
        n = len(_op_loops(op))
        best = sorted(found, key=lambda m: rank(m, n))[0]
        return f"{intrin.name} fits {op.name} in {len(found)} way(s); best:\n{best}"
    if not reasons:
        kinds = [k for _, _, k in intrin.loops]
        have = [k for _, _, k in _op_loops(op)]
        return (f"{intrin.name} does not fit {op.name}: it needs {kinds.count('S')} "
                f"data-parallel and {kinds.count('R')} reduction loops, the operation has "
                f"{have.count('S')} and {have.count('R')}")
    uniq = list(dict.fromkeys(reasons))
    return (f"{intrin.name} does not fit {op.name}: no loop mapping is feasible; "
            + "; ".join(uniq[:4]) + ("" if len(uniq) <= 4 else f"; ... ({len(uniq) - 4} more)"))
