"""The records the queue state is made of, and their wire format.

The state of one namespace is one JSON document (msgspec structs, readable with ``jq``)::

    {"format": 1, "version": 42, "epoch": 0, "commit_id": "...", "writers": {...},
     "seq": 1234, "queues": {...}, "jobs": [...], "dead": [...], "keys": {...}}

``version`` counts commits and never repeats, so the document's bytes (and an S3 ETag, which
is their MD5) never repeat either. ``writers`` (each writer's last commit) lets a writer whose
write failed ambiguously find out whether it landed, however many commits others made since.
"""

from __future__ import annotations

import base64
from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

from objq_broker.errors import PayloadInvalid
from objq_broker.model.checks import Attempts, GroupConcurrency, PositiveSeconds, WriteRate

#: The state format this code writes while no queue has runs (``docs/runs.md``); a state
#: with runs is written as format 2, and one that holds an archive tail as format 3: each is
#: what older releases refuse rather than overwrite (a release before the tail would drop
#: its records). Any other format is refused, never rewritten.
FORMAT_VERSION = 1
RUNS_FORMAT_VERSION = 2
TAIL_FORMAT_VERSION = 3
#: A state that has ever held a job of a group, or a queue with group settings, is format 4
#: (``docs/groups.md``): a release before groups would drop every job's group on its next
#: write, and with it the order and the caps its group promised.
GROUPS_FORMAT_VERSION = 4
READABLE_FORMATS = (
    FORMAT_VERSION,
    RUNS_FORMAT_VERSION,
    TAIL_FORMAT_VERSION,
    GROUPS_FORMAT_VERSION,
)
#: How many writers' last commits the state remembers, and for how long after each one's last
#: commit: a writer whose write failed looks for its mark within seconds (its commit deadline),
#: so only this many other writers committing meanwhile could push the mark out.
MAX_WRITER_MARKS = 128
WRITER_MARK_TTL_SECONDS = 3600.0
#: How long the state remembers a broker client's last request (to apply a resent one once).
SESSION_TTL_SECONDS = 3600.0

#: Queue defaults, used when a queue is declared without overrides.
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_BACKOFF_BASE_SECONDS = 1.0
DEFAULT_BACKOFF_CAP_SECONDS = 3600.0
DEFAULT_LEASE_SECONDS = 60.0
#: Dead letters are kept a week, as Dramatiq keeps its dead messages.
DEFAULT_DEAD_TTL_SECONDS = 7 * 24 * 3600.0
#: An idempotency key returns the same job when reused within this window.
DEFAULT_IDEMPOTENCY_SECONDS = 24 * 3600.0


#: Where a job is: waiting to be claimed, waiting for its time, leased, or dead-lettered.
JobState = Literal["ready", "delayed", "in-flight", "dead"]
#: The states of a job still in a queue (a dead letter's record says "dead" elsewhere).
LiveState = Literal["ready", "delayed", "in-flight"]
#: How a job left the queue, as the archive records it: finished, dead-lettered by the broker,
#: or (said by the framework that ran it, possibly after it was acked) failed for good or
#: failed and sent again as a new job.
Outcome = Literal["done", "dead", "failed", "retried"]
#: What a framework may say of a job's run beyond the broker's own "done" and "dead".
RunOutcome = Literal["failed", "retried"]
#: What a nack did: the job will run again after a backoff, or it was dead-lettered.
NackResult = Literal["retry", "dead"]


class Lease(msgspec.Struct, frozen=True):
    """Who holds a delivered job, under which token, until when."""

    token: str
    owner: str
    expires_at: float
    #: When the holder last claimed or heartbeated it (0: before releases that record it).
    renewed_at: float = 0.0


