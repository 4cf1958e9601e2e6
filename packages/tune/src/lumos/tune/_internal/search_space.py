"""Search spaces: Ray-Tune-style domains mapped onto Optuna distributions.

A ``param_space`` is a (nested) dict whose leaves are domains
(``tune.uniform(0, 1)``), grid searches (``tune.grid_search([...])``), Optuna
distributions, or constants; or a define-by-run function
``(optuna.Trial) -> dict`` for conditional spaces. :class:`SearchSpace`
compiles either form once and then samples a trial's config through the
Optuna trial, so that any Optuna sampler drives the search.

Parameter names in the study are the config paths joined with ``/``
(``{"model": {"lr": ...}}`` -> ``"model/lr"``), like Ray Tune's flattened keys.
"""

from __future__ import annotations

import copy
import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from lumos.tune._internal.errors import SearchSpaceError

DefineByRun = Callable[[optuna.Trial], Mapping[str, Any] | None]
ParamSpace = Mapping[str, Any] | DefineByRun | None

_PRIMITIVES = (type(None), bool, int, float, str)


def _finite(fn: str, **values: float) -> None:
    for key, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise SearchSpaceError(f"{fn}({key}={value!r}): {key} must be a number")
        if not math.isfinite(value):
            raise SearchSpaceError(f"{fn}({key}={value!r}): {key} must be finite")


class Domain(ABC):
    """A sampled hyperparameter: one Optuna distribution plus how its value enters the config."""

    @abstractmethod
    def distribution(self) -> BaseDistribution:
        """The Optuna distribution the sampler draws from."""

    @abstractmethod
    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        """Draw the value through ``trial`` (recorded in the study) and return the config value."""


class Float(Domain):
    """A float in ``[low, high]``, optionally on a log scale and/or quantized by ``q``."""

    def __init__(
        self, fn: str, low: float, high: float, *, log: bool = False, q: float | None = None
    ) -> None:
        _finite(fn, low=low, high=high)
        if q is not None:
            _finite(fn, q=q)
            if q <= 0:
                raise SearchSpaceError(f"{fn}(q={q!r}): q must be > 0")
        if low > high:
            raise SearchSpaceError(
                f"{fn}(low={low!r}, high={high!r}): low must be <= high; swap the bounds"
            )
        if log and low <= 0:
            raise SearchSpaceError(f"{fn}(low={low!r}, high={high!r}): a log scale needs low > 0")
        self.fn = fn
        self.low = float(low)
        self.high = float(high)
        self.log = log
        self.q = None if q is None else float(q)
        # quniform: Optuna's step grid starts at `low`; trim `high` to the last grid
        # point ourselves (Optuna would warn and do the same).
        self._step: float | None = None
        if self.q is not None and not log:
            n = math.floor((self.high - self.low) / self.q + 1e-9)
            self._step = self.q
            self.high = self.low + n * self.q

    def distribution(self) -> BaseDistribution:
        return FloatDistribution(self.low, self.high, log=self.log, step=self._step)

    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        value = trial.suggest_float(name, self.low, self.high, log=self.log, step=self._step)
        return self.to_config(value)

    def to_config(self, value: Any) -> Any:
        if self.q is not None and self.log:
            # qloguniform: sampled on the log scale, rounded to a multiple of q, kept in range.
            quantized = round(float(value) / self.q) * self.q
            return min(max(quantized, self.low), self.high)
        return value

    def __repr__(self) -> str:
        q = f", q={self.q!r}" if self.q is not None else ""
        return f"{self.fn}({self.low!r}, {self.high!r}{q})"


