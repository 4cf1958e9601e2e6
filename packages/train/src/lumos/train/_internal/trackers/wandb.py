"""Weights & Biases for Train: a driver-side ``WandbLoggerCallback`` and the rank-0
``setup_wandb``."""

from __future__ import annotations

import os
import shutil
from typing import Any

from lumos.storage import Checkpoint
from lumos.train._internal.callback import Callback
from lumos.train._internal.extras import require_extra
from lumos.train._internal.result import Result
from lumos.train._internal.trackers import common

wandb = require_extra("wandb", "wandb", "lumos.train.integrations.wandb")


def _login(api_key: str | None, api_key_file: str | None) -> None:
    """Put the key (given, or read from ``api_key_file``) in ``WANDB_API_KEY``."""
    if api_key and api_key_file:
        raise ValueError(f"pass api_key or api_key_file={api_key_file!r}, not both")
    if api_key_file:
        with open(os.path.expanduser(api_key_file), encoding="utf-8") as f:
            api_key = f.readline().strip()
    if api_key:
        os.environ["WANDB_API_KEY"] = api_key


class WandbLoggerCallback(Callback):
    """Logs a Train run to Weights & Biases from the driver: ``train_loop_config`` as the
    run's config, every report of rank 0 (step: the report's number in this ``fit()``,
    from 1), each committed checkpoint's path in the summary (``checkpoint``) and,
    with ``upload_checkpoints``, its files as a ``model`` artifact; the run's exit code is
    0 when ``fit()`` succeeded, else 1. Each ``fit()`` (a resume too) is one W&B run named
    after the Train run. ``WANDB_MODE=offline`` logs without a network. Needs
    ``pip install 'lumos-train[wandb]'``.

    Args:
        project: W&B project; default ``WANDB_PROJECT`` (one of them is required).
        group: W&B group; default ``WANDB_GROUP``.
        api_key_file: A file holding the API key (sets ``WANDB_API_KEY``).
        api_key: The API key (sets ``WANDB_API_KEY``).
        excludes: Metric and config keys (or ``/``-joined prefixes) not to log.
        upload_checkpoints: Log each committed checkpoint's files as an artifact.
        **kwargs: More ``wandb.init`` arguments (``entity``, ``tags``, ``mode``, ...).

    Example:
        >>> from lumos.train.integrations.wandb import WandbLoggerCallback
        >>> RunConfig(callbacks=[WandbLoggerCallback(project="resnet")])
    """

    def __init__(
        self,
        project: str | None = None,
        group: str | None = None,
        api_key_file: str | None = None,
        api_key: str | None = None,
        excludes: list[str] | None = None,
        upload_checkpoints: bool = False,
        **kwargs: Any,
    ) -> None:
        if api_key and api_key_file:
            raise ValueError(
                f"WandbLoggerCallback: pass api_key or api_key_file={api_key_file!r}, not both"
            )
        self.project = project
        self.group = group
        self.api_key_file = api_key_file
        self.api_key = api_key
        self.excludes = tuple(excludes or ())
        self.upload_checkpoints = upload_checkpoints
        self.kwargs = kwargs
        self.run: Any = None
        """The W&B run of the latest ``fit()``."""
        self._step = 0

    def _keep(self, key: str) -> bool:
        return not any(key == e or key.startswith(e + "/") for e in self.excludes)

    def on_start(self, run_name: str, run_path: str, config: dict[str, Any] | None) -> None:
        _login(self.api_key, self.api_key_file)
        project = self.project or os.environ.get("WANDB_PROJECT")
        if not project:
            raise ValueError(
                "WandbLoggerCallback(project=None) and WANDB_PROJECT is not set: pass "
                "project='...' or set WANDB_PROJECT"
            )
        self.run = wandb.init(
            **{
                "project": project,
                "group": self.group or os.environ.get("WANDB_GROUP"),
                "name": run_name,
                "config": {k: v for k, v in common.flat(config or {}).items() if self._keep(k)},
                "reinit": "create_new",
                **self.kwargs,
            }
        )
        self.run.summary["lumos.run_path"] = run_path
        self._step = 0

    def on_report(self, metrics: dict[str, Any], checkpoint: Checkpoint | None) -> None:
        self._step += 1
        self.run.log(
            {k: v for k, v in common.scalars(metrics).items() if self._keep(k)}, step=self._step
        )
        if checkpoint is None:
            return
        self.run.summary["checkpoint"] = checkpoint.uri
        if self.upload_checkpoints:
            name = checkpoint.path.rstrip("/").rsplit("/", 1)[-1]
            local, temporary = common.local_dir(checkpoint)
            artifact = wandb.Artifact(name=f"checkpoint_{self.run.name}", type="model")
            artifact.add_dir(local, name=name)
            self.run.log_artifact(artifact)
            if temporary:
                shutil.rmtree(local, ignore_errors=True)

    def on_finish(self, result: Result | None, error: BaseException | None) -> None:
        if self.run is None:
            return
        if error is not None:
            self.run.summary["error"] = f"{type(error).__name__}: {error}"[:5000]
        self.run.finish(exit_code=0 if error is None else 1)


def setup_wandb(
    config: dict[str, Any] | None = None,
    api_key: str | None = None,
    api_key_file: str | None = None,
    rank_zero_only: bool = True,
    **kwargs: Any,
) -> Any:
    """Start a W&B run in the training function and return it (as Ray's ``setup_wandb``).
    Only rank 0 logs by default; the other ranks get an object whose every call does
    nothing.

    Args:
        config: The run's config.
        api_key: The API key (sets ``WANDB_API_KEY``).
        api_key_file: A file holding the API key.
        rank_zero_only: Log on rank 0 only.
        **kwargs: More ``wandb.init`` arguments (``project``, ``group``, ``name``, ...);
            ``name`` defaults to the Train run's name.

    Returns:
        The ``wandb`` run, or a no-op stand-in on the other ranks.

    Example:
        >>> def train_fn(config):
        ...     run = setup_wandb(config, project="resnet")
        ...     run.log({"loss": 0.5})
    """
    if not common.rank_zero(rank_zero_only):
        return common.NoopModule()
    _login(api_key, api_key_file)
    kwargs.setdefault("name", common.run_name_default())
    kwargs.setdefault("reinit", "create_new")
    return wandb.init(config=config, **kwargs)
