"""MkDocs hook: expand a ``<!-- api-names: lumos.train -->`` line into one mkdocstrings block
per public name of that module.

The public names are the keys of the module's ``_LAZY`` table (name -> defining
module), read from the source with ``ast`` so that the reference always lists what
``__all__`` exports, without importing the package. Entries that are submodules
(``"search": "lumos.tune.search"``) are left out: they have pages of their own.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- api-names: ([\w.]+) -->$", re.MULTILINE)


def init_file(module: str) -> Path:
    """The ``__init__.py`` of a public lumos module, in whichever package holds it."""
    parts = module.split(".")
    for src in sorted(ROOT.glob("packages/*/src")):
        path = src.joinpath(*parts, "__init__.py")
        if path.is_file():
            return path
    raise FileNotFoundError(f"api-names: no __init__.py for {module!r} under packages/*/src")


def public_names(module: str) -> list[str]:
    """The names ``module`` exports through its ``_LAZY`` table, submodules left out."""
    tree = ast.parse(init_file(module).read_text())
    consts: dict[str, str] = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign | ast.AnnAssign):
            continue
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        if not isinstance(target, ast.Name) or node.value is None:
            continue
        value = node.value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            consts[target.id] = value.value
        elif target.id == "_LAZY" and isinstance(value, ast.Dict):
            table: dict[str, str] = {}
            for key, val in zip(value.keys, value.values, strict=True):
                if not isinstance(key, ast.Constant):
                    continue
                where = consts[val.id] if isinstance(val, ast.Name) else ast.literal_eval(val)
                table[str(key.value)] = str(where)
            return sorted(
                (n for n, where in table.items() if where != f"{module}.{n}"),
                key=lambda n: (not n[0].isupper(), n.lower()),
            )
    raise ValueError(f"api-names: {module} has no _LAZY table")


def expand(markdown: str) -> str:
    """Replace every marker with ``::: module.Name`` blocks, one per public name."""

    def blocks(match: re.Match[str]) -> str:
        module = match.group(1)
        return "\n\n".join(f"::: {module}.{name}" for name in public_names(module))

    return MARKER.sub(blocks, markdown)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs event: expand the markers of each page before it is rendered."""
    return expand(markdown)
