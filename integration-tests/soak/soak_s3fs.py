"""The soak's S3 filesystem: s3fs under ``FaultyFileSystem``, with a 5 MiB multipart part size.

s3fs's ``put_file`` goes multipart for files of at least twice its part size (50 MiB by
default: 100 MiB files). The soak's S3 Train runs write 11 MiB shards; with 5 MiB parts
(S3's smallest) each shard is a real three-part multipart upload, which the
``s3_restart_in_multipart`` fault cuts. Drivers and Train workers get this class
pickled by reference (this folder is on the Ray job's code search path).
"""

from __future__ import annotations

from typing import Any

from lumos.storage.testing import FaultyFileSystem

#: The part size of every upload (5 MiB: S3's smallest part but the last).
PART_SIZE = 5 * 1024 * 1024


class MultipartFaultyFileSystem(FaultyFileSystem):  # type: ignore[misc]
    """``FaultyFileSystem`` whose ``put_file`` uploads in ``PART_SIZE`` parts."""

    def put_file(self, lpath: str, rpath: str, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("chunksize", PART_SIZE)
        return super().put_file(lpath, rpath, *args, **kwargs)
