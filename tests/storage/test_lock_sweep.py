"""The lock files a directory store keeps beside its objects are swept once their keys are gone.

Releases before 2026-11-28 left one lock file behind for every key they ever wrote (every
result, every archive object); a key's delete now takes its lock file with it, and a sweep
(``objq gc``, the hourly background collection, results purge) deletes those left before.
A leftover is made here the way such a release made it: the key written (replacing it, as a
write that takes the key's lock file does), then its file deleted without its lock file.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from objq_broker import Queue
from objq_broker.engine.garbage import collect_garbage
from objq_broker.results.store import ResultStore
from objq_broker.storage import MemoryStore
from objq_broker.storage.file import FileStore
from objq_broker.storage.locks import LOCK_DIR, lock_name, sweep_locks
from objq_broker.storage.metered import MeteredStore

HOUR = 3600.0


def write_locked(store: FileStore, key: str) -> str:
    """Create ``key`` and replace it: the replacing write takes the key's lock file."""
    return store.write(key, b"{}", if_version=store.write(key, b"{}", if_absent=True))


def leave_lock_behind(store: FileStore, root: Path, key: str) -> None:
    """Write ``key``, then delete its file as a release before the sweep did."""
    write_locked(store, key)
    (root / key).unlink()


def age(root: Path, seconds: float) -> None:
    """Make every lock file under ``root`` look made ``seconds`` ago."""
    then = time.time() - seconds
    for lock in (root / LOCK_DIR).iterdir():
        os.utime(lock, (then, then))


def locks(root: Path) -> set[str]:
    return {lock.name for lock in (root / LOCK_DIR).iterdir()}


def test_a_sweep_deletes_old_lock_files_of_gone_keys_and_keeps_every_other(
    tmp_path: Path,
) -> None:
    # Given live keys, two keys gone an hour ago that left their lock files, and one just now
    store = FileStore(tmp_path)
    for key in ("a/1", "a/2", "state.json"):
        write_locked(store, key)
    for key in ("gone/1", "gone/2"):
        leave_lock_behind(store, tmp_path, key)
    age(tmp_path, 2 * HOUR)
    leave_lock_behind(store, tmp_path, "gone/young")
    before = locks(tmp_path)
    assert len(before) == 6

    # When a dry run looks, then a sweep runs
    would = store.sweep_locks(HOUR, dry_run=True)
    assert locks(tmp_path) == before
    swept = store.sweep_locks(HOUR)

    # Then only the old lock files of gone keys went
    assert would == swept == 2
    assert locks(tmp_path) == before - {lock_name("gone/1"), lock_name("gone/2")}
    assert store.sweep_locks(HOUR) == 0
    # And the keys still take part in compare-and-set: a gone key is written again
    version = store.write("gone/1", b"again", if_absent=True)
    assert store.write("gone/1", b"next", if_version=version) != version
    assert lock_name("gone/1") in locks(tmp_path)
    assert store.get("a/1") == b"{}"


def test_a_lock_file_in_use_is_not_swept(tmp_path: Path) -> None:
    # Given an old lock file of a gone key that a writer holds right now
    store = FileStore(tmp_path)
    leave_lock_behind(store, tmp_path, "gone")
    age(tmp_path, 2 * HOUR)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store._locked("gone"):
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)

    # When a sweep runs while it is held, then after it is released
    try:
        while_held = store.sweep_locks(HOUR)
        still_there = lock_name("gone") in locks(tmp_path)
    finally:
        release.set()
        holder.join(10)
    after = store.sweep_locks(HOUR)

    # Then the held one stayed, and went once free
    assert (while_held, still_there) == (0, True)
    assert after == 1 and locks(tmp_path) == set()


def test_gc_sweeps_the_lock_files_of_gone_keys(tmp_path: Path) -> None:
    # Given a namespace, and lock files an earlier release left behind
    url = tmp_path.as_uri()
    with Queue(url, broker="off", gc_interval_seconds=None) as queue:
        queue.enqueue("q", b"job")
    store = FileStore(tmp_path)
    for n in range(3):
        leave_lock_behind(store, tmp_path, f"archive/old-{n}.json")
    age(tmp_path, 2 * HOUR)
    live = locks(tmp_path) - {lock_name(f"archive/old-{n}.json") for n in range(3)}

    # When gc looks (dry run), then collects
    dry = collect_garbage(MeteredStore(store), dry_run=True)
    done = collect_garbage(MeteredStore(store))

    # Then both counted the three, the run deleted them, and the queue works on
    assert dry.lock_files == done.lock_files == 3
    assert done.as_dict()["lock_files"] == 3
    assert locks(tmp_path) == live
    with Queue(url, broker="off", gc_interval_seconds=None) as queue:
        assert [d.payload for d in queue.claim("q", 5)] == [b"job"]


def test_a_results_purge_sweeps_the_lock_files_of_results_gone(tmp_path: Path) -> None:
    # Given results, one of them expired, and lock files of results an earlier release purged
    store = FileStore(tmp_path)
    results = ResultStore(store)
    results.set("kept", b"1", ttl=None)
    results.set("expiring", b"2", ttl=0.01)
    for n in range(4):
        leave_lock_behind(store, tmp_path, f"results/old-{n}")
    age(tmp_path, 2 * HOUR)
    time.sleep(0.05)

    # When the results are purged
    deleted = results.purge()

    # Then the expired result went with its lock file, the old lock files went too, and the
    # kept result and its lock file stay
    assert deleted == 1
    assert locks(tmp_path) == {lock_name("results/kept")}
    assert results.get("kept") == b"1"


def test_stores_without_lock_files_sweep_nothing() -> None:
    assert sweep_locks(MemoryStore()) == 0
    assert sweep_locks(MeteredStore(MemoryStore())) == 0
