"""What a worker group is made of: its spec and the validators of resources and env vars.

No Ray import: the configs of lumos.train and lumos.tune use these validators too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

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
        runtime_env: Ray runtime environment of every worker actor (and of the standby),
            a dict with Ray's keys (``env_vars``, ``working_dir``, ``pip``, ...); see
            :func:`validate_runtime_env`. ``None``: the job's environment.
        min_workers: Make the group elastic: it starts with as many workers as fit
            between ``min_workers`` and ``num_workers`` (the maximum) and can then shrink
            (``remove_workers``) and grow (``add_workers``). Each worker gets its own
            one-bundle placement group, so ``placement_strategy`` must be PACK or SPREAD
            (a soft preference). ``None`` (default): exactly ``num_workers``, as before.
        elastic_start_wait_s: An elastic start waits (up to ``placement_timeout_s``)
            until ``min_workers`` run, then at most this long for the others to be placed.
        avoid_nodes: Node ids (hex) to place no worker on, where the cluster has another
            alive node (else ignored); a fixed-size group only. Train's hang watchdog
            sets it for the restart after a stuck rank (``FailureConfig(hang_avoid_node)``).

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
    runtime_env: dict[str, Any] | None = None
    min_workers: int | None = None
    elastic_start_wait_s: float = 1.0
    avoid_nodes: tuple[str, ...] = ()

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
        if self.runtime_env is not None:
            validate_runtime_env(self.runtime_env, "runtime_env")
        self._check_elastic()

    def _check_elastic(self) -> None:
        if self.min_workers is not None and (
            isinstance(self.min_workers, bool)
            or not isinstance(self.min_workers, int)
            or not 1 <= self.min_workers <= self.num_workers
        ):
            raise RuntimeConfigError(
                f"min_workers={self.min_workers!r} is invalid: must be None (fixed size) or an "
                f"int from 1 to num_workers ({self.num_workers})"
            )
        if self.min_workers is not None and self.placement_strategy.startswith("STRICT_"):
            raise RuntimeConfigError(
                f"placement_strategy={self.placement_strategy!r} is invalid with min_workers="
                f"{self.min_workers}: an elastic group places each worker on its own, so only "
                "PACK or SPREAD (soft preferences) apply"
            )
        if (
            isinstance(self.elastic_start_wait_s, bool)
            or not isinstance(self.elastic_start_wait_s, int | float)
            or self.elastic_start_wait_s < 0
        ):
            raise RuntimeConfigError(
                f"elastic_start_wait_s={self.elastic_start_wait_s!r} is invalid: must be a number >= 0"
            )

    @property
    def elastic(self) -> bool:
        """True when ``min_workers`` is set: the group may shrink and grow."""
        return self.min_workers is not None

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


RUNTIME_ENV_KEYS: tuple[str, ...] = (
    "env_vars",
    "working_dir",
    "py_modules",
    "excludes",
    "pip",
    "uv",
    "conda",
    "py_executable",
    "container",
    "image_uri",
    "java_jars",
    "worker_process_setup_hook",
    "config",
)
"""The keys of Ray's ``runtime_env`` dict (``ray.runtime_env.RuntimeEnv``) a worker may use."""


def validate_runtime_env(runtime_env: Any, name: str = "runtime_env") -> dict[str, Any]:
    """Check a Ray ``runtime_env`` dict; the message names the field, the value and the rule.

    The keys must be Ray's (:data:`RUNTIME_ENV_KEYS`); ``env_vars`` must map str to
    str, ``working_dir`` / ``py_executable`` / ``image_uri`` be strings and ``pip`` /
    ``uv`` / ``py_modules`` / ``excludes`` lists (``pip`` / ``uv`` also a dict or a
    requirements file path). Ray itself checks the rest when it starts a worker.

    Returns:
        ``runtime_env`` as a plain dict.

    Raises:
        RuntimeConfigError: A key is unknown or a value has the wrong type.
    """
    if not isinstance(runtime_env, dict):
        raise RuntimeConfigError(
            f"{name}={runtime_env!r} is invalid: must be a dict of Ray runtime_env keys, "
            "e.g. {'env_vars': {'HF_HOME': '/data/hf'}, 'pip': ['einops']}"
        )
    unknown = sorted(str(k) for k in runtime_env if k not in RUNTIME_ENV_KEYS)
    if unknown:
        raise RuntimeConfigError(
            f"{name} has unknown key(s) {', '.join(map(repr, unknown))}: allowed are "
            f"{', '.join(RUNTIME_ENV_KEYS)} (Ray's runtime_env keys)"
        )
    if "env_vars" in runtime_env:
        validate_env_vars(runtime_env["env_vars"], f"{name}['env_vars']")
    for key in ("working_dir", "py_executable", "image_uri"):
        if key in runtime_env and not isinstance(runtime_env[key], str):
            raise RuntimeConfigError(
                f"{name}[{key!r}]={runtime_env[key]!r} is invalid: must be a str"
            )
    for key in ("py_modules", "excludes", "java_jars"):
        value = runtime_env.get(key)
        if value is not None and not isinstance(value, list):
            raise RuntimeConfigError(f"{name}[{key!r}]={value!r} is invalid: must be a list")
    for key in ("pip", "uv", "conda"):
        value = runtime_env.get(key)
        if value is not None and not isinstance(value, list | dict | str):
            raise RuntimeConfigError(
                f"{name}[{key!r}]={value!r} is invalid: must be a list of requirements, "
                "a dict or a file path"
            )
    return dict(runtime_env)
