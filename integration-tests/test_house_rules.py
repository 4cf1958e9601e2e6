"""The house rules, enforced on the sources (``nox -s lint`` runs this file).

- No source file over 450 lines and no function over 60 lines (``MAX_FILE_LINES``,
  ``MAX_FUNCTION_LINES``): a failure names the file, the function and the rule.
- No import cycle between modules, ``TYPE_CHECKING`` imports and imports inside
  functions included: a small types module breaks one.
- The dependency arrows of DESIGN.md, below.

storage <- runtime-common <- {train, tune}; train and tune never import each
other; storage never imports Ray; no package imports another package's
``_internal`` modules (siblings use only the published names); and no module
import cycles, even through imports inside functions or ``TYPE_CHECKING``. The check parses every
module under each package's ``src/`` (imports inside functions and
``TYPE_CHECKING`` blocks count for the arrows), so a forbidden import fails here
however it is written.

It also checks that each package's public names are listed once: the lazy table
of an ``__init__`` and its typed (``TYPE_CHECKING``) imports name the same
objects from the same modules, and ``__all__`` is derived from the table.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package folder -> top-level or dotted module prefixes its sources must not import
PRIVATE = ("lumos.storage._internal", "lumos.runtime._internal")
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "storage": ("ray", "torch", "optuna", "lumos.runtime", "lumos.train", "lumos.tune"),
    "runtime-common": ("torch", "optuna", "lumos.train", "lumos.tune", "lumos.storage._internal"),
    "train": ("optuna", "lumos.tune", *PRIVATE),
    "tune": ("torch", "lumos.train", *PRIVATE),
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
        ("train", "from lumos.runtime._internal.lazy import lazy_attributes\n"),
        ("tune", "def f():\n    from lumos.storage._internal import filesystem\n"),
        ("runtime-common", "from lumos.storage._internal.errors import StorageError\n"),
    ],
)
def test_check_catches_forbidden_import(tmp_path: Path, folder: str, line: str) -> None:
    copy = tmp_path / "packages"
    shutil.copytree(ROOT / "packages", copy, ignore=shutil.ignore_patterns("tests", "__pycache__"))
    target = next((copy / folder / "src").rglob("_version.py"))
    target.write_text(target.read_text() + line)
    assert violations(copy), f"adding {line!r} to {folder} was not caught"


# -- import cycles ---------------------------------------------------------------------


def _module_names(packages_dir: Path) -> dict[str, Path]:
    """Every lumos module under ``packages_dir``: dotted name -> file."""
    modules: dict[str, Path] = {}
    for src in sorted(packages_dir.glob("*/src")):
        for path in sorted(src.rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _lumos_imports(path: Path, module: str, known: dict[str, Path]) -> set[str]:
    """The lumos modules ``module`` imports, inside functions and ``TYPE_CHECKING``
    blocks too: ``from a import b`` is ``a.b`` when that is a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in known else base)
    return {t for t in targets if t in known and t != module}


