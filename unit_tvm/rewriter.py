"""Rewriter: tile the mapped loops by the instruction's extents, move them innermost, tensorize
(UNIT §III-C); the loops around the instruction follow the CPU strategy in schedules/cpu.py."""

from tvm import s_tir, te

from . import intrinsics
from .schedules import cpu
from .target import as_target


def as_prim_func(op):
    """A te.Tensor (its inputs become parameters, in order, then the output) or a PrimFunc."""
    if isinstance(op, te.Tensor):
        return te.create_prim_func(list(op.op.input_tensors) + [op])
    return op


def _loop_extents(op):
    axes = list(op.op.axis) + list(op.op.reduce_axis)
    return [int(ax.dom.extent) for ax in axes], len(op.op.axis)


def rewrite(op, intrinsic, mapping=None, config=None, target=None):
    """Schedule `op` (a te.Tensor from te.compute) so that its core is `intrinsic`.

    mapping: a Mapping (default: the Inspector's best); config: a schedules.cpu.CpuConfig
    (default: the strategy's default breakpoints for the target's thread count).
    Returns the s_tir.Schedule.
    """
    intrin = intrinsics.get(intrinsic) if isinstance(intrinsic, str) else intrinsic
    if mapping is None:
        from .inspector import inspect

        found = inspect(op, intrin)
        if not found:
            from .inspector import explain

            raise ValueError(f"{intrin.name} does not fit {op.op.name}: {explain(op, intrin)}")
        mapping = found[0]
    if mapping.padded:
        raise NotImplementedError("padded mappings are lowered by unit_tvm.build (pad first)")
    target = as_target(target)
    extents, n_spatial = _loop_extents(op)
    sch = s_tir.Schedule(as_prim_func(op))
    block = sch.get_sblock(op.op.name)
    loops = sch.get_loops(block)
    outer = dict(enumerate(loops))
    intrin_loops = []
    outer_extent = dict(enumerate(extents))
    for m in mapping.loops:
        if m.op_extent == m.intrin_extent:
            intrin_loops.append(loops[m.op_index])
            del outer[m.op_index]
        else:
            o, i = sch.split(loops[m.op_index], [None, m.intrin_extent])
            outer[m.op_index] = o
            outer_extent[m.op_index] = m.op_extent // m.intrin_extent
            intrin_loops.append(i)
    spatial = [idx for idx in sorted(outer) if idx < n_spatial]
    reduce = [idx for idx in sorted(outer) if idx >= n_spatial]
    threads = int(target.attrs.get("num-cores", 1))
    if config is None:
        config = cpu.default_config([outer_extent[i] for i in spatial], threads)
    cpu.apply(sch, block, [outer[i] for i in spatial], [outer[i] for i in reduce],
              intrin_loops, config)
    sch.tensorize(intrin_loops[0], intrin.tensor_intrin)
    return sch
