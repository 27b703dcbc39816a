"""Software prefetch of the operand a tensorized kernel streams: the next panel of weights.

A tensorized CPU kernel reads its weights one panel per register tile: the lines the tile's
reduction touches (a dense layer's 2 column blocks x 768 rows, 24 KB; a conv's output-channel
block over its whole window, 36 KB for 256 -> 256 3x3). Every tile of a panel but the first
finds it in cache; the first waits for memory, line by line, because the instruction issues
faster than one core's share of DRAM bandwidth can feed it (16 vpdpbusd per 128 bytes of a
2-block dense tile: ~30 GB/s at 4 GHz). Where the weights do not stay in cache between calls
(BERT-base's 85 MB, ResNet-50's 25 MB on a shared 32 MB L3) that wait is not hidden. Measured
on Zen 4 (min of 40 calls, weights in cache / evicted by rotating 28 copies): BERT's FFN-up
dense (768 -> 3072) 755 / 786 us without prefetch, 733 / 743 us with it; ResNet-50's 3x3
512 -> 512 stride 2 (vpdpbusd.256) 243 / 277 us without, 238 / 245 us with.

The strategy (schedules/cpu.py) marks the outermost reduction loop around the instruction with
PREFETCH_ATTR; `prefetch_next_panel`, a TIR pass run after TVM's lowering (flat buffers), finds
the vector loads of at least MIN_VECTOR_BYTES in that loop (the instruction's streamed operand;
the broadcast operand is a 4-byte load), measures the span the loop nest reads of each such
buffer (the panel), and issues a prefetch of the line one panel ahead of each load, into L2.
The panel after a tile's is the one the same thread uses next whatever the loop order: packed
weights hold each output-channel block's reduction contiguously. A load whose span is not a
compile-time constant (a window clipped at run time) gets no prefetch.
"""

import tvm
import tvm_ffi
from tvm import tirx

from .te_expr import substitute

PREFETCH_ATTR = "unit_tvm.prefetch_next_panel"
MIN_VECTOR_BYTES = 32  # a ymm or zmm operand; 4-byte broadcasts and scalars are left alone
# Instruction updates per streamed vector below which a tile gets no prefetch: measured on Zen 4,
# a prefetch per update slowed the classifier of mobilenet_v2 (1 row: 1280 -> 1000) from 7.7 to
# 10.8 us, where the hardware prefetcher already follows a stream read once.
MIN_REUSE = 4
# Smaller operands are left alone: they stay in a core's L2 (1-2 MB on these servers) from one
# call to the next in small models, and inside big ones their first tile is a short wait; the
# prefetches also kept LLVM from unrolling small windows (a 3x3 conv with 9 KB of weights
# compiled to a loop over window rows instead of straight code).
MIN_STREAM_BYTES = 64 * 1024
# Larger panels get no prefetch: the panel fetched ahead has to sit in L2 beside the one every
# row of tiles still re-reads: two of these fill a quarter of a 1 MB L2 (Skylake-SP, Zen 4 /
# Zen 5) and half of Zen 3's 512 KB (Haswell's 256 KB would need less; not measured).
# Measured on Zen 5 (fp32, weights in cache): ResNet's 3x3 convs at 7x7
# (512 channels, 2 blocks: a 590 KB panel) 505-517 us with the prefetch, 413 us without; at
# 14x14 (147 KB) 432-463 against 406; end to end (`profile --fp32`, weights from memory)
# ResNet-50 18.1-18.5 ms either way, BERT-base 46.4-50.9 with it, 44.7-48.4 capped.
MAX_PANEL_BYTES = 128 * 1024
_LOCALITY_L2 = 2  # llvm.prefetch locality 2: prefetcht1 on x86 (measured: L1 gained less)


def _stream_loads(body):
    """(TensorLoad, its base with the loop's Binds substituted) of every wide vector load in
    `body` from a buffer the body does not write (an accumulator tile is written), the loops
    inside it: [(var, min, extent)], and how many stores it holds (instruction updates)."""
    binds, loads, loops, written = [], [], [], []

    def on_bind(stmt):
        binds.append((stmt.var, substitute(stmt.value, binds)))

    def on_for(loop):
        loops.append((loop.loop_var, loop.min, loop.extent))

    def on_store(store):
        written.append(store.buffer.name)

    def on_load(load):
        if _is_stream(load):
            loads.append((load, substitute(load.indices[0].base, binds)))

    tvm_ffi.structural_walk(body, [(tirx.Bind, on_bind), (tirx.For, on_for),
                                   (tirx.BufferStore, on_store),
                                   (tvm.ir.expr.TensorLoad, on_load)], order="pre")
    loads = [(load, base) for load, base in loads if load.source.name not in written]
    return loads, loops, len(written)


