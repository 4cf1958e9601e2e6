"""What a worker group is made of: its spec and the validators of resources and env vars.

No Ray import: the configs of lumos.train and lumos.tune use these validators too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from lumos.runtime._internal.errors import RuntimeConfigError

PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
"""A Ray placement-group strategy."""
PLACEMENT_STRATEGIES: tuple[str, ...] = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass(frozen=True)
class WorkerGroupSpec:
    """What to start: how many workers, what each needs, where and how.

    Args:
        num_workers: Number of workers (world size), >= 1.
        resources_per_worker: Ray resources of each worker, e.g. ``{"CPU": 1, "GPU": 1}``.
        placement_strategy: Placement group strategy.
        env_vars: Environment variables set in each worker before user code runs.
        placement_timeout_s: Give up starting after this many seconds (``None``: wait).
        health_check_timeout_s: A worker not answering within this many seconds (beyond
            its long-poll wait) is reported as ``WorkerHungEvent``.
        standby: Keep one extra, idle worker process ready (started with the group, its
            ``warm_imports`` imported, the launched function preloaded) that
            ``replace_workers`` uses instead of starting a new actor: a failed rank is
            back in well under a second. It reserves no Ray resources (it runs only in
            place of a dead worker, whose bundle it uses) and is used only for a rank on
            its node; with GPUs or custom resources per worker it is not started.
        warm_imports: Modules the standby imports while it waits (e.g. ``("torch",)``).

    Raises:
        RuntimeConfigError: A field is out of range (a ``ValueError``); the message names the field and value.

    Example:
        >>> spec = WorkerGroupSpec(num_workers=2, resources_per_worker={"CPU": 1, "GPU": 1},
        ...                        placement_strategy="SPREAD", env_vars={"NCCL_DEBUG": "WARN"})
        >>> spec.health_check_timeout_s
        10.0
    """

    num_workers: int
    resources_per_worker: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    placement_strategy: PlacementStrategy = "PACK"
    env_vars: dict[str, str] = field(default_factory=dict)
    placement_timeout_s: float | None = None
    health_check_timeout_s: float = 10.0
    standby: bool = False
    warm_imports: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (
            isinstance(self.num_workers, bool)
            or not isinstance(self.num_workers, int)
            or self.num_workers < 1
        ):
            raise RuntimeConfigError(
                f"num_workers={self.num_workers!r} is invalid: must be an int >= 1"
            )
        validate_resources(self.resources_per_worker)
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise RuntimeConfigError(
                f"placement_strategy={self.placement_strategy!r} is invalid: allowed are {', '.join(PLACEMENT_STRATEGIES)}"
            )
        validate_env_vars(self.env_vars)
        if self.placement_timeout_s is not None and not self.placement_timeout_s > 0:
            raise RuntimeConfigError(
                f"placement_timeout_s={self.placement_timeout_s!r} is invalid: must be > 0 or None (wait)"
            )
        if not self.health_check_timeout_s > 0:
            raise RuntimeConfigError(
                f"health_check_timeout_s={self.health_check_timeout_s!r} is invalid: must be > 0"
            )
        if not isinstance(self.warm_imports, tuple) or not all(
            isinstance(m, str) and m for m in self.warm_imports
        ):
            raise RuntimeConfigError(
                f"warm_imports={self.warm_imports!r} is invalid: must be a tuple of module names"
            )

    @property
    def uses_standby(self) -> bool:
        """True when ``standby`` is set and workers need only CPUs (and memory)."""
        return self.standby and set(self.resources_per_worker) <= {"CPU", "memory"}


def validate_resources(
    resources: dict[str, float], name: str = "resources_per_worker", allow_zero: bool = False
) -> None:
    """Check a Ray resource dict; the message names the field, the value and the rule."""
    if not isinstance(resources, dict) or (not resources and not allow_zero):
        raise RuntimeConfigError(
            f"{name}={resources!r} is invalid: must be a non-empty dict like {{'CPU': 1}}"
        )
    for k, v in resources.items():
        if (
            not isinstance(k, str)
            or isinstance(v, bool)
            or not isinstance(v, (int, float))
            or v < 0
        ):
            raise RuntimeConfigError(
                f"{name}[{k!r}]={v!r} is invalid: amounts must be numbers >= 0"
            )
    if not allow_zero and not any(v > 0 for v in resources.values()):
        raise RuntimeConfigError(
            f"{name}={resources!r} is invalid: at least one amount must be > 0 "
            "(a placement group bundle cannot be empty)"
        )


def validate_env_vars(env_vars: dict[str, str], name: str = "env_vars") -> None:
    if not isinstance(env_vars, dict):
        raise RuntimeConfigError(f"{name}={env_vars!r} is invalid: must be a dict of str to str")
    for k, v in env_vars.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise RuntimeConfigError(f"{name}[{k!r}]={v!r} is invalid: keys and values must be str")
