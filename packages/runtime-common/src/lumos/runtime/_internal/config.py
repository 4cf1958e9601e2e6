"""The run settings Train and Tune share: ``RunConfig`` and ``FailureConfig`` bases.

``lumos.train`` and ``lumos.tune`` each publish a ``RunConfig`` and a
``FailureConfig`` that subclass these (their callbacks differ, Train adds
restart settings), so one concept has one implementation, one default and one
error message.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lumos.runtime._internal.errors import RuntimeConfigError
from lumos.runtime._internal.run_claim import IF_EXISTS_CHOICES, IfExists
from lumos.storage import CheckpointConfig, validate_name

DEFAULT_STORAGE_PATH = "~/lumos_results"
"""Where runs and experiments are written when neither ``storage_path`` nor a parent job says."""


class FailureConfig(BaseModel):
    """How a job (a Train run, a Tune trial) recovers from failures.

    Args:
        max_failures: Failures the job may recover from: ``0`` (default) fails on the
            first error, ``-1`` retries forever, ``N`` retries up to N times. A retry
            resumes from the job's latest committed checkpoint.
        health_check_timeout_s: A worker that does not answer for this long counts
            as failed (hung).

    Example:
        >>> FailureConfig(max_failures=3).max_failures
        3
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_failures: int = 0
    health_check_timeout_s: float = Field(default=30.0, gt=0)

    @field_validator("max_failures")
    @classmethod
    def _check_max_failures(cls, value: int) -> int:
        if value < -1:
            raise RuntimeConfigError(
                f"max_failures={value} is not allowed; use -1 (retry forever), "
                "0 (no retries) or a positive number of retries"
            )
        return value


class RunConfig(BaseModel):
    """Where a job writes, what it is called, how it recovers and what it prints.

    ``RunConfig(storage_path, name)`` identifies a job: running it again with the
    same pair resumes it (``if_exists`` says otherwise).

    Args:
        name: The job's directory under ``storage_path``. Default: a readable name
            that is new each time, ``"<prefix>-<UTC time>-<6 hex digits>"`` (if it is
            taken, another is drawn: two jobs started in the same second, in one
            script or two processes, never share a directory).
        storage_path: Local directory or fsspec URL (``s3://bucket/runs``). Default:
            the enclosing job's directory (a Train run inside a Tune trial), else
            ``~/lumos_results``.
        storage_filesystem: An fsspec filesystem to use for ``storage_path``.
        failure_config: See :class:`FailureConfig`.
        checkpoint_config: See ``lumos.storage.CheckpointConfig``.
        callbacks: Driver-side callbacks of the package (``train.Callback``, ``tune.Callback``).
        verbose: ``0`` silent, ``1`` concise state lines (default), ``2`` more detail;
            ``True``/``False`` mean 1/0.
        if_exists: What ``fit()`` does when ``name`` already holds a job:
            ``"resume"`` (default) resumes it if it is the same job (Tune compares the
            trainable, metric, mode, search space and sampler; if they differ the
            stored one is kept and this one runs beside it as ``name-2``), and a
            finished one returns its stored result; ``"error"`` refuses; ``"new"``
            starts a new job beside it (``name-2``, ``name-3``, ...).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    callback_type: ClassVar[type] = object
    """The class every callback must be an instance of (set by each package)."""

    name: str | None = None
    storage_path: str | None = None
    storage_filesystem: Any = None
    failure_config: FailureConfig = Field(default_factory=FailureConfig)
    checkpoint_config: CheckpointConfig = Field(default_factory=CheckpointConfig)
    callbacks: list[Any] = Field(default_factory=list)
    verbose: int = Field(default=1, ge=0, le=2)
    if_exists: IfExists = "resume"

    @field_validator("if_exists", mode="before")
    @classmethod
    def _check_if_exists(cls, value: Any) -> Any:
        if not isinstance(value, str) or value not in IF_EXISTS_CHOICES:
            raise RuntimeConfigError(
                f"if_exists={value!r} is not allowed; use 'resume' (default: resume a "
                "stored job of that name), 'error' (refuse) or 'new' (start a new job "
                "beside it)"
            )
        return value

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        return None if value is None else validate_name(value, "name")

    @field_validator("storage_path", mode="before")
    @classmethod
    def _check_storage_path(cls, value: Any) -> Any:
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if value is not None and (not isinstance(value, str) or not value):
            raise RuntimeConfigError(
                f"storage_path={value!r} is not a path; pass a local directory or an "
                "fsspec URL such as 's3://bucket/runs'"
            )
        return value

    @field_validator("storage_filesystem")
    @classmethod
    def _check_fs(cls, value: Any) -> Any:
        if value is None:
            return None
        from fsspec import AbstractFileSystem

        if not isinstance(value, AbstractFileSystem):
            raise RuntimeConfigError(
                f"storage_filesystem={value!r} is not an fsspec filesystem; pass an "
                "fsspec.AbstractFileSystem (e.g. s3fs.S3FileSystem()) or None"
            )
        return value

    @field_validator("callbacks", mode="before")
    @classmethod
    def _check_callbacks(cls, value: Any) -> list[Any]:
        kind = cls.callback_type
        label = f"{kind.__module__.split('._internal')[0]}.{kind.__qualname__}"
        if not isinstance(value, list | tuple):
            raise RuntimeConfigError(
                f"callbacks={value!r} is not a list; pass a list of {label} objects"
            )
        for i, cb in enumerate(value):
            if not isinstance(cb, kind):
                raise RuntimeConfigError(
                    f"callbacks[{i}]={cb!r} is not a {label}; subclass {label} and "
                    "override the hooks you need"
                )
        return list(value)

    @field_validator("verbose", mode="before")
    @classmethod
    def _check_verbose(cls, value: Any) -> Any:
        return int(value) if isinstance(value, bool) else value

    def storage_location(
        self, parent_path: str | None = None, parent_filesystem: Any = None
    ) -> tuple[str, Any]:
        """``(storage_path, filesystem or None)`` to use.

        Args:
            parent_path: The enclosing job's directory (a Tune trial's), if any.
            parent_filesystem: That job's filesystem.
        """
        if self.storage_path is not None:
            return _resolved(self.storage_path, self.storage_filesystem), self.storage_filesystem
        if parent_path is not None:
            return parent_path, self.storage_filesystem or parent_filesystem
        return _resolved(DEFAULT_STORAGE_PATH, self.storage_filesystem), self.storage_filesystem


def _resolved(path: str, filesystem: Any) -> str:
    """A local path as the driver sees it (``~`` and relative paths resolved here), so
    that workers with another HOME or working directory write where the run state says;
    URLs and paths on an explicit filesystem are kept as given."""
    if filesystem is not None or "://" in path:
        return path
    return os.path.abspath(os.path.expanduser(path))
