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

from tvm import te, tirx

from . import intrinsics
from .mapping import LoopMatch, Mapping, OperandAccess

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


def _vars_in(e):
    """Names of loop variables an index expression uses."""
    name = type(e).__name__
    if name == "Var":
        return {e.name}
    if name in _BINARY:
        return _vars_in(e.a) | _vars_in(e.b)
    if name == "Cast":
        return _vars_in(e.value)
    return set()


def _eval(e, env):
    """Integer value of an index expression under env (var name -> int)."""
    name = type(e).__name__
    if name == "Var":
        return env.get(e.name, 0)
    if name == "IntImm":
        return int(e.value)
    if name == "Cast":
        return _eval(e.value, env)
    if name in _BINARY:
        a, b = _eval(e.a, env), _eval(e.b, env)
        return {
            "Add": lambda: a + b, "Sub": lambda: a - b, "Mul": lambda: a * b,
            "FloorDiv": lambda: a // b, "FloorMod": lambda: a % b,
            "Div": lambda: int(a / b), "Mod": lambda: a - int(a / b) * b,
            "Min": lambda: min(a, b), "Max": lambda: max(a, b),
        }[name]()
    raise NoMatch(f"index expression {e} is not affine arithmetic")


def _address(indices, shape, env):
    addr = 0
    for idx, ext in zip(indices, shape):
        addr = addr * int(ext) + _eval(idx, env)
    return addr


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


# -- 1. compute isomorphism -----------------------------------------------------------------------
def _match_tree(iu, ou, bind, path="root"):
    """Algorithm 1: walk both trees; bind instruction loads to op loads. Raises NoMatch."""
    ik, ok = _kind(iu), _kind(ou)
    if ik == "load":
        if ok != "load":
            raise NoMatch(f"at {path}: the instruction reads operand {iu.args[0].op.name} where the "
                          f"operation has {_describe(ou)}")
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
    """Operand binding {intrin operand: (op tensor, op indices, intrin indices)}; NoMatch if none."""
    op_red, op_src = _reduce_parts(op)
    in_red, in_src = _reduce_parts(intrin.output.op)
    if (op_red is None) != (in_red is None):
        raise NoMatch("the instruction is a reduction and the operation is not" if in_red is not None
                      else "the operation is a reduction and the instruction is not")
    if op_red is not None and not (type(op_red.condition).__name__ == "IntImm"
                                   and int(op_red.condition.value) == 1):
        raise NoMatch("the operation's reduction has a condition")
    if str(op.output(0).dtype) != intrin.output_dtype:
        raise NoMatch(f"output dtype: instruction accumulates {intrin.output_dtype}, operation "
                      f"produces {op.output(0).dtype}")
    if _combiner_name(op_red) != _combiner_name(in_red):
        raise NoMatch(f"reduction combiner differs: instruction {_combiner_name(in_red)}, "
                      f"operation {_combiner_name(op_red)} (sum is not max)")
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


def _unit_stride_dim(indices, loop):
    """The dimension whose index steps by exactly 1 with `loop` (others fixed), or None."""
    for d, idx in enumerate(indices):
        if loop in _vars_in(idx):
            try:
                if _eval(idx, {loop: 1}) - _eval(idx, {loop: 0}) == 1:
                    return d
            except NoMatch:
                continue
    return None


def _separable(index, loop_name):
    """True when `index` mentions no loop but `loop_name` (v, v//c, v%c, v*c, v+c ...)."""
    return _vars_in(index) <= {loop_name}


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
             if loop_name in _vars_in(idx)]
    return bool(reads) and all(_separable(i, loop_name) for i in reads)


def _varies_within_tile(indices, shape, loop, ext):
    """Whether the address changes while `loop` steps inside one instruction tile of `ext`.

    Judged on values, not syntax: a grouped conv reads data[f // kg * cg + rc], which does not
    change across 16 lanes of f when kg is a multiple of 16. Tiles at the start, the second
    position and the end of a generous range are tried.
    """
    if not any(loop in _vars_in(i) for i in indices):
        return False
    try:
        for base in (0, ext, 7 * ext):
            origin = _address(indices, shape, {loop: base})
            if any(_address(indices, shape, {loop: base + t}) != origin for t in range(1, ext)):
                return True
        return False
    except NoMatch:
        return True


def _dims_varying(op_idx, f_inv, loop_extent):
    """How many of the op's index dimensions change over one instruction tile (from its origin)."""
    varying = set()
    for op_loop, il in f_inv.items():
        origin = [_eval(i, {}) for i in op_idx]
        for t in range(1, loop_extent[il]):
            here = [_eval(i, {op_loop: t}) for i in op_idx]
            varying.update(d for d, (a, b) in enumerate(zip(origin, here)) if a != b)
    return len(varying)


