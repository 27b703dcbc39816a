"""How unit-tvm lowers its kernels: TVM's own TIR pipeline, with register tiles kept on the stack.

TVM places a CPU allocation on the stack only when it is smaller than 1024 bytes (LowerTVMBuiltin,
runtime::kMaxStackAlloca); anything larger comes from TVMBackendAllocWorkspace, a pointer LLVM
cannot promote to registers. A register tile of 16 accumulators of 16 int32 lanes is 1024 bytes,
so a 17-accumulator tile (a 17-column row of Inception) lived in memory: LLVM still kept it in
registers where every update ran, but a tap behind a run-time test (a window row that may read
padding) made it store the accumulators after each instruction. On the stack the tile is an
alloca that LLVM promotes to registers whatever the control flow.

`build` and `compile_relax` use the pipeline named by `pipeline(target)`: for CPU targets TVM's
"s_tir" pipeline with one pass added before the host's final lowering, `tiles_on_stack`, which
marks global allocations of at most STACK_TILE_BYTES with TVM's `disable_lower_builtin`
annotation (LowerTVMBuiltin then leaves them as stack allocas); other targets get TVM's default.
"""

import contextlib

import tvm
import tvm_ffi
from tvm import tirx
from tvm.tirx import compilation_pipeline

from .prefetch import prefetch_next_panel
from .target import is_cpu, is_gpu

# Measured on Zen 4 (vpdpbusd, 2 threads, both variants built and timed alternately in one
# process): with the tile on the stack (and padding rows skipped behind a run-time test, which
# schedules/padding_taps.py allows up to this size) Inception's 7x1 conv at 17x17 with 17
# accumulators ran 10% faster, its 1x1 768 -> 192 6% faster, 1x7 and 20-21 accumulator tiles
# 1-4% faster, 14-16 accumulators unchanged; 25 and 28 accumulators (more than the register file
# holds beside the operands) were erratic either way, up to 1.7x slower, so they stay where TVM
# puts them. 24 accumulators of 64 bytes:
STACK_TILE_BYTES = 1536

_ANNOTATION = "disable_lower_builtin"  # tirx.transform.kDisableLowerTVMBuiltin
PIPELINE = "unit_tvm"


def _constant_bytes(buffer) -> int:
    """Bytes of an allocation of constant shape, 0 if its shape is symbolic."""
    n = buffer.dtype.bits * buffer.dtype.lanes // 8
    for extent in buffer.shape:
        if not isinstance(extent, tirx.IntImm):
            return 0
        n *= int(extent)
    return n


def _on_stack(alloc, mutator):
    alloc = mutator.default_mutate(alloc)
    buffer = alloc.buffer
    if buffer.scope() != "global" or not 0 < _constant_bytes(buffer) <= STACK_TILE_BYTES:
        return alloc
    annotations = dict(alloc.annotations)
    annotations[_ANNOTATION] = tirx.IntImm("int32", 1)
    return tirx.AllocBuffer(buffer, annotations)


@tirx.transform.prim_func_pass(opt_level=0, name="unit_tvm.TilesOnStack")
def tiles_on_stack(func, _mod, _ctx):
    """Mark every global allocation of constant size <= STACK_TILE_BYTES for the stack."""
    return func.with_body(tvm_ffi.structural_mutate(func.body, [(tirx.AllocBuffer, _on_stack)]))


def _unit_tvm_pipeline(**kwargs):
    """TVM's s_tir pipeline, with prefetch_next_panel (prefetch.py) and tiles_on_stack ahead of
    the host's finalization passes (the first of which, LowerTVMBuiltin, decides stack or
    workspace)."""
    lower, finalize_host, finalize_device = compilation_pipeline.get_tir_pipeline("s_tir", **kwargs)
    return (lower, lambda: tvm.ir.transform.Sequential(
        [prefetch_next_panel, tiles_on_stack, finalize_host()]), finalize_device)


def pipeline(target) -> str:
    """Name of the TIR pipeline for `target`: "unit_tvm" on CPUs (registered on first use),
    TVM's "default" elsewhere (GPU host code may allocate device memory, which must stay with
    the runtime)."""
    if target is None or not is_cpu(target):
        return "default"
    if PIPELINE not in compilation_pipeline.PIPELINE_MAP:
        compilation_pipeline.register_tir_pipeline(PIPELINE, _unit_tvm_pipeline)
    return PIPELINE


def gpu_pass_config(target) -> dict:
    """PassContext settings a build for `target` needs: on CUDA, the copies a software pipeline
    marks asynchronous become cp.async (schedules/gpu.py `pipeline`); nothing else changes, a
    kernel without such marks compiles as before."""
    return {"tirx.use_async_copy": True} if target is not None and is_gpu(target) else {}


def _context(target):
    """The current PassContext (its level, passes and instruments kept) with
    gpu_pass_config(target) added to its config."""
    extra = gpu_pass_config(target)
    if not extra:
        return contextlib.nullcontext()
    current = tvm.transform.PassContext.current()
    return tvm.transform.PassContext(
        opt_level=current.opt_level, required_pass=list(current.required_pass),
        disabled_pass=list(current.disabled_pass), instruments=list(current.instruments),
        config={**dict(current.config), **extra})


def build(mod, target) -> tvm.runtime.Module:
    """tvm.tirx.build of a PrimFunc or IRModule through `pipeline(target)`."""
    with _context(target):
        return tvm.tirx.build(mod, target=target, pipeline=pipeline(target))


def compile_relax(mod, target) -> tvm.runtime.Executable:
    """tvm.compile of a Relax module, its TIR functions through `pipeline(target)`."""
    with _context(target):
        return tvm.compile(mod, target=target, tir_pipeline=pipeline(target))
