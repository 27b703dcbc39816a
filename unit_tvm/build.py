"""unit_tvm.build: one tensor operation -> a runtime module, tensorized where an instruction
fits."""

import os
import warnings
from dataclasses import dataclass

import tvm
from tvm import te
from tvm.s_tir import dlight

from . import checks, epilogue, intrinsics, lowering, selection
from .inspector import inspect
from .prepare import placeholders_of
from .rewriter import prepare_for, schedule
from .runner import prepare_host, target_for
from .target import as_target, is_gpu
from .tuner import tune_instruction
from .tuner.database import Database


class FallbackWarning(UserWarning):
    """No instruction could be used; TVM's default schedule was built instead."""


def _split(tensors):
    """(inputs, output), checked: the inputs must be exactly the placeholders the output reads
    (TVM would otherwise fail inside its C++ when making the function)."""
    if isinstance(tensors, te.Tensor) or not isinstance(tensors, (list, tuple)):
        # a te.Tensor is indexable, so list() of one would never end
        raise TypeError(f"unit_tvm.build takes a list of te tensors [inputs..., output], got "
                        f"{type(tensors).__name__}")
    tensors = list(tensors)
    if not tensors or not all(isinstance(t, te.Tensor) for t in tensors):
        raise TypeError("unit_tvm.build takes te tensors: the inputs, then the te.compute output")
    inputs, out = tensors[:-1], tensors[-1]
    checks.te_op(out, "unit_tvm.build (its last tensor)")
    needed = placeholders_of(out)
    if len(inputs) != len(needed) or not all(any(t.same_as(n) for n in needed) for t in inputs):
        raise ValueError(f"inputs {[t.op.name for t in inputs]} are not the placeholders "
                         f"{[t.op.name for t in needed]} that {out.op.name} reads")
    return inputs, out


def _exact_everywhere(candidates):
    """The instructions exact on their operands' whole dtype range: vpmaddubsw (exact only for
    u7 activations) is used only when named, by a caller who knows the data's range."""
    return [i for i in candidates if not i.operand_ranges]


def choose(out, target=None, intrinsic=None, params=None):
    """(Intrinsic, Prepared, default Schedule) for `out` on `target`, or (None, reason, None)
    when nothing applies. The instruction is the one unit_tvm.selection prefers among those
    whose default schedule tensorizes the op."""
    target = as_target(target)
    if intrinsic is not None:
        candidates = [intrinsics.require(intrinsic, target) if isinstance(intrinsic, str)
                      else intrinsic]
    else:
        candidates = _exact_everywhere(intrinsics.for_target(target))
    reasons = []

    def evaluate(intrin):
        try:
            prepared = prepare_op(out, intrin, params=params, target=target)
            sch = schedule(prepared, intrin, None, target)  # the default must tensorize
        except (ValueError, tvm.s_tir.ScheduleError) as e:
            reasons.append(str(e).splitlines()[0])
            return None
        cand = selection.Candidate(intrin, selection.mapping_waste(prepared.original_mapping),
                                   (prepared, sch))
        if not cand.fits:
            reasons.append(f"{intrin.name} would compute {cand.waste:.1f}x the work (padding)")
        return cand

    chosen = selection.first_choice(candidates, evaluate)
    if chosen is not None:
        return (chosen.intrinsic, *chosen.prepared)
    if not candidates:
        limited = [i for i in intrinsics.for_target(target) if i.operand_ranges]
        reasons.append(f"no registered instruction runs on {target}" if not limited else
                       "only instructions exact on a restricted operand range run here ("
                       + ", ".join(f"{i.name}: {i.operand_ranges}" for i in limited)
                       + "); name one with intrinsic= if the data stays in that range")
    return None, "; ".join(reasons), None


def alternatives(out, target=None, intrinsic=None, params=None, first=None):
    """Every (Intrinsic, Prepared) that computes `out` on `target` with a default schedule that
    tensorizes: each applicable instruction (or `intrinsic`) with each of the Inspector's
    feasible mappings, the static choice (see choose; `first` when the caller has it) first.
    The tuner races them."""
    target = as_target(target)
    if first is None:
        first, _, _ = choose(out, target, intrinsic, params)
    if first is None:
        return []
    if intrinsic is not None:
        pool = [intrinsics.require(intrinsic, target) if isinstance(intrinsic, str) else intrinsic]
    else:
        pool = _exact_everywhere(intrinsics.for_target(target))
    found = []
    chain = epilogue.find(out)
    for intrin in pool:
        # None: the operands re-based (unit_tvm.shift) when the op as written does not match
        mappings = list(enumerate(inspect(chain.core if chain else out, intrin))) or [(0, None)]
        for i, mapping in mappings:
            try:
                prepared = prepare_op(out, intrin, mapping, params=params, target=target)
                schedule(prepared, intrin, None, target)
            except (ValueError, tvm.s_tir.ScheduleError):
                continue
            if selection.mapping_waste(prepared.original_mapping) > selection.MAX_WASTE:
                continue
            if i:
                prepared.variant = "mapping " + ",".join(
                    f"{m.intrin_loop}:{m.op_loop}" for m in mapping.loops)
            found.append((intrin, prepared))
    if any(not _replicates(p) for _, p in found):
        # an instruction that needs an operand copied to every lane (a dense on a lanewise
        # instruction) only adds a pack to what another one computes directly
        found = [(i, p) for i, p in found if not _replicates(p)]
    found.sort(key=lambda a: a[0] is not first or bool(a[1].variant))  # stable: registry order
    return found


