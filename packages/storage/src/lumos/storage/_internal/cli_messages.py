"""The text of the ``lumos`` command's console lines and table cells (pure functions).

``cli.py`` decides what is printed where (tables, stdout or stderr); this module
says what the lines say, so the command's output can be read in one place.
"""

from __future__ import annotations

from typing import Any


def fmt_value(value: Any) -> str:
    """A metric value for a table cell (floats to 5 significant digits)."""
    if isinstance(value, float):
        return f"{value:.5g}"
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def fmt_best(best: dict[str, Any] | None) -> str:
    """The ``best`` of a summary as ``loss=0.12 (min, report 7)``."""
    if not best:
        return ""
    where = best.get("trial") or (
        f"report {best['report']}" if best.get("report") is not None else ""
    )
    note = ", ".join(str(p) for p in (best.get("mode"), where) if p)
    return f"{best['metric']}={fmt_value(best['value'])}" + (f" ({note})" if note else "")


def error_line(exc: BaseException) -> str:
    """``lumos: error: ...``: how the command reports an error on stderr."""
    return f"lumos: error: {exc}"


def no_runs(path: str) -> str:
    """What ``lumos ls`` says when ``path`` holds no runs."""
    return f"no lumos runs or sweeps under {path!r}"


def run_heading(detail: dict[str, Any]) -> str:
    """The rest of ``lumos show``'s first line, after the run's name."""
    return f"  run  {detail['status']}  ({detail['path']})"


def run_counts(detail: dict[str, Any]) -> str:
    """``created ..., updated ..., 12 reports, 3 checkpoints``."""
    return (
        f"created {detail['created_at']}, updated {detail['updated_at']}, "
        f"{detail['reports']} reports, {len(detail['checkpoints'])} checkpoints"
    )


def checkpoint_status(checkpoint: dict[str, Any]) -> str:
    """A checkpoint's status cell, with its validation's error if any."""
    error = checkpoint["validation_error"]
    return str(checkpoint["status"]) + (f": {error}" if error else "")


def rollback_line(rollback: dict[str, Any]) -> str:
    """``rollback 1 at report 9 (NonFiniteMetric: ...) to checkpoint_000003``."""
    return (
        f"rollback {rollback['number']} at report {rollback['from_report']} "
        f"({rollback['check']}: {rollback['reason']}) "
        f"to {rollback['to_checkpoint'] or 'the start'}"
    )


def latest_metrics(detail: dict[str, Any]) -> str:
    """``latest metrics (report 11): loss=0.12, acc=0.9``."""
    text = ", ".join(f"{k}={fmt_value(v)}" for k, v in detail["latest_metrics"].items())
    return f"latest metrics (report {detail['reports'] - 1}): {text}"
