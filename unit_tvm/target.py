"""Targets: the host CPU as a TVM Target, and the ISA features of any target."""

import functools
import os

import tvm
from tvm.target import codegen

# /proc/cpuinfo flag -> LLVM feature name, for the features our instructions need. LLVM's own
# host detection names a CPU model (e.g. "rocketlake" on a VM that reports model 167) whose
# feature list can miss what the VM really exposes (avxvnni, avx512bf16), so we add those.
_CPUINFO_TO_LLVM = {
    "avx2": "avx2",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512vl": "avx512vl",
    "avx512dq": "avx512dq",
    "avx512_vnni": "avx512vnni",
    "avx_vnni": "avxvnni",
    "avx512_bf16": "avx512bf16",
    "avx512_fp16": "avx512fp16",
    "avx512vbmi": "avx512vbmi",
    "amx_tile": "amx-tile",
    "amx_int8": "amx-int8",
    "amx_bf16": "amx-bf16",
}


# ISA levels a user may restrict this host to (UNIT_TVM_ISA / --isa), named as oneDNN names them
# (ONEDNN_MAX_CPU_ISA), and the LLVM features each level turns off: an AMX server can then be
# measured as the VNNI-only server it also stands for.
_AMX = ("amx-tile", "amx-int8", "amx-bf16")
ISA_LEVELS = {
    "native": (),
    "avx512_core_amx": (),
    "avx512_core_vnni": _AMX + ("avx512bf16", "avx512fp16"),
    "avx512_core": _AMX + ("avx512bf16", "avx512fp16", "avx512vnni", "avxvnni"),
    "avx2_vnni": _AMX + ("avx512f",),
    "avx2": _AMX + ("avx512f", "avxvnni"),
}


def isa_level():
    """The ISA level this process is restricted to ($UNIT_TVM_ISA, default 'native');
    ValueError naming the levels for an unknown one."""

    level = (os.environ.get("UNIT_TVM_ISA") or "native").lower()
    if level not in ISA_LEVELS:
        raise ValueError(f"UNIT_TVM_ISA={level!r} is not one of {', '.join(ISA_LEVELS)}")
    return level


def _cpuinfo_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def host(num_cores=None):
    """Return a tvm.target.Target (dict form) for this CPU: LLVM's host CPU plus /proc/cpuinfo
    features, less those the ISA level ($UNIT_TVM_ISA) turns off.

    num_cores defaults to the number of CPUs this process may run on.
    """
    # keyed on the level read now: `unit-tvm --isa` sets it after imports that may already
    # have asked for the host, and a target cached before it would keep the turned-off
    # instructions (AMX kernels timed against engines held to VNNI)
    return _host(num_cores, isa_level())


def restricted(level, num_cores=None):
    """This host less the features ISA level `level` turns off (ISA_LEVELS): a target that is
    at most that level and whose code runs here, whatever this CPU is (on an AVX2-only host
    'avx512_core' is the host itself)."""
    if level not in ISA_LEVELS:
        raise ValueError(f"ISA level {level!r} is not one of {', '.join(ISA_LEVELS)}")
    return _host(num_cores, level)


@functools.lru_cache(maxsize=None)
def _host(num_cores, level):
    cpu = codegen.llvm_get_system_cpu()
    if num_cores is None:
        num_cores = len(os.sched_getaffinity(0))
    base = tvm.target.Target({"kind": "llvm", "mcpu": cpu})
    have = set(codegen.llvm_get_cpu_features(base))
    extra = sorted(
        "+" + llvm
        for flag, llvm in _CPUINFO_TO_LLVM.items()
        if flag in _cpuinfo_flags() and llvm not in have
    )
    spec = {"kind": "llvm", "mcpu": cpu, "num-cores": int(num_cores)}
    off = ["-" + f for f in ISA_LEVELS[level]]
    if extra or off:
        spec["mattr"] = [e for e in extra if "-" + e[1:] not in off] + off
    return tvm.target.Target(spec)


def as_target(target):
    """Coerce None (this host), a dict or a Target into a tvm.target.Target."""
    if target is None:
        return host()
    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, dict):
        return tvm.target.Target(target)
    raise TypeError(
        f"target must be None, a dict or a tvm.target.Target, got {type(target).__name__} "
        f"({target!r}); TVM 0.27 rejects string targets, use e.g. "
        "{'kind': 'llvm', 'mcpu': 'znver4'}"
    )


def is_gpu(target) -> bool:
    """Whether `target` is a CUDA GPU (the GPU strategy, fp16 model path, device timing)."""
    return as_target(target).kind.name == "cuda"


def cuda_target(dev) -> tvm.target.Target:
    """The CUDA target of GPU `dev` (a tvm.cuda device): its own sm_XY architecture."""
    return tvm.target.Target({"kind": "cuda", "arch": "sm_" + dev.compute_version.replace(".",
                                                                                           "")})


