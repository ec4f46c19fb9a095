"""Runs: a queue's backlog kept out of the state's head, in objects that never change.

The segmented state (``docs/runs.md``): the head keeps what changes often, runs the rest.

A run is written create-only before the commit that refers to it. A *ready* run holds jobs that
were claimable when it was written, sorted by (priority, seq); a *timed* run holds delayed or
backing-off jobs, sorted by (visible_at, seq). Either is only ever consumed from its front (a
claimed job moves into the head), so the head keeps for each run a :class:`RunRef`: its key, its
count, how many were taken, and the order key of the next job. :class:`RunMerge` gives the
claim order across a queue's ready runs, so priorities and FIFO within a priority hold across
runs as they do within the head.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TypeVar

import msgspec

from objq_broker.errors import StateCorrupt
from objq_broker.model.checks import UNDECODABLE
from objq_broker.model.records import Job, KeyRecord, KeyRunRef, OrderKey, RunKind, RunRef

D = TypeVar("D")

#: The run object format this code reads and writes.
RUN_FORMAT = 1
#: Most jobs one run holds: a claimer reads (and caches) a run whole.
MAX_RUN_JOBS = 10_000


class RunDoc(msgspec.Struct, kw_only=True):
    """A run as stored. ``format`` has no default, so it is always written."""

    format: int
    queue: str
    kind: RunKind
    jobs: list[Job]


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(RunDoc)


#: Where runs are stored, under the namespace.
RUNS_PREFIX = "runs/"
_RUN_KEY = re.compile(r"runs/(\d+)-[0-9A-Za-z]+-\d+\.json")


def run_key(version: int, commit_id: str, number: int) -> str:
    """Where the ``number``-th run made by the commit ``commit_id`` is stored; ``version`` is
    the state version that commit writes, so :func:`orphan_runs` can tell a run whose commit
    can no longer land."""
    return f"{RUNS_PREFIX}{version:010d}-{commit_id}-{number}.json"


def orphan_runs(listed: Iterable[str], version: int, referenced: Collection[str]) -> list[str]:
    """Of the run objects ``listed``, those no state can refer to once the state is at
    ``version`` and refers to ``referenced``.

    A run is only ever referred to by the commit that wrote it, which writes the version in
    its key. With the state at that version or later, such a run is either referred to now,
    or was consumed since (its delete was lost), or its commit lost the race and cannot land:
    a write conditional on an older state fails. Runs of later versions may be a commit
    still in flight, and objects not named like runs are not ours: both are left."""
    orphans: list[str] = []
    for key in listed:
        match = _RUN_KEY.fullmatch(key)
        if match is not None and int(match[1]) <= version and key not in referenced:
            orphans.append(key)
    return orphans


def order_key(kind: RunKind, job: Job) -> OrderKey:
    """Where ``job`` sorts in a run of ``kind``."""
    if kind == "ready":
        return (job.priority, job.seq)
    if kind == "timed":
        return (job.visible_at, job.seq)
    return (job.finished_at or 0.0, job.seq)


def build_run(key: str, queue: str, kind: RunKind, jobs: Sequence[Job]) -> tuple[RunRef, bytes]:
    """The reference and the stored bytes of a new run of ``jobs`` (sorted here)."""
    if not jobs:
        raise ValueError(f"run {key}: expected at least one job, found none")
    for job in jobs:
        if job.queue != queue or job.lease is not None:
            raise ValueError(
                f"run {key}: expected unleased jobs of queue {queue!r}, found job {job.id} "
                f"of {job.queue!r}" + (" under a lease" if job.lease is not None else "")
            )
    ordered = sorted(jobs, key=lambda job: order_key(kind, job))
    data = _encoder.encode(RunDoc(format=RUN_FORMAT, queue=queue, kind=kind, jobs=ordered))
    oldest = min(job.enqueued_at for job in ordered)
    ref = RunRef(
        key=key,
        kind=kind,
        count=len(ordered),
        taken=0,
        next=order_key(kind, ordered[0]),
        oldest=oldest,
        last=order_key(kind, ordered[-1]),
    )
    return ref, data


def _decoded(decoder: msgspec.json.Decoder[D], data: bytes, what: str, key: str) -> D:
    """``data`` decoded as a ``what`` object (a run, a key run) stored at ``key``, or
    :class:`StateCorrupt` saying what was expected and what was found."""
    try:
        return decoder.decode(data)
    except UNDECODABLE as exc:
        raise StateCorrupt(
            f"{what} {key}: expected a {what} object of format {RUN_FORMAT}, found "
            f"{len(data)} bytes that do not decode as one ({exc})"
        ) from exc


def _check_header(
    what: str, key: str, fields: str, expected: tuple[object, ...], found: tuple[object, ...]
) -> None:
    """:class:`StateCorrupt` unless what the object holds (``found``) matches what the head
    says of it (``expected``); ``fields`` names them."""
    if found != expected:
        raise StateCorrupt(f"{what} {key}: expected ({fields}) {expected!r}, found {found!r}")


def decode_run(ref: RunRef, queue: str, data: bytes) -> list[Job]:
    """The jobs of the run ``ref`` refers to, checked against it; :class:`StateCorrupt` saying
    what was expected and what was found otherwise (a run is never rewritten)."""
    doc = _decoded(_decoder, data, "run", ref.key)
    _check_header(
        "run",
        ref.key,
        "format, queue, kind, jobs",
        (RUN_FORMAT, queue, ref.kind, ref.count),
        (doc.format, doc.queue, doc.kind, len(doc.jobs)),
    )
    if ref.base:
        for job in doc.jobs:
            job.seq += ref.base
    keys = [order_key(doc.kind, job) for job in doc.jobs]
    if keys != sorted(keys) or any(job.queue != queue for job in doc.jobs):
        raise StateCorrupt(f"run {ref.key}: expected jobs of {queue!r} in order, found otherwise")
    return doc.jobs


def rebased(ref: RunRef, base: int) -> RunRef:
    """``ref`` (of a run whose jobs are numbered from 0) given its place in the queue: its
    jobs' numbers start at ``base``."""
    if ref.base or ref.taken:
        raise ValueError(f"run {ref.key}: expected a new run numbered from 0, found {ref}")
    last = None if ref.last is None else (ref.last[0], ref.last[1] + base)
    return msgspec.structs.replace(
        ref, next=(ref.next[0], ref.next[1] + base), last=last, base=base
    )


