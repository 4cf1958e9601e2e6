"""Ray Tune's ``ray.tune.integration`` modules that lumos has:
``lumos.tune.integration.ray_train`` (``TuneReportCallback``, for a Train run inside a
trial). Experiment trackers are in ``lumos.tune.integrations`` (Ray's ``ray.air.integrations``).

Example:
    >>> from lumos.tune.integration.ray_train import TuneReportCallback
"""
