"""PyTorch Lightning on lumos (the ``lightning`` extra): see ``lumos.train.lightning``."""
