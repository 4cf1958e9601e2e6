"""Loader positions: every rank's data-loader positions travel with the checkpoint.

Each rank sends its loaders' pickled positions with every report
(``data_positions.py``); the aggregator gathers them into the report's ``Commit``.
Right before the run state names the checkpoint, this component writes them into the
checkpoint directory, so the positions commit with it in every upload mode and a
restart, a job-level restore or a rollback to that checkpoint lands on them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lumos.train._internal.controller.seam import CommitDraft, Component
from lumos.train._internal.data_positions import write_positions

if TYPE_CHECKING:
    from lumos.storage import RunStorage


class LoaderPositionsComponent(Component):
    """Writes a commit's loader positions into its checkpoint (``before_commit``).

    Args:
        storage: The run's storage.
    """

    def __init__(self, storage: RunStorage) -> None:
        self._storage = storage

    def before_commit(self, draft: CommitDraft) -> None:
        commit = draft.commit
        if commit.data_positions:  # written before the state names the checkpoint
            write_positions(
                self._storage, commit.dir_name, commit.data_positions, draft.attempt.world_size
            )
