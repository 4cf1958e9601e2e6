"""``lumos dashboard PATH``: a read-only web UI over a storage root, a run or a sweep.

The server is the standard library's ``ThreadingHTTPServer`` (no dependency: lumos
runs on clusters without internet, and a few GET endpoints need no framework). The
page and its chart library (uPlot, MIT, vendored under ``dashboard_static/``) ship in
the wheel; nothing is fetched from a CDN. The page polls the JSON endpoints:

- ``GET /api/root``: every run and sweep under the root (``lumos ls`` rows);
- ``GET /api/run?path=REL``: a run (``lumos show --json`` plus timeline and sizes);
- ``GET /api/metrics?path=REL``: its history as columns, with restart / rollback markers;
- ``GET /api/sweep?path=REL``: a sweep's trials with their curves;
- ``GET /api/stacks?path=REL&attempt=N&rank=R``: one rank's stacks the hang watchdog
  wrote for attempt N (``N`` and ``R`` are integers, nothing else reaches a path).

Security: GET (and HEAD) only, every other method answers 405; on loopback only
requests whose ``Host`` is this machine are answered (no DNS rebinding); ``REL`` is a
relative path of run names (each checked by ``validate_name``: no ``..``, no
separators once decoded, no ``_lumos``) and, on a local root, must resolve (symlinks
followed) inside the root; static files come from a fixed table. The page renders
every stored string with ``textContent`` and the responses carry a
``Content-Security-Policy`` allowing only the server's own scripts.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fsspec import AbstractFileSystem

from lumos.storage._internal import (
    dashboard_attempts,
    dashboard_data as data,
    dashboard_root,
    filesystem as fsu,
    run_view,
)
from lumos.storage._internal.cli_plugins import plugin_for
from lumos.storage._internal.errors import InvalidNameError
from lumos.storage._internal.jsonable import json_default
from lumos.storage._internal.names import validate_name
from lumos.storage._internal.retried import retried_exists

MAX_DEPTH = 4
"""The deepest run served under the root: sweep / trial / Train run / nested run."""

STATIC_FILES: dict[str, str] = {
    "/": "index.html",
    "/static/app.js": "app.js",
    "/static/app.css": "app.css",
    "/static/uPlot.iife.min.js": "uPlot.iife.min.js",
    "/static/uPlot.min.css": "uPlot.min.css",
    "/static/LICENSE-uPlot.txt": "LICENSE-uPlot.txt",
    "/favicon.ico": "favicon.svg",
}
"""URL -> file under ``dashboard_static/``: the only files the server reads from disk."""

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml",
}
_CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'"


class Forbidden(Exception):
    """A request for a path outside the served root (answered with 403)."""


@dataclass
class Dashboard:
    """What one ``lumos dashboard`` serves: a filesystem and a root on it.

    Args:
        fs: The filesystem of the root.
        root: The root's native path: a storage path, a run or a sweep.
    """

    fs: AbstractFileSystem
    root: str
    assets: dict[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        base = resources.files("lumos.storage._internal").joinpath("dashboard_static")
        self.assets = {name: base.joinpath(name).read_bytes() for name in STATIC_FILES.values()}

    def resolve(self, rel: str) -> str:
        """The native path of ``rel`` (run names joined by ``/``) inside the root.

        Raises:
            Forbidden: ``rel`` is not a plain relative path of names, or leaves the root.
        """
        if rel in ("", "."):
            return self.root
        parts = rel.split("/")
        if len(parts) > MAX_DEPTH:
            raise Forbidden(f"path={rel!r} is deeper than {MAX_DEPTH} runs")
        try:
            for part in parts:
                validate_name(part, "path")
        except InvalidNameError as exc:
            raise Forbidden(str(exc)) from exc
        path = fsu.join(self.root, *parts)
        if fsu.is_local(self.fs):
            real, real_root = os.path.realpath(path), os.path.realpath(self.root)
            if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
                raise Forbidden(f"path={rel!r} leads outside the served root")
        return path

    def root_page(self) -> dict[str, Any]:
        """``/api/root``."""
        return dashboard_root.root_page(self.fs, self.root)

    def _stored(self, rel: str) -> run_view.StoredRun:
        path = self.resolve(rel)
        if not run_view._has_state(self.fs, path):
            raise FileNotFoundError(f"no run at path={rel!r} under the served root")
        return run_view.load_run(self.fs, path)

    def run_page(self, rel: str) -> dict[str, Any]:
        """``/api/run``: a Train run (or the run record of a trial)."""
        return data.run_detail(self.root, self._stored(rel))

    def metrics_page(self, rel: str) -> dict[str, Any]:
        """``/api/metrics``."""
        return data.run_metrics(self._stored(rel))

    def sweep_page(self, rel: str) -> dict[str, Any]:
        """``/api/sweep``."""
        run = self._stored(rel)
        plugin = plugin_for(run)
        if plugin is None:
            raise FileNotFoundError(f"path={rel!r} is a Train run, not a sweep")
        return data.sweep_detail(self.root, run, plugin)

    def stacks_page(self, rel: str, query: dict[str, list[str]]) -> dict[str, Any]:
        """``/api/stacks``: one rank's stacks of a hang (``attempt`` and ``rank`` integers).

        Raises:
            Forbidden: ``attempt`` or ``rank`` is not a non-negative integer.
        """
        numbers: list[int] = []
        for key in ("attempt", "rank"):
            value = query.get(key, [""])[0]
            if not value.isdigit() or not value.isascii():
                raise Forbidden(f"{key}={value!r} must be a non-negative integer")
            numbers.append(int(value))
        return dashboard_attempts.stacks_text(self._stored(rel), *numbers)

    def api(self) -> dict[str, Callable[[str, dict[str, list[str]]], dict[str, Any]]]:
        """The JSON endpoints: URL path -> reader of ``?path=`` (and the whole query)."""
        return {
            "/api/root": lambda _rel, _q: self.root_page(),
            "/api/run": lambda rel, _q: self.run_page(rel),
            "/api/metrics": lambda rel, _q: self.metrics_page(rel),
            "/api/sweep": lambda rel, _q: self.sweep_page(rel),
            "/api/stacks": self.stacks_page,
        }


def _local_host(header: str) -> bool:
    """Whether a ``Host`` header names this machine (``127.0.0.1:8080``, ``[::1]``, ``localhost``)."""
    host = header.rsplit(":", 1)[0] if header.count(":") == 1 else header
    if host.startswith("["):
        host = host[1 : host.find("]")]
    return is_loopback(host)


def _handler(dashboard: Dashboard, loopback_only: bool) -> type[BaseHTTPRequestHandler]:
    endpoints = dashboard.api()

    class Handler(BaseHTTPRequestHandler):
        server_version = "lumos-dashboard"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the console keeps the URL line."""

        def _send(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", _CSP)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, obj: Any) -> None:
            body = json.dumps(obj, default=json_default, allow_nan=False).encode()
            self._send(status, body, "application/json")

        def do_GET(self) -> None:
            """Answer a static file or a JSON endpoint; anything else is 404."""
            url = urlsplit(self.path)
            if loopback_only and not _local_host(self.headers.get("Host", "")):
                # DNS rebinding: a page elsewhere must not read runs through this browser.
                self._json(HTTPStatus.FORBIDDEN, {"error": "Host must be this machine"})
                return
            if url.path in STATIC_FILES:
                name = STATIC_FILES[url.path]
                ctype = _TYPES[os.path.splitext(name)[1]]
                self._send(HTTPStatus.OK, dashboard.assets[name], ctype)
                return
            reader = endpoints.get(url.path)
            if reader is None:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"no page {url.path!r}"})
                return
            query = parse_qs(url.query)
            rel = query.get("path", [""])[0]
            try:
                self._json(HTTPStatus.OK, reader(rel, query))
            except Forbidden as exc:
                self._json(HTTPStatus.FORBIDDEN, {"error": str(exc)})
            except FileNotFoundError as exc:
                self._json(HTTPStatus.NOT_FOUND, data.describe_error(exc))
            except Exception as exc:  # a corrupt run is one error page, not a dead server
                self._json(HTTPStatus.INTERNAL_SERVER_ERROR, data.describe_error(exc))

        do_HEAD = do_GET

        def _refuse(self) -> None:
            self._json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "read-only: GET only"})

        do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse

    return Handler


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (``127.0.0.1``, ``::1``, ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_server(dashboard: Dashboard, host: str, port: int) -> ThreadingHTTPServer:
    """A server for ``dashboard`` bound to ``host:port`` (port 0: any free port)."""
    server = ThreadingHTTPServer((host, port), _handler(dashboard, is_loopback(host)))
    server.daemon_threads = True
    return server


def serve(path: str, host: str, port: int, endpoint_url: str | None = None) -> int:
    """Serve ``path`` (any fsspec URL) until interrupted; return the exit code."""
    fs, native = run_view.open_location(path, endpoint_url)
    if not retried_exists(fs, native):
        raise run_view.NotARunError(
            f"{path!r} does not exist: give a storage path, a run or a sweep"
        )
    server = make_server(Dashboard(fs, native), host, port)
    shown = f"[{host}]" if ":" in host else host
    print(
        f"lumos dashboard: serving {fsu.to_uri(fs, native)} on http://{shown}:{server.server_port}/"
    )
    if not is_loopback(host):
        print(
            f"warning: --host={host} is reachable from other machines; anyone who can reach "
            "it reads these runs (the dashboard has no login)",
            file=sys.stderr,
        )
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