class KeyRunDoc(msgspec.Struct, kw_only=True):
    """Idempotency keys kept out of the head, as stored: slot (``queue/key``) to record."""

    format: int
    queue: str
    keys: dict[str, KeyRecord]


_key_decoder = msgspec.json.Decoder(KeyRunDoc)


def build_key_run(
    key: str, queue: str, records: Mapping[str, KeyRecord]
) -> tuple[KeyRunRef, bytes]:
    """The reference and the stored bytes of a run of idempotency keys."""
    if not records:
        raise ValueError(f"key run {key}: expected at least one key, found none")
    doc = KeyRunDoc(format=RUN_FORMAT, queue=queue, keys=dict(records))
    expires = max(record.expires_at for record in records.values())
    return KeyRunRef(key=key, count=len(records), expires=expires), _encoder.encode(doc)


def decode_key_run(ref: KeyRunRef, queue: str, data: bytes) -> dict[str, KeyRecord]:
    """The keys of the key run ``ref`` refers to, checked against it (:class:`StateCorrupt`
    saying what was expected and what was found otherwise)."""
    doc = _decoded(_key_decoder, data, "key run", ref.key)
    found = (doc.format, doc.queue, len(doc.keys))
    _check_header("key run", ref.key, "format, queue, keys", (RUN_FORMAT, queue, ref.count), found)
    return doc.keys


