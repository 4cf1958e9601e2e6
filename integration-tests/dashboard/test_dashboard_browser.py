"""``lumos dashboard`` in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) driven by selenium, over runs made by the public API.

* a Train run whose rank 1 dies in its first attempt and that restarts (Ray backend):
  the failure's rank, node and kind come from the attempt record, not the error text;
* a Train run whose rank 1 hangs (the hang watchdog names it, writes the stacks and a
  new group resumes): the culprit with its node, and its stacks one click away;
* a Train run a health check rolls back (``NonFiniteMetric``, local mode);
* a Tune-over-Train sweep whose bad trial is pruned, and a trial's Train run page;
* a run whose name, config and metric names are HTML.

Each page is loaded, its content checked (error text, checkpoint count, the rollback
marker), its chart canvas checked for drawn pixels, and a screenshot saved (to
``tmp_path``, and to ``$LUMOS_DASHBOARD_SCREENSHOTS`` when set: the README's images).
Without chromium, chromedriver or selenium every test skips with one reason.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
try:
    import selenium  # noqa: F401

    HAVE_SELENIUM = True
except ImportError:
    HAVE_SELENIUM = False

MISSING = [
    what
    for what, ok in (
        ("chromium", CHROMIUM),
        ("chromedriver", CHROMEDRIVER),
        ("selenium", HAVE_SELENIUM),
    )
    if not ok
]
pytestmark = pytest.mark.skipif(
    bool(MISSING),
    reason=f"browser tests need {', '.join(MISSING)}: apt-get install chromium chromium-driver; "
    "pip install 'lumos-storage[test]'",
)

XSS = "<script>alert(1)</script>"
XSS_NAME = "<img src=x onerror=alert(1)>"  # run names cannot hold "/"
WAIT_S = 30.0
CANVAS_INK = """
const canvases = document.querySelectorAll(arguments[0] + ' canvas');
let ink = 0;
for (const c of canvases) {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  for (let i = 3; i < d.length; i += 4) if (d[i] !== 0) ink++;
}
return [canvases.length, ink];
"""


# -- the server and the browser ----------------------------------------------------------


class Served:
    """``lumos dashboard ROOT`` in a subprocess, and its URL."""

    def __init__(self, root: str) -> None:
        script = Path(sys.executable).with_name("lumos")
        self.proc = subprocess.Popen(
            [str(script), "dashboard", root, "--port", str(_free_port())],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert " on http://127.0.0.1:" in line, line
        self.url = line.strip().rsplit(" on ", 1)[1]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,1000")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def shared_storage(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One storage path for the runs made by the API: the root page shows them all."""
    return str(tmp_path_factory.mktemp("shared") / "storage")


def wait_for(driver: Any, css: str, text: str | None = None) -> Any:
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + WAIT_S
    while True:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        if found and (text is None or any(text in e.text for e in found)):
            return found
        errors = driver.find_elements(By.ID, "load-error")
        assert not errors, errors[0].text
        assert time.monotonic() < deadline, f"{css!r} with {text!r} never appeared"
        time.sleep(0.2)


