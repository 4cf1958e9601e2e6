"""The Python examples of the documentation run, on the session's Ray cluster.

Each page's runnable blocks (``docs_blocks``: every fenced ``python`` block without a
``<!-- no-test: why -->`` line above it) run in order in one namespace, as a reader
would paste them into one script (``__name__ == "__main__"``). An example that raises
fails its page's test, naming the page and line.

Where the examples write: the working directory and ``HOME`` are the test's folder, and
so is ``~/lumos_results``, both the default storage path and the literal the examples
spell out. Those two are redirected in the driver explicitly, because HOME alone would
not move them: the driver hands the path to the workers as configured and each worker
expands ``~`` with its own HOME (the Ray cluster's). After each page the user's own
``~/lumos_results`` must have gained nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docs_blocks
import pytest

# the data guide last: the Ray Data actors it leaves make its cluster restart after it
PAGES = sorted(
    (page for page in docs_blocks.pages() if docs_blocks.runnable(page)),
    key=lambda page: page == "guide/data.md",
)
#: ``~/lumos_results`` of the user running the tests: the examples must not write there
REAL_RESULTS = Path(os.path.expanduser("~/lumos_results"))


def _listing(path: Path) -> set[str]:
    return {p.name for p in path.iterdir()} if path.is_dir() else set()


#: Cluster-wide actors Ray Data starts on first use and keeps (Ray's, not lumos's)
RAY_DATA_SINGLETONS = frozenset({"_StatsActor", "_AutoscalingCoordinatorActor"})


@pytest.fixture
def docs_cluster(_clusters: Any) -> Iterator[None]:
    """The session's plain cluster, with the ``ray_cluster`` fixture's leak check but for
    Ray Data's singletons; a page that started them (the data guide) leaves a fresh
    cluster to the tests after it, whose own leak checks would count them."""
    import time

    from lumos.runtime.testing import alive_actors, alive_placement_groups

    _clusters.plain()
    yield
    deadline = time.monotonic() + 60.0
    while True:
        actors = alive_actors()
        ours = [(a.class_name, a.pid) for a in actors if a.class_name not in RAY_DATA_SINGLETONS]
        pgs = [p.placement_group_id for p in alive_placement_groups()]
        if (not ours and not pgs) or time.monotonic() > deadline:
            break
        time.sleep(0.5)  # kills are asynchronous; the state API is poll-only
    if len(actors) > len(ours) or ours or pgs:
        _clusters.shutdown()
    assert (ours, pgs) == ([], []), "the examples leaked Ray actors or placement groups"


def _run_page(page: str, results: Path) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": str(docs_blocks.DOCS / page)}
    for block in docs_blocks.runnable(page):
        source = block.code.replace('"~/lumos_results"', repr(str(results)))
        code = compile(source, f"docs/{page}:{block.line}", "exec")
        try:
            exec(code, namespace)
        except Exception as exc:
            raise AssertionError(f"the example at docs/{page}:{block.line} raised {exc!r}") from exc
    return namespace


# Ray Data's own deprecation notices (its DataContext), as lumos-train's test config ignores them
@pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")
@pytest.mark.parametrize("page", PAGES)
@pytest.mark.usefixtures("docs_cluster")
def test_the_pages_examples_run(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _listing(REAL_RESULTS)
    results = tmp_path / "lumos_results"
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("lumos.runtime._internal.config.DEFAULT_STORAGE_PATH", str(results))
    _run_page(page, results)
    # what the examples wrote stayed in the test's folder (workers included)
    assert _listing(REAL_RESULTS) - before == set()


def test_every_runnable_example_is_found() -> None:
    """The extraction sees the examples this suite promises to run (a parser bug that
    found none would make every page's test pass without running anything)."""
    counts = {page: len(docs_blocks.runnable(page)) for page in PAGES}
    assert counts.get("getting-started.md", 0) >= 3
    assert counts.get("guide/tune.md", 0) >= 5
    assert sum(counts.values()) >= 18
