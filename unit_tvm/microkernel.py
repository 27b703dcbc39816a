"""Kernels made of one instruction, generated from its semantics for any registered Intrinsic.

- `instruction_kernel`: n independent copies of the instruction's semantics, tensorized so that
  each copy is exactly one instruction. Used to check an instruction against numpy.
- `peak_kernel`: a register block of rows x cols independent accumulators that reuse loaded
  operands (a GEMM micro-kernel), all data in L1, used to measure the instruction's peak.
"""

import numpy as np
from tvm import s_tir, te, tirx

from .measure import numpy_dtype
from .te_expr import mutate_expr as _mutate_expr


def _rebuild(intrin, shapes, index_of, out_shape, out_index, name):
    """Re-express the semantics over bigger tensors.

    shapes: operand name -> new shape; index_of(name, new spatial vars, old indices) -> new
    indices; out_index(new spatial vars) -> the semantics' own spatial vars (a slice of them).
    Returns (input placeholders in operand order, output tensor).
    """
    sem = intrin.output
    red = sem.op.body[0]
    old_inputs = intrin.inputs
    new_inputs = [te.placeholder(shapes[t.op.name], t.dtype, name=t.op.name) for t in old_inputs]
    by_name = {t.op.name: t for t in new_inputs}
    extra_axes = []
    if isinstance(red, tirx.Reduce):
        extra_axes = [ax for ax in red.axis]

    def body(*vs):
        var_map = {ax.var.name: v for ax, v in zip(sem.op.axis, out_index(vs))}
        src = red.source[0] if isinstance(red, tirx.Reduce) else red
        src = _mutate_expr(src, lambda t, idx: by_name[t.op.name](*index_of(t.op.name, vs, idx)),
                           var_map)
        return te.sum(src, axis=extra_axes) if extra_axes else src

    out = te.compute(out_shape, body, name=name)
    return new_inputs, out


def instruction_kernel(intrin, n):
    """(prim_func, inputs, output): n independent instances of `intrin`, each one instruction."""
    shapes = {t.op.name: (n, *[int(s) for s in t.shape]) for t in intrin.inputs}
    out_shape = (n, *[int(s) for s in intrin.output.shape])
    ins, out = _rebuild(
        intrin, shapes,
        index_of=lambda name, vs, idx: (vs[0], *idx),
        out_shape=out_shape, out_index=lambda vs: vs[1:], name=intrin.output.op.name,
    )
    sch = s_tir.Schedule(te.create_prim_func(ins + [out]))
    block = sch.get_sblock(out.op.name)
    loops = sch.get_loops(block)
    # the init block goes above the instruction's loops, so the tensorized loop has one child
    sch.decompose_reduction(block, loops[1])
    sch.tensorize(sch.get_loops(block)[1], intrin.tensor_intrin)
    return sch.mod["main"], ins, out


