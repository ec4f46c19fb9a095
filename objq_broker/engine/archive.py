"""The archive of finished jobs: where its objects go, and reading them back by time.

The records of finished jobs (acked, or dead-lettered), one
:class:`~objq_broker.model.records.ArchiveRecord` per job, are written to immutable objects
``archive/YYYY/MM/DD/HH/<commit id>.jsonl``, one record per line, named by the UTC hour of the
commits that finished them. The folder names are what makes a time-range read cheap: a reader
lists only the days it needs and reads only the hours it needs.

An object per commit would cost each commit that finishes a job one more durable write before
the state's (with one job per commit, a third of a worker's round trip). So a commit keeps the
newest records in the state itself, its *archive tail* (:func:`plan_archive`), and writes them
out as one object once they add up to :data:`DEFAULT_ARCHIVE_TAIL_BYTES` and the tail has been
carried by :data:`CARRIED_WRITES` state writes, or once they add up to :data:`TAIL_CAP` times
that, or when a commit falls in a later hour than the first of them. The count of writes is
what bounds the archive's share of a namespace's writes to a tenth: when every commit finishes
dozens of jobs, their records would fill the tail at every other commit.

A record is durable either way before its job leaves the state: it is in the very write that
drops the job, or in an object written before. Readers (:func:`iter_archive`, ``objq archive
cat``, Spark's ``archive`` table, the dashboard) read the tail with the objects. They read the
state first: a tail written out meanwhile is then read twice, never missed, and
:func:`iter_archive` yields each record once.

A commit's time is a little later than the ``finished_at`` of the jobs it finishes (the jobs
are stamped when the batch is applied, and a conflicting write is retried), so a job that
finished just before an hour boundary can sit in the next hour's folder. Readers therefore
take one extra hour at the end of a range and filter records by ``finished_at``.

A process that crashes between writing an archive object and writing the state leaves an
object whose records are still in the state (its jobs, not yet finished there, or its tail);
they are archived again, so an archive can hold the same job more than once. Readers that
count should count distinct ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from objq_broker.engine.guard import STATE_KEY
from objq_broker.engine.snapshot import Snapshot
from objq_broker.errors import StateCorrupt
from objq_broker.model.encoding import decode_archive, encode_archive
from objq_broker.model.records import ArchiveRecord, ArchiveTail
from objq_broker.storage.base import ObjectStore

#: Folder of the archive of finished jobs.
ARCHIVE_PREFIX = "archive/"
#: How far after a job's ``finished_at`` its commit may land (see the module docstring).
COMMIT_SLACK = timedelta(hours=1)
_DAY = timedelta(days=1)


def archive_key(commit_id: str, committed_at: float) -> str:
    """The key of the archive object written by commit ``commit_id`` at ``committed_at``."""
    hour = datetime.fromtimestamp(committed_at, UTC).strftime("%Y/%m/%d/%H")
    return f"{ARCHIVE_PREFIX}{hour}/{commit_id}.jsonl"


#: The archive tail is written out as an object once its records add up to this many bytes:
#: about ten Celery messages, a hundred small jobs. 0: an object for every commit.
DEFAULT_ARCHIVE_TAIL_BYTES = 16 * 1024
#: ... and once this many state writes have carried it since it began (the one that began it
#: included), so archive objects add at most one write to every ten of the state's.
CARRIED_WRITES = 10
#: A tail of this many times the tail's size is written out however few writes carried it:
#: 256 KiB by default, what a state carries at most for the archive.
TAIL_CAP = 16


@dataclass(frozen=True)
class ArchivePlan:
    """What one commit does with the records of the jobs it finishes."""

    #: Archive objects to write before the state, as ``(key, records)``.
    objects: list[tuple[str, list[ArchiveRecord]]]
    #: The tail the state keeps afterwards.
    tail: ArchiveTail | None
    #: Its records encoded as an object's lines.
    lines: bytes = b""


def plan_archive(
    tail: ArchiveTail | None,
    records: list[ArchiveRecord],
    commit_id: str,
    now: float,
    tail_bytes: int = DEFAULT_ARCHIVE_TAIL_BYTES,
    *,
    version: int,
    held_lines: bytes | None = None,
) -> ArchivePlan | None:
    """Where commit ``commit_id`` at ``now``, writing state version ``version``, puts
    ``records``: in the state's tail, or, with the tail, in an object once they reach
    ``tail_bytes`` and :data:`CARRIED_WRITES` writes have carried the tail (or they reach
    :data:`TAIL_CAP` times ``tail_bytes``). A tail from an earlier hour is written out first,
    to its own hour's folder, so an object never spans two hours. None: nothing to do, the
    tail stays as it is (a commit that finishes no job, within its hour). ``held_lines``:
    ``tail``'s records encoded, when the caller kept them (a commit that finishes one job
    then encodes that job's record, not the whole tail again)."""
    if not records and not tail_due(tail, now, tail_bytes):
        return None
    same_hour = tail is not None and _hour(tail.since) == _hour(now)
    objects: list[tuple[str, list[ArchiveRecord]]] = []
    if tail is not None and not same_hour:
        objects.append((archive_key(commit_id, tail.since), tail.records))
        tail = None
    if tail is None:
        held_lines = b""
    elif held_lines is None:
        held_lines = encode_archive(tail.records)
    held = [*(tail.records if tail is not None else []), *records]
    since, began = (tail.since, tail.version) if tail is not None else (now, version)
    lines = held_lines + encode_archive(records)  # one line per record: they add up
    if not held or _full(len(lines), tail_bytes, version - began + 1 if began else None):
        if held:
            objects.append((archive_key(commit_id, since), held))
        return ArchivePlan(objects, None)
    return ArchivePlan(objects, ArchiveTail(since=since, records=held, version=began), lines)


