"""The one place where lumos starts Ray on its own."""

from __future__ import annotations

import threading

_lock = threading.Lock()


def ensure_ray() -> None:
    """Connect to Ray unless this process already is (``ray.init()`` with no arguments).

    This is the only place lumos calls ``ray.init()``: ``WorkerGroup.start``,
    ``WorkerPool``, ``TorchTrainer.fit()`` and ``Tuner.fit()`` come through here.
    With no arguments Ray joins the cluster named by ``RAY_ADDRESS`` (or the one
    this machine runs), else starts a local one. To choose the address, resources
    or a runtime environment yourself, call ``ray.init(...)`` before ``fit()``;
    lumos then uses that connection as it is.

    Example:
        >>> import ray
        >>> ray.init(num_cpus=4)          # doctest: +SKIP
        >>> ensure_ray()                  # no-op: already connected
    """
    import ray

    with _lock:
        if not ray.is_initialized():
            ray.init()
