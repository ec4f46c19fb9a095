"""What one replacing write of a state-sized object costs on a local file system, in parts:
objq's ``FileStore.write`` without fsync, against the bare system calls it and jqueue's file
store are made of. Run from the repository root::

    python benchmarks/file_write_parts.py
    python benchmarks/file_write_parts.py --bytes 17000 --iterations 2000 --rounds 2

Cases, each replacing one file again and again in a fresh temporary folder:

* ``objq FileStore.write``: the store's conditional update (stage a new file in its temporary
  folder, lock the key, check the version, rename over the object).
* ``stage + rename``: a new file written and renamed over the object, no lock or check (the
  least a write that readers never see half-done costs).
* ``empty file + rename``: the same with nothing written: the file system's cost of a new file
  and a rename, without the data.
* ``truncate + write in place``: jqueue's way (less its lock and its read of the old content):
  readers can see the file half-written.
* ``write in place, no truncate``: the page-cache copy alone.

On ext4, replacing a file that has data not yet on disk (by a rename over it, or a truncate to
zero) starts the writeback of that data at once (its ``auto_da_alloc`` default, which keeps a
crash from leaving an empty file where an application wrote without fsync). That is the
difference between the last case and the others.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from objq_broker.storage import open_store  # noqa: E402

#: Untimed iterations first, so lazy imports and the first allocations do not count.
WARMUP_ITERATIONS = 50


def cases(folder: Path, data: bytes) -> list[tuple[str, Callable[[int], None]]]:
    """The measured cases, each a function of the iteration's number."""
    staging = folder / "staging"
    staging.mkdir()
    store = open_store(f"{folder.as_uri()}/store?fsync=false")
    version = [store.write("state.json", data, if_absent=True)]

    def objq(_: int) -> None:
        version[0] = store.write("state.json", data, if_version=version[0])

    def stage_rename(n: int) -> None:
        tmp = staging / f"s{n}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        os.write(fd, data)
        os.close(fd)
        os.rename(tmp, folder / "renamed.json")

    def empty_rename(n: int) -> None:
        tmp = staging / f"e{n}.tmp"
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        os.rename(tmp, folder / "empty.json")

    def truncate_write(_: int) -> None:
        fd = os.open(folder / "truncated.json", os.O_RDWR | os.O_CREAT, 0o644)
        os.ftruncate(fd, 0)
        os.write(fd, data)
        os.close(fd)

    def overwrite(_: int) -> None:
        fd = os.open(folder / "overwritten.json", os.O_RDWR | os.O_CREAT, 0o644)
        os.pwrite(fd, data, 0)
        os.close(fd)

    return [
        ("objq FileStore.write (fsync=false)", objq),
        ("stage + rename", stage_rename),
        ("empty file + rename", empty_rename),
        ("truncate + write in place", truncate_write),
        ("write in place, no truncate", overwrite),
    ]


def timed(work: Callable[[int], None], iterations: int, start: int) -> float:
    """Mean microseconds per call of ``work`` over ``iterations`` calls."""
    for n in range(WARMUP_ITERATIONS):
        work(start + n)
    began = time.perf_counter()
    for n in range(iterations):
        work(start + WARMUP_ITERATIONS + n)
    return (time.perf_counter() - began) / iterations * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", type=int, default=17_000, help="object size (a state's)")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2, help="each case again, in turn")
    args = parser.parse_args()
    data = b"x" * args.bytes
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="objq-write-parts-") as tmp:
        measured = cases(Path(tmp), data)
        for round_ in range(args.rounds):
            for name, work in measured:
                start = round_ * (args.iterations + WARMUP_ITERATIONS)
                results.setdefault(name, []).append(timed(work, args.iterations, start))
    print(
        f"{args.bytes:,} bytes, {args.iterations:,} writes per case and round, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}\n"
    )
    print("| case | µs per write, each round |")
    print("|---|---:|")
    for name, means in results.items():
        print(f"| {name} | {' / '.join(f'{m:,.0f}' for m in means)} |")


if __name__ == "__main__":
    main()
