"""The web dashboard's JSON endpoints and its security, over plain HTTP (no Ray).

Runs are written with lumos.storage's public API (``RunStorage``, ``RunState``, the
record types); the server runs in this process on 127.0.0.1, on a free port.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from lumos.storage import AttemptRecord, CheckpointRecord, RollbackRecord, RunState, RunStorage
from lumos.storage._internal.dashboard_server import Dashboard, is_loopback, make_server
from lumos.storage._internal.run_view import open_location
from lumos.storage.cli import app

XSS = "<script>alert(1)</script>"
XSS_NAME = "<img src=x onerror=alert(1)>"  # a run name cannot hold "/": this is the HTML one


def make_run(root: Path, name: str, steps: int = 20) -> RunStorage:
    """A finished-after-a-restart run with checkpoints, a rollback and a history."""
    storage = RunStorage(str(root), name)
    t0 = time.time() - 100
    state = RunState(
        name=name,
        status="finished",
        created_at=t0,
        extra={"lr": 0.1, "note": XSS},
        attempts=[
            AttemptRecord(
                index=0,
                started_at=t0,
                ended_at=t0 + 10,
                status="errored",
                error=f"rank 1 on node 10.0.0.2 (1a2b3c4d), pid 42: RuntimeError: boom {XSS}",
            ),
            AttemptRecord(index=1, started_at=t0 + 11, ended_at=t0 + 20, status="finished"),
        ],
    )
    storage.append_metrics([{"step": i, "loss": 1.0 / (i + 1), XSS: i} for i in range(steps)], 0)
    for i in (4, 9):
        ckpt = root / f"src-{name}-{i}"
        ckpt.mkdir()
        (ckpt / "model.pt").write_bytes(b"x" * 1000)
        storage.persist_directory(ckpt, f"checkpoint_{i}")
        record = CheckpointRecord(
            dir_name=f"checkpoint_{i}", report_index=i, metrics={"loss": 0.1}, created_at=t0 + i
        )
        state, _ = storage.commit_checkpoint(state, record)
    rollback = RollbackRecord(
        number=1, check="NonFiniteMetric", reason="loss is nan", from_report=12
    )
    state = state.model_copy(update={"rollbacks": [rollback]})
    storage.save_state(state)
    return storage


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    root = tmp_path / "root"
    root.mkdir()
    make_run(root, "run-a")
    make_run(root, XSS_NAME, steps=5)
    (tmp_path / "outside").mkdir()
    make_run(tmp_path / "outside", "secret")
    os.symlink(tmp_path / "outside" / "secret", root / "link")
    fs, native = open_location(str(root))
    server = make_server(Dashboard(fs, native), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, server.server_port
    finally:
        server.shutdown()
        server.server_close()


def request(
    port: int, target: str, method: str = "GET", host: str | None = None
) -> tuple[int, Any, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, target, headers={"Host": host} if host else {})
        resp = conn.getresponse()
        body = resp.read()
        headers = {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()
    ctype = headers.get("content-type", "")
    return resp.status, json.loads(body) if "json" in ctype else body, headers


def test_root_lists_every_run_with_kind_status_duration_steps_and_best(
    served: tuple[Path, int],
) -> None:
    _, port = served
    status, doc, headers = request(port, "/api/root")
    assert status == 200
    assert headers["cache-control"] == "no-store"
    rows = {r["name"]: r for r in doc["rows"]}
    assert set(rows) == {"run-a", XSS_NAME}  # the symlinked run outside is not a child dir name
    row = rows["run-a"]
    assert (row["kind"], row["status"], row["reports"], row["rel"]) == (
        "run",
        "finished",
        20,
        "run-a",
    )
    assert row["best"]["metric"] == "loss"
    assert row["duration_s"] > 0
    assert row["started_at"].endswith("Z")


def test_run_page_has_attempts_with_rank_node_error_checkpoints_and_rollbacks(
    served: tuple[Path, int],
) -> None:
    _, port = served
    status, run, _ = request(port, "/api/run?path=run-a")
    assert status == 200
    first, second = run["attempts"]
    assert (first["rank"], first["node"], first["status"]) == ("1", "10.0.0.2", "errored")
    assert "RuntimeError: boom" in first["error"]
    assert (second["restart"], second["resume_report"]) == ("restart after a failure", 10)
    assert [c["dir_name"] for c in run["checkpoints"]] == ["checkpoint_4", "checkpoint_9"]
    assert all(c["size_bytes"] == 1000 and c["kept"] == "kept" for c in run["checkpoints"])
    assert run["rollbacks"][0]["reason"] == "loss is nan"
    assert run["config"]["note"] == XSS
    assert run["metrics"]["steps"] == 20  # the page's one request holds the history too


def test_metrics_are_columns_against_step_with_restart_and_rollback_markers(
    served: tuple[Path, int],
) -> None:
    _, port = served
    status, metrics, _ = request(port, "/api/metrics?path=run-a")
    assert status == 200
    assert metrics["steps"] == 20
    assert metrics["series"]["loss"][:2] == [1.0, 0.5]
    assert XSS in metrics["series"]
    kinds = {(m["kind"], m["step"]) for m in metrics["markers"]}
    assert kinds == {("restart", 10), ("rollback", 12)}


@pytest.mark.parametrize(
    "target",
    [
        "/api/run?path=..",
        "/api/run?path=../outside/secret",
        "/api/run?path=run-a/../..",
        "/api/run?path=..%2Foutside%2Fsecret",
        "/api/run?path=%2E%2E%2Foutside",
        "/api/run?path=/etc",
        "/api/run?path=link",  # a symlink out of the root
        "/api/run?path=run-a%2F_lumos",
        "/api/metrics?path=a/b/c/d/e",
    ],
)
def test_no_path_outside_the_root(served: tuple[Path, int], target: str) -> None:
    _, port = served
    status, doc, _ = request(port, target)
    assert status == 403, doc
    assert "secret" not in json.dumps(doc) or "path=" in doc["error"]


@pytest.mark.parametrize("target", ["/../../etc/passwd", "/static/../dashboard_server.py", "/x"])
def test_only_the_fixed_static_files_are_served(served: tuple[Path, int], target: str) -> None:
    _, port = served
    status, _, _ = request(port, target)
    assert status == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_read_only_every_other_method_is_405(served: tuple[Path, int], method: str) -> None:
    root, port = served
    before = sorted(p.name for p in root.iterdir())
    status, _, _ = request(port, "/api/run?path=run-a", method)
    assert status == 405
    assert sorted(p.name for p in root.iterdir()) == before


def test_page_and_assets_ship_with_a_strict_content_security_policy(
    served: tuple[Path, int],
) -> None:
    _, port = served
    status, body, headers = request(port, "/")
    assert status == 200
    assert b"/static/app.js" in body
    assert "script-src 'self'" in headers["content-security-policy"]
    assert b"cdn" not in body.lower()
    assert b"http" not in body.lower()
    status, js, headers = request(port, "/static/uPlot.iife.min.js")
    assert status == 200
    assert js.startswith(b"/*! https://github.com/leeoniya/uPlot")
    _, app_js, _ = request(port, "/static/app.js")
    assert b"innerHTML" not in app_js
    assert b"insertAdjacentHTML" not in app_js  # text nodes only


def test_a_hostile_run_name_comes_back_as_data(served: tuple[Path, int]) -> None:
    _, port = served
    from urllib.parse import quote

    status, run, _ = request(port, "/api/run?path=" + quote(XSS_NAME, safe=""))
    assert status == 200
    assert run["name"] == XSS_NAME


def test_missing_run_is_404_and_corrupt_state_is_500_not_a_dead_server(
    served: tuple[Path, int],
) -> None:
    root, port = served
    assert request(port, "/api/run?path=nope")[0] == 404
    bad = root / "bad" / "_lumos"
    bad.mkdir(parents=True)
    (bad / "run_state.json").write_text("{not json")
    status, doc, _ = request(port, "/api/run?path=bad")
    assert status == 500
    assert "RunStateError" in doc["error"]
    _, rows, _ = request(port, "/api/root")
    assert {r["name"]: r["status"] for r in rows["rows"]}["bad"] == "unreadable"


def test_a_run_as_the_root_is_served_alone(tmp_path: Path) -> None:
    storage = make_run(tmp_path, "solo")
    fs, native = open_location(storage.uri)
    dash = Dashboard(fs, native)
    doc = dash.root_page()
    assert doc["single"]
    assert doc["rows"][0]["rel"] == ""
    assert dash.run_page("")["name"] == "solo"


def test_loopback_check() -> None:
    assert is_loopback("127.0.0.1")
    assert is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    assert not is_loopback("10.1.2.3")


def test_cli_checks_the_port_and_a_train_run_has_no_optuna_dashboard(tmp_path: Path) -> None:
    make_run(tmp_path, "r")
    result = CliRunner().invoke(app, ["dashboard", str(tmp_path), "--port", "0"])
    assert result.exit_code == 2
    assert "--port=0" in result.stderr
    result = CliRunner().invoke(app, ["dashboard", str(tmp_path / "r"), "--optuna"])
    assert result.exit_code == 2
    assert "is a Train run" in result.stderr
    result = CliRunner().invoke(app, ["dashboard", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "10.0.0.1:8080"])
def test_a_foreign_host_header_is_refused_on_loopback(served: tuple[Path, int], host: str) -> None:
    _, port = served
    assert request(port, "/api/root", host=host)[0] == 403
    assert request(port, "/api/root", host=f"localhost:{port}")[0] == 200
    assert request(port, "/api/root", host=f"[::1]:{port}")[0] == 200


def test_serve_prints_the_url_and_warns_off_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from http.server import ThreadingHTTPServer

    from lumos.storage._internal import dashboard_server

    make_run(tmp_path, "r")

    def interrupted(self: ThreadingHTTPServer, poll_interval: float = 0.5) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ThreadingHTTPServer, "serve_forever", interrupted)
    assert dashboard_server.serve(str(tmp_path), "127.0.0.1", 0) == 0
    out = capsys.readouterr()
    assert " on http://127.0.0.1:" in out.out
    assert "warning" not in out.err
    assert dashboard_server.serve(str(tmp_path), "0.0.0.0", 0) == 0
    out = capsys.readouterr()
    assert "warning: --host=0.0.0.0 is reachable from other machines" in out.err
