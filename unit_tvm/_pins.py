"""Versions of TVM that unit-tvm is built and tested against, and the check made at import."""

TVM_VERSION = "0.27.0.post1"
TVM_FFI_VERSION = "0.1.14.post1"


class DependencyError(ImportError):
    """The installed TVM stack is not the one unit-tvm supports."""


def installed_versions():
    """Return (apache-tvm version, apache-tvm-ffi version) as installed, None where absent."""
    from importlib import metadata

    out = []
    for dist in ("apache-tvm", "apache-tvm-ffi"):
        try:
            out.append(metadata.version(dist))
        except metadata.PackageNotFoundError:
            out.append(None)
    return tuple(out)


def check_versions():
    """Raise DependencyError naming the fix when tvm-ffi (or TVM) is not the pinned version.

    tvm-ffi 0.1.15.x makes Schedule.tensorize segfault inside TVM's C++ (ToJSONGraph), which
    would crash every kernel this package builds, so we refuse to start instead.
    """
    tvm_v, ffi_v = installed_versions()
    if ffi_v != TVM_FFI_VERSION:
        raise DependencyError(
            f"unit-tvm needs apache-tvm-ffi=={TVM_FFI_VERSION} but found {ffi_v}: other versions "
            f"crash in Schedule.tensorize. Fix: pip install 'apache-tvm-ffi=={TVM_FFI_VERSION}'"
        )
    if tvm_v != TVM_VERSION:
        raise DependencyError(
            f"unit-tvm needs apache-tvm=={TVM_VERSION} but found {tvm_v}. "
            f"Fix: pip install 'apache-tvm=={TVM_VERSION}' 'apache-tvm-ffi=={TVM_FFI_VERSION}'"
        )
