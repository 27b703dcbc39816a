"""Whole models on aarch64: an aarch64 Python with TVM's runtime, run under qemu-aarch64.

A model compiled for aarch64 (`unit_tvm.compile(mod, target=aarch64.target(), ...)`) is exported
with the cross compiler and run by Debian's arm64 Python with the pinned apache-tvm and
apache-tvm-ffi aarch64 wheels, under qemu-user, through TVM's own runtime VM: the same path as
on a real ARM server (there, `pip install apache-tvm==...` and `unit_tvm.load`).

The aarch64 root (a folder: the arm64 Python and its libraries unpacked from Debian's packages,
the wheels installed into root/site) is made once by `python -m unit_tvm.cross.arm_python
setup` (root with apt; `make test` does it). A qemu plugin built here (arm_count_plugin.c)
counts the instructions a model executes: timings under qemu mean nothing, counts do.
"""

import argparse
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

import numpy as np

from .. import deploy
from .._pins import TVM_FFI_VERSION, TVM_VERSION
from . import aarch64

ROOT_ENV = "UNIT_TVM_AARCH64_ROOT"
PYTHON = "python3.11"  # Debian 12's Python, the one the cp311 aarch64 wheels are built for
# arm64 packages unpacked into the root: the interpreter, its standard library and what they
# link against (the C library comes from here too, not from the cross compiler's sysroot)
DEBS = ("python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib", "libc6",
        "zlib1g", "libexpat1", "libffi8", "libssl3", "libgcc-s1", "libstdc++6", "libbz2-1.0",
        "liblzma5", "libsqlite3-0", "libncursesw6", "libtinfo6", "libreadline8", "libuuid1",
        "libdb5.3", "libgdbm6", "libnsl2", "libtirpc3", "libcrypt1")
PLATFORMS = ("manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64")


def default_root() -> str:
    """Where the aarch64 root lives: $UNIT_TVM_AARCH64_ROOT, else beside this Python's
    environment (.venv/aarch64-python under `make`)."""
    return os.environ.get(ROOT_ENV) or os.path.join(sys.prefix, "aarch64-python")


def python_path(root: str | None = None) -> str:
    """The aarch64 interpreter inside the root."""
    return os.path.join(root or default_root(), "usr", "bin", PYTHON)


def missing(root: str | None = None) -> list[str]:
    """What is absent to run whole aarch64 models here (empty: nothing)."""
    root = root or default_root()
    out = list(aarch64.missing_tools())
    if not os.path.exists(python_path(root)):
        out.append(f"aarch64 Python ({python_path(root)}; `python -m unit_tvm.cross.arm_python "
                   f"setup` as root with apt)")
    elif not os.path.isdir(os.path.join(root, "site", "tvm")):
        out.append(f"TVM's aarch64 wheels in {os.path.join(root, 'site')}")
    return out


def _wheels() -> list[str]:
    """The aarch64 wheels: TVM at the pinned versions, numpy at this environment's version."""
    from importlib import metadata

    return [f"apache-tvm=={TVM_VERSION}", f"apache-tvm-ffi=={TVM_FFI_VERSION}",
            f"numpy=={metadata.version('numpy')}",
            f"typing_extensions=={metadata.version('typing_extensions')}"]


def setup(root: str | None = None) -> str:
    """Make the aarch64 root: arm64 Debian packages unpacked, TVM's aarch64 wheels installed.
    Needs apt and root (dpkg --add-architecture arm64); returns the root's path."""
    root = root or default_root()
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise PermissionError("setting up the aarch64 Python needs root and apt-get")
    foreign = subprocess.run(["dpkg", "--print-foreign-architectures"], check=True,
                             capture_output=True, text=True).stdout.split()
    if "arm64" not in foreign:
        subprocess.run(["dpkg", "--add-architecture", "arm64"], check=True)
    subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True)
    os.makedirs(root, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="unit_tvm_debs_") as debs:
        os.chmod(debs, 0o755)  # apt's download user must be able to write there
        subprocess.run(["apt-get", "download", "-qq", *[f"{d}:arm64" for d in DEBS]],
                       cwd=debs, check=True, capture_output=True)
        for deb in sorted(os.listdir(debs)):
            subprocess.run(["dpkg", "-x", os.path.join(debs, deb), root], check=True)
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--only-binary=:all:", *platforms, "--python-version", PYTHON[6:],
                    "--implementation", "cp", "--upgrade", "--target",
                    os.path.join(root, "site"), *_wheels()], check=True)
    check = _run_python(root, ["-c", "import tvm, numpy; print(tvm.__version__)"], timeout=600)
    if check.returncode != 0:
        raise RuntimeError(f"the aarch64 Python does not import TVM: {check.stderr[-2000:]}")
    return root


