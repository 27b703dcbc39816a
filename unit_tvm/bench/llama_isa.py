"""llama.cpp held to an ISA level (`unit-tvm --isa`): the installed llama-cpp-python is built for
this CPU (`-march=native`), so it would ignore the level. A held level gets llama.cpp built again
from llama-cpp-python's source with only the instructions that level keeps (ggml's CMake switches,
derived from unit_tvm.target's ISA levels, so the engines are held to the same features), once
per level and version, into a cache folder; bench-llm then imports that build instead."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from .. import target as target_mod

# ggml's x86 CMake switch -> the LLVM features it compiles for (every one must be kept)
GGML_SWITCHES = {
    "GGML_SSE42": ("sse4.2",),
    "GGML_AVX": ("avx",),
    "GGML_AVX2": ("avx2",),
    "GGML_FMA": ("fma",),
    "GGML_F16C": ("f16c",),
    "GGML_BMI2": ("bmi2",),
    "GGML_AVX_VNNI": ("avxvnni",),
    # ggml's AVX512 switch compiles for F, CD, VL, DQ and BW together
    "GGML_AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "GGML_AVX512_VBMI": ("avx512f", "avx512vbmi"),
    "GGML_AVX512_VNNI": ("avx512f", "avx512vnni"),
    "GGML_AVX512_BF16": ("avx512f", "avx512bf16"),
    "GGML_AMX_TILE": ("amx-tile",),
    "GGML_AMX_INT8": ("amx-tile", "amx-int8"),
    "GGML_AMX_BF16": ("amx-tile", "amx-bf16"),
}
PACKAGE = "llama-cpp-python"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "unit-tvm" / "llama-cpp"


def is_held(level: str) -> bool:
    """Whether ISA level `level` keeps fewer features than this CPU has (the installed,
    native llama.cpp would then run instructions the level excludes)."""
    return (target_mod.features(target_mod.restricted(level))
            != target_mod.features(target_mod.restricted("native")))


def cmake_args(level: str) -> list[str]:
    """ggml's CMake switches for a build that runs exactly the features `level` keeps on this
    CPU: each switch on where the restricted host target has all its features, off otherwise,
    and no native detection."""
    have = target_mod.features(target_mod.restricted(level))
    switches = [f"-D{name}={'ON' if all(f in have for f in needs) else 'OFF'}"
                for name, needs in GGML_SWITCHES.items()]
    return ["-DGGML_NATIVE=OFF", *switches]


def build_folder(level: str) -> Path:
    """Where the build for `level` on this CPU lives: keyed by the package's version and the
    switches, so another CPU class or version never reuses it."""
    version = metadata.version(PACKAGE)
    key = hashlib.sha256(" ".join(cmake_args(level)).encode()).hexdigest()[:12]
    return CACHE / f"{version}-{level}-{key}"


def ensure_built(level: str) -> Path:
    """The folder holding a llama_cpp package built for `level` (built now when missing:
    pip from source, about 3 minutes on 2 cores). RuntimeError with pip's tail on failure."""
    folder = build_folder(level)
    if (folder / "llama_cpp" / "__init__.py").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    print(f"building llama.cpp held to {level} ({' '.join(cmake_args(level))}); once, about "
          "3 minutes", file=sys.stderr, flush=True)
    staging = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    env = {**os.environ, "CMAKE_ARGS": " ".join(cmake_args(level))}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-cache-dir",
         "--no-binary", PACKAGE, "--target", str(staging),
         f"{PACKAGE}=={metadata.version(PACKAGE)}"], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise RuntimeError(f"building llama.cpp for {level} failed:\n{done.stderr[-2000:]}")
    try:
        staging.rename(folder)
    except OSError:  # another process finished the same build first: keep its copy
        shutil.rmtree(staging, ignore_errors=True)
        if not (folder / "llama_cpp" / "__init__.py").exists():
            raise
    return folder


def use_build_for(level: str) -> Path | None:
    """Make `import llama_cpp` load the build held to `level` (built when missing); None where
    the level holds nothing back on this CPU (the installed build is used). RuntimeError when
    llama_cpp was imported already (its library cannot be swapped in a running process)."""
    if not is_held(level):
        return None
    if "llama_cpp" in sys.modules:
        raise RuntimeError("llama_cpp is imported already: the build held to "
                           f"{level} must be chosen before it")
    folder = ensure_built(level)
    sys.path.insert(0, str(folder))
    return folder
