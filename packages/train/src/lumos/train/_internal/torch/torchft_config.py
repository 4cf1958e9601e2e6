"""TorchftConfig: per-step fault tolerance with torchft (Ray Train's ``TorchftConfig`` name)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from lumos.train._internal.torch.config import TorchConfig

LIGHTHOUSE_DEFAULTS: dict[str, Any] = {
    "min_replicas": 1,
    "join_timeout_ms": 60_000,
    "heartbeat_timeout_ms": 1000,
}
"""What lumos passes to torchft's ``LighthouseServer`` unless ``lighthouse_kwargs`` says
otherwise: a quorum of one live replica is enough (the survivors step on while a rank is
replaced), and a replica whose heartbeats stop for 1 s is out of the next quorum
(torchft's default is 5 s), so the survivors of a death wait about 1 s.

``join_timeout_ms`` is how long a quorum waits for a live replica that has not asked
yet; torchft's own 60 s (Ray's too). It must outlast a training step: a replica that
joins (a replacement) asks while the others train, and with a shorter wait than a step
the three formed quorums of two in turn for the rest of the run, each a new process
group and a heal (lumos's default was 100 ms). Only a replica that still heartbeats but
never asks (a stuck one) holds the others that long, until the hang watchdog replaces it.
"""

_LIGHTHOUSE_KEYS = frozenset(
    {"bind", "min_replicas", "join_timeout_ms", "quorum_tick_ms", "heartbeat_timeout_ms"}
)


class TorchftConfig(TorchConfig):
    """Per-step fault tolerance of data-parallel training with torchft (opt in per run).

    Pass it as ``TorchTrainer(torch_config=TorchftConfig(...))``. Every worker is one
    torchft replica group; lumos starts torchft's lighthouse in the driver and stops it
    when ``fit()`` ends. When a worker dies the other ranks keep training: their
    functions are not restarted, at most the step in flight is repeated, and only the
    dead rank is replaced (the warm standby first). The replacement runs the training
    function again and receives the model, the optimizer, the RNG states, the objects
    passed as ``prepare_torchft(state=...)`` (the loader position) and the report count
    from a live peer at its first ``optimizer.zero_grad()``, so it joins at the current
    step. Checkpoints keep their meaning and are the fallback: when no rank is left
    alive, the run restarts from the latest committed one as without torchft.

    Inside the function call ``lumos.train.torch.prepare_torchft(model, optimizer)``.
    Needs ``pip install 'lumos-train[torchft]'``.

    Args:
        lighthouse_kwargs: Keyword arguments of torchft's ``LighthouseServer`` (``bind``,
            ``min_replicas``, ``join_timeout_ms``, ``quorum_tick_ms``,
            ``heartbeat_timeout_ms``), over :data:`LIGHTHOUSE_DEFAULTS`.
        backend: Only ``"gloo"`` is tried by lumos so far (torchft's own process groups).
        timeout_s: Timeout of torchft's collectives, quorums and state transfer.

    Example:
        >>> TorchftConfig(lighthouse_kwargs={"min_replicas": 1}).lighthouse_args()["min_replicas"]
        1
    """

    lighthouse_kwargs: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float = Field(default=60.0, gt=0)

    @field_validator("backend")
    @classmethod
    def _gloo_only(cls, value: str | None) -> str | None:
        if value not in (None, "gloo"):
            raise ValueError(
                f"backend={value!r}: lumos runs torchft on its ProcessGroupGloo only so far; "
                "use backend='gloo' (or leave it unset)"
            )
        return value

    @field_validator("lighthouse_kwargs")
    @classmethod
    def _known_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - _LIGHTHOUSE_KEYS)
        if unknown:
            raise ValueError(
                f"lighthouse_kwargs has unknown key(s) {unknown}; torchft's LighthouseServer "
                f"takes {sorted(_LIGHTHOUSE_KEYS)}"
            )
        replicas = value.get("min_replicas", 1)
        if not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"lighthouse_kwargs['min_replicas']={replicas!r}: need an int >= 1")
        return value

    def lighthouse_args(self) -> dict[str, Any]:
        """The ``LighthouseServer`` keyword arguments lumos starts it with."""
        return {"bind": "[::]:0", **LIGHTHOUSE_DEFAULTS, **self.lighthouse_kwargs}
