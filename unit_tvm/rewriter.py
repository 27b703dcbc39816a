"""Rewriter: prepare operands, tile the mapped loops by the instruction's extents, move them
innermost, tensorize (UNIT §III-C); the loops around the instruction follow the target's
strategy (schedules/)."""

from tvm import s_tir

from . import checks, schedules
from .mapping import Mapping
from .prepare import prepare
from .schedules import cpu, gpu
from .target import as_target


def schedule(prepared, intrin, config=None, target=None) -> s_tir.Schedule:
    """s_tir.Schedule of a Prepared graph: the target's strategy (schedules/cpu.py around the
    tensorized core on a CPU, schedules/gpu.py on CUDA) with `config` (None: its default)."""
    target = as_target(target)
    return schedules.for_target(target).schedule(prepared, intrin, config, target)


def rewrite(op, intrinsic, mapping: Mapping | None = None, config=None, target=None,
            params=None) -> s_tir.Schedule:
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
    missing = intrin.missing_features(target)
    if missing:
        # LLVM would abort the process when selecting the instruction for this target
        raise ValueError(f"unit_tvm.rewrite: {intrin.name} cannot be compiled for {target}: "
                         f"it lacks {', '.join(missing)} (unit_tvm.target.instruction_target"
                         "(intrin) is this host with them added, to compile only)")
    return schedule(prepare_for(op, intrin, target, mapping, params), intrin, config, target)


def prepare_for(op, intrin, target, mapping=None, params=None, epilogue=None):
    """prepare() with the target strategy's choices (`prepare_options`): on GPU operands are
    staged one loop per dimension (fragment loads); on CPU a register tile's columns are padded
    to a width it can hold (schedules.register_tiles.tiled_extent: 71 -> 72; 17 stays, one
    tile wide), then, where the strategy's default tile wants other columns for the prepared
    op (its `tile_columns`: 14 -> 15 for AVX2's 4 x 3), prepared again with those."""
    strategy = schedules.for_target(target)
    options = strategy.prepare_options(target)
    prepared = prepare(op, intrin, mapping, params, epilogue=epilogue, **options)
    wanted = strategy.tile_columns(prepared, intrin, target)
    if wanted is None:
        return prepared
    options = {**options, "tile_columns": lambda _extent: wanted}
    return prepare(op, intrin, mapping, params, epilogue=epilogue, **options)
