"""Checkpoint validation: a committed checkpoint's validation runs while training goes on.

A report with ``validation=...`` commits its checkpoint with the validation pending
(``before_commit`` adds the request to the record); once committed, the validation is
queued on a ``ValidationRunner`` (``report_committed``), polled whenever the driver is
idle, and each ended one goes back to the run core (``RunHandle.validation_finished``),
which stores it, tells the ranks and the other components (the health checks). A run
finishes only when none is outstanding; the ones still running when a run stops stay
pending in the run state and run again when it resumes (:meth:`resubmit`).

How a validation runs is the spec's launcher: a Ray task on the Ray backend, a thread
of the driver in local mode and in unit tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from lumos.train._internal.controller import messages
from lumos.train._internal.controller.seam import (
    Attempt,
    CommitDraft,
    Committed,
    Component,
    RunHandle,
    Verdict,
)
from lumos.train._internal.controller.validations import Outcome, ValidationRunner

if TYPE_CHECKING:
    from lumos.train._internal.controller.validations import ValidationLauncher
    from lumos.train._internal.validation import ValidationConfig


class ValidationComponent(Component):
    """Runs the run's checkpoint validations (see the module docstring).

    Args:
        run: The run core.
        config: The trainer's ``ValidationConfig`` (``None``: no validation function).
        make_launcher: Builds the launcher from ``config`` at the first validation.
    """

    def __init__(
        self,
        run: RunHandle,
        config: ValidationConfig | None,
        make_launcher: Callable[[ValidationConfig], ValidationLauncher] | None,
    ) -> None:
        self._run = run
        self._config = config
        self._make_launcher = make_launcher
        self.runner: ValidationRunner | None = None  # started at the first validation

    def resubmit(self) -> Verdict | None:
        """Validations a previous driver left pending run again (or fail without a config)."""
        book = self._run.book
        pending = book.pending_validations()
        if not pending:
            return None
        if self._config is None:
            verdict = None
            for r in pending:
                outcome = Outcome(
                    r.report_index, r.dir_name, "failed", {}, messages.NO_VALIDATION_CONFIG
                )
                verdict = self._run.validation_finished(outcome) or verdict
            return verdict
        self._run.console.info(messages.validations_again_line(len(pending)))
        for r in pending:
            request = r.validation_request or {}
            self._runner().submit(r.report_index, r.dir_name, book.checkpoint(r), request)
        return None

    def attempt_started(self, attempt: Attempt) -> None:
        if self._config is not None:
            self._runner()  # its task workers warm up while the ranks start

    def before_commit(self, draft: CommitDraft) -> None:
        requested = draft.commit.validation
        if self._config is not None and requested is not None:
            draft.validation_request = self._config.request(requested)

    def report_committed(self, committed: Committed) -> None:
        if committed.validation_request is not None:
            commit = committed.commit
            self._runner().submit(
                commit.index, commit.dir_name, committed.checkpoint, committed.validation_request
            )

    def idle(self, timeout_s: float) -> Verdict | None:
        if self.runner is None:
            return None
        verdict: Verdict | None = None
        for outcome in self.runner.poll(timeout_s):
            found = self._run.validation_finished(outcome)  # every outcome is stored
            verdict = verdict or found  # the first verdict wins
        return verdict

    def outstanding(self) -> int:
        return self.runner.pending if self.runner is not None else 0

    def rolled_back(self, dir_names: set[str]) -> None:
        if self.runner is not None:
            self.runner.cancel(dir_names)

    def run_ending(self, finished: bool) -> None:
        if self.runner is not None:  # unfinished ones stay pending: they run on resume
            self.runner.shutdown()

    def _runner(self) -> ValidationRunner:
        if self.runner is None:
            config, make = self._config, self._make_launcher
            assert config is not None, "a validation without a validation_config"
            assert make is not None, "a validation_config without a launcher"
            self.runner = ValidationRunner(make(config))
        return self.runner