def shoot(driver: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    driver.save_screenshot(str(path))
    target = os.environ.get("LUMOS_DASHBOARD_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / path.name)
    return path


def leave(driver: Any, served: Served) -> None:
    """Stop the page polling (and drop its log) before its server goes."""
    driver.get("about:blank")
    driver.get_log("browser")
    served.close()


def assert_charts_drawn(driver: Any) -> None:
    count, ink = driver.execute_script(CANVAS_INK, "#charts")
    assert count >= 1, (count, ink)
    assert ink > 500, (count, ink)


def assert_no_script_ran(driver: Any) -> None:
    assert driver.execute_script("return window.__xss === undefined")
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


def page(driver: Any, served: Served, kind: str, rel: str) -> None:
    driver.get(served.url + f"#/{kind}/" + quote(rel, safe=""))


# -- runs made by the public API --------------------------------------------------------


def _nan_once(config: dict[str, Any]) -> None:
    """Steps with a checkpoint every 2; step 7 reports NaN until a rollback happened."""
    from lumos import train

    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            start = int(Path(d, "step").read_text())
    rolled_back = train.get_context().get_rollback_info() is not None
    for step in range(start + 1, int(config["steps"]) + 1):
        loss = math.nan if step == 7 and not rolled_back else 1.0 / step
        with tempfile.TemporaryDirectory() as d:
            if step % 2 == 0:
                Path(d, "step").write_text(str(step))
                ckpt = train.Checkpoint.from_directory(d)
                train.report({"step": step, "loss": loss}, checkpoint=ckpt)
            else:
                train.report({"step": step, "loss": loss})


def test_a_rolled_back_run_shows_its_rollback_marker_and_checkpoints(
    browser: Any, shared_storage: str, tmp_path: Path
) -> None:
    storage_dir = shared_storage
    from lumos import train
    from lumos.train.torch import TorchTrainer

    TorchTrainer(
        _nan_once,
        train_loop_config={"steps": 12},
        scaling_config=train.ScalingConfig(num_workers=0),
        run_config=train.RunConfig(
            name="rolled-back",
            storage_path=storage_dir,
            health_checks=[train.NonFiniteMetric("loss")],
            checkpoint_config=train.CheckpointConfig(num_to_keep=10),
        ),
    ).fit()
    served = Served(storage_dir)
    try:
        browser.get(served.url)
        wait_for(browser, "#runs td a", "rolled-back")
        page(browser, served, "run", "rolled-back")
        wait_for(browser, "#run-name", "rolled-back")
        markers = wait_for(browser, "#markers li.marker-rollback")
        assert "rollback 1" in markers[0].text
        assert "step 6" in markers[0].text
        rows = wait_for(browser, "#rollbacks tr.rollback-row")
        assert "NonFiniteMetric" in rows[0].text
        checkpoints = wait_for(browser, "#checkpoints tr.checkpoint-row")
        statuses = [r.text for r in checkpoints]
        assert len(checkpoints) == 6 + 0
        assert sum("rolled back" in s for s in statuses) == 0
        assert_charts_drawn(browser)
        shoot(browser, tmp_path, "dashboard-run")
        assert_no_script_ran(browser)
    finally:
        leave(browser, served)


def test_a_failed_and_restarted_run_shows_the_failure_rank_and_node(
    ray_cluster: str, browser: Any, shared_storage: str, tmp_path: Path
) -> None:
    storage_dir = shared_storage
    import workloads

    from lumos import train
    from lumos.train.torch import TorchTrainer

    TorchTrainer(
        workloads.steps_with_checkpoints,
        train_loop_config={"steps": 5, "crash_at": 2},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name="restarted",
            storage_path=storage_dir,
            failure_config=train.FailureConfig(max_failures=1),
        ),
    ).fit()
    served = Served(storage_dir)
    try:
        page(browser, served, "run", "restarted")
        rows = wait_for(browser, "#attempts tr.attempt-row")
        assert len(rows) == 2
        assert "errored" in rows[0].text
        assert "worker process died" in rows[0].text
        cell = lambda row, name: row.find_element("css selector", "td." + name).text  # noqa: E731
        assert "1" in cell(rows[0], "rank").split(", ")  # rank 0 may fail too (its peer died)
        assert cell(rows[0], "node") == "127.0.0.1"  # the node's IP, from the failure record
        assert cell(rows[0], "ended-by") == "failure"
        assert "rank 1 on node 127.0.0.1" in cell(rows[0], "failures")
        assert "actor_died" in cell(rows[0], "failures")
        assert cell(rows[1], "restart").startswith("replaced rank 1 by")  # the survivor stayed
        assert "finished" in rows[1].text
        assert wait_for(browser, "#markers li.marker-restart")[0].text.startswith("restart at step")
        assert len(wait_for(browser, "#checkpoints tr.checkpoint-row")) == 5
        assert_charts_drawn(browser)
        shoot(browser, tmp_path, "dashboard-run-restarted")
    finally:
        leave(browser, served)


def test_a_hung_rank_is_named_with_its_node_and_its_stacks_are_linked(
    ray_cluster: str, browser: Any, shared_storage: str, tmp_path: Path
) -> None:
    import workloads

    from lumos import train
    from lumos.train.torch import TorchConfig, TorchTrainer

    TorchTrainer(
        workloads.stall_once,
        train_loop_config={"steps": 4, "at": 2, "marker": str(tmp_path / "stalled")},
        torch_config=TorchConfig(timeout_s=600),  # gloo would give up first otherwise
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name="hung",
            storage_path=shared_storage,
            failure_config=train.FailureConfig(max_failures=1, hang_timeout_s=3.0),
        ),
    ).fit()
    served = Served(shared_storage)
    try:
        page(browser, served, "run", "hung")
        rows = wait_for(browser, "#attempts tr.attempt-row")
        assert len(rows) == 2
        ended = rows[0].find_element("css selector", "td.ended-by").text
        assert ended == "hang"
        assert rows[0].find_element("css selector", "td.rank").text == "1"
        assert rows[0].find_element("css selector", "td.node").text == "127.0.0.1"
        assert "lumos.train.RankStuckError" in rows[0].text
        restart = rows[1].find_element("css selector", "td.restart").text
        assert restart == "new group" or restart.startswith("replaced rank 1 by"), restart
        culprit = wait_for(browser, "#hangs li.culprit")[0].text
        assert culprit.startswith("rank 1 on node ")
        assert "workloads.py" in culprit
        assert_charts_drawn(browser)
        shoot(browser, tmp_path, "dashboard-run-hang")
        links = wait_for(browser, "#hangs a.stacks-link")
        assert [a.text.strip() for a in links] == ["rank 0", "rank 1"]
        links[1].click()
        stacks = wait_for(browser, "#stacks", "stall_once")[0].text
        assert "workloads.py" in stacks
        shoot(browser, tmp_path, "dashboard-stacks")
        assert_no_script_ran(browser)
    finally:
        leave(browser, served)


