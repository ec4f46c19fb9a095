"""Garbage collection: deleting the bodies objects, runs and staged objects no state refers to.

Every such object is written *before* the commit that refers to it, so a commit that never
lands leaves one behind: a process killed between the two writes, a try that lost its race
and whose writer died before deleting what it wrote, a background delete that never ran, a
Spark driver that died before its commit. None is ever read again; this module finds and
deletes them (``objq gc``, and now and then a long-running process, :class:`Sweeper`). On a
directory store it also deletes the lock files of keys that no longer exist, which releases
before 2026-11-28 left behind (:mod:`objq_broker.storage.locks`).

What is garbage, in three steps: the state is read **once**, the three folders are listed,
and an object is deleted only if

* the state read does not refer to it (``StateDoc.bodies``, which counts the bodies objects of
  every job, live or dead, in the head or in runs; ``StateDoc.run_keys()``, every ready,
  timed, dead and key run), **and**
* it was last written more than ``older_than`` ago (the listing's modification time, by the
  storage's clock), **and** a kind-specific rule holds: a run must be named like one, of a
  state version the state read has reached (:func:`~objq_broker.model.runs.orphan_runs`,
  the engine's own rule); a staged object's Spark write must be closed (``_closed``), or
  have staged nothing for :data:`OPEN_WRITE_SECONDS`.

The age is what makes this safe against commits in flight, including those that land while
the folders are listed: a commit refers only to objects its own tries wrote, at most
``commit_deadline_seconds`` (30 s) before it lands, so an object older than the margin can no
longer be referred to by a commit nobody has seen yet. The default margin of an hour is
120 times that deadline, far more than any clock skew between hosts, and short enough that
what a crash leaves behind is gone the same day. A Spark write is the exception: its driver
commits what its tasks staged once the last task is done, which may be hours after the first
staged its rows, so an open write (no ``_closed`` marker yet) keeps everything it staged until
it has staged nothing for a week.
"""

from __future__ import annotations

import logging
import random
import re
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from objq_broker.engine.janitor import DELETE_THREADS, Janitor
from objq_broker.errors import ObjqError, PreconditionFailed, StorageError
from objq_broker.model.bodies import BODIES_PREFIX
from objq_broker.model.checks import STAGING_PREFIX, UNDECODABLE
from objq_broker.model.runs import RUNS_PREFIX, orphan_runs
from objq_broker.storage.base import ObjectMeta, ObjectStore, write_if_unchanged
from objq_broker.storage.locks import sweep_locks

log = logging.getLogger("objq_broker.gc")

#: How long ago an unreferenced object must have been written to be deleted (see the module
#: docstring for why an hour).
DEFAULT_OLDER_THAN_SECONDS = 3600.0
#: How long a Spark write without its ``_closed`` marker must have staged nothing before what
#: it staged counts as abandoned (its driver died before committing or aborting).
OPEN_WRITE_SECONDS = 7 * 24 * 3600.0
#: How often a long-running process looks whether the namespace is due for a sweep.
DEFAULT_GC_INTERVAL_SECONDS = 3600.0
#: The object that says when the namespace was last swept, and by whom.
SWEEP_MARKER_KEY = "gc.json"
#: The marker the Spark writer's driver writes in a write's staging folder
#: (``model.checks.STAGING_PREFIX``) once the write is committed or aborted
#: (``objq_broker.spark.write``, which this layer may not import).
CLOSED_MARKER = "_closed"

Kind = Literal["bodies", "runs", "staging"]
#: Every kind of object collected, in the order reports show them.
KINDS: tuple[Kind, ...] = ("bodies", "runs", "staging")
_BODIES_KEY = re.compile(r"bodies/[^/]+\.json")


@dataclass(frozen=True, slots=True)
class Tally:
    """How many objects of one kind, and their bytes."""

    objects: int = 0
    bytes: int = 0

    def plus(self, size: int) -> Tally:
        return Tally(self.objects + 1, self.bytes + size)


