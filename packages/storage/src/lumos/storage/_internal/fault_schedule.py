"""Which calls a ``FaultyFileSystem`` fails: the fault kinds, the layered settings, the draws.

``FaultSchedule`` keeps the settings (constructor, environment, control file,
``set_faults``), draws each call's fate from a seeded ``random.Random``, counts what it
injected and records it per process; ``read_fault_records`` sums those records.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import random
import socket
import threading
from typing import Any

FAULT_KINDS = ("write", "rename", "list", "read", "delete")
"""The operation kinds a ``FaultyFileSystem`` can fail."""

FAULTS_ENV = "LUMOS_STORAGE_FAULTS"
"""Environment variable with a JSON object of settings that override the constructor's."""

FAULTS_FILE_ENV = "LUMOS_STORAGE_FAULTS_FILE"
"""Environment variable naming a control file (used when ``control_file`` is not given)."""

_SETTINGS = (
    "enabled",
    "permanent",
    "write_failure_rate",
    "rename_failure_rate",
    "list_failure_rate",
    "read_failure_rate",
    "delete_failure_rate",
    "max_consecutive",
)


class FaultSchedule:
    """The fault settings in force, the seeded draws and the counters of one ``FaultyFileSystem``.

    Args:
        seed: Seed of the fault draws.
        settings: The constructor's settings (``enabled``, ``permanent``, rates,
            ``max_consecutive``); ``LUMOS_STORAGE_FAULTS`` overrides them.
        control_file: Path of a JSON control file (default: ``LUMOS_STORAGE_FAULTS_FILE``).
        record_dir: Local directory for per-process fault records.

    Raises:
        ValueError: A setting is unknown or out of range.
    """

    def __init__(
        self,
        seed: int,
        settings: dict[str, Any],
        control_file: str | None = None,
        record_dir: str | None = None,
    ) -> None:
        self.control_file = control_file or os.environ.get(FAULTS_FILE_ENV) or None
        self.record_dir = record_dir
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._settings: dict[str, Any] = {}
        self._apply(settings, "FaultyFileSystem")
        env = os.environ.get(FAULTS_ENV)
        if env:
            self._apply(_parse_settings(env, FAULTS_ENV), FAULTS_ENV)
        self._base = dict(self._settings)
        self._file_mtime: int | None = None
        self._file_settings: dict[str, Any] = {}
        self._local_overrides: dict[str, Any] = {}
        self._streak: dict[tuple[str, str], int] = {}
        self.injected: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()

    # -- controls -------------------------------------------------------------
    def _apply(self, settings: dict[str, Any], source: str) -> None:
        self._settings.update(_validated(settings, source))

    def set_faults(self, **settings: Any) -> None:
        """Change settings in this process (``enabled``, ``permanent``, rates, ``max_consecutive``).

        They override the constructor, the environment and the control file until
        ``clear_overrides()``.
        """
        checked = _validated(settings, "set_faults")
        with self._lock:
            self._local_overrides.update(checked)
            self._recompute()

    def clear_overrides(self) -> None:
        """Forget what ``set_faults`` changed."""
        with self._lock:
            self._local_overrides.clear()
            self._recompute()

    def reset_counts(self) -> None:
        """Zero ``injected`` and ``calls``."""
        with self._lock:
            self.injected.clear()
            self.calls.clear()
            self._streak.clear()

    @property
    def settings(self) -> dict[str, Any]:
        """The settings in force now (after the control file is checked)."""
        with self._lock:
            self._poll_file()
            return dict(self._settings)

    def _recompute(self) -> None:
        self._settings = {}
        self._apply(self._base, "FaultyFileSystem")
        self._apply(self._file_settings, "control file")
        self._apply(self._local_overrides, "set_faults")

    def _poll_file(self) -> None:
        if not self.control_file:
            return
        try:
            mtime: int | None = os.stat(self.control_file).st_mtime_ns
        except OSError:
            mtime = None
        if mtime == self._file_mtime:
            return
        self._file_mtime = mtime
        settings: dict[str, Any] = {}
        if mtime is not None:
            try:
                with open(self.control_file) as f:
                    settings = _validated(_parse_settings(f.read(), self.control_file), "")
            except (OSError, ValueError):
                settings = {}  # torn or invalid: the other settings stay in force
        self._file_settings = settings
        self._recompute()

    @property
    def last_settings(self) -> dict[str, Any]:
        """The settings as last computed (the control file not checked again)."""
        return self._settings

    # -- injection ------------------------------------------------------------
    def maybe_fail(self, kind: str, path: Any) -> None:
        """Count a call of ``kind`` on ``path`` and raise the fault drawn for it, if any."""
        where = str(path)
        with self._lock:
            self._poll_file()
            settings = self._settings
            self.calls[kind] += 1
            rate = float(settings[f"{kind}_failure_rate"])
            if not settings["enabled"] or rate <= 0.0:
                return
            key = (kind, where)
            streak = self._streak.get(key, 0)
            limit = settings["max_consecutive"]
            if self._rng.random() >= rate or (limit is not None and streak >= limit):
                self._streak.pop(key, None)
                return
            self._streak[key] = streak + 1
            self.injected[kind] += 1
            permanent = bool(settings["permanent"])
            flavour = self._rng.randrange(3)
        exc = _make_error(kind, where, permanent, flavour)
        self._record(kind, where, exc)
        raise exc

    def _record(self, kind: str, where: str, exc: BaseException) -> None:
        if not self.record_dir:
            return
        line = json.dumps({"kind": kind, "path": where, "error": type(exc).__name__})
        name = f"faults-{socket.gethostname()}-{os.getpid()}.jsonl"
        try:
            os.makedirs(self.record_dir, exist_ok=True)
            with open(os.path.join(self.record_dir, name), "a") as f:
                f.write(line + "\n")
        except OSError:  # pragma: no cover - the record is best effort
            pass


