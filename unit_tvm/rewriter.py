"""Rewriter: prepare operands, tile the mapped loops by the instruction's extents, move them
innermost, tensorize (UNIT §III-C); loops around the instruction follow schedules/cpu.py."""

import tvm
from tvm import s_tir, te, tirx

from . import checks
from .mapping import Mapping
from .prepare import prepare
from .schedules import cpu, gpu
from .target import as_target, is_gpu


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
        _partition_padding(sch, block, sch.get_loops(block)[1:])


def _partition_padding(sch, block, inner_loops):
    """Mark the first inner loop of a padding stage (a pack or copy that writes the pad value
    outside the input: if_then_else(i >= pad and j < w + pad ..., x[...], pad)) for TVM's
    LoopPartition pass, which splits it into left pad, interior and right pad: the interior
    runs without the guard and vectorises (measured: the ResNet stem's quantize + pad + pack
    39 us -> 5.4 us, Zen 5)."""
    value = getattr(sch.get(block).body, "value", None)
    if not (isinstance(value, tvm.ir.expr.Call) and value.op.name.endswith("if_then_else")):
        return
    if inner_loops and sch.get(inner_loops[0]).kind != tirx.ForKind.VECTORIZED:
        sch.annotate(inner_loops[0], "pragma_loop_partition_hint", 1)


def producer_stages(sch, prepared):
    """Blocks computed once per call before the core: packs, shifts, compensation, and any
    producer the op itself has (e.g. a fused input quantization)."""
    skip = {prepared.core.op.name, prepared.output.op.name}
    root = sch.get_sblock("root")
    return [sch.get(b).name_hint for b in sch.get_child_blocks(root)
            if sch.get(b).name_hint not in skip]


def _inline_copy_stages(sch, prepared, intrin):
    """Inline producer stages read by nothing but other producers (a pad or a +128 shift feeding
    a pack): one pass less, and no buffer dies before the core. That matters for instructions
    that take their operands by pointer (AMX, vdpbf16ps): TVM's storage rewrite would lay a
    later buffer (the accumulator, a pack) into a dead buffer of another dtype (a u8 shift, a
    bf16 pad it re-typed to f32), and the pointer then fails to lower. ValueError when such an
    instruction meets a stage that cannot be inlined."""
    keep = {prepared.core.op.name, prepared.output.op.name}
    changed = True
    while changed:
        changed = False
        readers = {}
        for b in sch.get_child_blocks(sch.get_sblock("root")):
            for r in sch.get(b).reads:
                readers.setdefault(r.source.name, set()).add(sch.get(b).name_hint)
        for name in producer_stages(sch, prepared):
            written = sch.get(sch.get_sblock(name)).writes[0].source.name
            if readers.get(written, set()) & keep or not readers.get(written):
                continue
            try:
                sch.compute_inline(sch.get_sblock(name))
            except s_tir.ScheduleError:
                if intrin.pointer_operands:
                    raise ValueError(f"stage {name} cannot be inlined into the stage that reads "
                                     f"it, and {intrin.name} takes its operands by pointer "
                                     "(TVM's storage rewrite could re-type them)") from None
                continue
            changed = True
            break


def schedule(prepared, intrin, config=None, target=None):
    """s_tir.Schedule of a Prepared graph: the CPU strategy (schedules/cpu.py) around the
    tensorized core, or the GPU strategy (schedules/gpu.py) for a CUDA target."""
    target = as_target(target)
    if is_gpu(target):
        sch = s_tir.Schedule(te.create_prim_func(prepared.tensors))
        gpu.apply(sch, prepared, intrin, config if config is not None else gpu.GpuConfig())
        return sch
    mapping = prepared.mapping
    core_op = prepared.core.op
    n_spatial = len(core_op.axis)
    sch = s_tir.Schedule(te.create_prim_func(prepared.tensors))
    _inline_copy_stages(sch, prepared, intrin)
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
    checks.te_op(op, "unit_tvm.rewrite")
    intrin = checks.intrinsic(intrinsic, "unit_tvm.rewrite")
    if mapping is not None and not isinstance(mapping, Mapping):
        raise TypeError(f"unit_tvm.rewrite: mapping must be a unit_tvm.Mapping from "
                        f"unit_tvm.inspect, got {type(mapping).__name__}")
    if config is not None and not isinstance(config, (cpu.CpuConfig, gpu.GpuConfig)):
        raise TypeError(f"unit_tvm.rewrite: config must be a schedules.cpu.CpuConfig or "
                        f"schedules.gpu.GpuConfig, got {type(config).__name__}")
    target = as_target(target)
    return schedule(prepare_for(op, intrin, target, mapping, params), intrin, config, target)


def prepare_for(op, intrin, target, mapping=None, params=None, epilogue=None):
    """prepare() with the target's choices: on GPU operands are staged one loop per dimension
    (fragment loads); on CPU a register tile's columns are padded to a width it can hold
    (schedules.cpu.tiled_extent: 17 -> 18)."""
    cuda = is_gpu(target)
    return prepare(op, intrin, mapping, params, separable=cuda, epilogue=epilogue,
                   tile_columns=None if cuda else cpu.tiled_extent)
