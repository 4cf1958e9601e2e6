"""TorchTrainer internals: process group setup and model/data helpers."""
