"""A default CPU schedule for the operators no instruction covers (pooling, softmax, layer norm,
elementwise ops left by legalization, int8 depthwise convs): TVM's TIR is a serial loop nest, which at batch 1
can cost more than all the tensorized convolutions. Each block's leading data-parallel loops are
fused and parallelised, and its innermost data-parallel loop vectorised when it is the last loop.
"""

import tvm
from tvm import s_tir

MIN_PARALLEL = 64  # below this many iterations threads cost more than they save


def _schedule(func):
    sch = s_tir.Schedule(func)
    root = sch.get_sblock("root")
    for block in sch.get_child_blocks(root):
        loops = sch.get_loops(block)
        kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
        if not loops or len(kinds) != len(loops):
            continue
        lead = 0
        while lead < len(loops) and kinds[lead] == 0:
            lead += 1
        if lead == 0:
            continue
        extents = [int(sch.get(lp).extent) for lp in loops]
        reduction = lead < len(loops)
        # the last data-parallel loop is vectorised: innermost already for elementwise blocks; for
        # reductions (matmul, softmax sums) the reduction loops move outside it
        vec = lead - 1 if lead >= 2 and extents[lead - 1] % 8 == 0 else None
        par, total = [], 1
        for lp, ext in zip(loops[:lead if vec is None else vec], extents):
            par.append(lp)
            total *= ext
            if total >= 4 * MIN_PARALLEL:
                break
        if vec is not None and reduction:
            sch.reorder(*loops[:vec], *loops[lead:], loops[vec])
        if total >= MIN_PARALLEL and par:
            sch.parallel(sch.fuse(*par) if len(par) > 1 else par[0])
        if vec is not None:
            _, v = sch.split(loops[vec], [None, 8])
            sch.vectorize(v)
        if reduction and vec is not None:
            # the init moves above the reduction loops (their RVs survive the fuse and split)
            sch.decompose_reduction(block, loops[lead])
    return sch.mod["main"]


@tvm.transform.module_pass(opt_level=0, name="UnitDefaultCPUSchedule")
class DefaultCPUSchedule:
    """tvm.transform.Pass: parallel/vector schedule for unscheduled CPU PrimFuncs of a module."""

    def transform_module(self, mod, ctx):  # noqa: D401 - tvm pass hook
        updates = {}
        for gv, func in mod.functions.items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            if func.attrs is not None and "tirx.is_scheduled" in func.attrs:
                continue  # tensorized kernels (and anything scheduled before us)
            try:
                new = _schedule(func)
            except (tvm.s_tir.ScheduleError, tvm.error.InternalError, ValueError):
                continue  # keep TVM's loop nest for anything unusual
            updates[gv] = new.with_attr("tirx.is_scheduled", True)
        for gv, f in updates.items():
            mod[gv] = f
        return mod
