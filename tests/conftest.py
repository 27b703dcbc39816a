"""Shared fixtures: host target, ISA skips that print their reason, seeded RNG."""

import numpy as np
import pytest

import unit_tvm  # checks the pinned versions before any test
from unit_tvm import intrinsics
from unit_tvm.runner import prepare_host
from unit_tvm.target import host


def pytest_configure(config):
    """Kernels the tests build with TVM directly run on every CPU, as unit-tvm's own do."""
    prepare_host()


@pytest.fixture(scope="session")
def host_target():
    return host()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def require_host(name):
    """Skip (with the missing feature in the reason) when this host cannot execute `name`."""
    missing = intrinsics.get(name).missing_features(host())
    if missing:
        pytest.skip(f"{name} needs {', '.join(missing)}, which this CPU lacks")


def has_gpu():
    """Whether TVM sees a CUDA GPU here (a runtime built without CUDA has none)."""
    import tvm

    try:
        return tvm.cuda(0).exist
    except Exception:  # noqa: BLE001
        return False


def gpu_output(mod, x, quantize=None):
    """`unit_tvm.compile(mod)` for this machine's CUDA GPU (its own sm_XY) run on the numpy
    input `x`: the first output as float64 numpy."""
    import numpy as np
    import tvm
    from tvm import relax

    target = unit_tvm.target.cuda_target(tvm.cuda(0))
    vm = relax.VirtualMachine(unit_tvm.compile(mod, target, quantize=quantize), tvm.cuda(0))
    out = vm["main"](tvm.runtime.tensor(x, tvm.cuda(0)))
    return (out if hasattr(out, "numpy") else out[0]).numpy().astype(np.float64)


# the x86 vector instructions (AMX tiles aside), read off the registry: a new one is tested too
HOST_X86 = [i.name for i in intrinsics.all() if i.arch == "x86_64" and not i.tile]
