"""The instruction-semantics library: every tensorized instruction unit-tvm knows, by name.

    from unit_tvm import intrinsics
    intrinsics.all()                    # every registered Intrinsic
    intrinsics.get("x86.vpdpbusd")      # one, by name
    intrinsics.for_target(target)       # those the target can execute, best first

Adding an instruction: write its semantics and emit rule in a module here and list it in
_MODULES, or, outside this package, in a module of your own that another package declares
under the `unit_tvm.intrinsics` entry-point group (see README.md in this folder).
"""

from importlib import metadata
from types import ModuleType
from typing import Any

import tvm
from unit_tvm.target import as_target

from . import arm, cuda, fma, x86, x86_amx, x86_pre_vnni
from .base import Intrinsic, PairSumBound, derive_desc, derive_impl, placeholders

_MODULES = (x86_amx, x86, x86_pre_vnni, arm, cuda, fma)
ENTRY_POINTS = "unit_tvm.intrinsics"  # each names a module with an INTRINSICS list
_REGISTRY: dict[str, Intrinsic] = {}


def register(intrin: Intrinsic) -> Intrinsic:
    """Add an Intrinsic to the registry (its name must be new)."""
    if intrin.name in _REGISTRY:
        raise ValueError(f"intrinsic {intrin.name!r} is already registered")
    _REGISTRY[intrin.name] = intrin
    return intrin


def _plugin_modules() -> list[ModuleType]:
    """Instruction modules installed packages declare (entry-point group ENTRY_POINTS)."""
    return [ep.load() for ep in metadata.entry_points(group=ENTRY_POINTS)]


for _module in (*_MODULES, *_plugin_modules()):
    for _intrin in _module.INTRINSICS:
        register(_intrin)


def all() -> list[Intrinsic]:  # noqa: A001 - the public API name is `all`
    """Every registered Intrinsic, in registration order (fastest of a family first)."""
    return list(_REGISTRY.values())


def names() -> list[str]:
    """Names of every registered Intrinsic."""
    return list(_REGISTRY)


def get(name: str) -> Intrinsic:
    """The Intrinsic called `name`; KeyError listing the known names otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no intrinsic named {name!r}; known: {', '.join(_REGISTRY)}") from None


def for_target(target: tvm.target.Target | dict[str, Any] | None = None) -> list[Intrinsic]:
    """The Intrinsics `target` (default: this host) can execute, in registration order, less
    those superseded there (`Intrinsic.superseded_by`: the pre-VNNI forms where VNNI runs)."""
    usable = [i for i in _REGISTRY.values() if i.supported(target)]
    names = {i.name for i in usable}
    return [i for i in usable if not names & set(i.superseded_by)]


def require(name: str, target: tvm.target.Target | dict[str, Any] | None = None) -> Intrinsic:
    """get(name), raising ValueError naming the missing feature when `target` cannot run it."""
    intrin = get(name)
    missing = intrin.missing_features(target)
    if missing:
        raise ValueError(
            f"{name} cannot run on target {as_target(target)}: missing {', '.join(missing)}"
        )
    return intrin


__all__ = ["Intrinsic", "PairSumBound", "all", "names", "get", "for_target", "require", "register",
           "derive_desc", "derive_impl", "placeholders"]
