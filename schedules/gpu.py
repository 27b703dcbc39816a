"""GPU strategy around a Tensor Core core (UNIT §III-C GPU tuning, Fig. 6).

The Rewriter's prepared core has the instruction's m x n fragment loops innermost. Around them:
- thread blocks: the data-parallel loops outside the fragments (batch, the M and N tiles);
- warps: each warp accumulates a p x p window of 16x16 fragments as an outer product (p fragments
  of A and p of B loaded per reduction step feed p*p mma), so every fragment is reused p times;
- shared memory: per reduction step, the block's A and B tiles are staged in shared memory by all
  threads and reused by every warp of the block;
- options: `fuse_spatial` folds every data-parallel loop outside M/N into the block index (the
  paper's H/W fusion for small layers), `k_step` reduction fragments staged per shared tile.
Split-K (a reduction split across warps with a shared-memory reduction) is not implemented.
"""

from dataclasses import dataclass

FRAGMENT = 16
MAX_THREADS = 1024
SHARED_LIMIT = 48 * 1024


@dataclass(frozen=True)
class GpuConfig:
    """p: fragments per warp along M and N; warps_m x warps_n warps per block; k_step: 16-wide
    reduction fragments per shared-memory stage."""

    p: int = 2
    warps_m: int = 2
    warps_n: int = 2
    k_step: int = 2
    fuse_spatial: bool = True

    def key(self):
        return {"p": self.p, "warps_m": self.warps_m, "warps_n": self.warps_n,
                "k_step": self.k_step, "fuse_spatial": self.fuse_spatial}

    def threads(self):
        return 32 * self.warps_m * self.warps_n

    def shared_bytes(self, a_bytes, b_bytes):
        """Shared memory of one block's A and B stages."""
        k = self.k_step * FRAGMENT
        return (self.warps_m * self.p * FRAGMENT * k * a_bytes
                + self.warps_n * self.p * FRAGMENT * k * b_bytes)


