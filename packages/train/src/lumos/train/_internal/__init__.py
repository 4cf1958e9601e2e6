"""Internals of lumos.train; nothing here is public API."""
