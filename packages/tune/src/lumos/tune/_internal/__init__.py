"""Internals of lumos.tune; nothing here is public API."""
