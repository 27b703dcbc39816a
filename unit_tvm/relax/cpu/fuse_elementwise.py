"""Chains of elementwise ops left after quantization and tensorization, fused into one kernel
each before the default CPU schedule (relax/cpu/default_schedule.py) gives them loops.

TVM's build pipeline does not fuse: after legalization each op is a PrimFunc and a kernel of its
own that reads and writes a whole tensor. Models whose activations are spelled as several ops
(hardswish is an add, two clips, a multiply and a divide; a squeeze-excitation gate's sigmoid and
multiply) spent half their time in those passes (torchvision's mobilenet_v3_large: 53% of its
kernel time). Only elementwise, broadcast and injective PrimFuncs that nothing has scheduled
yet are grouped (TVM's FuseOps and FuseTIR); reductions (softmax, layer norm, pools) and every
kernel already scheduled (the tensorized ones, the quantizer's own) stay as they are."""

import tvm
from tvm import relax

# TVM's OpPatternKind values: elementwise 0, broadcast 1, injective 2, ..., opaque 8
_INJECTIVE = 2
_OPAQUE = 8


def _keep_apart(mod: tvm.IRModule) -> tvm.IRModule:
    """The module with every PrimFunc that FuseOps must not merge marked opaque: scheduled
    ones (marked first, so that AnnotateTIROpPattern, which keeps a pattern already set, does
    not analyse the tensorized kernels), and whatever it finds to be more than injective."""
    for gv, func in list(mod.functions.items()):
        if isinstance(func, tvm.tirx.PrimFunc) and "tirx.is_scheduled" in (func.attrs or {}):
            mod[gv] = func.with_attr("op_pattern", _OPAQUE)
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    for gv, func in list(mod.functions.items()):
        if isinstance(func, tvm.tirx.PrimFunc) and int(func.attrs["op_pattern"]) > _INJECTIVE:
            mod[gv] = func.with_attr("op_pattern", _OPAQUE)
    return mod


def fuse_elementwise(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` (legalized) with its chains of unscheduled elementwise / broadcast / injective
    PrimFuncs fused, each chain into one PrimFunc (cpu/default_schedule.py inlines its stages)."""
    mod = relax.transform.FuseOps()(_keep_apart(mod))
    return relax.transform.FuseTIR()(mod)
