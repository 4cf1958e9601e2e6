"""The soak's invariants, checked once every driver ended (see ``soak.py``).

Each check prints one line, ``PASS <run or trial>: <what>`` or ``FAIL <run or trial>:
<what>``, and under a FAIL its evidence, one ``- `` item each: the missing checkpoint
and where it was expected, the duplicated step and its rows, a driver's exit status
with its log's path and last lines, and so on. Storage is read through lumos's public
API (``lumos.storage.RunStorage``, ``lumos.tune.load_study``), the ledger from the
harness's own directory.

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
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from soak_config import DISK_FULL_FAIL_S, HANG_TIMEOUT_S, Job, log_tail

TEMP_MARKERS = (".tmp-", ".tmp", "soak-ckpt-")
SHOWN = 8
SPACE_WORDS = ("ENOSPC", "No space left")


def _ledger(ledger_dir: Path, run: str) -> list[dict[str, Any]]:
    path = Path(ledger_dir) / "ledger" / f"{run}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _fs(harness: Any, storage: str) -> Any:
    return None if storage == "local" else harness.s3.fs()


def _when(t: float | None) -> str:
    return (
        "?" if t is None else time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 10) % 10}"
    )


def _row(row: dict[str, Any]) -> str:
    keys = ("step", "attempt", "loss", "val_step", "val_shards")
    return "{" + ", ".join(f"{k}: {row[k]!r}" for k in keys if k in row) + "}"


def _tail(path: Path, lines: int = 12) -> str:
    return "\n".join(f"| {line}" for line in log_tail(path, lines))


class Checker:
    """Prints each check's verdict with its evidence; collects the violations."""

    def __init__(self) -> None:
        self.violations: list[str] = []
        self.lost = 0

    def check(self, subject: str, what: str, problems: list[str], note: str = "") -> bool:
        """PASS or FAIL ``subject: what``; each problem is printed under a FAIL (up to 8)."""
        if not problems:
            print(f"PASS {subject}: {what}" + (f" ({note})" if note else ""), flush=True)
            return True
        print(f"FAIL {subject}: {what}", flush=True)
        for problem in problems[:SHOWN]:
            first, *rest = problem.splitlines() or [""]
            print(f"    - {first}", flush=True)
            for line in rest:
                print(f"      {line}", flush=True)
        if len(problems) > SHOWN:
            print(f"    - ... ({len(problems)} in all)", flush=True)
        first_line = problems[0].splitlines()[0] if problems[0] else ""
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        self.violations.append(f"{subject}: {what}: {first_line}{more}")
        return False

    # -- one Train run ------------------------------------------------------------------------
    def train_run(
        self,
        label: str,
        storage: Any,
        ledger: list[dict[str, Any]],
        steps: int,
        final: bool,
        keep: int,
        shards: int = 2,
    ) -> None:
        """Every invariant of one Train run (``final``: it must have finished at ``steps``;
        ``shards``: each checkpoint's, 1 under torchft where rank 0 saves the replicas')."""
        state = storage.load_state()
        if state is None:
            self.check(label, "run state exists", [f"no run state at {storage.state_path}"])
            return
        if final:
            problems = [] if state.status == "finished" else [_status_evidence(storage, state)]
            self.check(label, f"finished at step {steps}", problems)
        rows = storage.read_metrics()
        problems = history_problems(rows, steps if final else None, shards)
        if problems:
            problems[0] += f" (history in {storage.uri}/_lumos/metrics)"
        self.check(
            label, "metrics history has every step once, in order", problems, f"{len(rows)} rows"
        )
        self.checkpoints(label, storage, state, ledger, keep, shards)
        if final:
            self.final_checkpoint(label, storage, state, rows, steps)
        leftovers = [f"{storage.uri}/{n}" for n in storage.list_uncommitted()]
        self.check(label, "no unfinished uploads", leftovers)

    def checkpoints(
        self,
        label: str,
        storage: Any,
        state: Any,
        ledger: list[dict[str, Any]],
        keep: int,
        shards: int = 2,
    ) -> None:
        committed = committed_checkpoints(ledger)
        kept = {c.dir_name: c for c in state.checkpoints if not c.rolled_back}
        rolled = {name for rb in state.rollbacks for name in rb.rolled_back}
        lost: list[str] = []
        bad: list[str] = []
        # Also every kept checkpoint the ledger did not see committed (a kill before any rank learnt it).
        to_verify = {n: (_step(n), "kept in the run state") for n in kept}
        to_verify.update(committed)
        for name, (step, how) in sorted(to_verify.items(), key=lambda kv: kv[1][0]):
            if name in rolled:
                continue
            where = storage.checkpoint_path(name)
            if name not in kept:
                newer = sorted((c for c in kept if _step(c) > step), key=_step)
                if len(newer) < keep:  # retention keeps the `keep` most recent
                    lost.append(
                        f"{name}: committed ({how}) but not in the run state {storage.state_path} "
                        f"(it keeps {sorted(kept, key=_step)}); expected at {where}: only "
                        f"{len(newer)} newer checkpoint(s) kept, retention keeps {keep}"
                    )
                continue
            problem = _verify_checkpoint(storage, name, step, where, shards)
            if problem is not None:
                (lost if problem.startswith("unreadable") else bad).append(problem)
        self.lost += len(lost)
        self.check(
            label, f"{len(committed)} committed checkpoints present or retired by retention", lost
        )
        self.check(label, f"{len(kept)} kept checkpoints complete and loadable", bad)

    def final_checkpoint(
        self, label: str, storage: Any, state: Any, rows: list[dict[str, Any]], steps: int
    ) -> None:
        want = f"step={steps}"
        problems = []
        if state.latest_checkpoint != want:
            problems.append(
                f"latest_checkpoint {state.latest_checkpoint!r} in {storage.state_path}"
            )
        self.check(label, f"latest checkpoint is {want}", problems)
        # The last step is validated; a finished run waited for it (its result is in its row).
        record = next((c for c in state.checkpoints if c.dir_name == want), None)
        problems = []
        if record is None:
            problems.append(f"no record of {want} in {storage.state_path}")
        elif record.validation_status not in ("validated", "failed", "timeout"):
            problems.append(
                f"{want}: validation_status {record.validation_status!r} in a finished run "
                f"({storage.state_path})"
            )
        elif record.validation_status == "validated":
            row = next((r for r in rows if r.get("step") == steps), None)
            if row is None or row.get("val_step") != steps:
                shown = _row(row) if row else "no row"
                problems.append(f"{want} validated, but its row of the history is {shown}")
        note = "" if record is None else f"{record.validation_status}"
        self.check(label, f"the validation of {want} is recorded", problems, note)


