"""The one place where lumos starts or joins Ray on its own (``ray.init()``)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.job_config import JobConfig

_lock = threading.Lock()


def ensure_ray(address: str | None = None, job_config: JobConfig | None = None) -> None:
    """Connect to Ray unless this process already is.

    This is the only place lumos calls ``ray.init()``: ``WorkerGroup.start``,
    ``WorkerPool``, ``TorchTrainer.fit()``, ``Tuner.fit()`` and the tests' simulated
    cluster (``lumos.runtime.testing.simulated_cluster``) come through here. With no
    arguments Ray joins the cluster named by ``RAY_ADDRESS`` (or the one this machine
    runs), else starts a local one. To choose the address, resources or a runtime
    environment yourself, call ``ray.init(...)`` before ``fit()``; lumos then uses that
    connection as it is.

    Args:
        address: The cluster to join (``ray.init(address=...)``); ``None``: Ray's
            default. Used only when this process is not connected yet.
        job_config: A ``ray.job_config.JobConfig`` for the job (e.g. its
            ``code_search_path``); ``None``: Ray's default. Used likewise.

    Example:
        >>> import ray
        >>> ray.init(num_cpus=4)          # doctest: +SKIP
        >>> ensure_ray()                  # no-op: already connected
    """
    import ray

    kwargs: dict[str, Any] = {}
    if address is not None:
        kwargs["address"] = address
    if job_config is not None:
        kwargs["job_config"] = job_config
    with _lock:
        if not ray.is_initialized():
            ray.init(**kwargs)