def _largest_divisor(n, limit):
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def fit(config, m_tiles, n_tiles, k_tiles):
    """The config clipped to the workload: every factor divides its loop (no predicates)."""
    p = min(config.p, _largest_divisor(m_tiles, config.p), _largest_divisor(n_tiles, config.p))
    wm = _largest_divisor(m_tiles // p, config.warps_m)
    wn = _largest_divisor(n_tiles // p, config.warps_n)
    ks = _largest_divisor(k_tiles, config.k_step)
    return GpuConfig(p, wm, wn, ks, config.fuse_spatial)


def config_space(m_tiles, n_tiles, k_tiles, a_bytes=2, b_bytes=2):
    """Distinct fitted configs within the thread and shared-memory limits: p in 1, 2, 4; warps
    1-4 per side; k_step 1, 2, 4."""
    out = []
    for p in (1, 2, 4):
        for wm in (1, 2, 4):
            for wn in (1, 2, 4):
                for ks in (1, 2, 4):
                    c = fit(GpuConfig(p, wm, wn, ks), m_tiles, n_tiles, k_tiles)
                    if (c not in out and c.threads() <= MAX_THREADS
                            and c.shared_bytes(a_bytes, b_bytes) <= SHARED_LIMIT):
                        out.append(c)
    return out


def _bind_copy(sch, block, threads_y):
    """All threads of the block copy a tile: fused loops split over threadIdx.y x threadIdx.x."""
    loops = sch.get_loops(block)
    fused = sch.fuse(*loops[-2:]) if len(loops) >= 2 else loops[-1]
    _, ty, tx = sch.split(fused, [None, threads_y, 32])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")


def _bind_elementwise(sch, block):
    loops = sch.get_loops(block)
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    bx, tx = sch.split(fused, [None, 128])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _read_index(sch, block, name):
    for i, region in enumerate(sch.get(block).reads):
        if region.source.name == name:
            return i
    raise ValueError(f"{name} is not read by the core")


def apply(sch, prepared, intrin, config):
    """Schedule a Prepared graph for a CUDA target; returns the (fitted) config used."""
    mapping = prepared.mapping
    core_op = prepared.core.op
    n_spatial = len(core_op.axis)
    skip = {core_op.name}
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(block).name_hint not in skip:  # packs, producers and the epilogue
            _bind_elementwise(sch, block)

    block = sch.get_sblock(core_op.name)
    loops = sch.get_loops(block)
    m_match, n_match, k_match = mapping.loops
    orig = prepared.original_mapping.loops
    m_pos, n_pos = orig[0].op_index, orig[1].op_index  # M/N tile loops of the core
    outer_spatial = [i for i in range(n_spatial) if i not in (m_match.op_index, n_match.op_index)]
    m_tiles = int(core_op.axis[m_pos].dom.extent)
    n_tiles = int(core_op.axis[n_pos].dom.extent)
    k_ext = int(core_op.reduce_axis[k_match.op_index - n_spatial].dom.extent)
    config = fit(config, m_tiles, n_tiles, k_ext // FRAGMENT)
    p, wm, wn, ks = config.p, config.warps_m, config.warps_n, config.k_step

    bm, tym, pm = sch.split(loops[m_pos], [None, wm, p])
    bn, tyn, pn = sch.split(loops[n_pos], [None, wn, p])
    ko, kk, ki = sch.split(loops[k_match.op_index], [None, ks, FRAGMENT])
    others = [loops[i] for i in outer_spatial if i not in (m_pos, n_pos)]
    red_others = [loops[i] for i in range(n_spatial, len(loops)) if i != k_match.op_index]
    im, jn = loops[m_match.op_index], loops[n_match.op_index]
    sch.reorder(*others, bm, bn, tym, tyn, *red_others, ko, kk, pm, pn, im, jn, ki)
    block_loops = others + [bm, bn] if config.fuse_spatial else [bm, bn]
    bx = sch.fuse(*block_loops)
    sch.bind(bx, "blockIdx.x")
    ty = sch.fuse(tym, tyn)
    sch.bind(ty, "threadIdx.y")

    # accumulators: a p x p window of fragments per warp, stored back through the helper
    acc = sch.cache_write(block, 0, "wmma.accumulator")
    sch.reverse_compute_at(acc, ty)
    a_name = next(o.op_tensor for o in mapping.operands if o.intrin_operand == "a")
    b_name = next(o.op_tensor for o in mapping.operands if o.intrin_operand == "b")
    for name, frag_scope, helper in ((a_name, "wmma.matrix_a", "load_a"),
                                     (b_name, "wmma.matrix_b", "load_b")):
        shared = sch.cache_read(block, _read_index(sch, block, name), "shared")
        sch.compute_at(shared, ko)
        _bind_copy(sch, shared, wm * wn)
        frag = sch.cache_read(block, _read_index(sch, block, shared_name(sch, shared)), frag_scope)
        sch.compute_at(frag, kk)
        f_loops = sch.get_loops(frag)
        r_o, r_i = sch.split(f_loops[-2], [None, FRAGMENT])
        c_o, c_i = sch.split(f_loops[-1], [None, FRAGMENT])
        sch.reorder(r_o, c_o, r_i, c_i)
        sch.tensorize(r_i, intrin.helper(helper))
    init = sch.decompose_reduction(block, red_others[0] if red_others else ko)
    i_loops = sch.get_loops(init)
    sch.tensorize(i_loops[-2], intrin.helper("fill"))
    sch.tensorize(im, intrin.tensor_intrin)
    a_loops = sch.get_loops(acc)
    r_o, r_i = sch.split(a_loops[-2], [None, FRAGMENT])
    c_o, c_i = sch.split(a_loops[-1], [None, FRAGMENT])
    sch.reorder(r_o, c_o, r_i, c_i)
    sch.tensorize(r_i, intrin.helper("store"))
    return config


def shared_name(sch, block):
    """Name of the buffer a cache stage block writes."""
    return sch.get(block).writes[0].source.name
