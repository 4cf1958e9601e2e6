"""Driver-side callbacks."""

from __future__ import annotations

from abc import ABCMeta
from types import NotImplementedType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lumos.runtime import WorkerFailure
    from lumos.storage import Checkpoint
    from lumos.train._internal.result import Result


HOOKS = ("on_start", "on_report", "on_failure", "on_restart", "on_finish")
"""The hooks of :class:`Callback`: a class defining all of them counts as one."""


class _CallbackType(ABCMeta):
    """The metaclass of :class:`Callback`: an ``ABCMeta`` (so ``__subclasshook__`` applies
    and a subclass may mix in other ABCs); ``Callback`` has no abstract method."""


class Callback(metaclass=_CallbackType):
    """Hooks called by the controller in the process that runs ``fit()``.

    Subclass it and override what you need; every hook does nothing by
    default. Hooks run in the controller's thread, so keep them quick. An
    exception raised by a hook ends the run (the workers are stopped first).

    An object whose class defines every hook counts as a ``Callback`` too
    (``isinstance`` says so, as for ``collections.abc`` protocols): a package that
    cannot import ``lumos.train`` offers one that way
    (``lumos.tune.integration.ray_train.TuneReportCallback``).

    Example:
        >>> class PrintLoss(Callback):
        ...     def on_report(self, metrics, checkpoint):
        ...         print(metrics["loss"], checkpoint)
        >>> RunConfig(callbacks=[PrintLoss()])  # doctest: +SKIP
    """

    @classmethod
    def __subclasshook__(cls, other: type) -> bool | NotImplementedType:
        """``issubclass(other, Callback)`` for a class that defines every hook."""
        if cls is Callback and all(any(h in vars(k) for k in other.__mro__) for h in HOOKS):
            return True
        return NotImplemented  # type: ignore[no-any-return]

    def on_start(self, run_name: str, run_path: str, config: dict[str, Any] | None) -> None:
        """Called once per ``fit()``, before the first worker starts (a resumed run
        calls it again).

        Args:
            run_name: ``RunConfig(name)`` (or the generated name).
            run_path: the run's directory (local path or fsspec URL).
            config: the trainer's ``train_loop_config``.
        """

    def on_report(self, metrics: dict[str, Any], checkpoint: Checkpoint | None) -> None:
        """Called for each report of rank 0, in order.

        Args:
            metrics: the metrics rank 0 reported.
            checkpoint: the committed checkpoint when this report carried one
                (called once every rank reported it), else ``None``.
        """

    def on_failure(self, failures: list[WorkerFailure], will_restart: bool) -> None:
        """Called when workers failed.

        Args:
            failures: what failed (``rank``, ``kind``, ``node_id``, ``error``,
                ``message``), one entry per failed rank.
            will_restart: whether the run restarts (else ``fit()`` raises).
        """

    def on_restart(self, attempt: int, checkpoint: Checkpoint | None) -> None:
        """Called when training restarts after a failure.

        Args:
            attempt: the attempt number starting now (the first attempt is 0).
            checkpoint: the checkpoint training resumes from, or ``None``.
        """

    def on_finish(self, result: Result | None, error: BaseException | None) -> None:
        """Called once when the run ends (finished, failed or stopped).

        Args:
            result: the result when training finished, else ``None``.
            error: the exception ``fit()`` is about to raise, else ``None``.
        """
