"""What ``Tuner.restore`` needs beyond the experiment itself: the search space and the
TuneConfig a sweep ran with (``_lumos/tuner.pkl``, written by ``fit()``), and the
split of an experiment path into ``storage_path`` and ``name``; and what identifies
the sweep (``_lumos/tuner.json``: trainable, metric, mode, search space, sampler,
written when the experiment is created), which a rerun compares with its own."""

from __future__ import annotations

import logging
import posixpath
from typing import Any

from lumos.storage import RunStorage, retried_read, retried_write
from lumos.tune._internal import messages

logger = logging.getLogger("lumos.tune")

TUNER_STATE = "tuner.pkl"
TUNER_DEFINITION = "tuner.json"
DEFINITION_FORMAT = 1


def split_experiment_path(path: str) -> tuple[str, str]:
    """``"s3://b/sweeps/exp-7/"`` -> ``("s3://b/sweeps", "exp-7")``."""
    parent, name = posixpath.split(str(path).rstrip("/"))
    if not name:
        raise ValueError(f"{path!r} names no experiment: give {{storage_path}}/{{name}}")
    return parent or ".", name


def save_tuner_state(storage: RunStorage, param_space: Any, tune_config: Any) -> None:
    """Store what a restore needs (best effort: an unpicklable space is only logged)."""
    from ray import cloudpickle

    try:
        data = cloudpickle.dumps({"param_space": param_space, "tune_config": tune_config})  # type: ignore[no-untyped-call]
    except Exception:
        logger.debug("could not pickle the param_space / tune_config", exc_info=True)
        return
    path = posixpath.join(storage.state_dir, TUNER_STATE)
    retried_write(storage.fs, path, data)


def load_tuner_state(storage: RunStorage) -> dict[str, Any]:
    """What :func:`save_tuner_state` stored, or ``{}``."""
    from ray import cloudpickle

    path = posixpath.join(storage.state_dir, TUNER_STATE)
    data = retried_read(storage.fs, path)
    if data is None:
        return {}
    try:
        state = cloudpickle.loads(data)
    except Exception:
        logger.warning(messages.unreadable_tuner_state(path), exc_info=True)
        return {}
    return dict(state) if isinstance(state, dict) else {}


def save_definition(storage: RunStorage, definition: dict[str, Any]) -> None:
    """Store what identifies the sweep (plain JSON: readable by any later version)."""
    storage.write_json(TUNER_DEFINITION, {"format": DEFINITION_FORMAT, **definition})


def has_definition(storage: RunStorage) -> bool:
    """Whether the experiment stored what identifies it (experiments of earlier versions
    did not: a ``fit()`` that runs them on stores its own)."""
    try:
        return storage.read_json(TUNER_DEFINITION) is not None
    except ValueError:
        return False  # unreadable: written anew


def load_definition(storage: RunStorage) -> dict[str, Any] | None:
    """What identifies the stored sweep, as far as it was stored.

    Experiments written before ``tuner.json`` existed give the metric and mode their
    state recorded; ``None`` when nothing is known (the sweep is then resumed as is).
    """
    try:
        data = storage.read_json(TUNER_DEFINITION)
    except ValueError:
        logger.warning(
            "could not read %s of %s; comparing only its metric and mode with this sweep",
            TUNER_DEFINITION,
            storage.uri,
            exc_info=True,
        )
        data = None
    if isinstance(data, dict):
        return {k: v for k, v in data.items() if k != "format"}
    state = storage.load_state()
    stored = state.extra.get("tune") if state is not None else None
    if isinstance(stored, dict) and ("metric" in stored or "mode" in stored):
        return {k: stored[k] for k in ("metric", "mode") if k in stored}
    return None