def is_cpu(target) -> bool:
    """Whether `target` is an LLVM CPU target (x86 or aarch64)."""
    return as_target(target).kind.name == "llvm"


def arch(target):
    """'x86_64', 'aarch64', 'cuda' or another triple prefix for a target."""
    target = as_target(target)
    if target.kind.name == "cuda":
        return "cuda"
    if target.kind.name != "llvm":
        return target.kind.name
    triple = str(target.attrs.get("mtriple", "")) or codegen.llvm_get_system_triple()
    return triple.split("-")[0]


def features(target):
    """The set of ISA features a target enables (LLVM names; CUDA: {'sm_XY', 'tensorcore'})."""
    target = as_target(target)
    if target.kind.name == "cuda":
        sm = str(target.attrs.get("arch", "sm_50"))
        out = {sm}
        if int(sm.split("_")[1][:2]) >= 70:
            out.add("tensorcore")
        if int(sm.split("_")[1][:2]) >= 72:
            out.add("tensorcore-int8")
        return out
    if target.kind.name != "llvm":
        return set()
    return set(codegen.llvm_get_cpu_features(target))


def _x86_vector_bits(target) -> int:
    """Widest float vector of an x86 target: 512 with AVX-512, 256 with AVX, 128 (SSE); 0 on
    another architecture."""
    if arch(target) != "x86_64":
        return 0
    found = features(target)
    return 512 if "avx512f" in found else 256 if "avx" in found else 128


def vector_registers(target) -> int:
    """Vector registers a CPU target's code may use: 32 with AVX-512 (zmm0-31) and on aarch64
    (v0-31), 16 on x86 without it (ymm0-15 on AVX2). Register tiles are sized from it."""
    bits = _x86_vector_bits(as_target(target))
    return 16 if bits and bits < 512 else 32


# Per-core L2 of the CPU a target names (LLVM's -mcpu), from the vendors' documentation: the
# cache a register tile's re-read operand should come from (schedules/loop_order.py). Other
# and unnamed CPUs: 1 MB (Skylake-SP, Zen 4 / Zen 5, Neoverse V1).
_L2_BYTES = {"haswell": 256 << 10, "broadwell": 256 << 10, "znver1": 512 << 10,
             "znver2": 512 << 10, "znver3": 512 << 10, "icelake-server": 1280 << 10,
             "sapphirerapids": 2 << 20, "emeraldrapids": 2 << 20, "graniterapids": 2 << 20}
DEFAULT_L2_BYTES = 1 << 20


def l2_bytes(target) -> int:
    """Bytes of one core's L2 cache on a CPU target (by its -mcpu; 1 MB when unknown)."""
    mcpu = str(as_target(target).attrs.get("mcpu", ""))
    return _L2_BYTES.get(mcpu, DEFAULT_L2_BYTES)


# Per-core L1 data cache, the same way: 48 KB on Zen 5 and Intel's cores since Ice Lake; 32 KB
# on the others (Haswell to Skylake-SP, Zen 1-4, Neoverse).
_L1_BYTES = {"znver5": 48 << 10, "icelake-server": 48 << 10, "sapphirerapids": 48 << 10,
             "emeraldrapids": 48 << 10, "graniterapids": 48 << 10}
DEFAULT_L1_BYTES = 32 << 10


def l1_bytes(target) -> int:
    """Bytes of one core's L1 data cache on a CPU target (by its -mcpu; 32 KB when unknown)."""
    mcpu = str(as_target(target).attrs.get("mcpu", ""))
    return _L1_BYTES.get(mcpu, DEFAULT_L1_BYTES)


def float_lanes(target) -> int:
    """float32 lanes of one vector register of a CPU target: 16 with AVX-512, 8 with AVX, 4
    otherwise (SSE, NEON)."""
    return max(_x86_vector_bits(as_target(target)), 128) // 32


def is_host(target):
    """True when kernels built for `target` can run on this machine."""
    target = as_target(target)
    if target.kind.name != "llvm" or arch(target) != arch(host()):
        return False
    return features(target) <= features(host()) | {"64bit"}


def instruction_target(intrin):
    """A target that can execute `intrin`: this host when it can, else this host's CPU with the
    instruction's first feature set added (to compile its kernels here and run them elsewhere, or
    to check everything but the instruction itself)."""
    base = host()
    if intrin.supported(base) or intrin.arch != arch(base):
        return base
    spec = dict(base.export())
    have = features(base)
    add = sorted("+" + f for f in intrin.requires[0] if f not in have)
    spec["mattr"] = list(spec.get("mattr", [])) + add
    return tvm.target.Target({k: v for k, v in spec.items() if k in (
        "kind", "mcpu", "mattr", "num-cores", "mtriple")})