class RunMerge:
    """The claim order across one queue's ready runs: a heap of each run's next job.

    Taking a job needs its run's contents (read from storage by the engine beforehand:
    :meth:`needed` says which). ``refs`` are updated in place as jobs are taken.
    """

    def __init__(self, refs: Sequence[RunRef]) -> None:
        self.refs = [ref for ref in refs if ref.kind == "ready"]
        self._heap = [(ref.next, index) for index, ref in enumerate(self.refs) if ref.remaining]
        heapq.heapify(self._heap)
        #: Runs whose last job is known, by it: what :meth:`needed` bounds a claim with.
        self._by_last = sorted(
            (ref for ref in self.refs if ref.last is not None),
            key=lambda ref: ref.last or (0, 0),
        )
        self._oldest: dict[str, list[float]] = {}  # per run: earliest enqueued_at from i on

    def __len__(self) -> int:
        return sum(ref.remaining for ref in self.refs)

    def best(self) -> OrderKey | None:
        """The order key of the best job left in any run."""
        return self._heap[0][0] if self._heap else None

    def needed(self, n: int) -> list[str]:
        """The runs that taking ``n`` jobs could touch. Two bounds, both sound: a run is
        reached only after every run whose next job sorts before its own, so at most the
        ``n`` best by next job; and runs taken in order of their last job until they hold
        ``n`` jobs end at a key that the ``n`` best jobs all sort at or before, so a run whose
        next job sorts after it is not reached. (A deep FIFO backlog of many runs then needs
        its first one or two, not one per job claimed.)"""
        bound: OrderKey | None = None
        held = 0
        for ref in self._by_last:
            held += ref.remaining
            if held >= n:
                bound = ref.last
                break
        best = heapq.nsmallest(n, self._heap)
        return [self.refs[i].key for next_key, i in best if bound is None or next_key <= bound]

    def peek(self, contents: Mapping[str, list[Job]]) -> Job | None:
        """The best job left, if any and its run's ``contents`` are at hand."""
        if not self._heap:
            return None
        ref = self.refs[self._heap[0][1]]
        jobs = contents.get(ref.key)
        return None if jobs is None else jobs[ref.taken]

    def take(self, contents: Mapping[str, list[Job]]) -> Job:
        """Take the best job left (the caller checked :meth:`best`); its run moves on."""
        _, index = heapq.heappop(self._heap)
        ref = self.refs[index]
        jobs = contents.get(ref.key)
        if jobs is None:
            raise KeyError(f"run {ref.key} was not read before the claim that needs it")
        job = msgspec.structs.replace(jobs[ref.taken])
        ref.taken += 1
        if ref.remaining:
            ref.next = order_key("ready", jobs[ref.taken])
            ref.oldest = self._oldest_from(ref.key, jobs)[ref.taken]
            heapq.heappush(self._heap, (ref.next, index))
        return job

    def oldest(self) -> float | None:
        """The earliest ``enqueued_at`` among the jobs left in every run."""
        return min((ref.oldest for ref in self.refs if ref.remaining), default=None)

    def _oldest_from(self, key: str, jobs: list[Job]) -> list[float]:
        suffix = self._oldest.get(key)
        if suffix is None:
            suffix = [0.0] * len(jobs)
            low = float("inf")
            for i in range(len(jobs) - 1, -1, -1):
                low = min(low, jobs[i].enqueued_at)
                suffix[i] = low
            self._oldest[key] = suffix
        return suffix


def run_is_due(ref: RunRef, now: float) -> bool:
    """Whether ``ref`` is a timed run whose next job is due at ``now``."""
    return ref.kind == "timed" and ref.remaining > 0 and ref.next[0] <= now


def take_due(ref: RunRef, jobs: list[Job], until: float) -> list[Job]:
    """Take the jobs at the front of ``ref`` (its contents ``jobs``) whose time (``visible_at``
    in a timed run, ``finished_at`` in a dead one) is ``until`` or earlier, moving the run on;
    copies, to be placed in the head (or dropped)."""
    due: list[Job] = []
    while ref.remaining and order_key(ref.kind, jobs[ref.taken])[0] <= until:
        due.append(msgspec.structs.replace(jobs[ref.taken]))
        ref.taken += 1
    if ref.remaining and due:
        ref.next = order_key(ref.kind, jobs[ref.taken])
        ref.oldest = min(job.enqueued_at for job in jobs[ref.taken :])
    return due


def small_runs(refs: Iterable[RunRef], kind: RunKind, run_jobs: int, at_least: int) -> list[RunRef]:
    """The runs of ``kind`` among ``refs`` worth merging into one: those at most half full
    (of ``run_jobs``), smallest first while together they fit in one run, when there are
    ``at_least`` of them (fewer are left: merging is a rewrite, worth it only for several).

    Small runs come from spills that could not merge into the queue's newest run (another
    process wrote it, as direct-mode producers taking turns do) and from runs mostly taken.
    Merging them bounds the head: a queue then keeps about one reference per half run."""
    small = sorted(
        (ref for ref in refs if ref.kind == kind and 0 < 2 * ref.remaining <= run_jobs),
        key=lambda ref: ref.remaining,
    )
    group: list[RunRef] = []
    held = 0
    for ref in small:
        if held + ref.remaining > run_jobs:
            break
        group.append(ref)
        held += ref.remaining
    return group if len(group) >= max(at_least, 2) else []


def merged_jobs(kind: RunKind, runs: Sequence[tuple[RunRef, list[Job]]]) -> list[Job]:
    """The jobs left in ``runs`` (each a ref and its contents), in the order of a run of
    ``kind``: each is sorted already, so this is one pass."""
    left = [jobs[ref.taken :] for ref, jobs in runs]
    return list(heapq.merge(*left, key=lambda job: order_key(kind, job)))
