"""What ``Tuner.restore`` needs beyond the experiment itself: the search space and the
TuneConfig a sweep ran with (``_lumos/tuner.pkl``, written by ``fit()``), and the
split of an experiment path into ``storage_path`` and ``name``."""

from __future__ import annotations

import logging
import posixpath
from typing import Any

from lumos.storage import RunStorage
from lumos.tune._internal import messages

logger = logging.getLogger("lumos.tune")

TUNER_STATE = "tuner.pkl"


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
    storage.fs.makedirs(storage.state_dir, exist_ok=True)
    storage.fs.pipe_file(path, data)


def load_tuner_state(storage: RunStorage) -> dict[str, Any]:
    """What :func:`save_tuner_state` stored, or ``{}``."""
    from ray import cloudpickle

    path = posixpath.join(storage.state_dir, TUNER_STATE)
    try:
        data = storage.fs.cat_file(path)
    except FileNotFoundError:
        return {}
    try:
        state = cloudpickle.loads(data)
    except Exception:
        logger.warning(messages.unreadable_tuner_state(path), exc_info=True)
        return {}
    return dict(state) if isinstance(state, dict) else {}