def import_cycles(packages_dir: Path) -> list[list[str]]:
    """Strongly connected groups of lumos modules that import each other (Tarjan)."""
    known = _module_names(packages_dir)
    graph = {m: sorted(_lumos_imports(p, m, known)) for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return cycles


def test_no_import_cycles() -> None:
    cycles = import_cycles(ROOT / "packages")
    assert not cycles, "Modules import each other (a cycle is a missing module):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_cycle_check_catches_a_cycle_inside_a_function(tmp_path: Path) -> None:
    copy = tmp_path / "packages"
    shutil.copytree(ROOT / "packages", copy, ignore=shutil.ignore_patterns("tests", "__pycache__"))
    pkg = copy / "storage" / "src" / "lumos" / "storage" / "_internal"
    (pkg / "cycle_a.py").write_text("from lumos.storage._internal import cycle_b\n")
    (pkg / "cycle_b.py").write_text("def f():\n    from lumos.storage._internal.cycle_a import x\n")
    assert [
        "lumos.storage._internal.cycle_a",
        "lumos.storage._internal.cycle_b",
    ] in import_cycles(copy)


def test_cycle_check_catches_a_type_checking_cycle(tmp_path: Path) -> None:
    copy = tmp_path / "packages"
    shutil.copytree(ROOT / "packages", copy, ignore=shutil.ignore_patterns("tests", "__pycache__"))
    pkg = copy / "tune" / "src" / "lumos" / "tune" / "_internal"
    (pkg / "cycle_a.py").write_text("from lumos.tune._internal.cycle_b import B\n")
    (pkg / "cycle_b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from lumos.tune._internal.cycle_a import A\n"
    )
    assert ["lumos.tune._internal.cycle_a", "lumos.tune._internal.cycle_b"] in import_cycles(copy)


# -- sizes -----------------------------------------------------------------------------

MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 60


def size_violations(packages_dir: Path) -> list[str]:
    """Every source file over ``MAX_FILE_LINES`` and function over ``MAX_FUNCTION_LINES``
    (decorators excluded, docstring and nested functions included)."""
    problems: list[str] = []
    for path in sorted(packages_dir.glob("*/src/**/*.py")):
        rel = path.relative_to(packages_dir)
        text = path.read_text()
        lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        if lines > MAX_FILE_LINES:
            problems.append(f"{rel}: {lines} lines (rule: no source file over {MAX_FILE_LINES})")
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    problems.append(
                        f"{rel}:{node.lineno} {node.name}: {length} lines"
                        f" (rule: no function over {MAX_FUNCTION_LINES})"
                    )
    return problems


def test_sizes() -> None:
    problems = size_violations(ROOT / "packages")
    assert not problems, "Split these (a new module, a smaller function):\n" + "\n".join(problems)


def test_size_check_catches_a_long_file_and_function(tmp_path: Path) -> None:
    copy = tmp_path / "packages"
    shutil.copytree(ROOT / "packages", copy, ignore=shutil.ignore_patterns("tests", "__pycache__"))
    pkg = copy / "storage" / "src" / "lumos" / "storage" / "_internal"
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (pkg / "long_fn.py").write_text(f"def too_long() -> None:\n{body}")
    (pkg / "long_file.py").write_text("".join(f"X{i} = {i}\n" for i in range(MAX_FILE_LINES + 1)))
    found = "\n".join(size_violations(copy))
    assert "long_fn.py:1 too_long: 61 lines (rule: no function over 60)" in found
    assert "long_file.py: 451 lines (rule: no source file over 450)" in found


# -- ARCHITECTURE.md names every module ------------------------------------------------

INDEX_HEADING = re.compile(r"^### (lumos-[a-z-]+) \(`packages/([a-z-]+)/src/lumos/(\w+)/`\)")
INDEX_ENTRY = re.compile(r"^- `([\w/]+\.py)`")


def architecture_index(text: str) -> dict[str, set[str]]:
    """The module index of ARCHITECTURE.md: package folder -> module paths it lists."""
    index: dict[str, set[str]] = {}
    current: set[str] | None = None
    for line in text.splitlines():
        if heading := INDEX_HEADING.match(line):
            current = index.setdefault(heading.group(2), set())
        elif line.startswith("#"):
            current = None
        elif current is not None and (entry := INDEX_ENTRY.match(line)):
            current.add(entry.group(1))
    return index


def source_modules(packages_dir: Path) -> dict[str, set[str]]:
    """Every module a change could touch: package folder -> paths under ``src/lumos/<pkg>/``
    (``__init__.py`` name tables and ``_version.py`` aside)."""
    found: dict[str, set[str]] = {}
    for folder in sorted(p for p in packages_dir.iterdir() if (p / "src" / "lumos").is_dir()):
        (pkg_root,) = (folder / "src" / "lumos").iterdir()
        found[folder.name] = {
            str(path.relative_to(pkg_root))
            for path in pkg_root.rglob("*.py")
            if path.name not in {"__init__.py", "_version.py"}
        }
    return found


def test_architecture_names_every_module() -> None:
    index = architecture_index((ROOT / "ARCHITECTURE.md").read_text())
    problems = []
    for folder, modules in source_modules(ROOT / "packages").items():
        listed = index.get(folder, set())
        problems += [f"{folder}: {m} is not in ARCHITECTURE.md" for m in sorted(modules - listed)]
        problems += [f"{folder}: {m} is listed but gone" for m in sorted(listed - modules)]
    assert not problems, "Keep the module index of ARCHITECTURE.md true:\n" + "\n".join(problems)
