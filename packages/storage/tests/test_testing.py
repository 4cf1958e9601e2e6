from __future__ import annotations

import os

import pytest

from lumos.storage import RunState, RunStorage
from lumos.storage.testing import S3Server, _require, s3_server


def test_s3_server_is_on_loopback_and_restores_env() -> None:
    before = dict(os.environ)
    with s3_server() as server:
        assert server.endpoint_url.startswith("http://127.0.0.1:")
        bucket = server.create_bucket()
        storage = RunStorage(f"{bucket}/runs", "r", server.filesystem())
        storage.save_state(RunState(name="r"))
        assert storage.load_state() == RunState.model_validate(storage.load_state().model_dump())
        named = server.create_bucket("named-bucket")
        assert named == "named-bucket"
        assert server.filesystem().exists("named-bucket")
    assert dict(os.environ) == before


def test_session_server_fixture_is_shared(s3: S3Server) -> None:
    fs = s3.filesystem()
    bucket = s3.create_bucket()
    fs.pipe_file(f"{bucket}/k", b"v")
    assert s3.filesystem().cat_file(f"{bucket}/k") == b"v"


def test_missing_optional_dependency_message() -> None:
    with pytest.raises(ImportError, match=r"pip install 'lumos-storage\[test\]'"):
        _require("lumos_no_such_module", "moto[server]")
