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


ResourcesFn = Callable[[dict[str, Any]], Any]


class WithResources:
    """A trainable that names the Ray resources each of its trials reserves: one dict,
    or a function of the trial's config (``resources_fn``)."""

    def __init__(
        self,
        trainable: Trainable,
        resources: dict[str, float],
        resources_fn: ResourcesFn | None = None,
    ) -> None:
        self.trainable = trainable
        self.resources = resources
        self.resources_fn = resources_fn
        self.__name__ = getattr(trainable, "__name__", type(trainable).__name__)

    def __call__(self, config: dict[str, Any], **objects: Any) -> Any:
        return self.trainable(config, **objects)

    def __repr__(self) -> str:
        shape = self.resources_fn if self.resources_fn is not None else self.resources
        return f"with_resources({self.__name__}, {shape})"


def with_resources(
    trainable: Trainable, resources: Mapping[str, float] | float | ResourcesFn
) -> WithResources:
    """Set the Ray resources each trial reserves (``{"CPU": 2, "GPU": 1}``, or a CPU count),
    or a function ``config -> resources`` giving each trial its own.

    A dict is the same as ``TuneConfig(trial_resources=...)``; giving both with
    different values is an error. With a function, each trial's actor gets what the
    function returns for its config; trials of equal resources reuse each other's
    actors, an idle actor of another shape is released to make room.

    Example:
        >>> tuner = tune.Tuner(tune.with_resources(objective, {"CPU": 2}), param_space=...)
        >>> tuner = tune.Tuner(
        ...     tune.with_resources(objective, lambda config: {"CPU": config["workers"]}),
        ...     param_space={"workers": tune.choice([1, 2])})
    """
    if not callable(trainable):
        raise TuneTypeError(f"with_resources(trainable={trainable!r}): give the trial function")
    if callable(resources):
        return WithResources(as_function(trainable), {}, resources_fn=resources)
    return WithResources(as_function(trainable), resource_shape(resources, "with_resources"))


def resource_shape(resources: Any, where: str) -> dict[str, float]:
    """``resources`` (a dict in Ray's or lumos's spelling, or a CPU count) as a checked
    resource dict; ``where`` names the call in the error message."""
    if isinstance(resources, bool) or not isinstance(resources, (Mapping, int, float)):
        raise TuneConfigError(
            f"{where}(resources={resources!r}): give a dict such as {{'CPU': 2}} "
            "or a number of CPUs"
        )
    if isinstance(resources, Mapping):
        # Ray's spelling: {"cpu": 1, "gpu": 0} means CPU and GPU.
        shape: dict[str, float] = {
            _RAY_NAMES.get(str(k), str(k)): float(v) for k, v in resources.items()
        }
    else:
        shape = {"CPU": float(resources)}
    validate_resources(shape, f"{where}(resources)", allow_zero=True)
    return shape


_RAY_NAMES = {"cpu": "CPU", "gpu": "GPU"}


def unwrap_resources(trainable: Trainable) -> dict[str, float] | None:
    """The resources ``with_resources`` attached (through ``with_parameters`` too), or None
    (also when they are a function of the config: see :func:`unwrap_resources_fn`)."""
    found = _with_resources(trainable)
    if found is None or found.resources_fn is not None:
        return None
    return dict(found.resources)


def unwrap_resources_fn(trainable: Trainable) -> ResourcesFn | None:
    """The ``config -> resources`` function ``with_resources`` attached, or None."""
    found = _with_resources(trainable)
    return found.resources_fn if found is not None else None


def _with_resources(trainable: Trainable) -> WithResources | None:
    while True:
        if isinstance(trainable, WithResources):
            return trainable
        if isinstance(trainable, WithParameters):
            trainable = trainable.trainable
            continue
        return None
