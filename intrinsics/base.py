"""The Intrinsic type: an instruction described once, by its semantics as a te.compute.

Everything tensorize needs is derived from that compute (UNIT §III-A, Fig. 4):
- the loop kinds (data-parallel or reduction) and extents, the operand dtypes,
- the TensorIntrin *description*, built from the compute's expression tree by `derive_desc`,
- the buffers of the TensorIntrin *implementation*.
The only hand-written part per instruction is `emit`: given the implementation's buffers, it
writes the statement that loads/broadcasts the operands and calls the LLVM/CUDA intrinsic.
"""

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import te, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T
from unit_tvm import target as _target

_TENSOR_LOAD = "te.tensor_load"


def _full_region(buf: tirx.Buffer) -> tvm.ir.TensorRegion:
    return buf[tuple(slice(0, s) for s in buf.shape)]


def te_expr_to_tir(
    expr: tirx.Expr,
    tensor_buffers: Mapping[str, tirx.Buffer],
    var_map: Sequence[tuple[tirx.Var, tirx.Expr]],
) -> tirx.Expr:
    """Rewrite a te expression into TIR: tensor reads become buffer loads, iter vars are renamed.

    tensor_buffers maps a te.Tensor's op name to a tirx.Buffer; var_map is a list of
    (te var, tir expr) pairs.
    """

    def on_call(call: tvm.ir.Call, mutator: tvm_ffi.StructuralMutator) -> tirx.Expr:
        if call.op.name == _TENSOR_LOAD:
            buf = tensor_buffers[call.args[0].op.name]
            return tirx.BufferLoad(buf, [mutator.mutate(x) for x in list(call.args)[1:]])
        return mutator.default_mutate(call)

    def on_var(var: tirx.Var, _mutator: tvm_ffi.StructuralMutator) -> tirx.Expr:
        for old, new in var_map:
            if var.same_as(old):
                return new
        return var

    return tvm_ffi.structural_mutate(expr, [(tvm.ir.expr.Call, on_call), (tirx.Var, on_var)])


def buffer_loads(expr: tirx.Expr) -> list[tvm.ir.TensorLoad]:
    """All buffer loads in a TIR expression, in visit order."""
    loads: list[tvm.ir.TensorLoad] = []
    tvm_ffi.structural_walk(expr, [(tvm.ir.expr.TensorLoad, loads.append)])
    return loads


def _declare_args(
    tensors: list[te.Tensor],
    scopes: Mapping[str, str],
    offset_factor: int,
    strided: tuple[str, ...],
) -> dict[str, tirx.Buffer]:
    """Declare one function argument buffer per te tensor (in order); returns name -> Buffer."""
    bufs: dict[str, tirx.Buffer] = {}
    for t in tensors:
        name = t.op.name
        strides = None
        if name in strided and len(t.shape) > 1:
            # the first (row) dimension may have any stride; the rest stay dense, since the
            # instruction reads each row as one contiguous block
            dense = [1]
            for ext in reversed([int(x) for x in t.shape[1:]][1:]):
                dense.insert(0, dense[0] * ext)
            strides = [T.int32()] + dense
        bufs[name] = T.arg(
            name,
            T.buffer(
                [int(s) for s in t.shape],
                t.dtype,
                offset_factor=offset_factor,
                scope=scopes.get(name, "global"),
                strides=strides,
            ),
        )
    return bufs


