"""Optional extras of lumos-train: import one, or an ``ImportError`` naming the extra.

Standard library only, so an integration's public module can check for its extra
before it loads code that subclasses the extra's classes.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require_extra(module: str, extra: str, feature: str, what: str | None = None) -> ModuleType:
    """Import ``module``, or raise an ``ImportError`` that names ``pip install 'lumos-train[extra]'``.

    Args:
        module: The module to import, e.g. ``"lightning.pytorch"``.
        extra: The lumos-train extra that installs it, e.g. ``"lightning"``.
        feature: The lumos module that needs it (the message's subject).
        what: How to call the missing dependency in the message (default: ``module``).

    Example:
        >>> require_extra("math", "none", "lumos.train.example").pi > 3
        True
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{feature} needs {what or module}: pip install 'lumos-train[{extra}]'"
        ) from exc
