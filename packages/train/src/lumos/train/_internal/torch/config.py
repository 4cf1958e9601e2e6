"""TorchConfig."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TorchConfig(BaseModel):
    """How ``TorchTrainer`` sets up ``torch.distributed``.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; default: ``"nccl"`` with
            ``ScalingConfig(use_gpu=True)``, else ``"gloo"``.
        timeout_s: timeout (seconds) of forming the process group and of its
            collectives: a collective waiting for a peer that stopped answering
            gives up after it. (A peer whose process died is noticed at once.)

    Example:
        >>> TorchConfig(backend="gloo", timeout_s=600).backend
        'gloo'
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["gloo", "nccl"] | None = None
    timeout_s: float = Field(default=1800.0, gt=0)

    def resolved_backend(self, use_gpu: bool) -> str:
        """The backend to use for ``use_gpu``."""
        if self.backend is not None:
            return self.backend
        return "nccl" if use_gpu else "gloo"
