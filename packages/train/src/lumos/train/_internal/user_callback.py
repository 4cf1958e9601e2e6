"""Ray Train V2's callback interface, ``ray.train.UserCallback``, on lumos's ``Callback``.

A ``UserCallback`` subclass overrides Ray's ``after_report(run_context, metrics,
checkpoint)`` and ``after_exception(run_context, worker_exceptions)``; lumos calls them
from its own hooks (``on_report``, ``on_failure``), in the process that runs ``fit()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lumos.train._internal.callback import Callback

if TYPE_CHECKING:
    from lumos.runtime import WorkerFailure
    from lumos.storage import Checkpoint


@dataclass(frozen=True)
class TrainRunContext:
    """What a :class:`UserCallback` learns of the run (Ray's ``TrainRunContext``, in part).

    Attributes:
        run_name: ``RunConfig(name)`` (or the generated name).
        run_path: The run's directory (local path or fsspec URL).
        train_loop_config: The trainer's ``train_loop_config``.
    """

    run_name: str = ""
    run_path: str = ""
    train_loop_config: dict[str, Any] | None = None


class UserCallback(Callback):
    """Ray Train V2's callback interface (``ray.train.UserCallback``): override
    :meth:`after_report` and :meth:`after_exception`. A subclass that also overrides
    ``on_start`` calls ``super().on_start(...)`` so that ``run_context`` is filled in.

    Example:
        >>> class PrintLoss(train.UserCallback):
        ...     def after_report(self, run_context, metrics, checkpoint):
        ...         print(run_context.run_name, metrics[0]["loss"], checkpoint)
        >>> train.RunConfig(callbacks=[PrintLoss()])  # doctest: +SKIP
    """

    _run_context: TrainRunContext = TrainRunContext()

    def on_start(self, run_name: str, run_path: str, config: dict[str, Any] | None) -> None:
        """Records the run for ``run_context``."""
        self._run_context = TrainRunContext(run_name, run_path, config)

    def on_report(self, metrics: dict[str, Any], checkpoint: Checkpoint | None) -> None:
        """Calls :meth:`after_report` with ``[metrics]``."""
        self.after_report(self._run_context, [metrics], checkpoint)

    def on_failure(self, failures: list[WorkerFailure], will_restart: bool) -> None:
        """Calls :meth:`after_exception` with each failed rank's error."""
        errors: dict[int, BaseException] = {
            f.rank: f.error if f.error is not None else RuntimeError(f.message) for f in failures
        }
        self.after_exception(self._run_context, errors)

    def after_report(
        self,
        run_context: TrainRunContext,
        metrics: list[dict[str, Any]],
        checkpoint: Checkpoint | None,
    ) -> None:
        """Called after a report of every worker (Ray's hook).

        Args:
            run_context: The run (its name, directory and ``train_loop_config``).
            metrics: ``[rank 0's metrics]``: lumos's driver keeps only rank 0's (Ray
                lists every rank's).
            checkpoint: The committed checkpoint of this report, else ``None``.
        """

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, BaseException]
    ) -> None:
        """Called after workers failed (Ray's hook).

        Args:
            run_context: The run.
            worker_exceptions: Each failed world rank's error (``-1``: not one worker's).
        """