def _bytes(dtype) -> int:
    """Bytes of one value of `dtype` (all its lanes)."""
    dtype = tvm.runtime.DataType(str(dtype))
    return dtype.bits * dtype.lanes // 8


def _is_stream(load) -> bool:
    """A load of MIN_VECTOR_BYTES or more consecutive elements of a flat buffer."""
    return (len(load.indices) == 1 and isinstance(load.indices[0], tirx.Ramp)
            and _bytes(load.ty.dtype) >= MIN_VECTOR_BYTES)


def _panels(loop):
    """{buffer name: elements one pass of `loop` reads of it, first lane to last} for each
    buffer streamed in `loop`; a buffer whose span is not a constant is left out, and all are
    when the tile uses each streamed vector fewer than MIN_REUSE times."""
    loads, loops, updates = _stream_loads(loop.body)
    distinct = {(load.source.name, tvm_ffi.structural_hash(base)) for load, base in loads}
    if updates < MIN_REUSE * len(distinct):
        return {}
    loops.append((loop.loop_var, loop.min, loop.extent))
    dom = {v: tvm.sym.IntervalSet(lo, lo + ext - 1) for v, lo, ext in loops}
    ana = tvm.sym.Analyzer()
    by_buffer, dtypes = {}, {}
    for load, base in loads:
        buf = load.source
        if int(buf.shape[0]) * _bytes(buf.dtype) < MIN_STREAM_BYTES:
            continue
        bounds = ana.int_set(base, dom)
        lanes = int(load.indices[0].lanes)
        by_buffer.setdefault(buf.name, []).append((bounds.min_value, bounds.max_value + lanes))
        dtypes[buf.name] = buf.dtype
    panels = {}
    for name, spans in by_buffer.items():
        ref = spans[0][0]
        offsets = [ana.simplify(x - ref) for span in spans for x in span]
        if all(isinstance(x, tirx.IntImm) for x in offsets):
            span = max(int(x) for x in offsets) - min(int(x) for x in offsets)
            if span * _bytes(dtypes[name]) <= MAX_PANEL_BYTES:
                panels[name] = span
    return panels


def _prefetch(load, panel):
    """Evaluate: prefetch the line `panel` elements after `load`'s first lane. The address is
    formed as a byte offset on a handle, not as an index of the buffer: past the last panel it
    points beyond the buffer, which a prefetch may (it never faults, on x86 or ARM) and which an
    in-bounds index may not; a clamp to the buffer cost 4 instructions per prefetch."""
    buf, base = load.source, load.indices[0].base
    here = tirx.address_of(tirx.BufferLoad(buf, [base]))
    ahead = tirx.handle_add_byte_offset(here, panel * _bytes(buf.dtype))
    return tirx.Evaluate(tirx.call_llvm_intrin(
        "void", "llvm.prefetch.p0", ahead, tirx.const(0, "int32"),
        tirx.const(_LOCALITY_L2, "int32"), tirx.const(1, "int32")))


def _with_prefetches(loop):
    panels = _panels(loop)
    done = set()

    def on_store(store, mutator):
        fetches = []

        def on_load(load):
            if not _is_stream(load) or load.source.name not in panels:
                return
            key = (load.source.name, tvm_ffi.structural_hash(load.indices[0].base))
            if key not in done:
                done.add(key)
                fetches.append(_prefetch(load, panels[load.source.name]))

        tvm_ffi.structural_walk(store.value, [(tvm.ir.expr.TensorLoad, on_load)], order="pre")
        return tirx.SeqStmt(fetches + [store]) if fetches else store

    if not panels:
        return loop
    body = tvm_ffi.structural_mutate(loop.body, [(tirx.BufferStore, on_store)])
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body,
                    loop.thread_binding, loop.annotations, loop.step)


@tirx.transform.prim_func_pass(opt_level=0, name="unit_tvm.PrefetchNextPanel")
def prefetch_next_panel(func, _mod, _ctx):
    """Prefetch, in every loop marked with PREFETCH_ATTR, the next panel of each streamed
    operand (module docstring)."""

    def on_for(loop, mutator):
        loop = mutator.default_mutate(loop)
        return _with_prefetches(loop) if PREFETCH_ATTR in loop.annotations else loop

    return func.with_body(tvm_ffi.structural_mutate(func.body, [(tirx.For, on_for)]))