def peak_kernel(intrin, threads, rows=6, cols=4, steps=None, reps=None):
    """A prim_func that issues threads * reps * steps * rows * cols independent instructions.

    Each of `threads` parallel chunks keeps a rows x cols block of accumulators in registers;
    per step it loads `cols` vectors of the shared operand and broadcasts `rows` values of the
    broadcast operand (the register block of a GEMM micro-kernel). All data stays in L1, so the
    kernel measures the instruction's throughput. Returns (func, inputs, output, ops).
    """
    # the broadcast operand (or, for tile instructions, the first) varies along rows, the others
    # along columns; steps keep each thread's operands within ~32 KiB of L1
    bname = intrin.broadcast_operand or intrin.inputs[0].op.name
    step_bytes = 0
    for t in intrin.inputs:
        n = 1
        for x in t.shape:
            n *= int(x)
        itemsize = np.dtype(numpy_dtype(t.dtype)).itemsize
        step_bytes += n * (rows if t.op.name == bname else cols) * itemsize
    if steps is None:
        steps = max(1, min(64, 32768 // step_bytes))
    if reps is None:
        reps = max(1, (1 << 26) // (steps * rows * cols * intrin.ops_per_instruction))
    shapes = {}
    for t in intrin.inputs:
        own = [int(x) for x in t.shape]
        block = rows if t.op.name == bname else cols
        shapes[t.op.name] = (threads, steps, block, *own)
    out_shape = (threads, rows, cols, *[int(x) for x in intrin.output.shape])
    rep = te.reduce_axis((0, reps), name="rep")
    step = te.reduce_axis((0, steps), name="step")

    def index_of(name, vs, idx):
        return (vs[0], step, vs[1] if name == bname else vs[2], *idx)

    ins, out = _rebuild(intrin, shapes, index_of, out_shape, lambda vs: vs[3:], "peak")
    red = out.op.body[0]
    out = te.compute(
        out_shape,
        lambda *vs: te.sum(
            _mutate_expr(red.source[0], lambda t, idx: t(*idx),
                         {ax.var.name: v for ax, v in zip(out.op.axis, vs)}),
            axis=[rep, step] + list(red.axis),
        ),
        name="peak",
    )
    sch = s_tir.Schedule(te.create_prim_func(ins + [out]))
    block = sch.get_sblock("peak")
    loops = sch.get_loops(block)
    n_sp = len(out_shape)
    p, r_loop, c_loop, inner_sp = loops[0], loops[1], loops[2], loops[3:n_sp]
    rep_l, step_l, inner_red = loops[n_sp], loops[n_sp + 1], loops[n_sp + 2:]
    sch.reorder(p, rep_l, step_l, r_loop, c_loop, *inner_sp, *inner_red)
    # a small function-local buffer is an alloca that LLVM keeps in registers
    acc = sch.cache_write(block, 0, "global")
    sch.reverse_compute_at(acc, p)
    sch.parallel(p)
    sch.unroll(r_loop)
    sch.unroll(c_loop)
    sch.decompose_reduction(block, rep_l)
    sch.tensorize(inner_sp[0], intrin.tensor_intrin)
    ops = threads * reps * steps * rows * cols * intrin.ops_per_instruction
    return sch.mod["main"], ins, out, ops


def wmma_kernel(intrin, n):
    """(prim_func, inputs, output): n independent 16x16x16 Tensor Core tiles, one warp each.

    Operands go global -> shared -> wmma fragment through the instruction's helper intrinsics
    (load_a / load_b / fill / store); the mma itself through its main TensorIntrin.
    """
    shapes = {t.op.name: (n, *[int(s) for s in t.shape]) for t in intrin.inputs}
    out_shape = (n, *[int(s) for s in intrin.output.shape])
    ins, out = _rebuild(
        intrin, shapes, index_of=lambda name, vs, idx: (vs[0], *idx),
        out_shape=out_shape, out_index=lambda vs: vs[1:], name=intrin.output.op.name,
    )
    sch = s_tir.Schedule(te.create_prim_func(ins + [out]))
    block = sch.get_sblock(out.op.name)
    frags = []
    for i, scope in enumerate(("wmma.matrix_a", "wmma.matrix_b")):
        shared = sch.cache_read(block, i, "shared")
        frag = sch.cache_read(block, i, scope)
        frags.append((shared, frag))
    acc = sch.cache_write(block, 0, "wmma.accumulator")
    tile = sch.get_loops(block)[0]
    sch.bind(tile, "blockIdx.x")
    sch.reverse_compute_at(acc, tile)
    for shared, frag in frags:
        sch.compute_at(frag, tile)
        sch.compute_at(shared, tile)
        fused = sch.fuse(*sch.get_loops(shared)[1:])
        _, tx = sch.split(fused, [None, 32])
        sch.bind(tx, "threadIdx.x")
    init = sch.decompose_reduction(block, sch.get_loops(block)[1])
    sch.tensorize(sch.get_loops(init)[1], intrin.helper("fill"))
    sch.tensorize(sch.get_loops(block)[1], intrin.tensor_intrin)
    for (_, frag), helper in zip(frags, ("load_a", "load_b")):
        sch.tensorize(sch.get_loops(frag)[1], intrin.helper(helper))
    sch.tensorize(sch.get_loops(acc)[1], intrin.helper("store"))
    return sch.mod["main"], ins, out