def _run_python(root, args, *, plugin=None, timeout=900):
    """Run the aarch64 Python under qemu (one TVM thread, TVM's runtime library only)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "site"), TVM_NUM_THREADS="1",
               TVM_USE_RUNTIME_LIB="1", PYTHONDONTWRITEBYTECODE="1",
               TVM_THREAD_POOL_SPIN_COUNT="0", PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1")
    qemu = [aarch64.QEMU, "-L", root] + (["-plugin", plugin] if plugin else [])
    return subprocess.run(qemu + [python_path(root), *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


@dataclass(frozen=True)
class InstructionCounts:
    """Instructions one run executed (qemu plugin): all of them, and per tensorized
    instruction (sdot, udot, usdot, smmla, ummla, usmmla) how many and their multiply-adds."""

    instructions: int
    executed: dict = field(default_factory=dict)
    macs: dict = field(default_factory=dict)

    def __sub__(self, other: "InstructionCounts") -> "InstructionCounts":
        names = set(self.executed) | set(other.executed)
        return InstructionCounts(
            self.instructions - other.instructions,
            {n: self.executed.get(n, 0) - other.executed.get(n, 0) for n in names},
            {n: self.macs.get(n, 0) - other.macs.get(n, 0) for n in names})

    @property
    def tensorized_macs(self) -> int:
        """Multiply-adds the dot-product / matrix instructions performed (padding included)."""
        return sum(self.macs.values())


def _parse_counts(path) -> InstructionCounts:
    executed, macs, total = {}, {}, 0
    with open(path) as f:
        for line in f:
            name, value = line.split()
            if name == "instructions":
                total = int(value)
            elif name.endswith(".macs"):
                macs[name[:-5]] = macs.get(name[:-5], 0) + int(value)
            else:
                executed[name] = executed.get(name, 0) + int(value)
    return InstructionCounts(total, executed, macs)


@functools.lru_cache(maxsize=None)
def count_plugin() -> str:
    """Path of the instruction-counting qemu plugin, built once per process with gcc."""
    src = os.path.join(os.path.dirname(__file__), "arm_count_plugin.c")
    out = os.path.join(aarch64.process_temp_dir("unit_tvm_qemu_"), "count.so")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", out, src], check=True,
                   capture_output=True, text=True)
    return out


@dataclass(frozen=True)
class ArmRun:
    """What one model call under qemu gave: its outputs, and (when counted) the instructions
    that call executed."""

    outputs: list
    counts: InstructionCounts | None = None


def run_model(model, inputs, *, root: str | None = None, count: bool = False,
              timeout: int = 900) -> ArmRun:
    """Call a model compiled for aarch64 (a relax Executable, or the path of its exported
    library) on numpy `inputs` under qemu; its outputs, as numpy arrays.

    count=True also counts the instructions of the call: a run that only loads the model and
    one that calls it once, both counted, and their difference.
    """
    root = root or default_root()
    absent = missing(root)
    if absent:
        raise FileNotFoundError(f"cannot run aarch64 models here: missing {'; '.join(absent)}")
    main = os.path.join(os.path.dirname(__file__), "arm_vm_main.py")
    with tempfile.TemporaryDirectory(prefix="unit_tvm_arm_") as tmp:
        lib = model if isinstance(model, (str, os.PathLike)) else os.path.join(tmp, "model.so")
        if lib != model:
            deploy.export(model, lib, cc=aarch64.CC)
        args = [os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")]
        np.savez(args[0], *[np.ascontiguousarray(x) for x in inputs])
        counts = {}
        for calls in (0, 1) if count else (1,):
            path = os.path.join(tmp, f"counts{calls}.txt")
            plugin = f"{count_plugin()},out={path}" if count else None
            proc = _run_python(root, [main, str(lib), *args, str(calls)], plugin=plugin,
                               timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"the model failed under qemu-aarch64 ({proc.returncode}): "
                                   f"{proc.stderr[-3000:]}")
            if count:
                counts[calls] = _parse_counts(path)
        with np.load(args[1]) as out:
            outputs = [out[f"arr_{i}"] for i in range(len(out.files))]
    return ArmRun(outputs, counts[1] - counts[0] if count else None)


def main(argv=None) -> int:
    """`python -m unit_tvm.cross.arm_python setup|check [--root DIR]`."""
    parser = argparse.ArgumentParser(prog="python -m unit_tvm.cross.arm_python",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["setup", "check"])
    parser.add_argument("--root", default=None, help=f"the aarch64 root (default: "
                                                      f"${ROOT_ENV} or <prefix>/aarch64-python)")
    args = parser.parse_args(argv)
    if args.action == "setup":
        print(f"aarch64 Python with TVM {TVM_VERSION} in {setup(args.root)}")
        return 0
    absent = missing(args.root)
    print("ready" if not absent else "missing: " + "; ".join(absent))
    return 1 if absent else 0


if __name__ == "__main__":
    sys.exit(main())