class Job(msgspec.Struct, omit_defaults=True):
    """One job. ``visible_at`` is when it may next be claimed: its ETA, its retry time, or,
    while leased, its lease expiry. Lower ``priority`` runs first; ``seq`` keeps FIFO order
    within a priority."""

    id: str
    queue: str
    body: str
    seq: int
    enqueued_at: float
    visible_at: float
    max_attempts: int
    #: True when ``body`` holds base64 because the payload is not UTF-8 text.
    b64: bool = False
    priority: int = 0
    attempts: int = 0
    lease: Lease | None = None
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    key: str | None = None
    #: Where the body is when it is kept out of the state ("bodies/<commit>.json#<index>").
    ref: str | None = None
    #: The group (a tenant) the job belongs to (``docs/groups.md``); None: a group of its own.
    group: str | None = None

    @property
    def payload(self) -> bytes:
        if self.ref is not None and not self.body:
            raise ValueError(
                f"job {self.id}: the payload is stored out of line at {self.ref}; "
                "read jobs through Queue, which loads it"
            )
        return decode_body(self.id, self.body) if self.b64 else self.body.encode()

    @property
    def shown_payload(self) -> bytes:
        """The payload as a reader shows it: the raw bytes of a body marked base64 that is
        not (:attr:`payload` raises :class:`~objq_broker.errors.PayloadInvalid` for it)."""
        try:
            return self.payload
        except PayloadInvalid:
            return self.body.encode()

    def state_at(self, now: float) -> LiveState:
        """'in-flight', 'delayed' or 'ready' (a dead letter's record says 'dead' elsewhere)."""
        if self.lease is not None:
            return "in-flight"
        return "delayed" if self.visible_at > now else "ready"


def decode_body(job_id: str, body: str) -> bytes:
    """A body marked base64, decoded; :class:`~objq_broker.errors.PayloadInvalid` when it is
    not base64 (a job sent that way by hand, or over the wire by another client)."""
    try:
        return base64.b64decode(body, validate=True)
    except ValueError as exc:  # binascii.Error, or text beyond ASCII
        raise PayloadInvalid(
            f"job {job_id}: expected a base64 body (the job is marked so), found "
            f"{len(body)} characters that are not ({exc}): it cannot be decoded"
        ) from None


def encode_payload(payload: bytes) -> tuple[str, bool]:
    """Text payloads stay readable in the state; anything else is base64."""
    try:
        return payload.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(payload).decode("ascii"), True


class QueueConfig(msgspec.Struct):
    """Per-queue defaults kept in the state, so every worker of every host agrees on them.
    Every field is written out, so a later release's defaults never change a queue silently.
    The constraints hold both where settings enter (:func:`objq_broker.model.checks.checked`)
    and where the state is decoded."""

    max_attempts: Attempts = DEFAULT_MAX_ATTEMPTS
    backoff_base_seconds: PositiveSeconds = DEFAULT_BACKOFF_BASE_SECONDS
    backoff_cap_seconds: PositiveSeconds = DEFAULT_BACKOFF_CAP_SECONDS
    lease_seconds: PositiveSeconds = DEFAULT_LEASE_SECONDS
    dead_ttl_seconds: PositiveSeconds = DEFAULT_DEAD_TTL_SECONDS
    idempotency_seconds: PositiveSeconds = DEFAULT_IDEMPOTENCY_SECONDS
    #: Delete the queue (jobs, dead letters, and its kombu bindings) once nobody has used it
    #: for this long: no claim, no heartbeat of its jobs, no declare (kombu's ``x-expires``;
    #: enqueues do not count). None: the queue never expires.
    expires_seconds: PositiveSeconds | None = None
    #: At most this many jobs of one group leased or backing off at once (1: a group's jobs run
    #: one after another, in order). Unset: no cap. Written only when set, so the settings of
    #: a queue without groups are stored as before groups existed.
    group_concurrency: GroupConcurrency | UnsetType = UNSET
    #: False: claims take a queue's groups in plain (priority, seq) order, not fairly by how
    #: many jobs each holds in flight. Unset: fair (``docs/groups.md``).
    fairness: bool | UnsetType = UNSET

    @property
    def group_cap(self) -> int | None:
        """The most jobs one group may hold in flight or backing off; None: no cap."""
        return None if isinstance(self.group_concurrency, UnsetType) else self.group_concurrency

    @property
    def fair(self) -> bool:
        """Whether claims share the queue fairly among its groups."""
        return self.fairness is not False

    def has_group_rules(self) -> bool:
        """Whether a group setting is set (the state is then format 4)."""
        return self.group_concurrency is not UNSET or self.fairness is not UNSET


