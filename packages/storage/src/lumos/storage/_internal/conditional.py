"""Conditional writes on S3 (``If-None-Match: *`` / ``If-Match``), which the lease uses.

Only S3 through s3fs is known to offer preconditions on PUT; the callers fall back to
write-then-read-back where ``ConditionalWritesUnsupportedError`` says a store has none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fsspec import AbstractFileSystem

from lumos.storage._internal.filesystem import call, invalidate, read_bytes
from lumos.storage._internal.retry import retry_call


class ConditionalWritesUnsupportedError(Exception):
    """The store rejected a precondition header (it has no conditional writes)."""


def conditional_backend(fs: AbstractFileSystem) -> AbstractFileSystem | None:
    """The s3fs filesystem behind ``fs`` (itself or wrapped by ``FaultyFileSystem``), else None.

    Only S3 (through s3fs) is known to offer ``If-None-Match: *`` and ``If-Match``
    on PUT; other stores fall back to write-then-read-back.
    """
    current: Any = fs
    for _ in range(8):
        if type(current).__module__.split(".", 1)[0] == "s3fs":
            return current
        # A wrapper (FaultyFileSystem) names what it wraps.
        inner = getattr(type(current), "wrapped_filesystem", None)
        if inner is None:
            return None
        current = current.wrapped_filesystem
    return None


def _error_codes(exc: BaseException) -> tuple[set[str], set[int]]:
    codes: set[str] = set()
    statuses: set[int] = set()
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        response = getattr(current, "response", None)
        if isinstance(response, dict):
            error = response.get("Error") or {}
            if isinstance(error, dict) and error.get("Code"):
                codes.add(str(error["Code"]))
            meta = response.get("ResponseMetadata") or {}
            if isinstance(meta, dict) and isinstance(meta.get("HTTPStatusCode"), int):
                statuses.add(int(meta["HTTPStatusCode"]))
        current = current.__cause__ or current.__context__
    return codes, statuses


def _precondition_failed(exc: BaseException) -> bool:
    if isinstance(exc, FileExistsError):
        return True
    codes, statuses = _error_codes(exc)
    return bool(
        codes & {"PreconditionFailed", "ConditionalRequestConflict"} or statuses & {409, 412}
    )


def _unsupported(exc: BaseException) -> bool:
    codes, statuses = _error_codes(exc)
    # 501, or a 400 naming the header as invalid: S3-compatible stores without preconditions.
    return bool(codes & {"NotImplemented", "InvalidArgument", "InvalidRequest"} or statuses & {501})


def read_with_etag(fs: AbstractFileSystem, path: str) -> tuple[bytes | None, str | None]:
    """``(content, etag)`` of ``path``; ``(None, None)`` when it does not exist.

    The ETag is read first: if the object changes between the two reads, a write
    conditioned on that ETag fails, so acting on the pair is safe.
    """
    invalidate(fs, path)
    try:
        info = call("list", path, fs.info, path)
    except FileNotFoundError:
        return None, None
    etag = info.get("ETag") or info.get("etag")
    data = read_bytes(fs, path)
    if data is None:
        return None, None
    return data, None if etag is None else str(etag)


def _retried(operation: str, fs: AbstractFileSystem, path: str, fn: Callable[[], bool]) -> bool:
    """``fn()`` with transient errors retried, then ``path``'s cached listing dropped."""
    try:
        return retry_call(operation, path, fn, passthrough=(ConditionalWritesUnsupportedError,))
    finally:
        invalidate(fs, path)


def _conditional_put(fs: AbstractFileSystem, path: str, data: bytes, **kwargs: Any) -> bool:
    def put() -> bool:
        try:
            fs.pipe_file(path, data, **kwargs)
        except Exception as exc:
            if _unsupported(exc):
                raise ConditionalWritesUnsupportedError(str(exc)) from exc
            if _precondition_failed(exc) or (
                isinstance(exc, FileNotFoundError) and "IfMatch" in kwargs
            ):
                return False
            raise
        return True

    return _retried("conditional write", fs, path, put)


def put_if_absent(fs: AbstractFileSystem, path: str, data: bytes) -> bool:
    """Create ``path`` with ``data`` unless it exists (``If-None-Match: *``); False if it did.

    A retried put whose first try landed reports False: read the object back to tell.

    Raises:
        ConditionalWritesUnsupportedError: The store does not implement the header.
    """
    return _conditional_put(fs, path, data, mode="create")


def put_if_match(fs: AbstractFileSystem, path: str, data: bytes, etag: str) -> bool:
    """Replace ``path`` with ``data`` if its ETag is still ``etag`` (``If-Match``); else False.

    Raises:
        ConditionalWritesUnsupportedError: The store does not implement the header.
    """
    return _conditional_put(fs, path, data, IfMatch=etag)


def delete_if_match(fs: AbstractFileSystem, path: str, etag: str) -> bool:
    """Delete ``path`` if its ETag is still ``etag``; False if it changed or is gone.

    Falls back to a plain delete where the store has no conditional delete.
    """
    backend = conditional_backend(fs)
    if backend is None:
        raise ConditionalWritesUnsupportedError(f"{type(fs).__name__} has no conditional delete")
    bucket, key, _version = backend.split_path(path)

    def delete() -> bool:
        try:
            backend.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=etag)
        except FileNotFoundError:
            return False
        except Exception as exc:
            if _precondition_failed(exc):
                return False
            if _unsupported(exc):
                raise ConditionalWritesUnsupportedError(str(exc)) from exc
            raise
        return True

    return _retried("conditional delete", fs, path, delete)


def abort_multipart_uploads(fs: AbstractFileSystem, path: str) -> list[str]:
    """Abort the S3 multipart uploads in progress under ``path``; returns their keys.

    An upload cut off by a killed worker (or a server restart) stays "in progress" on
    S3 until someone aborts it, holding its parts' storage. Call it only when no rank
    writes under ``path`` (a run's cleanup of its uncommitted uploads). A no-op on
    stores other than S3.
    """
    backend = conditional_backend(fs)
    if backend is None:
        return []
    bucket, prefix, _version = backend.split_path(path)
    prefix = prefix.rstrip("/") + "/"

    def listing() -> list[dict[str, Any]]:
        out = backend.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix)
        return list(out.get("Uploads", []) or [])

    def abort(key: str, upload_id: str) -> Callable[[], Any]:
        return lambda: backend.call_s3(
            "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id
        )

    aborted: list[str] = []
    for upload in retry_call("list multipart uploads", path, listing):
        key = str(upload["Key"])
        retry_call("abort multipart upload", f"{bucket}/{key}", abort(key, upload["UploadId"]))
        aborted.append(key)
    return aborted
