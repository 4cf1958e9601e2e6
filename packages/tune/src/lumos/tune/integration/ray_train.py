"""Ray's ``ray.tune.integration.ray_train``: ``TuneReportCallback`` for a Train run inside
a Tune trial.

In lumos the callback is not needed: a ``TorchTrainer.fit()`` inside a trial function
already reports rank 0's metrics (and its committed checkpoints) to the trial, with no
glue. Ray Train V2 needs the callback for that, so Ray's documentation passes it; lumos
accepts it in Train's ``RunConfig(callbacks=[...])`` and does what Ray's adds on top:
each report that committed a checkpoint reaches the trial with ``checkpoint_path`` (the
checkpoint's URL) among its metrics. Nothing is reported twice.

Example:
    >>> from lumos.tune.integration.ray_train import TuneReportCallback
    >>> def train_driver_fn(config):
    ...     trainer = TorchTrainer(train_fn, train_loop_config=config,
    ...         run_config=train.RunConfig(callbacks=[TuneReportCallback()]))
    ...     trainer.fit()
    >>> tune.Tuner(train_driver_fn, param_space={"lr": tune.loguniform(1e-4, 1e-1)}).fit()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lumos.runtime import context as job_context
from lumos.tune._internal.session import current_session

__all__ = ["CHECKPOINT_PATH_KEY", "TuneReportCallback"]

CHECKPOINT_PATH_KEY = "checkpoint_path"
"""The metric that names the checkpoint committed with a report (Ray's key)."""


class TuneReportCallback:
    """Ray's callback that forwards a Train run's reports to the Tune trial it runs in.

    A ``lumos.train.Callback`` (it defines every Train hook; ``lumos.tune`` cannot import
    ``lumos.train``), so Train's ``RunConfig(callbacks=[TuneReportCallback()])`` takes
    it. lumos forwards each report of rank 0 to the trial by itself; with this callback,
    a report that committed a checkpoint also carries ``checkpoint_path``, its URL (Ray's
    ``checkpoint.path``; read it with ``Result.filesystem``).

    Raises:
        RuntimeError: it was built outside a Tune trial (as Ray).

    Example:
        >>> def train_driver_fn(config):
        ...     TorchTrainer(train_fn, run_config=train.RunConfig(
        ...         callbacks=[TuneReportCallback()])).fit()
    """

    def __init__(self) -> None:
        if current_session() is None:
            raise RuntimeError(
                "TuneReportCallback must be used in a Tune session: build it inside the "
                "function given to tune.Tuner (it is optional in lumos: a Train run in a "
                "trial reports to it by itself)"
            )
        self._ctx: job_context.JobContext | None = None
        self._forward: Callable[[dict[str, Any], str], None] | None = None

    def on_start(self, run_name: str, run_path: str, config: dict[str, Any] | None) -> None:
        """The run starts in the trial: its checkpointed reports get ``checkpoint_path``."""
        ctx = job_context.current()
        forward = ctx.report_checkpoint if ctx is not None else None
        if ctx is None or forward is None or self._ctx is ctx:
            return

        def with_path(metrics: dict[str, Any], checkpoint_url: str) -> None:
            forward({**metrics, CHECKPOINT_PATH_KEY: checkpoint_url}, checkpoint_url)

        ctx.report_checkpoint = with_path
        self._ctx, self._forward = ctx, forward

    def on_report(self, metrics: dict[str, Any], checkpoint: Any) -> None:
        """Nothing: the run forwards each report to the trial itself (once)."""

    def on_failure(self, failures: list[Any], will_restart: bool) -> None:
        """Nothing: the trial learns of the run's failure from ``fit()``."""

    def on_restart(self, attempt: int, checkpoint: Any) -> None:
        """Nothing."""

    def on_finish(self, result: Any, error: BaseException | None) -> None:
        """The run ended: the trial's later reports are its own again."""
        if self._ctx is not None and self._forward is not None:
            self._ctx.report_checkpoint = self._forward
        self._ctx = self._forward = None

    def __repr__(self) -> str:
        return "TuneReportCallback()"