@dataclass
class Collection:
    """What one collection found and did: ``garbage`` by kind (deleted, unless ``dry_run``),
    unreferenced objects ``kept`` because they are younger than the margin, and deletes that
    ``failed`` (tried again at the next collection)."""

    older_than_seconds: float
    dry_run: bool
    garbage: dict[Kind, Tally] = field(default_factory=lambda: {k: Tally() for k in KINDS})
    kept: dict[Kind, Tally] = field(default_factory=lambda: {k: Tally() for k in KINDS})
    failed: int = 0
    #: Lock files of deleted keys that a directory store swept (see
    #: :mod:`objq_broker.storage.locks`), or would have (``dry_run``).
    lock_files: int = 0
    keys: list[str] = field(default_factory=list)
    #: False when the store holds no state: nothing is collected then.
    state_found: bool = True

    @property
    def total(self) -> Tally:
        return Tally(
            sum(t.objects for t in self.garbage.values()),
            sum(t.bytes for t in self.garbage.values()),
        )

    def as_dict(self) -> dict[str, object]:
        """The collection as JSON-ready data (``objq gc --json``)."""
        total = self.total
        return {
            "dry_run": self.dry_run,
            "state_found": self.state_found,
            "older_than_seconds": self.older_than_seconds,
            "garbage": _by_kind(self.garbage),
            "objects": total.objects,
            "bytes": total.bytes,
            "deleted": 0 if self.dry_run else total.objects - self.failed,
            "failed": self.failed,
            "kept_young": _by_kind(self.kept),
            "lock_files": self.lock_files,
        }


def _by_kind(tallies: dict[Kind, Tally]) -> dict[str, dict[str, int]]:
    return {kind: {"objects": t.objects, "bytes": t.bytes} for kind, t in tallies.items()}


def find_garbage(
    store: ObjectStore, *, older_than: float = DEFAULT_OLDER_THAN_SECONDS, now: float | None = None
) -> Collection:
    """Read the state once, list, and say what is garbage (nothing is deleted). ``now`` (Unix
    seconds, default the clock's) is what ages are counted from."""
    if older_than < 0:
        raise ValueError(f"older_than: expected seconds >= 0, found {older_than!r}")
    # Imported here: the snapshot module imports the commit loop, which runs sweeps.
    from objq_broker.engine.snapshot import Snapshot

    snapshot = Snapshot.read(store)
    if not snapshot.exists:
        # No namespace here (or the URL names the wrong folder): nothing to judge against.
        return Collection(older_than, dry_run=True, state_found=False)
    referenced = snapshot.referenced_bodies | snapshot.referenced_runs
    version = snapshot.version
    listed = {prefix: store.list_meta(prefix) for prefix in (BODIES_PREFIX, RUNS_PREFIX)}
    listed[STAGING_PREFIX] = store.list_meta(STAGING_PREFIX)
    cutoff = (time.time() if now is None else now) - older_than
    found = Collection(older_than, dry_run=True)

    def judge(kind: Kind, meta: ObjectMeta, candidate: bool) -> None:
        if not candidate or meta.key in referenced:
            return
        if meta.modified <= cutoff:
            found.garbage[kind] = found.garbage[kind].plus(meta.size)
            found.keys.append(meta.key)
        else:
            found.kept[kind] = found.kept[kind].plus(meta.size)

    for meta in listed[BODIES_PREFIX]:
        judge("bodies", meta, _BODIES_KEY.fullmatch(meta.key) is not None)
    runs = listed[RUNS_PREFIX]
    unreachable = set(orphan_runs((meta.key for meta in runs), version, referenced))
    for meta in runs:
        judge("runs", meta, meta.key in unreachable)
    for meta, candidate in _staged(listed[STAGING_PREFIX], referenced, cutoff, now):
        judge("staging", meta, candidate)
    return found


def _staged(
    listed: list[ObjectMeta], referenced: set[str], cutoff: float, now: float | None
) -> Iterable[tuple[ObjectMeta, bool]]:
    """Each staged object, and whether its write allows collecting it (see the module
    docstring); a closed write's marker goes once nothing else of the write is left."""
    writes: dict[str, list[ObjectMeta]] = defaultdict(list)
    for meta in listed:
        write_id = meta.key.removeprefix(STAGING_PREFIX).split("/", 1)[0]
        writes[write_id].append(meta)
    open_cutoff = min(cutoff, (time.time() if now is None else now) - OPEN_WRITE_SECONDS)
    for write_id, objects in writes.items():
        marker = f"{STAGING_PREFIX}{write_id}/{CLOSED_MARKER}"
        closed = any(meta.key == marker for meta in objects)
        others = [meta for meta in objects if meta.key != marker]
        if closed:
            for meta in others:
                yield meta, True
            left = [m for m in others if m.key in referenced or m.modified > cutoff]
            yield from ((meta, not left) for meta in objects if meta.key == marker)
        else:
            abandoned = max(meta.modified for meta in objects) <= open_cutoff
            for meta in objects:
                yield meta, abandoned


