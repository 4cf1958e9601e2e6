"""The driver's components: one capability each, on the seam of ``controller/seam.py``.

* ``positions.py``: loader positions, written into a checkpoint before it commits.
* ``validation.py``: checkpoint validations (queued, polled, stored, resumed).
* ``health.py``: health checks on reports and validations, and the rollback they ask for.
* ``elastic.py``: elastic resizing and preemption moves (the Ray backend's group).
"""