def _trial(config: dict[str, float]) -> None:
    import workloads

    from lumos import train
    from lumos.train.torch import TorchTrainer

    TorchTrainer(
        workloads.report_steps,
        train_loop_config={"loss": config["loss"], "max_steps": 5 if config["loss"] < 1 else 3000},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(verbose=False),
    ).fit()


def test_a_pruned_sweep_shows_its_trials_curves_and_trial_run_pages(
    ray_cluster: str, browser: Any, shared_storage: str, tmp_path: Path
) -> None:
    storage_dir = shared_storage
    import ray.cloudpickle
    from it_helpers import sweep_good_and_bad

    # This folder is not on the workers' code search path: ship _trial by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    sweep_good_and_bad(
        _trial, "pruned-sweep", storage_dir, key="loss", good=0.5, bad=5.0, metric="loss", upper=1.0
    )
    served = Served(storage_dir)
    try:
        page(browser, served, "sweep", "pruned-sweep")
        rows = wait_for(browser, "#trials tr.trial-row")
        statuses = sorted(r.find_element("css selector", "td.status").text for r in rows)
        assert statuses == ["PRUNED", "TERMINATED"]
        assert "--optuna" in browser.find_element("css selector", "code").text
        assert_charts_drawn(browser)
        shoot(browser, tmp_path, "dashboard-sweep")
        runs = [r.find_elements("css selector", "td.trial-runs a") for r in rows]
        assert [len(r) for r in runs] == [1, 1]  # each trial's Train run (Tune over Train)
        runs[0][0].click()
        wait_for(browser, "#run-name", "train")
        wait_for(browser, "#attempts tr.attempt-row")
        assert_charts_drawn(browser)
        browser.get(served.url)  # the root: this sweep and the runs of the tests before
        rows = wait_for(browser, "#runs tr.run-row", "pruned-sweep")
        assert "sweep" in " ".join(r.text for r in rows)
        shoot(browser, tmp_path, "dashboard-root")
    finally:
        leave(browser, served)


def test_html_in_names_renders_as_text(browser: Any, tmp_path: Path) -> None:
    from lumos.storage import AttemptRecord, RunState, RunStorage

    storage = RunStorage(str(tmp_path / "root"), XSS_NAME)
    storage.append_metrics([{XSS: float(i), "loss": 1.0 / (i + 1)} for i in range(30)], 0)
    storage.save_state(
        RunState(
            name=XSS_NAME,
            status="errored",
            extra={XSS: XSS},
            attempts=[AttemptRecord(index=0, status="errored", error=f"boom {XSS}")],
        )
    )
    served = Served(str(tmp_path / "root"))
    try:
        browser.get(served.url)
        wait_for(browser, "#runs td a", XSS_NAME)
        page(browser, served, "run", XSS_NAME)
        assert wait_for(browser, "#run-name")[0].text == XSS_NAME
        titles = [e.text for e in wait_for(browser, ".chart h3")]
        assert XSS in titles
        assert XSS in wait_for(browser, "#attempts pre")[0].text
        assert json.loads(wait_for(browser, "#config")[0].text) == {XSS: XSS}
        assert not browser.find_elements("css selector", "#app script, #app img")
        assert_no_script_ran(browser)
    finally:
        leave(browser, served)
