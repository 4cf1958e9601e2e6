"""Child process for the crash-safety and lease tests (killed with SIGKILL by the parent).

Usage: python crash_child.py MODE STORAGE_PATH NAME [S3_ENDPOINT]
Protocol: the child prints one line per milestone on stdout; the parent reads
them to know when to kill.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading

from lumos.storage import CheckpointRecord, RunState, RunStorage


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    mode, storage_path, name = sys.argv[1:4]
    endpoint = sys.argv[4] if len(sys.argv) > 4 else ""
    fs = None
    if endpoint:
        from lumos.storage.testing import s3_filesystem

        fs = s3_filesystem(endpoint)
    storage = RunStorage(storage_path, name, fs)

    if mode == "lease":
        lease = storage.acquire_lease(holder="child-driver", ttl_s=300.0)
        say(f"LEASED {os.getpid()} {lease.host}")
        sys.stdin.read()  # hold until killed
        return

    # A committed first checkpoint.
    src = tempfile.mkdtemp(prefix="lumos-crash-src-")
    with open(os.path.join(src, "weights.bin"), "wb") as f:
        f.write(b"committed" * 1000)
    storage.persist_directory(src, "ckpt_0")
    state, _ = storage.commit_checkpoint(
        RunState(name=name), CheckpointRecord(dir_name="ckpt_0", metrics={"loss": 1.0})
    )
    say("COMMITTED")

    if mode == "checkpoint":
        big = tempfile.mkdtemp(prefix="lumos-crash-big-")
        for i in range(200):
            sub = os.path.join(big, f"shard_{i % 4}")
            os.makedirs(sub, exist_ok=True)
            with open(os.path.join(sub, f"part_{i:04d}.bin"), "wb") as f:
                f.write(os.urandom(64 * 1024))
        lock = threading.Lock()
        done = [0]
        never = threading.Event()

        def on_file_done(_rel: str) -> None:
            with lock:
                done[0] += 1
                if done[0] == 5:
                    say("UPLOADING")
            if done[0] >= 5:
                never.wait()  # every upload thread stops here: the upload stays partial

        storage.persist_directory(big, "ckpt_1", on_file_done=on_file_done)
        say("UNREACHABLE")
    elif mode == "state":
        payload = "x" * (8 * 1024 * 1024)
        i = 1
        while True:
            say(f"WRITING {i}")
            storage.save_state(
                state.model_copy(update={"report_count": i, "extra": {"payload": payload}})
            )
            i += 1
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
