"""lumos.tune (skeleton; filled by its issue)."""

from lumos.tune._version import __version__

__all__ = ["__version__"]
