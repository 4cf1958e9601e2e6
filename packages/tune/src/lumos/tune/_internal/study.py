"""Read access to a stored experiment's Optuna study (analysis, optuna-dashboard)."""

from __future__ import annotations

import os

import optuna
from fsspec import AbstractFileSystem

from lumos.storage import RunStorage
from lumos.tune._internal import journal as _journal
from lumos.tune._internal.experiment import open_study_storage, quiet_optuna, study_journal_path


def load_study(
    storage_path: str | os.PathLike[str],
    name: str,
    storage_filesystem: AbstractFileSystem | None = None,
) -> optuna.Study:
    """The Optuna study of experiment ``{storage_path}/{name}``, as stored now (read-only).

    Safe while the experiment runs: it reads a snapshot and never writes.

    Example:
        >>> study = tune.load_study("~/lumos_results", "sweep-7")
        >>> study.best_trial.params
    """
    storage = RunStorage(storage_path, name, storage_filesystem)
    optuna_storage, _ = open_study_storage(storage, writable=False)
    with quiet_optuna():
        return optuna.load_study(study_name=storage.name, storage=optuna_storage)


def export_study_journal(
    storage_path: str | os.PathLike[str],
    name: str,
    local_path: str,
    storage_filesystem: AbstractFileSystem | None = None,
) -> str:
    """Write the experiment's study journal to one local file for ``optuna-dashboard``.

    On local storage the journal already is such a file
    (``{storage_path}/{name}/_lumos/study.journal``); on object stores it is kept in
    chunks, which this merges.

    Example:
        >>> tune.export_study_journal("s3://bucket/sweeps", "sweep-7", "/tmp/sweep-7.journal")
        >>> # then: optuna-dashboard /tmp/sweep-7.journal

    Returns:
        ``local_path``.
    """
    storage = RunStorage(storage_path, name, storage_filesystem)
    journal = _journal.FsJournal(storage.fs, study_journal_path(storage), writable=False)
    return _journal.export_study_journal(journal, os.path.expanduser(local_path))
