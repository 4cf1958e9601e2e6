"""The dependency arrows of DESIGN.md, enforced on the import graph of the sources.

storage <- runtime-common <- {train, tune}; train and tune never import each
other; storage never imports Ray. The check parses every module under each
package's ``src/`` (imports inside functions and ``TYPE_CHECKING`` blocks
count too), so a forbidden import fails here however it is written.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package folder -> top-level or dotted module prefixes its sources must not import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "storage": ("ray", "torch", "optuna", "lumos.runtime", "lumos.train", "lumos.tune"),
    "runtime-common": ("torch", "optuna", "lumos.train", "lumos.tune"),
    "train": ("optuna", "lumos.tune"),
    "tune": ("torch", "lumos.train"),
}


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            # `from lumos import tune` imports lumos.tune
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Call):
            # importlib.import_module("lumos.tune") / __import__("ray")
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in {"import_module", "__import__"} and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.append((node.lineno, arg.value))
    return found


def violations(packages_dir: Path) -> list[str]:
    """Every forbidden import under ``packages_dir``, as ``file:line imports module``."""
    problems: list[str] = []
    for folder, forbidden in FORBIDDEN.items():
        src = packages_dir / folder / "src"
        for path in sorted(src.rglob("*.py")):
            for lineno, module in _imported_modules(path):
                for prefix in forbidden:
                    if module == prefix or module.startswith(prefix + "."):
                        rel = path.relative_to(packages_dir)
                        problems.append(f"{rel}:{lineno} imports {module} (forbidden for {folder})")
    return problems


def test_no_lumos_namespace_init() -> None:
    inits = sorted(ROOT.glob("packages/*/src/lumos/__init__.py"))
    assert not inits, f"lumos is a PEP 420 namespace; remove {inits}"


def test_dependency_direction() -> None:
    problems = violations(ROOT / "packages")
    assert not problems, "A dependency points the wrong way:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("folder", "line"),
    [
        ("train", "import lumos.tune\n"),
        ("train", "from lumos import tune\n"),
        ("tune", "from lumos.train.torch import TorchTrainer\n"),
        ("storage", "import ray\n"),
        ("storage", "def f():\n    from ray.util import state\n"),
        ("runtime-common", "import importlib\nimportlib.import_module('lumos.tune')\n"),
    ],
)
def test_check_catches_forbidden_import(tmp_path: Path, folder: str, line: str) -> None:
    copy = tmp_path / "packages"
    shutil.copytree(ROOT / "packages", copy, ignore=shutil.ignore_patterns("tests", "__pycache__"))
    target = next((copy / folder / "src").rglob("_version.py"))
    target.write_text(target.read_text() + line)
    assert violations(copy), f"adding {line!r} to {folder} was not caught"
