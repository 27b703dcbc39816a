"""unit-tvm: compile tensor programs onto tensorized instructions (UNIT, CGO 2021) with TVM 0.27.

Public API (README.md; design: docs/ARCHITECTURE.md): unit_tvm.compile, unit_tvm.load,
unit_tvm.intrinsics, unit_tvm.target.host(), unit_tvm.inspect, unit_tvm.explain,
unit_tvm.rewrite, unit_tvm.tune, unit_tvm.build; unit_tvm.llm (decoder LLMs with a key/value
cache).
"""

from ._pins import TVM_FFI_VERSION, TVM_VERSION, DependencyError, check_versions

# before anything imports tvm: a clear error naming the pinned versions instead of a failure
# deep inside an incompatible tvm
check_versions()

from . import intrinsics, target  # noqa: E402
from .build import BuildReport, FallbackWarning, build, build_report  # noqa: E402
from .inspector import explain, inspect  # noqa: E402
from .mapping import LoopMatch, Mapping, OperandAccess  # noqa: E402
from .rewriter import rewrite  # noqa: E402
from .tuner import tune  # noqa: E402


def compile(mod, target=None, **kwargs):  # noqa: A001 - the public API name; see compiler
    """Compile a Relax model, quantized and tensorized (see unit_tvm.compiler.compile)."""
    from .compiler import compile as _compile  # the graph passes load on first use

    return _compile(mod, target, **kwargs)


def load(path: str, device: str = "cpu"):
    """Load a model exported by `unit-tvm compile`: callable on numpy arrays (unit_tvm.deploy)."""
    from .deploy import load as _load  # as compile: loaded on first use

    return _load(path, device)


def __getattr__(name: str):
    """unit_tvm.llm (decoder LLMs) on first use, like compile: `import unit_tvm` stays light."""
    if name == "llm":
        import importlib

        return importlib.import_module(".llm", __name__)
    raise AttributeError(f"module 'unit_tvm' has no attribute {name!r}")


__version__ = "0.1.0"
__all__ = ["intrinsics", "target", "inspect", "explain", "rewrite", "build", "build_report",
           "BuildReport", "tune", "compile", "load",
           "Mapping",
           "LoopMatch", "OperandAccess", "FallbackWarning", "DependencyError", "TVM_VERSION",
           "TVM_FFI_VERSION", "llm"]