def tail_due(tail: ArchiveTail | None, now: float, tail_bytes: int) -> bool:
    """Whether a commit at ``now`` that finishes no job must still write ``tail`` out: it is
    from an earlier hour, or the tail is off (``tail_bytes`` 0; a tail an earlier setting
    left). Most commits finish nothing, and this is all they cost the archive."""
    return tail is not None and (tail_bytes == 0 or _hour(tail.since) != _hour(now))


def _full(size: int, tail_bytes: int, carried: int | None) -> bool:
    """Whether a tail of ``size`` bytes, carried by ``carried`` state writes with this one
    (None: not known), is to be written out."""
    if size < tail_bytes:
        return False
    return carried is None or carried >= CARRIED_WRITES or size >= tail_bytes * TAIL_CAP


def _hour(at: float) -> int:
    """The UTC hour ``at`` falls in, counted from the epoch (UTC has no daylight saving, and
    POSIX time no leap seconds): what :func:`floor_hour` says, without building a datetime."""
    return int(at // 3600)


def key_hour(key: str) -> datetime:
    """The UTC hour an archive key's folder names; :class:`StateCorrupt` for a foreign key."""
    parts = key.removeprefix(ARCHIVE_PREFIX).split("/")
    try:
        if len(parts) != 5 or not key.startswith(ARCHIVE_PREFIX):
            raise ValueError("wrong number of folders")
        year, month, day, hour = (int(p) for p in parts[:4])
        return datetime(year, month, day, hour, tzinfo=UTC)
    except ValueError as exc:
        raise StateCorrupt(
            f"archive key {key!r}: expected {ARCHIVE_PREFIX}YYYY/MM/DD/HH/<commit>.jsonl ({exc})"
        ) from exc


#: Up to this many days, an archive range is listed day by day; beyond, all at once.
DAYS_LISTED_ONE_BY_ONE = 31


def archive_keys(
    store: ObjectStore, since: float | None = None, until: float | None = None
) -> list[str]:
    """Keys of the archive objects that may hold jobs finished in ``[since, until)``, oldest
    hour first. Without bounds, the whole archive. Lists one prefix per day in a range of up to
    :data:`DAYS_LISTED_ONE_BY_ONE` days (a LIST each), and the whole archive once beyond."""
    if since is None and until is None:
        return sorted(_archive_objects(store, ARCHIVE_PREFIX))
    # Nothing is archived later than now: a range reaching into the future ends here.
    latest = datetime.now(UTC) + COMMIT_SLACK
    end = latest if until is None else min(floor_hour(until) + COMMIT_SLACK, latest)
    start = None if since is None else floor_hour(since)
    if start is None or (end - start).days > DAYS_LISTED_ONE_BY_ONE:
        return sorted(
            key
            for key in _archive_objects(store, ARCHIVE_PREFIX)
            if (start is None or start <= key_hour(key)) and key_hour(key) <= end
        )
    keys: list[str] = []
    day = start.replace(hour=0)
    while day <= end:
        for key in _archive_objects(store, f"{ARCHIVE_PREFIX}{day:%Y/%m/%d}/"):
            if start <= key_hour(key) <= end:
                keys.append(key)
        day += _DAY
    return sorted(keys)


def read_archive(store: ObjectStore, key: str) -> list[ArchiveRecord]:
    """The records of one archive object."""
    return decode_archive(store.get(key), f"{store.url}/{key}")


#: What readers that name archive objects call the state's archive tail: the state's own key.
TAIL_KEY = STATE_KEY


def read_tail(store: ObjectStore) -> list[ArchiveRecord]:
    """The records the state keeps in its archive tail, oldest first."""
    return Snapshot.read(store).archive_tail


#: What tells one archive record from another (:func:`record_id`).
RecordId = tuple[str, str, str]


def record_id(record: ArchiveRecord) -> RecordId:
    """What tells one archive record from another: its commit, job and outcome (a job acked and
    noted as failed in one commit has two records)."""
    return record.commit_id, record.job.id, record.outcome


def iter_archive(
    store: ObjectStore,
    since: float | None = None,
    until: float | None = None,
    *,
    tail: list[ArchiveRecord] | None = None,
) -> Iterator[ArchiveRecord]:
    """Records of jobs finished in ``[since, until)``, object by object, oldest hour first,
    then the state's tail. ``tail``: the tail of a state the caller has just read, so it is
    not read again (it must be read before the objects are listed: see the module
    docstring)."""
    if tail is None:
        tail = read_tail(store)
    in_tail = {record_id(record) for record in tail}
    for key in archive_keys(store, since, until):
        for record in read_archive(store, key):
            if record_id(record) not in in_tail and finished_within(record, since, until):
                yield record
    for record in tail:
        if finished_within(record, since, until):
            yield record


#: Outcomes from best to worst: a job counts with the worst one its records say (a framework
#: may note "failed" on a job acked "done"); ``objq status`` and ``objq report`` both rank so.
OUTCOME_RANKS: dict[str, int] = {"done": 0, "retried": 1, "failed": 2, "dead": 3}


def worst_outcomes(records: Iterable[ArchiveRecord]) -> dict[tuple[str, str], str]:
    """Each job's worst outcome among ``records``, by ``(queue, job id)``: a job archived
    twice, or noted on by its framework, counts once."""
    worst: dict[tuple[str, str], str] = {}
    for record in records:
        key = (record.job.queue, record.job.id)
        seen = worst.get(key)
        if seen is None or OUTCOME_RANKS[record.outcome] > OUTCOME_RANKS[seen]:
            worst[key] = record.outcome
    return worst


def finished_within(record: ArchiveRecord, since: float | None, until: float | None) -> bool:
    """Whether ``record``'s job finished in ``[since, until)`` (None: unbounded)."""
    finished = record.job.finished_at or 0.0
    return (since is None or finished >= since) and (until is None or finished < until)


def _archive_objects(store: ObjectStore, prefix: str) -> list[str]:
    # Only ``.jsonl`` objects: a crashed writer's temporary files never count.
    return [key for key in store.list(prefix) if key.endswith(".jsonl")]


def floor_hour(at: float) -> datetime:
    """The UTC hour ``at`` falls in."""
    return datetime.fromtimestamp(at, UTC).replace(minute=0, second=0, microsecond=0)