def prepare_op(out, intrin, mapping=None, params=None, target=None):
    """prepare() for an op as users write it: a reduction, or elementwise stages after one
    (bias, activation, requantization), which go into the kernel's write-back."""
    target = as_target(target)
    chain = epilogue.find(out)
    if chain is None:
        return prepare_for(out, intrin, target, mapping, params)
    return prepare_for(chain.core, intrin, target, mapping, params, epilogue=chain.spec(out))


def _replicates(prepared):
    """Whether preparation copies an operand across instruction loops it does not vary along
    (the Inspector's broadcast operands)."""
    return any(a.broadcast_along for a in prepared.original_mapping.operands)


def default_schedule(func, target):
    """TVM's own schedule for a function no instruction fits: as is on CPU; on GPU, dlight's
    fallback (threads bound, so the kernel is valid)."""
    mod = tvm.IRModule({"main": func})
    if is_gpu(target):

        with target:
            mod = dlight.ApplyDefaultSchedule(dlight.gpu.Fallback())(mod)
    return mod


@dataclass(frozen=True)
class BuildReport:
    """What unit_tvm.build made of one operation: the module and how it computes the op."""
    module: object  # the runtime module, callable as module(*arrays)
    intrinsic: str = ""  # the instruction used; "" when TVM's default schedule was built
    mapping: str = ""  # the loop mapping ("" for the Inspector's first), e.g. "i:j,k:r"
    stages: tuple = ()  # preparation stages (packs, shifts, compensation)
    reason: str = ""  # why no instruction was used, when none was

    @property
    def tensorized(self) -> bool:
        """Whether an instruction computes the op's core."""
        return bool(self.intrinsic)


def build_report(tensors, target=None, *, intrinsic=None, tune=False, trials=None,
                 database=None, runner=None) -> BuildReport:
    """unit_tvm.build, returning a BuildReport (module, instruction, mapping, fallback reason)."""
    _check_build_args(intrinsic, tune, trials, database)
    target = target_for(target, runner)
    prepare_host()
    inputs, out = _split(tensors)
    intrin, prepared, sch = choose(out, target, intrinsic, params=inputs)
    if intrin is None:
        warnings.warn(f"unit_tvm.build: no tensorized instruction used: {prepared}",
                      FallbackWarning, stacklevel=3)
        module = lowering.build(default_schedule(te.create_prim_func(inputs + [out]), target),
                                target)
        return BuildReport(module, reason=prepared)
    if tune or database is not None:
        # every instruction and mapping that fits is an alternative: a database record of any
        # decides; tuning times each one's default config and tunes the fastest
        alts = (alternatives(out, target, intrinsic, params=inputs, first=intrin)
                or [(intrin, prepared)])
        index, result = tune_instruction(alts, target, trials=trials, database=database,
                                         measure=bool(tune), runner=runner)
        intrin, prepared = alts[index]
        sch = schedule(prepared, intrin, result.config, target)
    module = lowering.build(sch.mod, target)
    return BuildReport(module, intrin.name, prepared.variant, tuple(prepared.stages))


def _check_build_args(intrinsic, tune, trials, database):
    """TypeError naming the expected type, before anything reaches TVM."""
    checks.intrinsic(intrinsic, "unit_tvm.build", optional=True)
    checks.flag(tune, "tune", "unit_tvm.build")
    checks.count(trials, "trials", "unit_tvm.build")
    if database is not None and not isinstance(database, (str, os.PathLike, Database)):
        raise TypeError(f"unit_tvm.build: database must be a path or a unit_tvm.tuner.Database, "
                        f"got {type(database).__name__} ({database!r})")


def build(tensors, target=None, *, intrinsic=None, tune=False, trials=None, database=None,
          runner=None) -> tvm.runtime.Module:
    """Compile the te.compute `tensors[-1]` (its input placeholders are `tensors[:-1]`).

    target: None (this host), a dict or a tvm.target.Target. Returns a module callable as
    mod(*arrays) with the arrays in the order of `tensors`. The best applicable instruction is
    chosen by the Inspector unless `intrinsic` names one; when none applies, a FallbackWarning
    says why and TVM's default schedule is built (a correct result, never an exception).
    tune / trials / database: every fitting instruction and loop mapping (`alternatives`) is
    timed with its default config and the fastest tuned (see unit_tvm.tuner.tune_instruction);
    a database record of any of them is used without measuring. build_report() also says
    which instruction and mapping were used. runner: where tuning measures (default: this
    machine; a unit_tvm.fleet.RpcRunner times candidates on a tracker's servers, and `target`
    defaults to theirs).
    """
    return build_report(tensors, target, intrinsic=intrinsic, tune=tune, trials=trials,
                        database=database, runner=runner).module
