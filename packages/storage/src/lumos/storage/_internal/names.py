"""Validation of run names and checkpoint directory names."""

from __future__ import annotations

import unicodedata

from lumos.storage._internal.errors import InvalidNameError

RESERVED_NAMES = frozenset({"_lumos"})
"""Names lumos keeps for its own state, refused as run or checkpoint names."""

MAX_NAME_LENGTH = 255
"""The longest name accepted (a path component on common filesystems)."""


def validate_name(value: object, field: str = "name") -> str:
    """Check that ``value`` is a safe single path component and return it.

    Args:
        value: The candidate name.
        field: The setting that held it; named in the error message.

    Returns:
        ``value`` unchanged.

    Raises:
        InvalidNameError: ``value`` is not a string, is empty, absolute, contains
            ``..``, a path separator or a control character, starts with ``~``,
            is longer than 255 characters, or is the reserved name ``_lumos``.

    Example:
        >>> validate_name("epoch=3", field="checkpoint_dir_name")
        'epoch=3'
    """
    if not isinstance(value, str):
        raise InvalidNameError(field, value, f"expected a string, got {type(value).__name__}")
    if not value or not value.strip():
        raise InvalidNameError(field, value, "it is empty")
    if value.startswith(("/", "\\")) or (len(value) >= 2 and value[1] == ":"):
        raise InvalidNameError(field, value, "it is an absolute path")
    if ".." in value:
        raise InvalidNameError(field, value, "it contains '..'")
    if "/" in value or "\\" in value:
        raise InvalidNameError(field, value, "it contains a path separator")
    for ch in value:
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            raise InvalidNameError(field, value, f"it contains the control character {ch!r}")
    if value == ".":
        raise InvalidNameError(field, value, "'.' is the current directory")
    if value.startswith("~"):
        raise InvalidNameError(field, value, "a leading '~' would be expanded to a home directory")
    if value in RESERVED_NAMES:
        raise InvalidNameError(field, value, f"{value!r} is reserved for lumos' own state")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidNameError(field, value, f"it is {len(value)} characters long")
    return value


def validate_relpath(value: str, field: str = "relpath") -> str:
    """Validate a relative path made of valid names separated by ``/``."""
    if not isinstance(value, str) or not value:
        raise InvalidNameError(field, value, "it is empty")
    for part in value.split("/"):
        validate_name(part, field)
    return value
