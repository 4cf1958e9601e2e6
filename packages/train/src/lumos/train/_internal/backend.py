"""Backends: what a trainer sets up around the user's function (driver half)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lumos.train._internal.session import WorkerHooks

if TYPE_CHECKING:
    from lumos.runtime import WorkerGroupProtocol


class Backend:
    """Driver-side half of a backend (``DataParallelTrainer`` uses this no-op one).

    Attributes:
        warm_imports: Modules a standby worker imports ahead of taking over a rank.
        peer_recovery: A dead rank is replaced while the others keep training, and its
            replacement catches up from a live peer (``TorchftConfig``).
    """

    warm_imports: tuple[str, ...] = ()
    peer_recovery: bool = False

    def prepare_launch(self, group: WorkerGroupProtocol) -> WorkerHooks | None:
        """Called before every launch of the training function on ``group``.

        Returns:
            Hooks that run in every worker's training thread, or ``None``.
        """
        return None

    def shutdown(self) -> None:
        """Called once when ``fit()`` ends: drop what the launches held."""

    def process_group_backend(self) -> str:
        """The ``torch.distributed`` backend local mode joins under torchrun (gloo here)."""
        return "gloo"