class Integer(Domain):
    """An integer in ``[low, high]`` (both inclusive here), optionally log scale or step ``q``."""

    def __init__(self, fn: str, low: int, high: int, *, log: bool = False, q: int = 1) -> None:
        for key, value in (("low", low), ("high", high), ("q", q)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise SearchSpaceError(f"{fn}({key}={value!r}): {key} must be an int")
        if q < 1:
            raise SearchSpaceError(f"{fn}(q={q!r}): q must be >= 1")
        if low > high:
            raise SearchSpaceError(
                f"{fn}: the range is empty (low={low!r}, inclusive high={high!r}); "
                "low must be below high"
            )
        if log and low < 1:
            raise SearchSpaceError(f"{fn}(low={low!r}): a log scale needs low >= 1")
        if log and q != 1:
            raise SearchSpaceError(f"{fn}(q={q!r}): a log scale supports only q=1")
        self.fn = fn
        self.low = low
        self.high = low + ((high - low) // q) * q
        self.log = log
        self.q = q

    def distribution(self) -> BaseDistribution:
        return IntDistribution(self.low, self.high, log=self.log, step=self.q)

    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        return trial.suggest_int(name, self.low, self.high, step=self.q, log=self.log)

    def __repr__(self) -> str:
        return f"{self.fn}({self.low!r}, {self.high!r})"


class Categorical(Domain):
    """One of ``categories``.

    Primitive categories (None, bool, int, float, str) are stored in the study as
    they are; otherwise the study stores the index and the config gets the object.
    """

    def __init__(self, categories: Sequence[Any], fn: str = "choice") -> None:
        if isinstance(categories, (str, bytes)) or not isinstance(categories, Sequence):
            raise SearchSpaceError(
                f"{fn}(categories={categories!r}): categories must be a list or tuple"
            )
        if len(categories) == 0:
            raise SearchSpaceError(f"{fn}(categories=[]): give at least one category")
        self.fn = fn
        self.categories = list(categories)
        self.by_index = not all(type(c) in _PRIMITIVES for c in self.categories)

    def choices(self) -> list[Any]:
        """The values the study stores (the categories, or their indices)."""
        return list(range(len(self.categories))) if self.by_index else list(self.categories)

    def distribution(self) -> BaseDistribution:
        return CategoricalDistribution(self.choices())

    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        return self.to_config(trial.suggest_categorical(name, self.choices()))

    def to_config(self, value: Any) -> Any:
        if self.by_index:
            return copy.deepcopy(self.categories[int(value)])
        return value

    def __repr__(self) -> str:
        return f"{self.fn}({self.categories!r})"


class GridSearch(Categorical):
    """Every value is tried (the cartesian product over all grid searches)."""

    def __init__(self, values: Sequence[Any]) -> None:
        super().__init__(values, fn="grid_search")


class _OptunaDomain(Domain):
    """An Optuna distribution given directly in ``param_space``."""

    def __init__(self, dist: BaseDistribution) -> None:
        if not isinstance(dist, (FloatDistribution, IntDistribution, CategoricalDistribution)):
            raise SearchSpaceError(
                f"unsupported Optuna distribution {dist!r}: use FloatDistribution, "
                "IntDistribution or CategoricalDistribution"
            )
        self.dist = dist

    def distribution(self) -> BaseDistribution:
        return self.dist

    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        d = self.dist
        if isinstance(d, FloatDistribution):
            return trial.suggest_float(name, d.low, d.high, log=d.log, step=d.step)
        if isinstance(d, IntDistribution):
            return trial.suggest_int(name, d.low, d.high, step=d.step, log=d.log)
        assert isinstance(d, CategoricalDistribution)
        return trial.suggest_categorical(name, list(d.choices))

    def __repr__(self) -> str:
        return repr(self.dist)


class SampleFrom:
    """A value computed from the rest of the config (``tune.sample_from``).

    Not a parameter of the study: it is evaluated after every sampled parameter,
    in the order of ``param_space``, with a ``spec`` whose ``spec.config`` holds the
    config so far (attribute or key access).
    """

    def __init__(self, func: Callable[..., Any]) -> None:
        if not callable(func):
            raise SearchSpaceError(f"sample_from(func={func!r}): give a function (spec) -> value")
        self.func = func

    def resolve(self, config: dict[str, Any]) -> Any:
        """The value for ``config`` (the rest of the trial's config)."""
        return self.func(_Spec(config))

    def __repr__(self) -> str:
        return f"sample_from({self.func!r})"


class _AttrDict(dict[str, Any]):
    """A dict whose keys are also attributes (``spec.config.lr``), as in Ray Tune."""

    def __getattr__(self, name: str) -> Any:
        try:
            value = self[name]
        except KeyError:
            raise AttributeError(name) from None
        return _AttrDict(value) if isinstance(value, dict) else value


class _Spec:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = _AttrDict(config)


# ---------------------------------------------------------------------------
# Compiled spaces

_Path = tuple[str | int, ...]


def _path_name(path: _Path) -> str:
    return "/".join(str(p) for p in path)


def _set_path(root: Any, path: _Path, value: Any) -> None:
    node = root
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


class SearchSpace:
    """A compiled ``param_space``: samples configs through an Optuna trial.

    Args:
        param_space: A nested dict of domains, grid searches, Optuna distributions and
            constants; or a define-by-run function ``(optuna.Trial) -> dict | None``;
            or None (empty config).

    Raises:
        SearchSpaceError: for anything that is not a valid space.
    """

    def __init__(self, param_space: ParamSpace) -> None:
        self.define_by_run: DefineByRun | None = None
        self.template: Any = {}
        self.domains: list[tuple[_Path, Domain]] = []
        self.grid: list[tuple[_Path, GridSearch]] = []
        self.functions: list[tuple[_Path, SampleFrom]] = []
        if param_space is None:
            return
        if callable(param_space) and not isinstance(param_space, Mapping):
            self.define_by_run = param_space
            return
        if not isinstance(param_space, Mapping):
            raise SearchSpaceError(
                f"param_space must be a dict or a function (optuna.Trial) -> dict, "
                f"got {type(param_space).__name__}"
            )
        self.template = self._compile(param_space, ())
        names = [_path_name(p) for p, _ in self.domains]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SearchSpaceError(f"param_space has clashing parameter names: {dupes}")

    def _compile(self, node: Any, path: _Path) -> Any:
        if isinstance(node, SampleFrom):
            self.functions.append((path, node))
            return None
        if isinstance(node, GridSearch):
            self.grid.append((path, node))
            self.domains.append((path, node))
            return None
        if isinstance(node, Domain):
            self.domains.append((path, node))
            return None
        if isinstance(node, BaseDistribution):
            self.domains.append((path, _OptunaDomain(node)))
            return None
        if isinstance(node, Mapping):
            out: dict[Any, Any] = {}
            for key, value in node.items():
                if not isinstance(key, str):
                    raise SearchSpaceError(
                        f"param_space keys must be strings, got {key!r} at {_path_name(path)!r}"
                    )
                out[key] = self._compile(value, (*path, key))
            return out
        if isinstance(node, (list, tuple)):
            items = [self._compile(v, (*path, i)) for i, v in enumerate(node)]
            return items if isinstance(node, list) else list(items)
        if callable(node):
            raise SearchSpaceError(
                f"param_space[{_path_name(path)!r}] is a function; wrap it in "
                "tune.sample_from(lambda spec: ...) or use a define-by-run param_space"
            )
        return node

    @property
    def num_grid_points(self) -> int:
        """Number of grid combinations (1 when there is no grid search)."""
        n = 1
        for _, g in self.grid:
            n *= len(g.categories)
        return n

    def grid_params(self, index: int) -> dict[str, Any]:
        """The study params fixing the grid searches for combination ``index``."""
        if not self.grid:
            return {}
        combos = itertools.product(*(g.choices() for _, g in self.grid))
        combo = next(itertools.islice(combos, index % self.num_grid_points, None))
        return {_path_name(p): v for (p, _), v in zip(self.grid, combo, strict=False)}

    def distributions(self) -> dict[str, BaseDistribution]:
        """The Optuna distributions of a dict space (empty for define-by-run)."""
        return {_path_name(p): d.distribution() for p, d in self.domains}

    def sample(self, trial: optuna.Trial | optuna.trial.FixedTrial) -> dict[str, Any]:
        """Draw a config through ``trial`` (a live trial, or a FixedTrial to rebuild one)."""
        if self.define_by_run is not None:
            result = self.define_by_run(trial)  # type: ignore[arg-type]
            if result is None:
                return dict(trial.params)
            if not isinstance(result, Mapping):
                raise SearchSpaceError(
                    "a define-by-run param_space must return a dict (or None), "
                    f"got {type(result).__name__}"
                )
            # As Ray's OptunaSearch: the suggested params plus the returned values.
            return {**trial.params, **result}
        config = copy.deepcopy(self.template)
        for path, domain in self.domains:
            _set_path(config, path, domain.suggest(trial, _path_name(path)))  # type: ignore[arg-type]
        for path, function in self.functions:
            _set_path(config, path, function.resolve(config))
        return config  # type: ignore[no-any-return]

    def config_from_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Rebuild the config of a trial from its study params (restore)."""
        return self.sample(optuna.trial.FixedTrial(dict(params)))

    def __repr__(self) -> str:
        if self.define_by_run is not None:
            return f"SearchSpace(define_by_run={self.define_by_run!r})"
        return f"SearchSpace({self.domains!r})"