def _access(intrin, name, bind, f_inv, loop_extent, op_shape_of):
    """(S'(u) ⊆ S(v) holds?, OperandAccess, reason) for one operand under a loop map."""
    tensor, op_idx, in_idx = bind[name]
    intrin_tensor = next(t for t in intrin.inputs if t.op.name == name)
    in_shape = [int(s) for s in intrin_tensor.shape]
    s_v = set().union(*[_vars_in(i) for i in in_idx]) if in_idx else set()
    s_u = {il for ol, il in f_inv.items()
           if _varies_within_tile(op_idx, op_shape_of(tensor), ol, loop_extent[il])}
    if not s_u <= s_v:
        extra = sorted(s_u - s_v)
        return False, None, (f"S'({tensor.op.name}) = {sorted(s_u)} is not a subset of "
                             f"S({name}) = {sorted(s_v)}: {tensor.op.name} would need a different "
                             f"element per step of instruction loop(s) {extra}, but {name} is one "
                             f"value along them")
    # contiguity: along each instruction loop the op address must step exactly like the address
    # in a dense buffer of the instruction operand's shape (checked at the tile origin and at the
    # next aligned tile). Operands the instruction reads with a row stride may use any one row
    # stride S: op step = row * S + column offset within the row.
    op_shape = op_shape_of(tensor)
    row_size = 1
    for ext in in_shape[1:]:
        row_size *= ext
    row_strided = name in intrin.strided
    contiguous = True
    strides = []
    row_stride = None
    for il, op_loop in sorted(((il, ol) for ol, il in f_inv.items()), key=lambda x: x[0]):
        ext = loop_extent[il]
        in_steps = [_address(in_idx, in_shape, {il: t}) - _address(in_idx, in_shape, {il: 0})
                    for t in range(ext)]
        for base in (0, ext):
            try:
                origin = _address(op_idx, op_shape, {op_loop: base})
                steps = [_address(op_idx, op_shape, {op_loop: base + t}) - origin for t in range(ext)]
            except NoMatch:
                contiguous, steps = False, None
                break
            if row_strided and il in _vars_in(in_idx[0]) and _unit_stride_dim(op_idx, op_loop) is None:
                # rows that skip elements (a strided conv) are a constant address step, but not a
                # dense block of any dimension, which is what tensorize can bind a tile to
                contiguous = False
            for got, want in zip(steps, in_steps):
                row, col = divmod(want, row_size) if row_strided else (0, want)
                if row == 0:
                    ok = got == col
                else:
                    s_here = (got - col) / row
                    ok = s_here == int(s_here) and (row_stride is None or s_here == row_stride)
                    row_stride = int(s_here) if ok else row_stride
                if not ok:
                    contiguous = False
        strides.append(steps[1] if steps and ext > 1 else 0)
    if row_stride is not None and row_stride < row_size:
        contiguous = False  # rows would overlap
    if contiguous and _dims_varying(op_idx, f_inv, loop_extent) > len(in_shape):
        # tensorize binds the instruction's buffer to the trailing dimensions of the op's, one to
        # one: a tile whose rows run on across two op dimensions (a 128-wide reduction over
        # 64-channel blocks) has the right addresses but no such binding
        contiguous = False
    broadcast = tuple(sorted(s_v - s_u))
    if broadcast:
        contiguous = False
    return True, OperandAccess(tensor.op.name, name, contiguous, broadcast, tuple(strides)), None


def _candidates(op, intrin, bind):
    """Yield (Mapping | None, reason) for every injective kind-preserving loop map."""
    op_loops = _op_loops(op)
    in_loops = intrin.loops
    loop_extent = {n: e for n, e, _ in in_loops}
    by_kind = {k: [i for i, l in enumerate(op_loops) if l[2] == k] for k in ("S", "R")}
    choices = [by_kind[k] for _, _, k in in_loops]
    shape_of = lambda t: [int(s) for s in t.shape]  # noqa: E731
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
            ok, acc, why = _access(intrin, t.op.name, bind, f_inv, loop_extent, shape_of)
            if not ok:
                reason = why
                break
            accesses.append(acc)
        if reason:
            yield None, reason
            continue
        yield Mapping(intrin.name, op.name, tuple(matches), tuple(accesses)), None


def _as_op(op):
    if isinstance(op, te.Tensor):
        return op.op
    return op


def _rank(mapping, n_loops):
    """Best first: least padded work (the factor padding multiplies the op's work by: 16 rows
    padded onto a 17-wide loop cost less than onto a batch of 1), operands contiguous, innermost
    op loops (the paper's default)."""
    waste = 1.0
    for m in mapping.loops:
        waste *= (m.op_extent + m.padding) / m.op_extent
    strided = sum(not a.contiguous for a in mapping.operands)
    depth = sum(n_loops - m.op_index for m in mapping.loops)
    return (round(waste, 6), strided, depth)


def _get_intrin(intrinsic):
    return intrinsics.get(intrinsic) if isinstance(intrinsic, str) else intrinsic


def inspect(op, intrinsic):
    """Every feasible Mapping of `intrinsic` onto `op` (te.Tensor or ComputeOp), best first."""
    op = _as_op(op)
    intrin = _get_intrin(intrinsic)
    try:
        bind = compute_isomorphism(op, intrin)
    except NoMatch:
        return []
    found = [m for m, _ in _candidates(op, intrin, bind) if m is not None]
    n = len(_op_loops(op))
    return sorted(found, key=lambda m: _rank(m, n))


def explain(op, intrinsic):
    """Plain-words account of whether `intrinsic` fits `op`, and why not when it does not."""
    op = _as_op(op)
    intrin = _get_intrin(intrinsic)
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
        best = sorted(found, key=lambda m: _rank(m, n))[0]
        return f"{intrin.name} fits {op.name} in {len(found)} way(s); best:\n{best}"
    if not reasons:
        kinds = [k for _, _, k in intrin.loops]
        have = [k for _, _, k in _op_loops(op)]
        return (f"{intrin.name} does not fit {op.name}: it needs {kinds.count('S')} data-parallel and "
                f"{kinds.count('R')} reduction loops, the operation has {have.count('S')} and "
                f"{have.count('R')}")
    uniq = list(dict.fromkeys(reasons))
    return (f"{intrin.name} does not fit {op.name}: no loop mapping is feasible; "
            + "; ".join(uniq[:4]) + ("" if len(uniq) <= 4 else f"; ... ({len(uniq) - 4} more)"))
