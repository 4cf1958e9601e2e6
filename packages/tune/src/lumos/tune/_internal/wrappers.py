"""Trainable wrappers, as in Ray Tune: ``tune.with_parameters`` and ``tune.with_resources``.

They return what Ray's return, so Ray's documentation code runs unchanged:

- ``with_resources(fn, resources)`` returns ``fn`` itself with the resources attached
  (an attribute); a ``Trainable`` class gets a subclass carrying them. The result is
  still the user's function: ``ray.remote(...)``, ``callable(...)`` and calling it work.
- ``with_parameters(fn, **objects)`` returns a new function ``(config) -> ...`` that
  calls ``fn(config, **objects)``; a ``Trainable`` class gets a subclass whose
  ``setup(config)`` receives them. The objects live in Ray's object store (put once, when
  wrapped) and each trial actor fetches them once.

:func:`trial_resources` reads the attached resources back wherever the trainable went
(through ``with_parameters`` too, either order, and through the class wrapper).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from lumos.runtime import ensure_ray, validate_resources
from lumos.tune._internal.errors import TuneConfigError, TuneTypeError
from lumos.tune._internal.trainable import ClassTrainable, Trainable

TrainableT = TypeVar("TrainableT")
TrainableClassT = TypeVar("TrainableClassT", bound=type[Trainable])
ResourcesFn = Callable[[dict[str, Any]], Any]

RESOURCES_ATTR = "_lumos_resources"
"""The attribute ``with_resources`` sets on a function (or a ``Trainable`` class)."""


@dataclass(frozen=True)
class TrialResources:
    """What ``with_resources`` attached: one resource dict, or a function of the config.

    Attributes:
        resources: The checked resource dict (``{}`` when ``resources_fn`` is given).
        resources_fn: ``config -> resources`` (checked per trial by the executor), or None.
    """

    resources: dict[str, float] = field(default_factory=dict)
    resources_fn: ResourcesFn | None = None


class SharedObjects:
    """The object refs ``with_parameters`` put, fetched once per process on first use
    (later trials on the same actor reuse them); pickles as the refs only."""

    def __init__(self, refs: dict[str, Any]) -> None:
        self.refs = refs
        self.values: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"refs": self.refs}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.refs = state["refs"]
        self.values = None

    def get(self) -> dict[str, Any]:
        """The objects by keyword (``ray.get`` of every ref, the first time only)."""
        if self.values is None:
            import ray

            fetched = ray.get(list(self.refs.values()))
            self.values = dict(zip(self.refs, fetched, strict=True))
        return self.values


def _check_trainable(trainable: Any, where: str) -> None:
    if not callable(trainable) or (
        inspect.isclass(trainable) and not issubclass(trainable, Trainable)
    ):
        raise TuneTypeError(
            f"{where}(trainable={trainable!r}): give a trial function (config) -> None | dict "
            "or a subclass of tune.Trainable"
        )


@overload
def with_parameters(trainable: TrainableClassT, **objects: Any) -> TrainableClassT: ...


@overload
def with_parameters(
    trainable: Callable[..., Any], **objects: Any
) -> Callable[[dict[str, Any]], Any]: ...


def with_parameters(trainable: Any, **objects: Any) -> Any:
    """Pass large objects (datasets, arrays, models) to every trial without copying them
    into each trial's function: each is put in Ray's object store once, and the trial
    function gets them as keyword arguments (a ``Trainable`` class: in ``setup``).

    Starts (or connects to) Ray when it is not running.

    Args:
        trainable: The trial function ``(config, **objects) -> None | dict``, or a
            ``tune.Trainable`` subclass whose ``setup(config, **objects)`` takes them.
        **objects: The objects to share.

    Returns:
        As Ray: a new function ``(config) -> ...`` named like ``trainable`` (keeping the
        resources ``with_resources`` attached), or a subclass of the ``Trainable`` class.

    Raises:
        TuneTypeError: ``trainable`` is neither callable nor a ``Trainable`` subclass.

    Example:
        >>> def objective(config, data=None):
        ...     tune.report({"loss": float(data.mean()) * config["x"]})
        >>> tuner = tune.Tuner(tune.with_parameters(objective, data=np.ones(10**7)),
        ...                    param_space={"x": tune.uniform(0, 1)})
    """
    _check_trainable(trainable, "with_parameters")
    ensure_ray()
    import ray

    shared = SharedObjects({name: ray.put(value) for name, value in objects.items()})
    if inspect.isclass(trainable):
        return parameters_class(trainable, shared)
    return parameters_function(trainable, shared)


def parameters_function(trainable: Callable[..., Any], shared: SharedObjects) -> Any:
    """``trainable`` as ``inner(config)`` calling ``trainable(config, **shared objects)``."""

    def inner(config: dict[str, Any]) -> Any:
        return trainable(config, **shared.get())

    inner.__name__ = getattr(trainable, "__name__", "tune_with_parameters")
    inner.__qualname__ = inner.__name__
    spec = getattr(trainable, RESOURCES_ATTR, None)
    if isinstance(spec, TrialResources):
        setattr(inner, RESOURCES_ATTR, spec)
    return inner


def parameters_class(cls: Any, shared: SharedObjects) -> Any:
    """A subclass of ``cls`` whose ``setup(config)`` also gets the shared objects."""

    def setup(self: Trainable, config: dict[str, Any], **kwargs: Any) -> None:
        cls.setup(self, config, **{**shared.get(), **kwargs})

    return _subclass(cls, {"setup": setup})


def _subclass(cls: Any, attributes: dict[str, Any]) -> Any:
    """A subclass of ``cls`` named like it, with ``attributes`` (Ray's class wrappers)."""
    namespace = {"__module__": cls.__module__, "__doc__": cls.__doc__, **attributes}
    return types.new_class(cls.__name__, (cls,), exec_body=lambda ns: ns.update(namespace))


def with_resources(
    trainable: TrainableT, resources: Mapping[str, float] | float | ResourcesFn
) -> TrainableT:
    """Set the Ray resources each trial reserves (``{"CPU": 2, "GPU": 1}``, Ray's
    ``{"cpu": 2}``, or a CPU count), or a function ``config -> resources`` giving each
    trial its own.

    As Ray, it returns ``trainable`` itself with the resources attached (a bound method
    is wrapped in a function first; a ``Trainable`` class becomes a subclass carrying
    them), so calling it, ``callable()`` and ``ray.remote()`` work as on the function.
    Like Ray, it marks that function object: wrapping it again replaces the resources.

    A dict is the same as ``TuneConfig(trial_resources=...)``; giving both with
    different values is an error. With a function, each trial's actor gets what the
    function returns for its config; trials of equal resources reuse each other's
    actors, an idle actor of another shape is released to make room.

    Raises:
        TuneTypeError: ``trainable`` is neither callable nor a ``Trainable`` subclass, or
            is an object that takes no attributes (wrap it in a function).
        TuneConfigError: ``resources`` is not a dict, a number or a function.

    Example:
        >>> tuner = tune.Tuner(tune.with_resources(objective, {"CPU": 2}), param_space=...)
        >>> tuner = tune.Tuner(
        ...     tune.with_resources(objective, lambda config: {"CPU": config["workers"]}),
        ...     param_space={"workers": tune.choice([1, 2])})
    """
    _check_trainable(trainable, "with_resources")
    if callable(resources) and not isinstance(resources, Mapping):
        spec = TrialResources(resources_fn=resources)
    else:
        spec = TrialResources(resource_shape(resources, "with_resources"))
    if inspect.isclass(trainable):
        return _subclass(trainable, {RESOURCES_ATTR: spec})  # type: ignore[no-any-return]
    target: Any = trainable
    if isinstance(trainable, types.MethodType):  # a bound method takes no attributes
        target = _as_function(trainable)
    try:
        setattr(target, RESOURCES_ATTR, spec)
    except (AttributeError, TypeError) as exc:
        raise TuneTypeError(
            f"with_resources(trainable={trainable!r}): this object takes no attributes; "
            "wrap it in a function: def objective(config): ..."
        ) from exc
    return target  # type: ignore[no-any-return]


def _as_function(method: types.MethodType) -> Callable[..., Any]:
    def call(config: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        return method(config, *args, **kwargs)

    call.__name__ = call.__qualname__ = method.__name__
    return call


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


def trial_resources(trainable: Any) -> TrialResources | None:
    """What ``with_resources`` attached to ``trainable`` (a function, a ``Trainable``
    class, or the trial function lumos made of that class), or None."""
    if isinstance(trainable, ClassTrainable):
        trainable = trainable.cls
    spec = getattr(trainable, RESOURCES_ATTR, None)
    return spec if isinstance(spec, TrialResources) else None


def unwrap_resources(trainable: Any) -> dict[str, float] | None:
    """The resource dict ``with_resources`` attached, or None (also when they are a
    function of the config: see :func:`unwrap_resources_fn`)."""
    spec = trial_resources(trainable)
    if spec is None or spec.resources_fn is not None:
        return None
    return dict(spec.resources)


def unwrap_resources_fn(trainable: Any) -> ResourcesFn | None:
    """The ``config -> resources`` function ``with_resources`` attached, or None."""
    spec = trial_resources(trainable)
    return spec.resources_fn if spec is not None else None
