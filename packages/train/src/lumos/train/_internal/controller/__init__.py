"""The Train driver: the run core every backend drives, its components, the Ray controller.

``core.py`` (``RunCore``) keeps one run's bookkeeping; ``seam.py`` names the hooks its
components plug into (``components/``); ``controller.py`` is the Ray backend's state
machine, and ``lumos.train._internal.local`` the local-mode / torchrun backend.
"""
