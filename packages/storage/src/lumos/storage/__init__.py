"""lumos.storage (skeleton; filled by its issue)."""

from lumos.storage._version import __version__

__all__ = ["__version__"]
