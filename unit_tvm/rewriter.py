"""Rewriter: prepare operands, tile the mapped loops by the instruction's extents, move them
innermost, tensorize (UNIT §III-C); loops around the instruction follow schedules/cpu.py."""

from tvm import s_tir, te

from . import intrinsics
from .prepare import prepare
from .schedules import cpu, gpu
from .target import as_target


def _parallel_stage(sch, block, min_extent=64):
    """Run a preparation stage (pack, shift, compensation) once, its leading data-parallel loops
    fused until there is enough parallel work (batch 1 and one channel block are extent 1)."""
    loops = sch.get_loops(block)
    kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    if len(kinds) != len(loops):
        return
    lead, total = 0, 1
    while lead < len(loops) and kinds[lead] == 0 and total < min_extent:
        total *= int(sch.get(loops[lead]).extent)
        lead += 1
    if lead == 0 or total < 2:
        return
    sch.parallel(sch.fuse(*loops[:lead]) if lead > 1 else loops[0])
    if lead < len(loops):
        cpu.vectorize_lanes(sch, block)  # a copy along contiguous channel blocks (NCHW16c)


def producer_stages(sch, prepared):
    """Blocks computed once per call before the core: packs, shifts, compensation, and any
    producer the op itself has (e.g. a fused input quantization)."""
    skip = {prepared.core.op.name, prepared.output.op.name}
    root = sch.get_sblock("root")
    return [sch.get(b).name_hint for b in sch.get_child_blocks(root)
            if sch.get(b).name_hint not in skip]


def schedule(prepared, intrin, config=None, target=None):
    """s_tir.Schedule of a Prepared graph: the CPU strategy (schedules/cpu.py) around the
    tensorized core, or the GPU strategy (schedules/gpu.py) for a CUDA target."""
    target = as_target(target)
    if target.kind.name == "cuda":
        sch = s_tir.Schedule(te.create_prim_func(prepared.tensors))
        gpu.apply(sch, prepared, intrin, config if config is not None else gpu.GpuConfig())
        return sch
    mapping = prepared.mapping
    core_op = prepared.core.op
    n_spatial = len(core_op.axis)
    sch = s_tir.Schedule(te.create_prim_func(prepared.tensors))
    for name in producer_stages(sch, prepared):
        _parallel_stage(sch, sch.get_sblock(name))
    block = sch.get_sblock(core_op.name)
    loops = sch.get_loops(block)
    outer = dict(enumerate(loops))
    intrin_loops = []
    for m in mapping.loops:
        if m.op_extent == m.intrin_extent:
            intrin_loops.append(loops[m.op_index])
            del outer[m.op_index]
        else:
            o, i = sch.split(loops[m.op_index], [None, m.intrin_extent])
            outer[m.op_index] = o
            intrin_loops.append(i)
    spatial = [outer[i] for i in sorted(outer) if i < n_spatial]
    reduce = [outer[i] for i in sorted(outer) if i >= n_spatial]
    if config is None:
        config = cpu.default(prepared, target)
    epilogue = sch.get_sblock(prepared.output.op.name)
    if prepared.shifted:
        # the epilogue also reads the compensation, produced once at root; TVM can only compute a
        # block per tile when all its producers are in that tile, so it runs as its own pass
        _parallel_stage(sch, epilogue)
        epilogue = None
    cpu.apply(sch, block, spatial, reduce, intrin_loops, config, write_back=epilogue)
    sch.tensorize(intrin_loops[0], intrin.tensor_intrin)
    return sch


def rewrite(op, intrinsic, mapping=None, config=None, target=None, params=None):
    """Schedule `op` (a te.Tensor from te.compute) so that its core is `intrinsic`.

    mapping: a Mapping of the instruction on `op` (default: the Inspector's best; s8 x s8 ops are
    shifted to u8 x s8 first when the instruction needs it); config: a schedules.cpu.CpuConfig
    (default: the strategy's default breakpoints). Returns the s_tir.Schedule, whose function
    takes op's placeholders (in first-read order) and then the output.
    """
    intrin = intrinsics.get(intrinsic) if isinstance(intrinsic, str) else intrinsic
    target = as_target(target)
    prepared = prepare(op, intrin, mapping, params, separable=target.kind.name == "cuda")
    return schedule(prepared, intrin, config, target)
