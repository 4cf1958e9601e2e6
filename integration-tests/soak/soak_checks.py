"""The soak's invariants, checked once every driver ended (see ``soak.py``).

Each check prints ``PASS <what>`` or ``FAIL <what>: <why>``. Storage is read through
lumos's public API (``lumos.storage.RunStorage``, ``lumos.tune.load_study``), the
ledger from the harness's own directory.

Definitions:

* A checkpoint is **committed** (per the README's promise) when a rank's SYNC
  ``report()`` with it returned (SYNC returns after the commit), or when any rank
  saw it as ``train.get_checkpoint()`` (how a rank learns an ASYNC commit).
* **Metrics history**: a restart resumes from the latest committed checkpoint, and
  the steps after it are reported again; the history keeps the later report (the
  chunk that starts inside the history replaces the rows from there on). So the
  final history must hold every step ``1..N`` exactly once, in order, each row's
  ``attempt`` never below the previous row's.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

TEMP_MARKERS = (".tmp-", ".tmp", "soak-ckpt-")


def _ledger(harness: Any, run: str) -> list[dict[str, Any]]:
    path = Path(harness.ledger_dir) / "ledger" / f"{run}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _fs(harness: Any, storage: str) -> Any:
    return None if storage == "local" else harness.s3.fs()


class Checker:
    def __init__(self) -> None:
        self.violations: list[str] = []
        self.lost = 0

    def check(self, what: str, problems: list[str]) -> None:
        if problems:
            shown = "; ".join(problems[:8]) + (
                f"; ... ({len(problems)} in all)" if len(problems) > 8 else ""
            )
            print(f"FAIL {what}: {shown}", flush=True)
            self.violations.append(f"{what}: {shown}")
        else:
            print(f"PASS {what}", flush=True)

    # -- one Train run ------------------------------------------------------------------------
    def train_run(
        self,
        label: str,
        storage: Any,
        ledger: list[dict[str, Any]],
        steps: int,
        final: bool,
        keep: int,
    ) -> None:
        import torch

        state = storage.load_state()
        if state is None:
            self.check(f"{label}: run state exists", ["no run state"])
            return
        if final:
            self.check(
                f"{label}: finished at step {steps}",
                [] if state.status == "finished" else [f"status {state.status!r}"],
            )
        rows = storage.read_metrics()
        got = [r.get("step") for r in rows]
        want = list(range(1, steps + 1)) if final else list(range(1, len(got) + 1))
        problems = [] if got == want else [f"steps {got} != {want}"]
        attempts = [int(r.get("attempt", 0)) for r in rows]
        if any(b < a for a, b in itertools.pairwise(attempts)):
            problems.append(f"attempts go back: {attempts}")
        for r in rows:
            if "val_step" in r and (r["val_step"] != r["step"] or r.get("val_shards") != 2):
                problems.append(
                    f"validation of step {r['step']} saw step {r['val_step']}, {r.get('val_shards')} shards"
                )
        self.check(f"{label}: metrics history has every report once, in order", problems)

        # committed per the ledger
        committed: dict[str, int] = {}
        for rec in ledger:
            if rec.get("ckpt") and rec.get("mode") == "sync":
                committed[rec["ckpt"]] = rec["step"]
            if rec.get("seen"):
                committed[rec["seen"]] = int(rec["seen"].split("=")[1])
        kept = {c.dir_name: c for c in state.checkpoints if not c.rolled_back}
        rolled = {name for rb in state.rollbacks for name in rb.rolled_back}
        lost: list[str] = []
        bad: list[str] = []
        # Also every kept checkpoint the ledger did not see committed (a kill before any rank learnt it).
        to_verify = {**{n: int(n.split("=")[1]) for n in kept}, **committed}
        for name, step in sorted(to_verify.items(), key=lambda kv: kv[1]):
            if name in rolled:
                continue
            if name not in kept:
                newer = [c for c in kept if int(c.split("=")[1]) > step]
                if len(newer) < keep:  # retention keeps the `keep` most recent
                    lost.append(
                        f"{name} (committed, not in the run state, only {len(newer)} newer kept)"
                    )
                continue
            try:
                with storage.checkpoint(name).as_directory() as d:
                    files = sorted(p.name for p in Path(d).iterdir())
                    if files != ["meta.json", "shard-0.pt", "shard-1.pt"]:
                        bad.append(f"{name}: files {files}")
                        continue
                    for rank in (0, 1):
                        shard = torch.load(Path(d) / f"shard-{rank}.pt", weights_only=True)
                        if shard["step"] != step or shard["rank"] != rank:
                            bad.append(
                                f"{name}: shard {rank} holds {shard['step']}/{shard['rank']}"
                            )
            except Exception as exc:  # unreadable = lost
                lost.append(f"{name}: {type(exc).__name__}: {exc}")
        self.lost += len(lost)
        self.check(
            f"{label}: {len(committed)} committed checkpoints present or retired by retention", lost
        )
        self.check(f"{label}: {len(kept)} kept checkpoints complete and loadable", bad)
        if final and state.latest_checkpoint != f"step={steps}":
            self.check(
                f"{label}: latest checkpoint is the last step",
                [f"latest {state.latest_checkpoint}"],
            )
        self.check(
            f"{label}: no unfinished uploads",
            [f"{storage.uri}/{n}" for n in storage.list_uncommitted()],
        )


def _temp_files(harness: Any) -> list[str]:
    found = []
    root = Path(harness.local_root)
    for path in root.rglob("*"):
        if any(m in path.name for m in TEMP_MARKERS):
            found.append(str(path))
    if harness.s3 is not None:
        fs = harness.s3.fs()
        with contextlib.suppress(FileNotFoundError):
            for key in fs.find(harness.s3.bucket):
                base = key.rsplit("/", 1)[-1]
                if any(m in base for m in TEMP_MARKERS):
                    found.append(f"s3://{key}")
        with contextlib.suppress(Exception):
            uploads = fs.list_multipart_uploads(harness.s3.bucket)
            found += [f"multipart upload in progress: {u.get('Key')}" for u in uploads or []]
    return found


def check_all(harness: Any) -> tuple[int, list[str]]:
    from lumos.storage import RunStorage

    c = Checker()
    for job in harness.jobs:
        c.check(
            f"{job.name}: driver ended with status 0 (after {job.starts} start(s))",
            [e.splitlines()[0] for e in job.unexpected_exits]
            + ([] if job.result else ["no RESULT line"]),
        )
        fs = _fs(harness, job.storage)
        steps = int(job.spec["loop"]["steps"])
        if job.kind == "train":
            storage = RunStorage(job.spec["storage_path"], job.name, fs)
            c.train_run(
                job.name,
                storage,
                _ledger(harness, job.name),
                steps,
                final=True,
                keep=int(job.spec["num_to_keep"]),
            )
        else:
            sweep(c, harness, job, fs)
    c.check("no temp files or half uploads in local storage or the bucket", _temp_files(harness))
    leaks(c)
    return c.lost, c.violations


def sweep(c: Checker, harness: Any, job: Any, fs: Any) -> None:
    import optuna

    from lumos import tune
    from lumos.storage import RunStorage

    name = job.name
    experiment = RunStorage(job.spec["storage_path"], name, fs)
    trials = job.result["trials"] if job.result else []
    c.check(
        f"{name}: {len(trials)} trials ended, none in error",
        [
            f"{t['trial']}: {t['status']} {t['error']}"
            for t in trials
            if t["error"] or t["status"] == "ERROR"
        ],
    )
    # no finished trial ran twice (the per-trial ledger)
    events: dict[str, list[str]] = defaultdict(list)
    path = Path(harness.ledger_dir) / "ledger" / "trials.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("sweep") == name:  # trial names repeat across sweeps
                events[rec["trial"]].append(rec["event"])
    again = []
    for trial, seq in events.items():
        ended = [i for i, e in enumerate(seq) if e in ("end", "pruned")]
        if ended and (len(ended) > 1 or ended[0] != len(seq) - 1):
            again.append(f"{trial}: {seq}")
    c.check(f"{name}: no finished trial ran again", again)
    # the Optuna study agrees with the trial journal (the driver's results)
    problems = []
    study = tune.load_study(job.spec["storage_path"], name, fs)
    if len(study.trials) != len(trials):
        problems.append(f"study has {len(study.trials)} trials, the journal {len(trials)}")
    for st, t in zip(sorted(study.trials, key=lambda s: s.number), trials):
        if st.state == optuna.trial.TrialState.COMPLETE:
            loss = (t["metrics"] or {}).get("loss")
            if loss is None or abs(float(st.value) - float(loss)) > 1e-9:
                problems.append(f"{t['trial']}: study value {st.value}, journal loss {loss}")
        elif st.state == optuna.trial.TrialState.PRUNED:
            if t["status"] not in ("TERMINATED", "PRUNED"):
                problems.append(f"{t['trial']}: pruned in the study, {t['status']} in the journal")
        else:
            problems.append(f"{t['trial']}: study state {st.state.name}, journal {t['status']}")
    c.check(f"{name}: Optuna study agrees with the trial journal", problems)
    # every nested Train run: history in order, committed checkpoints kept
    for t in trials:
        run = f"{name}-{t['trial']}"
        storage = experiment.child(t["trial"]).child("train")
        if storage.load_state() is None:
            continue
        c.train_run(
            f"{name}/{t['trial']}",
            storage,
            _ledger(harness, run),
            int(job.spec["loop"]["steps"]),
            final=False,
            keep=2,
        )
    leftovers = [
        f"{experiment.uri}/{d}"
        for d in experiment.list_uncommitted(reserved=[t["trial"] for t in trials])
    ]
    for t in trials:
        child = experiment.child(t["trial"])
        leftovers += [f"{child.uri}/{d}" for d in child.list_uncommitted(reserved=["train"])]
    c.check(f"{name}: no unfinished uploads in the experiment", leftovers)


def leaks(c: Checker) -> None:
    from lumos.runtime.testing import alive_actors, alive_placement_groups

    deadline = time.monotonic() + 60.0
    while True:
        actors = alive_actors()
        pgs = alive_placement_groups()
        if (not actors and not pgs) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    c.check(
        "no leaked actors or placement groups",
        [f"actor {a.class_name} {a.state} ({a.actor_id[:8]})" for a in actors]
        + [f"placement group {p.placement_group_id[:8]} {p.state}" for p in pgs],
    )
