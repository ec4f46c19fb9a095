"""``StoreCollector``: what ``objq status`` shows, as Prometheus metrics, read on each scrape."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

from prometheus_client.core import Metric

from objq_broker.errors import ObjqError
from objq_broker.metrics.families import Family
from objq_broker.metrics.reading import JOB_STATES, StoreReading, read_store
from objq_broker.storage import ObjectStore

log = logging.getLogger("objq_broker.metrics")

UP = Family("objq_up", "gauge", "1 if this scrape read the store's state, 0 if the read failed.")
SCRAPE_ERRORS = Family(
    "objq_scrape_errors_total",
    "counter",
    "Scrapes whose read of the store failed, since this collector started.",
)
SCRAPE_DURATION = Family(
    "objq_scrape_duration_seconds",
    "gauge",
    "How long this scrape took to read the store.",
    unit="seconds",
)
STATE_EXISTS = Family(
    "objq_state_exists",
    "gauge",
    "1 if the state object exists; 0 before the first commit, or once it was removed.",
)
STATE_COMMITS = Family(
    "objq_state_commits_total",
    "counter",
    "Commits that made the stored state, by every process of the namespace (its version).",
)
STATE_SIZE = Family(
    "objq_state_size_bytes", "gauge", "Size of the stored state object.", unit="bytes"
)
ARCHIVE_TAIL = Family(
    "objq_archive_tail_records",
    "gauge",
    "Finished jobs whose archive records the state still holds, until they fill an object.",
)
LAST_COMMIT = Family(
    "objq_state_last_commit_timestamp_seconds",
    "gauge",
    "Unix time of the last commit, by the committing process's clock (absent before the first).",
    unit="seconds",
)
LAST_COMMIT_AGE = Family(
    "objq_state_last_commit_age_seconds",
    "gauge",
    "Seconds from the last commit to this scrape's read (absent before the first commit).",
    unit="seconds",
)
BROKER_TAKEOVERS = Family(
    "objq_broker_takeovers_total",
    "counter",
    "Times a broker took over the namespace (the state's broker epoch).",
)
BROKER_REGISTERED = Family(
    "objq_broker_registered",
    "gauge",
    "1 while the state names a broker for the namespace, else 0.",
)
BROKER_ACTIVE_CLIENTS = Family(
    "objq_broker_active_clients",
    "gauge",
    "Broker clients that committed in the last 10 minutes.",
)
QUEUE_JOBS = Family(
    "objq_queue_jobs",
    "gauge",
    "Jobs of a queue by state: ready, delayed, in_flight, dead.",
    labels=("queue", "state"),
)
QUEUE_OLDEST_READY_AGE = Family(
    "objq_queue_oldest_ready_age_seconds",
    "gauge",
    "Seconds since the oldest ready job of a queue was enqueued (0 when none is ready).",
    labels=("queue",),
    unit="seconds",
)

#: Every family, in the order a scrape yields them; a failed read yields the first three.
SCRAPE_FAMILIES = (UP, SCRAPE_ERRORS, SCRAPE_DURATION)
STATE_FAMILIES = (
    STATE_EXISTS,
    STATE_COMMITS,
    STATE_SIZE,
    ARCHIVE_TAIL,
    LAST_COMMIT,
    LAST_COMMIT_AGE,
    BROKER_TAKEOVERS,
    BROKER_REGISTERED,
    BROKER_ACTIVE_CLIENTS,
    QUEUE_JOBS,
    QUEUE_OLDEST_READY_AGE,
)


class StoreCollector:
    """Reads a store once per scrape and yields its queues' numbers and its state's facts.

    A read that fails (storage unreachable, bucket missing, state corrupt) does not fail the
    scrape: it yields ``objq_up 0`` with the error count, and logs one line. Scrapes that
    arrive together are read one at a time, so a slow store is not read in parallel.

    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> from objq_broker.storage import MemoryStore
    >>> registry = CollectorRegistry()
    >>> registry.register(StoreCollector(MemoryStore()))
    >>> b"objq_up 1.0" in generate_latest(registry)
    True
    """

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._errors = 0

    def describe(self) -> list[Metric]:
        """Every family a scrape may yield, without reading the store (the registry calls
        this when the collector is registered)."""
        return [family.build() for family in (*SCRAPE_FAMILIES, *STATE_FAMILIES)]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            started = time.monotonic()
            reading = self._read()
            took = time.monotonic() - started
            errors = self._errors
        yield UP.one(0 if reading is None else 1)
        yield SCRAPE_ERRORS.one(errors)
        yield SCRAPE_DURATION.one(took)
        if reading is not None:
            yield from state_families(reading)

    def _read(self) -> StoreReading | None:
        try:
            return read_store(self.store)
        except Exception as exc:  # any failure is one scrape's; the next one tries again
            self._errors += 1
            # One line, whatever the error: a scrape every few seconds must not flood the log.
            kind = "" if isinstance(exc, ObjqError | OSError) else f"{type(exc).__name__}: "
            log.warning("reading %s failed: %s%s", self.store.url, kind, " ".join(str(exc).split()))
            return None


def state_families(reading: StoreReading) -> Iterator[Metric]:
    """The families of one successful read."""
    state = reading.summary
    yield STATE_EXISTS.one(1 if state.exists else 0)
    yield STATE_COMMITS.one(state.version)
    yield STATE_SIZE.one(state.size_bytes)
    yield ARCHIVE_TAIL.one(state.archive_tail_records)
    yield LAST_COMMIT.build([] if state.committed_at is None else [((), state.committed_at)])
    age = state.last_commit_age_seconds
    yield LAST_COMMIT_AGE.build([] if age is None else [((), age)])
    yield BROKER_TAKEOVERS.one(state.epoch)
    yield BROKER_REGISTERED.one(1 if state.broker is not None else 0)
    yield BROKER_ACTIVE_CLIENTS.one(state.active_clients)
    yield QUEUE_JOBS.build(
        ((q.queue, state), q.jobs[state]) for q in reading.queues for state in JOB_STATES
    )
    # 0, not absent, when nothing is ready: an idle queue keeps its series, and an alert on
    # the age stays quiet instead of flapping between "no data" and a value.
    yield QUEUE_OLDEST_READY_AGE.build(
        ((q.queue,), q.oldest_ready_age_seconds or 0.0) for q in reading.queues
    )
