"""The messages between a worker's training session and the controller (one owner).

Worker -> driver (through ``WorkerSession.emit``, small tuples, cheap to pickle):

* ``("r", attempt, index, metrics, dir_name, pending[, positions[, validation]])``:
  report ``index``; ``dir_name`` names the checkpoint this rank passed (``None``:
  metrics only); ``pending`` is True while this rank's upload of it runs in the
  background (ASYNC); ``positions`` (only from a rank with data loaders) are their
  pickled positions, which the driver stores with the report's checkpoint
  (``data_positions.py``); ``validation`` (only when asked) is the report's
  validation request (``validation.report_validation_arg``).
* ``("u", attempt, index, dir_name)``: this rank's background upload of report
  ``index`` finished.
* ``("uf", attempt, index, dir_name, error)``: that upload failed (``error`` is a
  ``lumos.runtime.RemoteError``); the driver treats it as this rank's failure.

Driver -> every rank (``WorkerGroup.send``):

* ``("commit", index, dir_name)``: report ``index``'s checkpoint is committed. A rank
  that waits for its SYNC report's commit blocks for it; the others read it at their
  next ``train.report()`` / ``get_checkpoint()`` without blocking.
* ``("validated", index, status)``: report ``index``'s checkpoint's validation ended
  (``status``: ``validated``, ``timeout`` or ``failed``); its metrics are in the run
  state. ``get_all_reported_checkpoints(consistency_mode=VALIDATED)`` waits for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REPORT = "r"
UPLOADED = "u"
UPLOAD_FAILED = "uf"
COMMIT = "commit"
VALIDATED = "validated"


@dataclass(frozen=True)
class RankReport:
    """One rank's ``train.report()`` call as the driver receives it.

    Attributes:
        index: The report's index in the run (the same on every rank).
        metrics: The rank's metrics.
        checkpoint_dir_name: The checkpoint this rank passed, or ``None`` (metrics only).
        upload_pending: True while this rank uploads that checkpoint in the background.
        data_positions: The rank's data-loader positions at this report, or ``None``.
        validation: The validation this report asks for (``{}``: the trainer's
            defaults; ``fn_kwargs`` / ``timeout_s`` override them), or ``None``.
    """

    index: int
    metrics: dict[str, Any]
    checkpoint_dir_name: str | None
    upload_pending: bool = False
    data_positions: bytes | None = None
    validation: dict[str, Any] | None = None


@dataclass(frozen=True)
class UploadDone:
    """A rank's background upload of report ``index`` ended (``error`` set when it failed)."""

    index: int
    dir_name: str
    error: BaseException | None = None


def report_message(
    attempt: int,
    index: int,
    metrics: dict[str, Any],
    dir_name: str | None,
    pending: bool,
    positions: bytes | None = None,
    validation: dict[str, Any] | None = None,
) -> tuple[Any, ...]:
    """The message of one ``train.report()`` call."""
    if validation is not None:
        return (REPORT, attempt, index, metrics, dir_name, pending, positions, validation)
    if positions is None:
        return (REPORT, attempt, index, metrics, dir_name, pending)
    return (REPORT, attempt, index, metrics, dir_name, pending, positions)


def uploaded_message(
    attempt: int, index: int, dir_name: str, error: BaseException | None = None
) -> tuple[Any, ...]:
    """The message that a background upload finished (or failed with ``error``)."""
    if error is None:
        return (UPLOADED, attempt, index, dir_name)
    return (UPLOAD_FAILED, attempt, index, dir_name, error)


def decode(payload: Any) -> tuple[int, RankReport | UploadDone] | None:
    """``(attempt, report or upload outcome)`` from a worker's message; ``None`` for others."""
    if not (isinstance(payload, tuple) and payload):
        return None
    kind = payload[0]
    if kind == REPORT:
        _, attempt, index, metrics, dir_name, pending, *optional = payload
        report = RankReport(index, metrics, dir_name, bool(pending), *optional)
        return int(attempt), report
    if kind == UPLOADED:
        _, attempt, index, dir_name = payload
        return int(attempt), UploadDone(index, dir_name)
    if kind == UPLOAD_FAILED:
        _, attempt, index, dir_name, error = payload
        return int(attempt), UploadDone(index, dir_name, error)
    return None


def commit_message(index: int, dir_name: str) -> tuple[str, int, str]:
    """The driver's notice to every rank that report ``index``'s checkpoint committed."""
    return (COMMIT, index, dir_name)


def decode_commit(value: Any) -> tuple[int, str] | None:
    """``(index, dir_name)`` of a commit notice; ``None`` for any other value."""
    if isinstance(value, tuple) and len(value) == 3 and value[0] == COMMIT:
        return int(value[1]), str(value[2])
    return None


def validated_message(index: int, status: str) -> tuple[str, int, str]:
    """The driver's notice to every rank that report ``index``'s validation ended."""
    return (VALIDATED, index, status)


def decode_validated(value: Any) -> tuple[int, str] | None:
    """``(index, status)`` of a validation notice; ``None`` for any other value."""
    if isinstance(value, tuple) and len(value) == 3 and value[0] == VALIDATED:
        return int(value[1]), str(value[2])
    return None


def default_checkpoint_dir_name(index: int) -> str:
    """Name of a checkpoint directory when the user gave none."""
    return f"checkpoint_{index}"