def derive_desc(
    output: te.Tensor, *, scopes: Mapping[str, str] | None = None, offset_factor: int = 1
) -> tirx.PrimFunc:
    """Build the TensorIntrin description PrimFunc from a te.compute `output`.

    A reduction compute `d[i] = sum_k f(...)` becomes the accumulate-in-place form
    `d[i] = d[i] + f(...)` (what tensorize matches after decompose_reduction); a plain compute
    becomes `d[i] = f(...)`. Buffers get offset_factor so that any sub-region can bind to them.
    """
    scopes = scopes or {}
    op = output.op
    body = op.body[0]
    is_reduce = isinstance(body, tirx.Reduce)
    all_axes = list(op.axis) + (list(op.reduce_axis) if is_reduce else [])
    # an axis of extent 1 (the reduction of a float32 multiply-add) keeps its loop but is no
    # block variable: a workload's block under a loop of extent 1 binds that axis to the
    # outer block's variable, so the description binds it to 0
    axes = [ax for ax in all_axes if int(ax.dom.extent) != 1]
    unit_axes = [ax for ax in all_axes if int(ax.dom.extent) == 1]
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name(op.name + "_desc")
            bufs = _declare_args(list(op.input_tensors) + [output], scopes, offset_factor, ())
            out = bufs[op.name]
            inputs = [bufs[t.op.name] for t in op.input_tensors]
            with T.sblock("root"):
                T.reads(([_full_region(out)] if is_reduce else [])
                        + [_full_region(b) for b in inputs])
                T.writes([_full_region(out)])
                loops = [T.serial(0, int(ax.dom.extent)) for ax in all_axes]
                loop_vars = [frame.__enter__() for frame in loops]
                with T.sblock(op.name):
                    block_vars = [
                        (T.axis.reduce if ax.iter_type == ax.CommReduce else T.axis.spatial)(
                            int(ax.dom.extent), lv
                        )
                        for ax, lv in zip(all_axes, loop_vars) if int(ax.dom.extent) != 1
                    ]
                    var_map = [(ax.var, bv) for ax, bv in zip(axes, block_vars)]
                    var_map += [(ax.var, tirx.const(0, "int32")) for ax in unit_axes]
                    src = body.source[0] if is_reduce else body
                    value = te_expr_to_tir(src, bufs, var_map)
                    index = [next(e for v, e in var_map if v.same_as(ax.var)) for ax in op.axis]
                    if is_reduce:
                        value = tirx.BufferLoad(out, index) + value
                    T.reads(buffer_loads(value))
                    T.writes([tirx.BufferLoad(out, index)])
                    T.buffer_store(out, value, index)
                for frame in reversed(loops):
                    frame.__exit__(None, None, None)
    return ib.get()


def derive_impl(
    output: te.Tensor,
    emit: Callable[[dict[str, tirx.Buffer]], object],
    *,
    scopes: Mapping[str, str] | None = None,
    offset_factor: int = 1,
    strided: tuple[str, ...] = (),
) -> tirx.PrimFunc:
    """Build the TensorIntrin implementation PrimFunc: the desc's buffers around `emit(bufs)`.

    `emit` receives a dict operand name -> tirx.Buffer and must add the implementation
    statements with the IRBuilder (T.buffer_store / T.evaluate). Operands named in `strided`
    get symbolic row strides (e.g. wmma fragments loaded from a larger tile).
    """
    scopes = scopes or {}
    op = output.op
    is_reduce = isinstance(op.body[0], tirx.Reduce)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name(op.name + "_impl")
            bufs = _declare_args(list(op.input_tensors) + [output], scopes, offset_factor, strided)
            out = bufs[op.name]
            inputs = [bufs[t.op.name] for t in op.input_tensors]
            with T.sblock("root"):
                T.reads(([_full_region(out)] if is_reduce else [])
                        + [_full_region(b) for b in inputs])
                T.writes([_full_region(out)])
                emit(bufs)
    return ib.get()


