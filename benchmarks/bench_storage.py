"""Checkpoint persist to local storage vs a plain copy of the same files.

Budget (DESIGN.md): ``RunStorage.persist_directory`` of a 256 MiB checkpoint
to local storage within 1.25x of a plain copy (``shutil.copytree``).

Both sides run under the same conditions: the source files are read once
before timing (so both read from the page cache), each repetition writes to
a fresh destination on the same filesystem, ``os.sync()`` runs before each
timed copy (no dirty pages of the other side pending), destinations are
removed outside the timed region, and which side goes first alternates per
repetition so background load hits both alike. Medians (the verdict) and
minimums (least disturbed by other load) are reported, plus a many-small-files
case (2048 x 128 KiB) for information.

Run: ``python benchmarks/bench_storage.py [--reps N] [--dir PATH]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from lumos.storage import RunStorage

BUDGET = 1.25
MIB = 1024 * 1024


def make_checkpoint(root: str, num_files: int, file_size: int) -> None:
    os.makedirs(root, exist_ok=True)
    block = os.urandom(min(file_size, 4 * MIB))
    for i in range(num_files):
        sub = os.path.join(root, f"shard_{i % 4}")
        os.makedirs(sub, exist_ok=True)
        with open(os.path.join(sub, f"part_{i:05d}.bin"), "wb") as f:
            written = 0
            while written < file_size:
                chunk = block[: file_size - written]
                f.write(chunk)
                written += len(chunk)


def warm(root: str) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                while f.read(8 * MIB):
                    pass


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_case(label: str, work: str, num_files: int, file_size: int, reps: int) -> float:
    src = os.path.join(work, f"src-{label}")
    make_checkpoint(src, num_files, file_size)
    warm(src)
    dest_root = os.path.join(work, f"dest-{label}")
    os.makedirs(dest_root, exist_ok=True)
    copy_times: list[float] = []
    persist_times: list[float] = []
    for rep in range(reps + 1):  # first round is a warm-up for both, not counted
        plain_dest = os.path.join(dest_root, f"plain-{rep}")
        storage = RunStorage(dest_root, f"run-{rep}")

        def plain(d: str = plain_dest) -> float:
            os.sync()  # start from clean dirty-page state, as for the other side
            return timed(lambda: shutil.copytree(src, d))

        def persist(s: RunStorage = storage) -> float:
            os.sync()
            return timed(lambda: s.persist_directory(src, "checkpoint_0"))

        # Alternate which side goes first so neither always pays the other's writeback.
        if rep % 2 == 0:
            t_copy, t_persist = plain(), persist()
        else:
            t_persist, t_copy = persist(), plain()
        shutil.rmtree(plain_dest)
        shutil.rmtree(storage.run_path)
        if rep > 0:
            copy_times.append(t_copy)
            persist_times.append(t_persist)
    shutil.rmtree(src)
    copy_med = statistics.median(copy_times)
    persist_med = statistics.median(persist_times)
    ratio = persist_med / copy_med
    best_ratio = min(persist_times) / min(copy_times)
    total = num_files * file_size / MIB
    print(
        f"{label:>10}: {num_files} files, {total:.0f} MiB | plain copy median {copy_med * 1000:7.1f} ms"
        f" (min {min(copy_times) * 1000:6.1f}) | persist_directory median {persist_med * 1000:7.1f} ms"
        f" (min {min(persist_times) * 1000:6.1f}) | ratio median {ratio:.2f}x, min {best_ratio:.2f}x"
        f" (budget {BUDGET}x: {'OK' if ratio <= BUDGET else 'OVER'})"
    )
    return ratio


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="lumos-bench-storage-", dir=args.dir)
    try:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(
            f"work dir {work}, {args.reps} reps (+1 warm-up), cpus={os.cpu_count()}, "
            f"load average {load:.1f} (figures are noisy when the machine is busy)"
        )
        ratio = bench_case("large", work, 16, 16 * MIB, args.reps)
        bench_case("many-small", work, 2048, 128 * 1024, args.reps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"RESULT persist/copy ratio for 256 MiB (16 x 16 MiB): {ratio:.2f}x, budget {BUDGET}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
