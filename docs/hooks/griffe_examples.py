"""Griffe extension: read a Google-style ``Example:`` section as ``Examples:``.

The house style (STYLE.md) writes ``Example:`` above doctest lines; griffe's Google
parser knows only the plural as an examples section and would render the singular
as an admonition, with the ``>>>`` lines as Markdown quotes. The docstrings stay as
they are; only what the API reference reads changes.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

SINGULAR = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Rename every ``Example:`` section line to ``Examples:`` before parsing."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Griffe event: called for each object loaded, before its docstring is parsed."""
        if obj.docstring is not None:
            obj.docstring.value = SINGULAR.sub(r"\1Examples:", obj.docstring.value)
