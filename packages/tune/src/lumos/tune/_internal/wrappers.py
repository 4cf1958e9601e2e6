"""Trainable wrappers, as in Ray Tune: ``tune.with_parameters`` and ``tune.with_resources``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lumos.runtime import ensure_ray, validate_resources
from lumos.tune._internal.errors import TuneConfigError, TuneTypeError
from lumos.tune._internal.trainable import as_function

Trainable = Callable[..., Any]


class WithParameters:
    """A trainable called as ``trainable(config, **objects)``; the objects live in Ray's
    object store (put once, when wrapped) and each trial actor fetches them once."""

    def __init__(self, trainable: Trainable, refs: dict[str, Any]) -> None:
        self.trainable = trainable
        self.refs = refs
        self.__name__ = getattr(trainable, "__name__", type(trainable).__name__)
        self._objects: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"trainable": self.trainable, "refs": self.refs, "__name__": self.__name__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._objects = None

    def __call__(self, config: dict[str, Any]) -> Any:
        if self._objects is None:  # once per actor: later trials on it reuse them
            import ray

            values = ray.get(list(self.refs.values()))
            self._objects = dict(zip(self.refs, values, strict=True))
        return self.trainable(config, **self._objects)

    def __repr__(self) -> str:
        return f"with_parameters({self.__name__}, {sorted(self.refs)})"


def with_parameters(trainable: Trainable, **objects: Any) -> WithParameters:
    """Pass large objects (datasets, arrays, models) to every trial without copying them
    into each trial's function: each is put in Ray's object store once, and the trial
    function gets them as keyword arguments.

    Starts (or connects to) Ray when it is not running.

    Args:
        trainable: The trial function ``(config, **objects) -> None | dict``.
        **objects: The objects to share.

    Returns:
        A trainable to give to :class:`~lumos.tune.Tuner`.

    Example:
        >>> def objective(config, data=None):
        ...     tune.report({"loss": float(data.mean()) * config["x"]})
        >>> tuner = tune.Tuner(tune.with_parameters(objective, data=np.ones(10**7)),
        ...                    param_space={"x": tune.uniform(0, 1)})
    """
    if not callable(trainable):
        raise TuneTypeError(
            f"with_parameters(trainable={trainable!r}): give the trial function "
            "(config, **objects) -> None | dict"
        )
    ensure_ray()
    import ray

    refs = {name: ray.put(value) for name, value in objects.items()}
    return WithParameters(as_function(trainable), refs)


class WithResources:
    """A trainable that names the Ray resources each of its trials reserves."""

    def __init__(self, trainable: Trainable, resources: dict[str, float]) -> None:
        self.trainable = trainable
        self.resources = resources
        self.__name__ = getattr(trainable, "__name__", type(trainable).__name__)

    def __call__(self, config: dict[str, Any], **objects: Any) -> Any:
        return self.trainable(config, **objects)

    def __repr__(self) -> str:
        return f"with_resources({self.__name__}, {self.resources})"


def with_resources(trainable: Trainable, resources: Mapping[str, float] | float) -> WithResources:
    """Set the Ray resources each trial reserves (``{"CPU": 2, "GPU": 1}``, or a CPU count).

    The same as ``TuneConfig(trial_resources=...)``; giving both with different values
    is an error. A function ``config -> resources`` (Ray's per-config form) is not
    supported yet: lumos reuses one actor shape for every trial of a sweep.

    Example:
        >>> tuner = tune.Tuner(tune.with_resources(objective, {"CPU": 2}), param_space=...)
    """
    if not callable(trainable):
        raise TuneTypeError(f"with_resources(trainable={trainable!r}): give the trial function")
    if callable(resources):
        raise TuneConfigError(
            "with_resources(trainable, resources=<function>): a per-config resource function "
            "is not supported yet (a sweep's trials share one actor shape); give a dict "
            "such as {'CPU': 2, 'GPU': 1}"
        )
    if isinstance(resources, bool) or not isinstance(resources, (Mapping, int, float)):
        raise TuneConfigError(
            f"with_resources(resources={resources!r}): give a dict such as {{'CPU': 2}} "
            "or a number of CPUs"
        )
    if isinstance(resources, Mapping):
        # Ray's spelling: {"cpu": 1, "gpu": 0} means CPU and GPU.
        shape = {_RAY_NAMES.get(k, k): float(v) for k, v in resources.items()}
    else:
        shape = {"CPU": float(resources)}
    validate_resources(shape, "with_resources(resources)", allow_zero=True)
    return WithResources(as_function(trainable), {k: float(v) for k, v in shape.items()})


_RAY_NAMES = {"cpu": "CPU", "gpu": "GPU"}


def unwrap_resources(trainable: Trainable) -> dict[str, float] | None:
    """The resources ``with_resources`` attached (through ``with_parameters`` too), or None."""
    while True:
        if isinstance(trainable, WithResources):
            return dict(trainable.resources)
        if isinstance(trainable, WithParameters):
            trainable = trainable.trainable
            continue
        return None
