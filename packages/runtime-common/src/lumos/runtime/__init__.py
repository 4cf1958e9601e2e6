"""lumos.runtime (skeleton; filled by its issue)."""

from lumos.runtime._version import __version__

__all__ = ["__version__"]
