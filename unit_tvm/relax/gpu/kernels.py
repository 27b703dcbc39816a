"""The Tensor Core kernels of a model on the GPU path: one tensorized PrimFunc per distinct te
op (layers of equal shape share it), with the default config, a database's or a tuned one (each
form of the op raced), and the report of what computes each op."""

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import NamedTuple

import tvm

from ...build import alternatives, choose
from ...rewriter import schedule
from ...tuner import tune_instruction

# set by te_reference(): read by every Kernels of this thread or task while it is on
_TE_REFERENCE = contextvars.ContextVar("unit_tvm_gpu_te_reference", default=False)


@dataclass(frozen=True)
class GpuKernel:
    """One tensorized (or not) op of the model: what the report says about it."""
    op: str  # e.g. "conv2d 1x56x56x64 -> 64 k3x3 s1"
    intrinsic: str  # "" when TVM's own schedule computes it
    reason: str = ""
    form: str = ""  # how the op was written for it: "direct" / "gemm" (gpu_conv), "dense"


class Made(NamedTuple):
    """A tensorized kernel of the model: its PrimFunc, instruction and the op's form."""

    func: tvm.tirx.PrimFunc
    intrinsic: str
    form: str


@dataclass
class Kernels:
    """Tensorized PrimFuncs built so far, one per distinct te op (layers of equal shape share)."""
    target: object
    database: object
    tune: bool
    trials: object
    funcs: dict = field(default_factory=dict)  # te signature -> Made or None
    report: list = field(default_factory=list)

    def get(self, signature, forms, label):
        """Made computing the op, or None when no instruction fits any form. forms: form name
        -> te tensors ([inputs..., out]) of the same op, the preferred form first."""
        if signature not in self.funcs:
            self.funcs[signature] = self._make(forms)
        made = self.funcs[signature]
        self.report.append(GpuKernel(label, made.intrinsic if made else "",
                                     "" if made else "no Tensor Core instruction fits",
                                     made.form if made else ""))
        return made

    def _make(self, forms):
        """Without tuning or a database: the preferred form that tensorizes, default config.
        Otherwise every form's alternatives are raced (or the database's fastest is taken).
        Within te_reference(): the preferred form's te definition, unscheduled."""
        if _TE_REFERENCE.get():
            form, tensors = next(iter(forms.items()))
            return Made(tvm.te.create_prim_func(tensors), "te", form)
        alts, form_of = [], []
        for form, tensors in forms.items():
            inputs, out = tensors[:-1], tensors[-1]
            intrin, prepared, sch = choose(out, self.target, params=inputs)
            if intrin is None:
                continue
            if not (self.tune or self.database is not None):
                return Made(sch.mod["main"], intrin.name, form)
            found = alternatives(out, self.target, params=inputs, first=intrin) or [
                (intrin, prepared)]
            alts += found
            form_of += [form] * len(found)
        if not alts:
            return None
        index, result = tune_instruction(alts, self.target, trials=self.trials,
                                         database=self.database, measure=self.tune)
        intrin, prepared = alts[index]
        sch = schedule(prepared, intrin, result.config, self.target)
        return Made(sch.mod["main"], intrin.name, form_of[index])


@contextlib.contextmanager
def te_reference():
    """Within it, each kernel the GPU pass makes is its op's te definition, unscheduled: the
    pass's module then builds and runs on a CPU, which checks everything around the kernels
    (layouts, chains, operand loads, quantization) against a reference; the kernels
    themselves are checked against the same te definitions on a GPU."""
    token = _TE_REFERENCE.set(True)
    try:
        yield
    finally:
        _TE_REFERENCE.reset(token)
