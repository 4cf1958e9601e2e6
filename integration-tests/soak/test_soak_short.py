"""The chaos soak, short and seeded: 2 minutes of faults on Train runs and a sweep.

Runs ``soak.py --minutes 2 --seed 20261201`` as a subprocess (it starts its own
simulated multi-node cluster and moto S3 server) and asserts that it exits 0 with
a final line that reports faults injected, nothing lost and no violation. The long
soak is ``nox -s soak -- --minutes N --seed S``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parent / "soak.py"
SEED = 20261201
LINE = re.compile(
    r"faults injected: (\d+) \((.*)\) · runs resumed: (\d+) · "
    r"committed checkpoints lost: (\d+) · invariant violations: (\d+)"
)


def test_short_soak_loses_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [
            sys.executable,
            str(SOAK),
            *("--minutes", "2", "--seed", str(SEED)),
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        env=env,
        timeout=840,
        check=False,
    )
    out = proc.stdout.decode(errors="replace")
    lines = [line for line in out.splitlines() if line.strip()]
    # The verdicts, the evidence under each FAIL, the harness's log lines and the end block.
    shown = (
        "PASS ",
        "FAIL ",
        "    - ",
        "      ",
        "[soak",
        "failed checks",
        "  FAIL ",
        "soak ",
        "rerun",
    )
    verdicts = "\n".join(line for line in lines if line.startswith(shown))
    assert proc.returncode == 0, f"{verdicts}\n{proc.stderr.decode(errors='replace')[-3000:]}"
    match = LINE.fullmatch(lines[-1])
    assert match is not None, lines[-1]
    faults, kinds, _resumed, lost, violations = match.groups()
    assert (lost, violations) == ("0", "0"), lines[-1]
    # The schedule fired, several kinds of faults: not an idle run.
    assert int(faults) >= 5, lines[-1]
    assert kinds.count(",") >= 2, lines[-1]
    assert "\nFAIL " not in f"\n{verdicts}", verdicts
