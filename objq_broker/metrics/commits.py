"""``CommitCollector``: one process's own commit counters (``Queue.metrics()``).

These are counted by the process that commits (or, through the namespace's broker, sends) the
operations, since it started; no other process can see them, so they are exposed from that
process. Commit durations are a histogram (``objq_engine_commit_duration_seconds``, fixed
buckets from 1 ms to 10 s, see :mod:`objq_broker.engine.timings`), so the processes of a
namespace add up bucket by bucket.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from objq_broker.errors import ConfigurationError
from objq_broker.metrics.families import Family
from objq_broker.queue import Queue

#: The ``store`` label: which namespace a process's counters are about (a process may hold
#: queues on several).
STORE_LABEL = ("store",)

#: Each field of ``Queue.metrics()`` and the family it is exposed as.
ENGINE_FAMILIES: dict[str, Family] = {
    "ops": Family(
        "objq_engine_operations_total",
        "counter",
        "Operations this process submitted whose batch was committed or failed.",
        STORE_LABEL,
    ),
    "batches": Family(
        "objq_engine_batches_total",
        "counter",
        "Batches of operations this process committed, or sent to the namespace's broker.",
        STORE_LABEL,
    ),
    "state_writes": Family(
        "objq_engine_state_writes_total",
        "counter",
        "Conditional writes of the state object that succeeded (the storage bill's PUTs).",
        STORE_LABEL,
    ),
    "state_reads": Family(
        "objq_engine_state_reads_total",
        "counter",
        "Reads of the state object by this process's commit loop.",
        STORE_LABEL,
    ),
    "archive_writes": Family(
        "objq_engine_archive_writes_total",
        "counter",
        "Archive objects written (finished and dead jobs leaving the state).",
        STORE_LABEL,
    ),
    "bodies_writes": Family(
        "objq_engine_bodies_writes_total",
        "counter",
        "Bodies objects written (payloads too large to keep in the state).",
        STORE_LABEL,
    ),
    "conflicts": Family(
        "objq_engine_conflicts_total",
        "counter",
        "Conditional writes lost to another writer, each followed by a re-read and a retry.",
        STORE_LABEL,
    ),
    "storage_errors": Family(
        "objq_engine_storage_errors_total",
        "counter",
        "Storage errors met while committing (retried until the commit deadline).",
        STORE_LABEL,
    ),
    "runs_merged": Family(
        "objq_engine_runs_merged_total",
        "counter",
        "Small runs of a backlog merged into larger ones.",
        STORE_LABEL,
    ),
    "commit_seconds_total": Family(
        "objq_engine_commit_seconds_total",
        "counter",
        "Time spent committing batches, retries included.",
        STORE_LABEL,
        unit="seconds",
    ),
    "enqueued": Family(
        "objq_jobs_enqueued_total",
        "counter",
        "Jobs this process enqueued (an enqueue answered by a live idempotency key not counted).",
        STORE_LABEL,
    ),
    "claimed": Family(
        "objq_jobs_claimed_total", "counter", "Jobs this process claimed (leased).", STORE_LABEL
    ),
    "acked": Family(
        "objq_jobs_acked_total", "counter", "Jobs this process acknowledged as done.", STORE_LABEL
    ),
    "retried": Family(
        "objq_jobs_retried_total",
        "counter",
        "Jobs this process nacked that went back to their queue for another attempt, or whose "
        "run it reported failed and sent again as a new job.",
        STORE_LABEL,
    ),
    "failed": Family(
        "objq_jobs_failed_total",
        "counter",
        "Jobs whose run this process reported failed for good (the framework settled them "
        "itself; archived as failed, not dead-lettered).",
        STORE_LABEL,
    ),
    "dead_lettered": Family(
        "objq_jobs_dead_lettered_total",
        "counter",
        "Jobs this process nacked that became dead letters (attempts spent, or no retry).",
        STORE_LABEL,
    ),
    "released": Family(
        "objq_jobs_released_total",
        "counter",
        "Jobs this process gave back unprocessed, without counting an attempt.",
        STORE_LABEL,
    ),
    "expired": Family(
        "objq_leases_expired_total",
        "counter",
        "Leases that ran out unextended (their holder died or stalled) and were given back by "
        "this process's commits, as their queue's broker or by an Expire.",
        STORE_LABEL,
    ),
    "max_batch_ops": Family(
        "objq_engine_largest_batch_operations",
        "gauge",
        "Operations in the largest batch since this process started.",
        STORE_LABEL,
    ),
}


#: What this process asked of each store, counted as each request returned (failed ones too,
#: as they are billed): ``Queue.storage_meter``.
STORAGE_REQUESTS = Family(
    "objq_storage_requests_total",
    "counter",
    "Requests this process made to the store, by kind: read and write (the state's conditional "
    "ones), put and get (immutable objects: bodies, runs, archive), delete and list.",
    ("store", "kind"),
)
STORAGE_BYTES = Family(
    "objq_storage_bytes_total",
    "counter",
    "Bytes this process read from (direction=read) and wrote to (direction=written) the store.",
    ("store", "direction"),
    unit="bytes",
)


#: How long this process's own commits took (a process that sends its operations to a broker
#: commits only while it is the broker).
COMMIT_DURATIONS = Family(
    "objq_engine_commit_duration_seconds",
    "histogram",
    "How long this process's commits took: batch applied, objects and state written, retries "
    "included.",
    STORE_LABEL,
    unit="seconds",
)


class CommitCollector:
    """Exposes the commit counters of this process's queues, one ``store`` label each.

    For an ``AsyncQueue`` pass its ``.sync`` queue; for Dramatiq's ``ObjqBroker``, its
    ``.client``.

    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> with Queue("memory://commit-collector-doc") as queue:
    ...     registry = CollectorRegistry()
    ...     registry.register(CommitCollector(queue))
    ...     _ = queue.enqueue("emails", b"hi")
    ...     b'objq_engine_batches_total{store="memory://commit-collector-doc"} 1.0' in (
    ...         generate_latest(registry)
    ...     )
    True
    """

    def __init__(self, *queues: Queue) -> None:
        urls = [queue.store.url for queue in queues]
        if len(set(urls)) != len(urls):
            raise ConfigurationError(
                f"CommitCollector: expected one queue per store (the store is the label that "
                f"tells them apart), found {sorted(urls)}"
            )
        self.queues = queues

    def describe(self) -> list[Metric]:
        families = [*ENGINE_FAMILIES.values(), STORAGE_REQUESTS, STORAGE_BYTES, COMMIT_DURATIONS]
        return [family.build() for family in families]

    def collect(self) -> Iterator[Metric]:
        metrics = [(queue.store.url, queue.metrics()) for queue in self.queues]
        counts = [(url, values.snapshot()) for url, values in metrics]
        for field, family in ENGINE_FAMILIES.items():
            yield family.build(((url,), values[field]) for url, values in counts)
        yield COMMIT_DURATIONS.histogram(
            ((url,), values.commit_durations.cumulative(), values.commit_durations.total_seconds)
            for url, values in metrics
        )
        meters = [(queue.store.url, queue.storage_meter.snapshot()) for queue in self.queues]
        yield STORAGE_REQUESTS.build(
            ((url, kind), n) for url, meter in meters for kind, n in meter.requests.items()
        )
        yield STORAGE_BYTES.build(
            sample
            for url, meter in meters
            for sample in (
                ((url, "read"), meter.bytes_read),
                ((url, "written"), meter.bytes_written),
            )
        )