def ranges(numbers: list[int], every: int = 1) -> str:
    """``[1, 2, 3, 5]`` -> ``"1..3, 5"``: runs of numbers ``every`` apart (``"[]"``: none)."""
    if not numbers:
        return "[]"
    parts: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n - prev == every:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}..{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(parts)


def _step(name: str) -> int:
    return int(name.split("=")[1])


def _status_evidence(storage: Any, state: Any) -> str:
    attempts = [
        f"#{a.index} {a.status}" + (f" ({a.error[:200]})" if a.error else "")
        for a in state.attempts[-3:]
    ]
    return f"status {state.status!r} in {storage.state_path}; last attempts: {'; '.join(attempts)}"


def _verify_checkpoint(
    storage: Any, name: str, step: int, where: str, shards: int = 2
) -> str | None:
    """None when the checkpoint has every shard of its step, else what is wrong."""
    import torch

    want = ["meta.json", *(f"shard-{rank}.pt" for rank in range(shards))]
    try:
        with storage.checkpoint(name).as_directory() as d:
            files = sorted(p.name for p in Path(d).iterdir())
            if files != want:
                return f"{name} at {where}: files {files}, want {', '.join(want)}"
            for rank in range(shards):
                shard = torch.load(Path(d) / f"shard-{rank}.pt", weights_only=True)
                if shard["step"] != step or shard["rank"] != rank:
                    return (
                        f"{name} at {where}: shard-{rank}.pt holds step {shard['step']}, "
                        f"rank {shard['rank']}"
                    )
    except Exception as exc:  # unreadable = lost
        return f"unreadable: {name} at {where}: {type(exc).__name__}: {exc}"
    return None


def committed_checkpoints(ledger: list[dict[str, Any]]) -> dict[str, tuple[int, str]]:
    """Checkpoint name -> (step, how the ledger saw it committed), first sighting."""
    committed: dict[str, tuple[int, str]] = {}
    for rec in ledger:
        who = f"rank {rec.get('rank')}, pid {rec.get('pid')}, attempt {rec.get('attempt')}"
        when = _when(rec.get("t"))
        if rec.get("ckpt") and rec.get("mode") == "sync" and rec["ckpt"] not in committed:
            committed[rec["ckpt"]] = (
                int(rec["step"]),
                f"its SYNC report returned on {who} at {when}",
            )
        seen = rec.get("seen")
        if seen and seen not in committed:
            committed[seen] = (
                _step(seen),
                f"get_checkpoint() returned it on {who} after step {rec.get('step')} at {when}",
            )
    return committed


def history_problems(rows: list[dict[str, Any]], steps: int | None, shards: int = 2) -> list[str]:
    """What is wrong with a metrics history that must hold steps 1..steps (or 1..len) once."""
    problems: list[str] = []
    at: dict[Any, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        at[r.get("step")].append(i)
    for step, where in sorted(at.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        if len(where) > 1:
            shown = ", ".join(f"row {i} {_row(rows[i])}" for i in where)
            problems.append(f"step {step} appears {len(where)} times: {shown}")
    want = range(1, (steps if steps is not None else len(rows)) + 1)
    missing = [s for s in want if s not in at]
    if missing:
        problems.append(f"steps missing: {missing} ({len(rows)} rows)")
    extra = sorted(s for s in at if s not in want and s is not None)
    if extra or None in at:
        problems.append(f"steps beyond 1..{len(want)}: {extra + ([None] if None in at else [])}")
    got = [r.get("step") for r in rows]
    for i in range(1, len(got)):
        if isinstance(got[i], int) and isinstance(got[i - 1], int) and got[i] < got[i - 1]:
            problems.append(f"out of order at row {i}: {_row(rows[i - 1])} then {_row(rows[i])}")
            break
    for i in range(1, len(rows)):
        if int(rows[i].get("attempt", 0)) < int(rows[i - 1].get("attempt", 0)):
            problems.append(
                f"attempt goes back at row {i}: {_row(rows[i - 1])} then {_row(rows[i])}"
            )
            break
    for i, r in enumerate(rows):
        if "val_step" in r and (r["val_step"] != r.get("step") or r.get("val_shards") != shards):
            problems.append(f"row {i} holds another step's validation: {_row(r)}")
    return problems


# -- the faults that plan a failure or a second driver ------------------------------------------
def driver_status(c: Checker, job: Job) -> None:
    """Every driver ended with status 0, the soak's own kills and planned failures aside."""
    problems = [
        f"start {e.start} exited {e.rc} (log {e.log_path}); its last lines:\n{_tail(e.log_path)}"
        for e in job.unexpected_exits
    ]
    if not job.result:
        last = job.log_at(max(job.starts, 1))
        problems.append(f"no RESULT line: no start exited 0 (last log {last}):\n{_tail(last)}")
    planned = [e for e in job.exits if e.why not in ("ok", "unexpected")]
    note = f"{len(job.exits)} start(s)" + (
        f"; {len(planned)} ended by the soak's faults" if planned else ""
    )
    c.check(job.name, "driver ended with status 0", problems, note)


def disk_full(c: Checker, job: Job) -> None:
    """A run whose disk filled up failed with ENOSPC and, once space was freed, finished."""
    df = job.disk_full
    if df is None:
        return
    out = df["outcome"] or {}
    log_path = Path(out.get("log") or job.log_at(df["start"]))
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    said = [line.strip() for line in text.splitlines() if any(w in line for w in SPACE_WORDS)]
    problems = []
    if out.get("rc") is None:
        problems.append(
            f"still running {DISK_FULL_FAIL_S:.0f} s after its disk filled up at {_when(df['at'])} "
            f"(log {log_path}); lines about space: {said[-3:]}\n{_tail(log_path)}"
        )
    elif out["rc"] == 0:
        problems.append(f"exited 0 although its disk was full (log {log_path})")
    elif not said:
        problems.append(
            f"exited {out['rc']} but its log never says ENOSPC or 'No space left' "
            f"(log {log_path}); its last lines:\n{_tail(log_path)}"
        )
    if not job.result:
        problems.append("no rerun finished after the space was freed")
    note = f"exit {out.get('rc')}: {said[-1][:240]!r}" if said else ""
    c.check(job.name, "a full disk failed the run with ENOSPC; the rerun finished", problems, note)


def lease_takeover(c: Checker, harness: Any, job: Job) -> None:
    """After a second driver took the stopped driver's lease over, the stopped one committed nothing."""
    t = job.takeover
    if t is None:
        return
    stale = job.driver_info(t["stale_start"])
    what = (
        f"one driver at a time: the driver stopped past its lease (start {t['stale_start']}, "
        f"pid {t['stale_pid']}) committed nothing once another took the lease over"
    )
    if t.get("at") is None:
        later = job.log_at(t["start"])
        c.check(
            job.name,
            what,
            [
                f"no second driver took the lease over: {t.get('no_takeover')} (log {later}):\n{_tail(later)}"
            ],
        )
        return
    ray_job = stale.get("ray_job")
    # A commit of the stopped driver's shows as a SYNC checkpoint report that returned
    # (it returns only once committed); a metrics-only report returns without the
    # driver, and nothing is written for it once the lease is lost (RunStorage fences
    # every write; the storage checks below see any checkpoint lost to a stale driver).
    late = [
        r
        for r in _ledger(harness.ledger_dir, job.name)
        if ray_job is not None
        and r.get("job") == ray_job
        and float(r.get("t", 0)) > t["at"]
        and r.get("ckpt")
        and r.get("mode") == "sync"
    ]
    problems = []
    if ray_job is None:
        problems.append(
            f"the stopped driver's log {job.log_at(t['stale_start'])} has no DRIVER line"
        )
    if late:
        steps = sorted({int(r["step"]) for r in late})
        ckpts = sorted({_step(r["ckpt"]) for r in late if r.get("ckpt")})
        problems.append(
            f"{len(late)} report(s) of its workers returned after the takeover at "
            f"{_when(t['at'])} by pid {t.get('pid')} (start {t['start']}): steps {ranges(steps)}, "
            f"checkpoints step={ranges(ckpts, 2)} (every 2); the first at {_when(late[0].get('t'))}: "
            f"{json.dumps(late[0])}"
        )
        problems.append(
            f"the stopped driver {t.get('stale_end', '?')} (log {job.log_at(t['stale_start'])}):\n"
            + _tail(job.log_at(t["stale_start"]))
        )
    c.check(job.name, what, problems, f"it {t.get('stale_end', '?')}")


# -- everything ---------------------------------------------------------------------------------
def _temp_files(harness: Any) -> list[str]:
    found = []
    root = Path(harness.local_root)
    for path in root.rglob("*"):
        if any(m in path.name for m in TEMP_MARKERS):
            found.append(f"temp file {path}")
    if harness.s3 is not None:
        fs = harness.s3.fs()
        with contextlib.suppress(FileNotFoundError):
            for key in fs.find(harness.s3.bucket):
                base = key.rsplit("/", 1)[-1]
                if any(m in base for m in TEMP_MARKERS):
                    found.append(f"temp object s3://{key}")
        with contextlib.suppress(Exception):
            for u in fs.list_multipart_uploads(harness.s3.bucket) or []:
                found.append(
                    f"multipart upload in progress: s3://{harness.s3.bucket}/{u.get('Key')} "
                    f"(upload {str(u.get('UploadId'))[:12]}: created, never completed or aborted)"
                )
    return found


def check_all(harness: Any) -> tuple[int, list[str]]:
    """Run every check; returns (committed checkpoints lost, violations)."""
    from lumos.storage import RunStorage

    c = Checker()
    for job in harness.jobs:
        driver_status(c, job)
        fs = _fs(harness, job.storage)
        steps = int(job.spec["loop"]["steps"])
        if job.kind == "train":
            storage = RunStorage(job.spec["storage_path"], job.name, fs)
            c.train_run(
                job.name,
                storage,
                _ledger(harness.ledger_dir, job.name),
                steps,
                final=True,
                keep=int(job.spec["num_to_keep"]),
                shards=1 if job.spec.get("torchft") else 2,
            )
            disk_full(c, job)
            lease_takeover(c, harness, job)
        else:
            sweep(c, harness, job, fs)
    c.check(
        "storage",
        "no temp files or half uploads in local storage or the bucket",
        _temp_files(harness),
    )
    stalls_caught(c, harness.ledger_dir)
    leaks(c)
    return c.lost, c.violations


#: After the watchdog fires, stopping the group takes a few seconds at most: a stalled
#: rank still reporting this long after its stall ended was never stopped.
CAUGHT_MARGIN_S = 10.0


def stall_misses(ledger_dir: Path) -> list[str]:
    """The long user-thread stalls (longer than ``hang_timeout_s``) that the watchdog
    missed: the stalled process went on training after the stall ended."""
    path = Path(ledger_dir) / "stall" / "started.jsonl"
    if not path.exists():
        return []
    stalls = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows_by_pid: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for ledger in sorted((Path(ledger_dir) / "ledger").glob("*.jsonl")):
        for line in ledger.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if "pid" in row and "t" in row:
                    rows_by_pid[int(row["pid"])].append(row)
    problems = []
    for stall in stalls:
        seconds, began = float(stall["s"]), float(stall["t"])
        if seconds <= HANG_TIMEOUT_S:
            continue
        after = [
            r for r in rows_by_pid[int(stall["pid"])] if r["t"] >= began + seconds + CAUGHT_MARGIN_S
        ]
        if after:
            first = min(after, key=lambda r: r["t"])
            problems.append(
                f"pid {stall['pid']} ({first.get('run')}, rank {first.get('rank')}) stalled "
                f"{seconds:.0f} s {stall['where']} at {_when(began)} (hang_timeout_s "
                f"{HANG_TIMEOUT_S:g}) and still reported step {first.get('step')} at "
                f"{_when(first['t'])}: the watchdog never stopped it"
            )
    return problems


def stalls_caught(c: Checker, ledger_dir: Path) -> None:
    """Every long user-thread stall ended its attempt (the watchdog fired)."""
    c.check(
        "hang watchdog",
        "every stall past hang_timeout_s stopped its rank",
        stall_misses(ledger_dir),
    )


def _trial_events(harness: Any, name: str) -> dict[str, list[str]]:
    events: dict[str, list[str]] = defaultdict(list)
    path = Path(harness.ledger_dir) / "ledger" / "trials.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("sweep") == name:  # trial names repeat across sweeps
                events[rec["trial"]].append(
                    f"{rec['event']} (pid {rec.get('pid')} at {_when(rec.get('t'))})"
                )
    return events


def sweep(c: Checker, harness: Any, job: Job, fs: Any) -> None:
    """A sweep's invariants: trials, the study, each trial's Train run, no leftovers."""
    from lumos.storage import RunStorage

    name = job.name
    experiment = RunStorage(job.spec["storage_path"], name, fs)
    trials = job.result["trials"] if job.result else []
    c.check(
        name,
        f"{len(trials)} trials ended, none in error",
        [
            f"trial {t['trial']}: {t['status']}: {t['error']}"
            for t in trials
            if t["error"] or t["status"] == "ERROR"
        ],
    )
    again = []
    for trial, seq in _trial_events(harness, name).items():
        kinds = [e.split(" ", 1)[0] for e in seq]
        ended = [i for i, e in enumerate(kinds) if e in ("end", "pruned")]
        if ended and (len(ended) > 1 or ended[0] != len(kinds) - 1):
            again.append(f"trial {trial} ran again after it ended: {seq}")
    c.check(name, "no finished trial ran again", again)
    c.check(
        name, "the Optuna study agrees with the trial journal", _study_problems(job, fs, trials)
    )
    for t in trials:
        storage = experiment.child(t["trial"]).child("train")
        if storage.load_state() is None:
            continue
        c.train_run(
            f"{name}/{t['trial']}",
            storage,
            _ledger(harness.ledger_dir, f"{name}-{t['trial']}"),
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
    c.check(name, "no unfinished uploads in the experiment", leftovers)


def _study_problems(job: Job, fs: Any, trials: list[dict[str, Any]]) -> list[str]:
    import optuna

    from lumos import tune

    problems = []
    study = tune.load_study(job.spec["storage_path"], job.name, fs)
    if len(study.trials) != len(trials):
        problems.append(f"the study has {len(study.trials)} trials, the journal {len(trials)}")
    for st, t in zip(sorted(study.trials, key=lambda s: s.number), trials):
        if st.state == optuna.trial.TrialState.COMPLETE:
            loss = (t["metrics"] or {}).get("loss")
            if loss is None or abs(float(st.value) - float(loss)) > 1e-9:
                problems.append(f"trial {t['trial']}: study value {st.value}, journal loss {loss}")
        elif st.state == optuna.trial.TrialState.PRUNED:
            if t["status"] not in ("TERMINATED", "PRUNED"):
                problems.append(
                    f"trial {t['trial']}: pruned in the study, {t['status']} in the journal"
                )
        else:
            problems.append(
                f"trial {t['trial']}: study state {st.state.name}, journal {t['status']}"
            )
    return problems


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
        "cluster",
        "no leaked actors or placement groups",
        [f"actor {a.class_name} {a.state} ({a.actor_id[:8]})" for a in actors]
        + [
            f"placement group {p.placement_group_id[:8]} {p.name} {p.state} "
            f"(job {p.creator_job_id})"
            for p in pgs
        ],
    )