class KeyRecord(msgspec.Struct, array_like=True):
    """An idempotency key's job and when the key may be reused."""

    job_id: str
    expires_at: float


class BrokerRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """The process that commits for this namespace (the elected broker), as clients find it.

    ``epoch`` is the state's epoch when it took over: a broker whose epoch is no longer the
    state's has been replaced and writes nothing more. No token is ever kept here."""

    id: str
    address: str
    epoch: int
    since: float
    #: The broker's public CURVE key (Z85) when its link is secured by a token; a client
    #: checks its own token against it before connecting.
    key: str | None = None
    #: Which host's loopback the broker is on (:func:`objq_broker.broker.routing.host_id`):
    #: a broker listening on loopback serves only processes of that host.
    host: str = ""

    @property
    def secured(self) -> bool:
        return self.key is not None


class WriterMark(msgspec.Struct, array_like=True):
    """The last commit of one writer (an engine), and when it was made."""

    commit_id: str
    at: float


class SessionMark(msgspec.Struct, array_like=True):
    """The last request of one broker client that changed the state, and when."""

    seq: int
    at: float


#: Ready runs are claimed in (priority, seq) order; timed runs come due in (visible_at, seq);
#: dead runs (dead letters out of the head) expire in (finished_at, seq) order.
RunKind = Literal["ready", "timed", "dead"]
#: A job's place in its run: (priority, seq), (visible_at, seq) or (finished_at, seq).
OrderKey = tuple[int | float, int]


class RunRef(msgspec.Struct, kw_only=True, array_like=True):
    """A run of a queue's backlog (:mod:`objq_broker.model.runs`) as the head refers to it:
    ``taken`` jobs of ``count`` are gone from its front, ``next`` is the order key of the
    first one left, ``oldest`` the earliest ``enqueued_at`` among those left, and ``last`` the
    order key of its last job (None: not known, as if it sorted after every other).

    ``base`` is added to the ``seq`` of every job the run holds: a run written before the
    commit that enqueues it (by a Spark task) numbers its jobs from 0, and that commit gives
    it its place in the queue's order. ``next`` and ``last`` hold the numbers with it added."""

    key: str
    kind: RunKind
    count: int
    taken: int
    next: OrderKey
    oldest: float
    last: OrderKey | None = None
    base: int = 0

    @property
    def remaining(self) -> int:
        return self.count - self.taken


class KeyRunRef(msgspec.Struct, kw_only=True, array_like=True):
    """Idempotency keys of one queue kept out of the head (:mod:`objq_broker.model.runs`):
    ``count`` of them, all expired by ``expires``, when the run is dropped whole."""

    key: str
    count: int
    expires: float


class ArchiveRecord(msgspec.Struct, omit_defaults=True):
    """One finished or dead-lettered job, as a line of an archive object."""

    outcome: Outcome
    commit_id: str
    job: Job


class ArchiveTail(msgspec.Struct, kw_only=True):
    """The newest archive records, kept in the state until they are worth an object of their
    own (``engine.archive``): all of them committed in the UTC hour of ``since``, the commit
    time of the first, which names the hour folder they are written to."""

    since: float
    #: The state version whose write began the tail: it leaves for an object no sooner than
    #: :data:`~objq_broker.engine.archive.CARRIED_WRITES` writes later. 0: not known (a tail
    #: written by a release before it, or rewritten by one), so the tail may leave at once.
    version: int = 0
    records: list[ArchiveRecord]