def _validated(settings: dict[str, Any], source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if key not in _SETTINGS:
            raise ValueError(
                f"{source}: unknown fault setting {key!r}; allowed: {', '.join(_SETTINGS)}"
            )
        if key.endswith("_rate"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{source}: {key}={value!r} must be a number in [0, 1]")
            if not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"{source}: {key}={value!r} must be in [0, 1]")
            value = float(value)
        elif key == "max_consecutive":
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"{source}: max_consecutive={value!r} must be None or >= 1")
        elif not isinstance(value, bool):
            raise ValueError(f"{source}: {key}={value!r} must be true or false")
        out[key] = value
    return out


def _parse_settings(text: str, source: str) -> dict[str, Any]:
    try:
        loaded = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{source}: not a JSON object of fault settings ({exc})") from exc
    if not isinstance(loaded, dict):
        raise ValueError(f"{source}: expected a JSON object of fault settings, got {loaded!r}")
    return dict(loaded)


def _make_error(kind: str, where: str, permanent: bool, flavour: int) -> OSError:
    if permanent:
        return PermissionError(errno.EACCES, f"injected permanent {kind} fault on {where!r}")
    if flavour == 0:
        return ConnectionResetError(
            errno.ECONNRESET, f"injected {kind} fault on {where!r} (connection reset)"
        )
    if flavour == 1:
        return TimeoutError(errno.ETIMEDOUT, f"injected {kind} fault on {where!r} (timeout)")
    return OSError(
        errno.EBUSY, f"SlowDown: injected {kind} fault on {where!r} (throttled, HTTP 503)"
    )


def read_fault_records(record_dir: str) -> collections.Counter[str]:
    """Faults injected by kind, summed over every process that wrote to ``record_dir``."""
    total: collections.Counter[str] = collections.Counter()
    try:
        names = os.listdir(record_dir)
    except FileNotFoundError:
        return total
    for name in names:
        if not (name.startswith("faults-") and name.endswith(".jsonl")):
            continue
        with open(os.path.join(record_dir, name)) as f:
            for line in f:
                try:
                    total[str(json.loads(line)["kind"])] += 1
                except (ValueError, KeyError, TypeError):
                    continue  # a line torn by a killed process
    return total
