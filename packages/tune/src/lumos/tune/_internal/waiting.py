"""Which running trials wait for resources, and telling the user once they really do.

The executor says which trials' actors Ray has not placed for lack of resources. A
trial counts as waiting (``Trial.waiting_for_resources``) as soon as the executor says
so; the console hears of it only when it still waits at the next check, a
``resources_check_interval_s`` later, so an actor that Ray is just placing is never
announced, and each trial is announced once.
"""

from __future__ import annotations

from collections.abc import Mapping

from lumos.tune._internal.controller_api import Executor, ProgressSink
from lumos.tune._internal.live_trial import LiveTrial


class WaitingWatch:
    """Marks trials that wait for resources and announces each once, after a grace.

    Args:
        executor: Says which trials wait (``Executor.waiting_for_resources``).
        progress: Hears of the trials that really wait.
        resources: What one trial's actor needs (for the message).
    """

    __slots__ = ("_announced", "_executor", "_progress", "_resources", "_seen")

    def __init__(
        self, executor: Executor, progress: ProgressSink, resources: Mapping[str, float]
    ) -> None:
        self._executor = executor
        self._progress = progress
        self._resources = dict(resources)
        self._seen: set[str] = set()  # waiting at the last check
        self._announced: set[str] = set()

    def check(self, running: Mapping[str, LiveTrial]) -> None:
        """Update ``waiting_for_resources`` of the ``running`` trials; announce those
        waiting at this check and the one before that were never announced."""
        waiting_ids = set(self._executor.waiting_for_resources())
        newly: list[LiveTrial] = []
        for tid, trial in running.items():
            waits = tid in waiting_ids
            trial.waiting_for_resources = waits
            if waits and tid in self._seen and tid not in self._announced:
                self._announced.add(tid)
                newly.append(trial)
        self._seen = waiting_ids
        if newly:
            self._progress.waiting_for_resources(newly, dict(self._resources))
