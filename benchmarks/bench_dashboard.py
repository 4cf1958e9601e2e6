"""``lumos dashboard``'s cost: a storage root of 1,000 runs, and a run of 100,000 reported steps.

Targets (issue 29): each page's data in <= 2 s, on local disk and on the moto S3 server.
The runs are written with lumos.storage's public API the way Train writes them (a run
state, the history in chunks of 200 rows). Each figure is the wall time of what the page
fetches when it opens, through the real HTTP server on 127.0.0.1 (the root: ``/api/root``;
a run: ``/api/run``, which holds its metrics), the median of ``--reps`` loads, with
its ratio to the 2 s target (< 1.0: within it). On S3 it also prints the floor: the 1,000
run-state GETs alone, 16 at once, which reading every run costs at least; the root page
reads the storage path's index instead (``run_index``: every run's summary spelled in
its record's key, so one listing), and its ratio to that floor is printed too, since
moto's Python answers slow down with the machine's load (printed as ``loadavg``). The
history of a long run is read as a few folded segments (``metrics_segments``) and sent
thinned to the chart's resolution (``dashboard_series``). There is no Ray baseline:
open-source Ray has no page over a storage path.

    /work/venv/bin/python benchmarks/bench_dashboard.py [--runs 1000] [--steps 100000] [--reps 3]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fsspec import AbstractFileSystem

from lumos.storage import AttemptRecord, CheckpointRecord, RunState, RunStorage
from lumos.storage._internal.dashboard_server import Dashboard, make_server
from lumos.storage._internal.filesystem import resolve_filesystem
from lumos.storage.testing import s3_filesystem

TARGET_S = 2.0
CHUNK_ROWS = 200  # Train's MetricsBuffer writes chunks of up to 200 rows


def _write_run(storage_path: str, fs: AbstractFileSystem | None, name: str, steps: int) -> None:
    storage = RunStorage(storage_path, name, fs)
    for start in range(0, steps, CHUNK_ROWS):
        rows = [
            {"step": i, "loss": 1.0 / (i + 1), "lr": 0.1}
            for i in range(start, min(steps, start + CHUNK_ROWS))
        ]
        storage.append_metrics(rows, start)
    t0 = time.time() - 60
    state = RunState(
        name=name,
        status="finished",
        created_at=t0,
        report_count=steps,
        attempts=[AttemptRecord(index=0, started_at=t0, ended_at=t0 + 50, status="finished")],
        checkpoints=[CheckpointRecord(dir_name="checkpoint_0", report_index=steps - 1)],
        latest_checkpoint="checkpoint_0",
    )
    storage.save_state(state)


def _populate(storage_path: str, fs: AbstractFileSystem | None, runs: int, steps: int) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: _write_run(storage_path, fs, f"run-{i:04d}", 10), range(runs)))
    _write_run(storage_path + "-big", fs, "long-run", steps)


def _get(port: int, target: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("GET", target)
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 200, (target, resp.status, body[:300])
        json.loads(body)
        return len(body)
    finally:
        conn.close()


def _load(port: int, targets: list[str], reps: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(reps):
        start = time.perf_counter()
        with ThreadPoolExecutor(len(targets)) as pool:
            size = sum(pool.map(lambda t: _get(port, t), targets))
        times.append(time.perf_counter() - start)
    return statistics.median(times), size


def _measure(
    label: str, fs: AbstractFileSystem, root: str, targets: list[str], reps: int
) -> dict[str, Any]:
    server = make_server(Dashboard(fs, root), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        seconds, size = _load(server.server_port, targets, reps)
    finally:
        server.shutdown()
        server.server_close()
    row = {"case": label, "seconds": round(seconds, 3), "ratio_to_2s": round(seconds / TARGET_S, 2)}
    row["bytes"] = size
    print(json.dumps(row), flush=True)
    return row


def _cases(
    backend: str, storage_path: str, fs: AbstractFileSystem, args: Any
) -> list[dict[str, Any]]:
    root_fs, root = resolve_filesystem(storage_path, fs)
    _, big = resolve_filesystem(storage_path + "-big", fs)
    return [
        _measure(f"{backend}: root of {args.runs} runs", root_fs, root, ["/api/root"], args.reps),
        _measure(
            f"{backend}: run of {args.steps} steps",
            root_fs,
            big,
            ["/api/run?path=long-run"],
            args.reps,
        ),
    ]


@contextlib.contextmanager
def _moto_process() -> Iterator[str]:
    """moto's S3 server in a process of its own (in this one it would share the GIL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    moto = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen(
        [str(moto), "-H", "127.0.0.1", "-p", str(port)], stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _floor(fs: AbstractFileSystem, root: str, runs: int) -> dict[str, Any]:
    """What reading each run's state alone costs on this store (16 at once): no page can beat it."""
    paths = [f"{root}/run-{i:04d}/_lumos/run_state.json" for i in range(runs)]
    start = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(fs.cat_file, paths))
    seconds = time.perf_counter() - start
    row = {"case": f"floor: {runs} run-state GETs alone", "seconds": round(seconds, 3)}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        fs, _ = resolve_filesystem(tmp)
        _populate(f"{tmp}/root", None, args.runs, args.steps)
        rows += _cases("local", f"{tmp}/root", fs, args)
    with _moto_process() as endpoint:
        s3fs = s3_filesystem(endpoint)
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        s3fs.mkdir(bucket)
        _populate(f"s3://{bucket}/root", s3fs, args.runs, args.steps)
        rows += _cases("moto S3", f"s3://{bucket}/root", s3fs, args)
        floor = _floor(s3fs, f"{bucket}/root", args.runs)
        ratio = round(rows[-2]["seconds"] / floor["seconds"], 3)
        print(json.dumps({"case": "moto S3: root page / floor", "ratio": ratio}), flush=True)
    print(json.dumps({"loadavg": [round(x, 1) for x in os.getloadavg()], "cpus": os.cpu_count()}))
    worst = max(r["ratio_to_2s"] for r in rows)
    print(f"worst ratio to the 2 s target: {worst} ({'within' if worst <= 1 else 'OVER'})")


if __name__ == "__main__":
    main()