def collect_garbage(
    store: ObjectStore,
    *,
    older_than: float = DEFAULT_OLDER_THAN_SECONDS,
    dry_run: bool = False,
    now: float | None = None,
) -> Collection:
    """Find the garbage (:func:`find_garbage`) and, unless ``dry_run``, delete it, several
    objects at once. A delete that fails is counted and logged, never raised: the object is
    still garbage at the next collection."""
    found = find_garbage(store, older_than=older_than, now=now)
    found.dry_run = dry_run
    if found.state_found:
        found.lock_files = _sweep_locks(store, older_than, dry_run=dry_run)
    if dry_run or not found.keys:
        return found

    def delete(key: str) -> bool:
        try:
            store.delete(key)
        except StorageError as exc:
            log.warning("could not delete unreferenced object %s: %s", key, exc)
            return False
        return True

    with ThreadPoolExecutor(DELETE_THREADS, thread_name_prefix="objq-gc") as pool:
        found.failed = sum(1 for ok in pool.map(delete, found.keys) if not ok)
    log.info(
        "%s: deleted %d unreferenced objects (%d bytes)",
        store.url,
        found.total.objects - found.failed,
        found.total.bytes,
    )
    return found


def _sweep_locks(store: ObjectStore, older_than: float, *, dry_run: bool) -> int:
    """The store's lock files of deleted keys, swept (a directory store's; none elsewhere).
    A sweep that fails is logged: the next collection tries again."""
    try:
        return sweep_locks(store, older_than, dry_run=dry_run)
    except StorageError as exc:
        log.warning("could not sweep the lock files of %s: %s", store.url, exc)
        return 0


class SweepMark(msgspec.Struct):
    """The content of :data:`SWEEP_MARKER_KEY`: when the namespace was last swept, by whom."""

    swept_at: float
    by: str


_mark_decoder = msgspec.json.Decoder(SweepMark)


class Sweeper:
    """A long-running process's share of garbage collection: after a commit, now and then
    (every ``interval`` seconds, give or take a quarter, so processes started together spread
    out), it looks at :data:`SWEEP_MARKER_KEY` and, if nobody swept within ``interval``, takes
    the turn with a compare-and-set of the marker and collects. So however many processes
    commit to a namespace, it is swept about once per interval, by one of them: with an
    elected broker only the broker commits, in direct mode whichever process wins the marker.
    Each process pays one read of the marker per interval; the sweep costs the one read of the
    state and a listing of three folders. All of it runs on the janitor's threads, never on
    the commit path."""

    def __init__(
        self,
        store: ObjectStore,
        janitor: Janitor,
        *,
        interval: float = DEFAULT_GC_INTERVAL_SECONDS,
        older_than: float = DEFAULT_OLDER_THAN_SECONDS,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.janitor = janitor
        self.interval = interval
        self.older_than = older_than
        self.clock = clock
        self.id = uuid.uuid4().hex[:12]
        self._rng = rng or random.Random()
        # The first look comes at a random point of the first interval: a process restarted
        # more often than every interval still takes its turn, and one-shot commands rarely.
        self._next = time.monotonic() + interval * self._rng.random()
        self._looking = False
        #: Collections this process made (the last one's result in :attr:`last`).
        self.sweeps = 0
        self.last: Collection | None = None

    def after_commit(self) -> None:
        """Called on the writer thread after a commit landed: cheap unless a look is due."""
        now = time.monotonic()
        if now < self._next or self._looking:
            return
        self._looking = True
        self._next = now + self.interval * (0.75 + 0.5 * self._rng.random())
        self.janitor.run(self._look, "garbage to collect")

    def _look(self) -> None:
        try:
            if self._take_turn():
                self.last = collect_garbage(self.store, older_than=self.older_than)
                self.sweeps += 1
        except ObjqError as exc:  # a sweep is an optimisation: the next turn does it again
            log.warning("garbage collection of %s skipped: %s", self.store.url, exc)
        finally:
            self._looking = False

    def _take_turn(self) -> bool:
        """Whether this process sweeps now: nobody did within the interval, and this process
        won the compare-and-set of the marker."""
        now = self.clock()
        blob = self.store.read(SWEEP_MARKER_KEY)
        if blob is not None:
            try:
                last = _mark_decoder.decode(blob.data).swept_at
            except UNDECODABLE:
                last = float("-inf")  # not ours to keep: a valid marker replaces it
            if now - last < self.interval:
                return False
        data = msgspec.json.encode(SweepMark(swept_at=now, by=self.id))
        try:
            write_if_unchanged(
                self.store, SWEEP_MARKER_KEY, data, None if blob is None else blob.version
            )
        except PreconditionFailed:
            return False  # another process took this turn
        return True
