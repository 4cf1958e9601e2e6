"""lumos.train (skeleton; filled by its issue)."""

from lumos.train._version import __version__

__all__ = ["__version__"]