class StateDoc(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The whole state of one namespace, as stored. ``format`` has no default, so it is
    always written, and a JSON object without it is not taken for an empty state."""

    format: int
    version: int = 0
    epoch: int = 0
    commit_id: str = ""
    committed_at: float = 0.0
    #: Each writer's last commit, by writer id, the least recent first: a writer whose write
    #: timed out and landed may look for it only after many commits by others, more than a
    #: window of the last commits of all would hold (states written before kept the last 64
    #: in ``recent_commits``, now ignored).
    writers: dict[str, WriterMark] = msgspec.field(default_factory=dict)
    seq: int = 0
    queues: dict[str, QueueConfig] = msgspec.field(default_factory=dict)
    jobs: list[Job] = msgspec.field(default_factory=list)
    dead: list[Job] = msgspec.field(default_factory=list)
    keys: dict[str, KeyRecord] = msgspec.field(default_factory=dict)
    #: Bodies objects and how many jobs (live or dead) still refer to each.
    bodies: dict[str, int] = msgspec.field(default_factory=dict)
    #: The elected broker, if one holds the namespace.
    broker: BrokerRecord | None = None
    #: Commits the broker holding the record has written (under its epoch): how processes
    #: that cannot reach it tell a live broker from a dead one.
    broker_writes: int = 0
    #: Broker clients' last applied requests, by client id: a request sent again after its
    #: broker died is recognised and not applied twice.
    sessions: dict[str, SessionMark] = msgspec.field(default_factory=dict)
    #: Each queue's backlog kept out of the head, in runs (format 2 only).
    runs: dict[str, list[RunRef]] = msgspec.field(default_factory=dict)
    #: Each queue's dead letters kept out of the head, in dead runs (format 2 only).
    dead_runs: dict[str, list[RunRef]] = msgspec.field(default_factory=dict)
    #: Each queue's idempotency keys kept out of the head (format 2 only).
    key_runs: dict[str, list[KeyRunRef]] = msgspec.field(default_factory=dict)
    #: When each queue that expires was last used (claimed from, heartbeated or declared),
    #: kept only for queues with ``expires_seconds``.
    used: dict[str, float] = msgspec.field(default_factory=dict)
    #: At most this many state writes per second, by every process of the namespace together
    #: (``engine.budget``); None: as many as the work needs.
    write_budget: WriteRate | None = None
    #: Lease holders whose leases ran out, with when the last one did (``model.workers``):
    #: shown as gone for a while, then dropped.
    gone: dict[str, float] = msgspec.field(default_factory=dict)
    #: The newest archive records, not yet written to an archive object (format 3 only).
    archive_tail: ArchiveTail | None = None
    #: Set once a job of a group or a group setting entered the state: it is then format 4.
    grouped: bool = False
    #: Per queue, how many jobs of each group wait in its ready runs (``docs/groups.md``): a
    #: group counted here has its later jobs in the head wait behind those.
    group_runs: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)

    def has_runs(self) -> bool:
        """Whether anything is kept out of the head (the state then needs format 2)."""
        return bool(self.runs or self.dead_runs or self.key_runs)

    def needed_format(self) -> int:
        """The oldest format that can hold this state: older releases refuse what they
        would otherwise overwrite without the parts they do not know."""
        if self.grouped:
            return GROUPS_FORMAT_VERSION
        if self.archive_tail is not None:
            return TAIL_FORMAT_VERSION
        return RUNS_FORMAT_VERSION if self.has_runs() else FORMAT_VERSION

    def run_keys(self) -> set[str]:
        """The keys of every run this state refers to, of every kind."""
        refs: list[RunRef | KeyRunRef] = [r for runs in self.runs.values() for r in runs]
        refs += [r for runs in self.dead_runs.values() for r in runs]
        refs += [r for runs in self.key_runs.values() for r in runs]
        return {ref.key for ref in refs}
