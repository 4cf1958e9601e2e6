"""The ``[lightning]`` extra: ``lightning.pytorch`` or an ``ImportError`` that names it.

Imports nothing but the standard library, so ``lumos.train.lightning`` can check for
Lightning before it loads a module that subclasses Lightning's classes.
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRA = "pip install 'lumos-train[lightning]'"


def require_lightning() -> ModuleType:
    """``lightning.pytorch``, or an ``ImportError`` naming the ``[lightning]`` extra.

    Raises:
        ImportError: Lightning is not installed (or fails to import).
    """
    try:
        return importlib.import_module("lightning.pytorch")
    except ImportError as exc:
        raise ImportError(
            "lumos.train.lightning needs PyTorch Lightning (the `lightning` package), "
            f"which cannot be imported ({type(exc).__name__}: {exc}); install the extra: "
            f"{EXTRA}"
        ) from exc
