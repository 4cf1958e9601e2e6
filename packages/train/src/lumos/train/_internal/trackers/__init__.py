"""MLflow and W&B for Train: driver-side callbacks and rank-0 ``setup_*`` helpers.

``common`` holds what both trackers need; ``mlflow`` and ``wandb`` import their
tracker when imported (an ``ImportError`` naming the extra when it is missing).
"""
