"""unit-tvm: compile tensor programs onto tensorized instructions (UNIT, CGO 2021) with TVM 0.27.

Public API (see DESIGN.md): unit_tvm.intrinsics, unit_tvm.target.host(), unit_tvm.inspect,
unit_tvm.explain, unit_tvm.rewrite, unit_tvm.tune, unit_tvm.build.
"""

from ._pins import TVM_FFI_VERSION, TVM_VERSION, DependencyError, check_versions

check_versions()

from . import intrinsics, target  # noqa: E402  (after the version check, which guards tvm's import)

__version__ = "0.1.0"
__all__ = ["intrinsics", "target", "DependencyError", "TVM_VERSION", "TVM_FFI_VERSION"]
