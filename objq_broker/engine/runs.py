"""Reading runs (the backlog kept out of the state's head, ``docs/runs.md``) for the model.

Runs never change once written, so what has been read is kept for as long as the state refers
to it. A run the state refers to but storage no longer holds usually means the state read was
older than the commit that consumed the run: the caller reads the state again, and only a run
still missing then is lost (as is one that does not decode). Several runs are read in
parallel: on S3 or GCS each read is a round trip.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from objq_broker.engine.janitor import Janitor
from objq_broker.errors import StateCorrupt
from objq_broker.model.records import Job, KeyRecord, KeyRunRef, RunRef
from objq_broker.model.runs import decode_key_run, decode_run
from objq_broker.model.state import QueueState
from objq_broker.model.values import StagedRun
from objq_broker.storage.base import ObjectStore

#: Most runs read at once.
READ_THREADS = 8
#: Small runs of one kind a queue gathers before they are merged into one (``small_runs``):
#: a merge rewrites them, worth it for several.
MERGE_AT = 4


#: What reading runs found wrong: the keys of those not found, and why each of those that do
#: not decode (or do not hold what the head says) cannot be used.
Unread = tuple[list[str], dict[str, str]]


def read_runs(
    store: ObjectStore, state: QueueState, runs: Sequence[tuple[str, RunRef | KeyRunRef]]
) -> Unread:
    """Read those of ``runs`` (queue, ref) not read yet into ``state.run_contents`` (key runs
    into ``state.key_contents``); what could not be read."""
    return read_into(store, runs, state.run_contents, state.key_contents)


def read_into(
    store: ObjectStore,
    runs: Sequence[tuple[str, RunRef | KeyRunRef]],
    contents: dict[str, list[Job]],
    keys: dict[str, dict[str, KeyRecord]],
) -> Unread:
    """Read those of ``runs`` (queue, ref) not in ``contents`` (key runs: ``keys``) into it;
    what could not be read."""
    unread = [
        (queue, ref) for queue, ref in runs if ref.key not in contents and ref.key not in keys
    ]

    def read(run: tuple[str, RunRef | KeyRunRef]) -> tuple[RunRef | KeyRunRef, bytes | None]:
        blob = store.read(run[1].key)
        return run[1], None if blob is None else blob.data

    if len(unread) > 1:
        with ThreadPoolExecutor(min(READ_THREADS, len(unread)), "objq-runs") as pool:
            found = list(pool.map(read, unread))
    else:
        found = [read(run) for run in unread]
    missing: list[str] = []
    broken: dict[str, str] = {}
    for (queue, _), (ref, data) in zip(unread, found, strict=True):
        try:
            if data is None:
                missing.append(ref.key)
            elif isinstance(ref, KeyRunRef):
                keys[ref.key] = decode_key_run(ref, queue, data)
            else:
                contents[ref.key] = decode_run(ref, queue, data)
        except StateCorrupt as exc:
            broken[ref.key] = str(exc)
    return missing, broken


def check_staged(store: ObjectStore, queue: str, runs: Sequence[StagedRun]) -> dict[str, str]:
    """Why each of ``runs`` (written ahead of a staged write to ``queue``) cannot be added:
    not stored, or not decoding as the run it says it is. Read in parallel (a Spark write
    stages many) and thrown away: a staged run's jobs are numbered from 0 until the write
    gives them their place."""

    def problem(run: StagedRun) -> str | None:
        blob = store.read(run.key)
        if blob is None:
            return "expected a run object stored ahead of the write, found none"
        try:
            decode_run(run.ref(), queue, blob.data)
        except StateCorrupt as exc:
            return str(exc)
        return None

    if len(runs) > 1:
        with ThreadPoolExecutor(min(READ_THREADS, len(runs)), "objq-staged") as pool:
            found = list(pool.map(problem, runs))
    else:
        found = [problem(run) for run in runs]
    return {run.key: why for run, why in zip(runs, found, strict=True) if why is not None}


class MergeReads:
    """Reads, off the commit path, the small runs the next commit can merge
    (:meth:`~objq_broker.model.state.QueueState.merge_runs`), so the commit that merges them
    only sorts and writes. One read at a time; its runs are handed over once all are read, so
    a group is merged whole rather than evicted from the cache piece by piece."""

    def __init__(self, store: ObjectStore, janitor: Janitor, run_jobs: int) -> None:
        self.store = store
        self.janitor = janitor
        self.run_jobs = run_jobs
        self._lock = threading.Lock()
        self._read: dict[str, list[Job]] = {}
        self._reading = False

    def plan(self, state: QueueState, cache: Mapping[str, list[Job]]) -> None:
        """After a commit landed: start reading the runs to merge that ``cache`` lacks."""
        with self._lock:
            if self._reading or self._read:
                return
            wanted = [
                (queue, ref)
                for queue, ref in state.runs_to_merge(self.run_jobs, MERGE_AT)
                if ref.key not in cache
            ]
            if not wanted:
                return
            self._reading = True
        self.janitor.run(lambda: self._read_now(wanted), "runs to merge")

    def _read_now(self, wanted: list[tuple[str, RunRef]]) -> None:
        read: dict[str, list[Job]] = {}
        try:
            read_into(self.store, list(wanted), read, {})  # a run gone was taken meanwhile
        finally:
            with self._lock:
                self._read.update(read)
                self._reading = False

    def hand_over(self, cache: dict[str, list[Job]]) -> None:
        """Put what was read into ``cache``, once the whole read is done."""
        with self._lock:
            if self._reading:
                return
            cache.update(self._read)
            self._read.clear()
