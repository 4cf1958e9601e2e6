"""Each package lists its public names once.

Every public ``__init__`` keeps one lazy table (name -> defining module) and
derives ``__all__`` from it with ``lazy_attributes``; its ``TYPE_CHECKING``
imports (what type checkers and IDEs read) must name exactly the same objects
from the same modules. Parsed from the sources, so this runs in the lint
session with no package installed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INITS = sorted(
    p
    for p in ROOT.glob("packages/*/src/lumos/**/__init__.py")
    if "_internal" not in p.parts and "lazy_attributes(" in p.read_text()
)


def _table(tree: ast.Module) -> dict[str, str]:
    """The ``_LAZY`` dict with module-level string constants resolved."""
    consts: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            value = node.value
            if not isinstance(target, ast.Name) or value is None:
                continue
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                consts[target.id] = value.value
            elif target.id == "_LAZY" and isinstance(value, ast.Dict):
                table: dict[str, str] = {}
                for key, val in zip(value.keys, value.values, strict=True):
                    assert isinstance(key, ast.Constant)
                    if isinstance(val, ast.Name):
                        table[str(key.value)] = consts[val.id]
                    else:
                        assert isinstance(val, ast.Constant)
                        table[str(key.value)] = str(val.value)
                return table
    raise AssertionError("no _LAZY table")


def _typed_imports(tree: ast.Module) -> dict[str, str]:
    """Names imported under ``if TYPE_CHECKING:`` -> the module they come from."""
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom)
                assert stmt.module
                for alias in stmt.names:
                    # `X as X`: what strict type checkers accept as a re-export
                    assert alias.asname == alias.name, f"{alias.name}: re-export it as itself"
                    out[alias.name] = stmt.module
    return out


def _submodule(init: Path, name: str) -> bool:
    return (init.parent / f"{name}.py").exists() or (init.parent / name / "__init__.py").exists()


@pytest.mark.parametrize("init", INITS, ids=lambda p: str(p.relative_to(ROOT / "packages")))
def test_lazy_table_matches_typed_imports(init: Path) -> None:
    tree = ast.parse(init.read_text())
    table = _table(tree)
    typed = _typed_imports(tree)
    package = ".".join(init.parent.relative_to(init.parents[2]).parts)  # e.g. lumos.train
    for name, module in list(typed.items()):
        # `from lumos.runtime import testing` names the submodule itself
        if module == package and _submodule(init, name):
            typed[name] = f"{package}.{name}"
    eager = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    missing = sorted(set(table) - set(typed) - eager)
    extra = sorted(set(typed) - set(table))
    assert not missing, f"{init}: in _LAZY but not imported under TYPE_CHECKING: {missing}"
    assert not extra, f"{init}: imported under TYPE_CHECKING but not in _LAZY: {extra}"
    wrong = {n: (table[n], typed[n]) for n in typed if table[n] != typed[n]}
    assert not wrong, f"{init}: _LAZY and TYPE_CHECKING disagree on the module: {wrong}"


@pytest.mark.parametrize("init", INITS, ids=lambda p: str(p.relative_to(ROOT / "packages")))
def test_all_is_derived_from_the_table(init: Path) -> None:
    tree = ast.parse(init.read_text())
    hand_written = [
        node
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
    ]
    assert not hand_written, f"{init}: __all__ is written by hand; derive it with lazy_attributes"


def test_every_public_package_is_checked() -> None:
    names = {str(p.relative_to(ROOT / "packages")) for p in INITS}
    for expected in ("storage", "runtime-common", "train", "tune"):
        assert any(n.startswith(expected + "/") for n in names), f"{expected} has no lazy __init__"