@dataclass(frozen=True)
class PairSumBound:
    """A precondition on the weight operand that makes a saturating instruction exact on every
    activation: every int16 sum of u8 x s8 products the instruction forms has weights whose
    magnitudes add up to at most `bound`. vpmaddubsw sums each adjacent pair of products in
    int16: with the bound 128 a sum is at most 255 * 128 = 32640 <= 32767, so it never
    saturates. words=1: the pairs alone (|w0| + |w1|). words=2: the pair form's int16 results
    of two consecutive 4-byte words added by vpaddw before widening (the quad form), so the
    bound holds over the pair at one place in both words (|w0| + |w1| + |w4| + |w5| and
    |w2| + |w3| + |w6| + |w7| of every 8 reduction elements)."""

    bound: int = 128
    words: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.bound <= 128:
            raise ValueError(f"a pair-sum bound is in (0, 128] for int8 weights, not {self.bound}")
        if self.words not in (1, 2):
            raise ValueError(f"a pair-sum bound adds the pairs of 1 or 2 words, not {self.words}")

    @property
    def period(self) -> int:
        """Reduction elements whose groups repeat: 2 for pairs, 8 for two 4-byte words."""
        return 2 if self.words == 1 else 4 * self.words

    def group_sums(self, v: np.ndarray) -> np.ndarray:
        """Sum of |v| over each int16 group along v's last axis (the reduction in the order a
        packed weight holds it, zero-padded to whole periods): [..., groups]."""
        v = np.asarray(v)
        # integers as int32 (|-128| must fit; half float64's memory on an LLM's largest
        # weights), floats in float64
        a = np.abs(v.astype(np.int32 if v.dtype.kind in "iu" else np.float64))
        pad = -a.shape[-1] % self.period
        if pad:
            a = np.concatenate([a, np.zeros(a.shape[:-1] + (pad,), a.dtype)], axis=-1)
        pairs = a[..., 0::2] + a[..., 1::2]  # [..., n/2]: word h's pair p at 2h + p
        if self.words == 1:
            return pairs
        # [..., n/8, word, pair]: the same pair of both words added
        return pairs.reshape(a.shape[:-1] + (-1, self.words, 2)).sum(axis=-2)

    def holds(self, v: np.ndarray) -> bool:
        """Whether every group along the last axis of `v` (reduction order) obeys the bound."""
        return bool((self.group_sums(v) <= self.bound).all())

    def holds_packed(self, packed: np.ndarray) -> bool:
        """holds() on weights in a packed layout [..., words, lanes, word] (the instruction's
        operand: consecutive words of each lane's reduction on axis -3)."""
        p = np.asarray(packed)
        lanes_first = np.swapaxes(p, -3, -2)
        return self.holds(lanes_first.reshape(lanes_first.shape[:-2] + (-1,)))

    def implies(self, other: "PairSumBound") -> bool:
        """Whether weights under this bound obey `other` too (a group of more words contains
        the pairs of fewer)."""
        return self.bound <= other.bound and self.words >= other.words


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class Intrinsic:
    """One tensorized instruction: semantics (te.compute) + how to emit it + where it runs.

    name: the instruction, e.g. "x86.vpdpbusd" (the one positional argument).
    arch: "x86_64", "aarch64" or "cuda" — the target family that can execute it.
    requires: alternatives of feature sets; the target must have every feature of at least one
        alternative (LLVM feature names, or "tensorcore" for CUDA).
    semantics: () -> output te.Tensor, a te.compute over te.placeholder inputs.
    emit: the hand-written operand-preparation rule, see derive_impl.
    doc: one paragraph describing the instruction.
    scopes / offset_factor: buffer properties of desc and impl (CUDA fragments).
    strided: operands whose first (row) dimension may have any stride (the instruction takes a
        row stride: AMX tiles, wmma fragments); their other dimensions must be dense.
    operand_ranges: operand name -> (lo, hi) where the instruction is exact only on that range.
    weight_bound: a PairSumBound under which it is exact on every value of the other operand
        instead (a graph pass may choose it for weights quantized and checked under it).
    superseded_by: names of instructions that do its work better: where a target runs one of
        them, `intrinsics.for_target` (what selection chooses from) leaves this one out; it can
        still be named (the pre-VNNI forms on a VNNI host).
    family: instructions that are forms of one hardware instruction (e.g. AMX tdpbusd alone and
        chained): among a family the form that pads an op least is used (default: its name).
    helpers: extra TensorIntrins it needs around its core (wmma fragment load / store), name ->
        (desc, impl) factories, registered with the main one.
    host_check: () -> what this *machine* still lacks to execute it on the host beyond the CPU
        features (the OS permission AMX needs), or None.
    scratch_registers: vector registers one instruction needs besides its operands and its
        accumulator (an int16 product, a constant of ones), when that is known: the CPU
        strategy then sizes a register tile from the register file (schedules/cpu.py,
        operand_reuse_tile); None keeps its measured default tile.
    """

    name: str = field(kw_only=False)
    arch: str
    requires: Sequence[Sequence[str]]  # held as a tuple of tuples
    semantics: Callable[[], te.Tensor]
    emit: Callable[..., object]
    doc: str
    scopes: Mapping[str, str] = field(default_factory=dict)
    offset_factor: int = 1
    strided: tuple[str, ...] = ()
    operand_ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    helpers: Mapping[str, tuple[Callable, Callable]] = field(default_factory=dict)
    host_check: Callable[[], str | None] | None = None
    family: str = ""
    weight_bound: PairSumBound | None = None
    superseded_by: tuple[str, ...] = ()
    scratch_registers: int | None = None

    def __post_init__(self) -> None:
        # the arguments may come as lists or dicts: held as tuples and private copies
        normal = {"requires": tuple(tuple(alt) for alt in self.requires),
                  "scopes": dict(self.scopes), "strided": tuple(self.strided),
                  "operand_ranges": dict(self.operand_ranges), "helpers": dict(self.helpers),
                  "family": self.family or self.name,
                  "superseded_by": tuple(self.superseded_by)}
        for key, value in normal.items():
            object.__setattr__(self, key, value)

    # -- semantics and what is read off it -------------------------------------------------
    @functools.cached_property
    def output(self) -> te.Tensor:
        """The semantics' output te.Tensor (its op is the te.compute)."""
        return self.semantics()

    @property
    def inputs(self) -> list[te.Tensor]:
        """The semantics' input te.Tensors, in operand order."""
        return list(self.output.op.input_tensors)

    @property
    def operands(self) -> list[str]:
        """Operand names: inputs then the accumulator/output."""
        return [t.op.name for t in self.inputs] + [self.output.op.name]

    @property
    def input_dtypes(self) -> tuple[str, ...]:
        return tuple(str(t.dtype) for t in self.inputs)

    @property
    def output_dtype(self) -> str:
        return str(self.output.dtype)

    @property
    def loops(self) -> list[tuple[str, int, str]]:
        """[(name, extent, 'S' | 'R')] in the compute's order: data-parallel then reduction."""
        op = self.output.op
        out = [(ax.var.name, int(ax.dom.extent), "S") for ax in op.axis]
        out += [(ax.var.name, int(ax.dom.extent), "R") for ax in op.reduce_axis]
        return out

    @property
    def lanes(self) -> int:
        """Number of output elements one instruction produces."""
        n = 1
        for _, ext, kind in self.loops:
            n *= ext if kind == "S" else 1
        return n

    @property
    def reduction_width(self) -> int:
        """Number of products summed into each output element."""
        n = 1
        for _, ext, kind in self.loops:
            n *= ext if kind == "R" else 1
        return n

    @property
    def weight_word(self) -> int:
        """Elements of one output's reduction stored together in the second operand (the one a
        model's weights fill): 4 for the int8 words of VNNI, sdot and AMX, 2 for bf16 pairs, 8
        for smmla's rows. Packed weights are KCRS[x/word]c[y]k[word]c with it."""
        return int(self.inputs[1].shape[-1])

    @functools.cached_property
    def _spatial_reads(self) -> dict[str, set[str]]:
        """{input name: the data-parallel loops its indices use}."""
        spatial = {ax.var.name for ax in self.output.op.axis}
        used: dict[str, set[str]] = {t.op.name: set() for t in self.inputs}

        def visit(call: tvm.ir.Call) -> None:
            if getattr(call.op, "name", None) == _TENSOR_LOAD:
                for idx in list(call.args)[1:]:
                    used[call.args[0].op.name].update(
                        v.name for v in tvm.tirx.analysis.undefined_vars(idx) if v.name in spatial)

        tvm_ffi.structural_walk(self.output.op.body[0], [(tvm.ir.expr.Call, visit)])
        return used

    @property
    def broadcast_operand(self) -> str | None:
        """Name of the input read by no data-parallel loop (broadcast to every lane, UNIT
        Fig. 4a), or None."""
        return next((name for name, loops in self._spatial_reads.items() if not loops), None)

    @property
    def lanewise(self) -> bool:
        """Whether every input is indexed by every data-parallel loop: each output lane reads
        its own operands (a depthwise window), none is shared across lanes."""
        n_spatial = len(self.output.op.axis)
        return all(len(loops) == n_spatial for loops in self._spatial_reads.values())

    @property
    def tile(self) -> bool:
        """Whether it is a tile instruction (AMX, i8mm, wmma): each input is shared along some
        data-parallel loop and none is broadcast, so rows of pixels are read with a stride; the
        layouts that suit it (a conv's window folded into the reduction) differ from a vector
        one's."""
        return not self.broadcast_operand and not self.lanewise

    @property
    def channel_blocks(self) -> tuple[int, int]:
        """(x, y): the input- and output-channel blocks of a packed layout the instruction reads
        directly (NCHW[x]c activations, KCRS[x/4]c[y]k[4]c weights): its reduction width and its
        innermost data-parallel extent. A lanewise instruction reduces over window taps, not
        channels: both blocks are its lanes (a depthwise conv's NCHW[y]c in and out)."""
        spatial = [ext for _, ext, kind in self.loops if kind == "S"]
        return (spatial[-1] if self.lanewise else self.reduction_width), spatial[-1]

    @property
    def ops_per_instruction(self) -> int:
        """Arithmetic operations (multiply + add counted as 2) one instruction performs."""
        return 2 * self.lanes * self.reduction_width

    @functools.cached_property
    def pointer_operands(self) -> bool:
        """Whether the emit rule takes operands by pointer (tvm_access_ptr: AMX, vdpbf16ps)
        rather than loading them as vectors: read off the implementation."""
        found: list[tvm.ir.Call] = []

        def visit(call: tvm.ir.Call) -> None:
            if getattr(call.op, "name", None) == "tirx.tvm_access_ptr":
                found.append(call)

        tvm_ffi.structural_walk(self.impl.body, [(tvm.ir.expr.Call, visit)])
        return bool(found)

    # -- TensorIntrin -------------------------------------------------------------------------
    @functools.cached_property
    def desc(self) -> tirx.PrimFunc:
        """The TensorIntrin description, derived from the semantics."""
        return derive_desc(self.output, scopes=self.scopes, offset_factor=self.offset_factor)

    @functools.cached_property
    def impl(self) -> tirx.PrimFunc:
        """The TensorIntrin implementation: derived buffers around the hand-written emit rule."""
        return derive_impl(self.output, self.emit, scopes=self.scopes,
                           offset_factor=self.offset_factor, strided=self.strided)

    @property
    def tensor_intrin(self) -> str:
        """Name under which the TensorIntrin is registered with TVM (registered on first use)."""
        return _register(self)

    def helper(self, name: str) -> str:
        """Registered TensorIntrin name of one of this instruction's helpers (e.g. 'load_a')."""
        _register(self)
        if name not in self.helpers:
            raise KeyError(f"{self.name} has no helper {name!r}; it has {sorted(self.helpers)}")
        return f"unit_tvm.{self.name}.{name}"

    # -- targets ------------------------------------------------------------------------------
    def missing_features(self, target: tvm.target.Target | dict[str, Any] | None) -> list[str]:
        """Features the target lacks for this instruction ([] when supported).

        Names the smallest missing set among the alternatives, or the architecture mismatch.
        """

        target = _target.as_target(target)
        arch = _target.arch(target)
        if arch != self.arch:
            return [f"arch {self.arch} (target is {arch})"]
        have = _target.features(target)
        # per alternative, then the smallest of them (list[str])
        missing: list[Any] = [sorted(set(alt) - have) for alt in self.requires]
        missing = min(missing, key=len) if missing else []
        if not missing and self.host_check is not None and _target.is_host(target):
            reason = self.host_check()
            if reason:
                missing = [reason]
        return missing

    def supported(self, target: tvm.target.Target | dict[str, Any] | None = None) -> bool:
        """True when `target` (default: this host) can execute this instruction."""
        return not self.missing_features(target)

    def __repr__(self) -> str:
        loops = " x ".join(f"{e}{k}" for _, e, k in self.loops)
        dtypes = ",".join(self.input_dtypes)
        return f"Intrinsic({self.name}: {dtypes} -> {self.output_dtype}, {loops})"


_REGISTERED: set[str] = set()


def _register(intrin: Intrinsic) -> str:
    name = f"unit_tvm.{intrin.name}"
    if name not in _REGISTERED:
        tvm.s_tir.TensorIntrin.register(name, intrin.desc, intrin.impl, override=True)
        for helper, (desc_fn, impl_fn) in intrin.helpers.items():
            tvm.s_tir.TensorIntrin.register(f"{name}.{helper}", desc_fn(), impl_fn(), override=True)
        _REGISTERED.add(name)
    return name


def placeholders(**specs: tuple[tuple[int, ...], str]) -> tuple[te.Tensor, ...]:
    """Convenience for semantics: placeholders(a=((4,), 'uint8'), ...) -> tuple of te tensors."""
    return tuple(te.placeholder(shape, dtype, name=n) for n, (shape, dtype) in specs.items())
