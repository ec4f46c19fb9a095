"""The archive of finished jobs: where its objects go, and reading them back by time.

Every commit that finishes jobs (acked, or dead-lettered) first writes their records to one
immutable object ``archive/YYYY/MM/DD/HH/<commit id>.jsonl``, named by the UTC hour of the
commit, one :class:`~objq_broker.model.records.ArchiveRecord` per line. The folder names are what
makes a time-range read cheap: a reader lists only the days it needs and reads only the hours
it needs.

A commit's time is a little later than the ``finished_at`` of the jobs it finishes (the jobs
are stamped when the batch is applied, and a conflicting write is retried), so a job that
finished just before an hour boundary can sit in the next hour's folder. Readers therefore
take one extra hour at the end of a range and filter records by ``finished_at``.

A process that crashes between writing an archive object and writing the state leaves an
object whose jobs are still in the state; they are archived again when they finish, so an
archive can hold the same job more than once. Readers that count should count distinct ids.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from objq_broker.errors import StateCorrupt
from objq_broker.model.records import ArchiveRecord, decode_archive
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
    end = latest if until is None else min(_floor_hour(until) + COMMIT_SLACK, latest)
    start = None if since is None else _floor_hour(since)
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


def iter_archive(
    store: ObjectStore, since: float | None = None, until: float | None = None
) -> Iterator[ArchiveRecord]:
    """Records of jobs finished in ``[since, until)``, object by object, oldest hour first."""
    for key in archive_keys(store, since, until):
        for record in read_archive(store, key):
            finished = record.job.finished_at or 0.0
            if (since is None or finished >= since) and (until is None or finished < until):
                yield record


def _archive_objects(store: ObjectStore, prefix: str) -> list[str]:
    # Only ``.jsonl`` objects: a crashed writer's temporary files never count.
    return [key for key in store.list(prefix) if key.endswith(".jsonl")]


def _floor_hour(at: float) -> datetime:
    return datetime.fromtimestamp(at, UTC).replace(minute=0, second=0, microsecond=0)
