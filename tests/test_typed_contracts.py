"""The two extension points are read from their signatures: every public function and method
of intrinsics/ and schedules/ has its parameters and its return annotated (mypy, run by
`make test`, then checks the annotations against the code), and the instruction and recipe
contracts are frozen typed dataclasses."""

import ast
import dataclasses
from pathlib import Path

import pytest

from unit_tvm import intrinsics
from unit_tvm.relax.core.recipe import Recipe

ROOT = Path(__file__).resolve().parent.parent


def _public_functions(tree: ast.Module):
    """The module's functions and its classes' methods (closures inside them are private by
    construction); __init__ and __call__ count as public."""
    for node in tree.body:
        bodies = node.body if isinstance(node, ast.ClassDef) else [node]
        for fn in bodies:
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    not fn.name.startswith("_") or fn.name in ("__init__", "__call__")):
                yield fn


def _unannotated(path: Path) -> list[str]:
    """'file:line name [parameters]' of each public function of `path` with a parameter or
    its return type not annotated (self and cls excepted)."""
    missing = []
    for fn in _public_functions(ast.parse(path.read_text())):
        args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        args += [a for a in (fn.args.vararg, fn.args.kwarg) if a is not None]
        bare = [a.arg for a in args if a.annotation is None and a.arg not in ("self", "cls")]
        if bare or (fn.returns is None and fn.name != "__init__"):
            missing.append(f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name} {bare}")
    return missing


@pytest.mark.parametrize("folder", ["intrinsics", "schedules"])
def test_every_public_function_of_an_extension_point_is_annotated(folder):
    missing = [m for path in sorted((ROOT / folder).glob("*.py")) for m in _unannotated(path)]
    assert not missing, "\n".join(missing)


def test_the_contracts_are_frozen_dataclasses():
    """An Intrinsic and a Recipe cannot be changed after they are made (a pass replaces a
    recipe with a copy), and their fields carry types."""
    intrin = intrinsics.get("x86.vpdpbusd")
    for obj in (intrin, Recipe(kind="dense", in_shape=(1, 8), w_shape=(4, 8),
                               out_shape=(1, 4), out_channels=4)):
        assert dataclasses.is_dataclass(obj)
        assert all(f.type is not None for f in dataclasses.fields(obj))
        with pytest.raises(dataclasses.FrozenInstanceError):
            obj.kind = "conv2d" if isinstance(obj, Recipe) else None
    assert intrin.requires == (("avx512vnni",),) and intrin.family == intrin.name
