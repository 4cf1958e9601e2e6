"""Internals of lumos.runtime; not a public API."""
