"""Who is working: the lease holders of a namespace, read from the state (``objq workers``).

Every in-flight job names its holder (``Lease.owner``), when it was claimed and when its lease
was last renewed, so the holders at work are read from the jobs themselves, at no cost to a
commit. A holder whose leases ran out (a worker that died or hung) is noted in ``gone`` by the
commit that expired them and shown as gone for :data:`GONE_SECONDS`, then dropped. A worker
that holds nothing (idle, or stopped cleanly: it gives its leases back) is not listed.

Owner names say where a holder runs: ``host:pid`` by default, ``host:pid:framework`` from
the Dramatiq broker, the kombu transport and ``objq worker`` (:func:`owner_parts`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import msgspec

from objq_broker.model.records import Job

#: How long a holder whose leases all ran out is shown as gone.
GONE_SECONDS = 3600.0
#: Most gone holders kept (the oldest are dropped first): a crash loop must not grow the state.
MAX_GONE = 1000

WorkerStatus = Literal["working", "gone"]


class Worker(msgspec.Struct, frozen=True, omit_defaults=True):
    """One lease holder as ``objq workers`` shows it."""

    owner: str
    status: WorkerStatus
    host: str | None = None
    pid: int | None = None
    framework: str | None = None
    queues: list[str] = msgspec.field(default_factory=list)
    jobs_held: int = 0
    #: When the job it has held longest was claimed.
    oldest_claimed_at: float | None = None
    #: Its last claim or heartbeat (for a gone holder: when its last lease ran out).
    last_seen_at: float | None = None


def owner_parts(owner: str) -> tuple[str | None, int | None, str | None]:
    """(host, pid, framework) from an owner name ``host:pid[:framework]``; Nones where the
    name does not say (a name given by hand)."""
    host, _, rest = owner.partition(":")
    pid_text, _, framework = rest.partition(":")
    if not host or not pid_text.isdigit():
        return None, None, None
    return host, int(pid_text), framework or None


def note_gone(gone: dict[str, float], owner: str, now: float) -> None:
    """``owner`` lost a lease to expiry at ``now``."""
    gone.pop(owner, None)  # re-inserted last: the dict stays oldest first
    gone[owner] = now
    while len(gone) > MAX_GONE:
        del gone[next(iter(gone))]


def forget_gone(gone: dict[str, float], now: float) -> bool:
    """Drop holders gone longer than :data:`GONE_SECONDS`; whether any was."""
    old = [owner for owner, at in gone.items() if now - at > GONE_SECONDS]
    for owner in old:
        del gone[owner]
    return bool(old)


def workers(in_flight: Iterable[Job], gone: dict[str, float], now: float) -> list[Worker]:
    """The holders of ``in_flight`` jobs (working), then those gone within
    :data:`GONE_SECONDS` that hold nothing now, each sorted by owner name."""
    held: dict[str, list[Job]] = {}
    for job in in_flight:
        if job.lease is not None:
            held.setdefault(job.lease.owner, []).append(job)
    rows = [_working(owner, jobs) for owner, jobs in sorted(held.items())]
    for owner, at in sorted(gone.items()):
        if owner not in held and now - at <= GONE_SECONDS:
            host, pid, framework = owner_parts(owner)
            rows.append(Worker(owner, "gone", host, pid, framework, last_seen_at=at))
    return rows


def _working(owner: str, jobs: list[Job]) -> Worker:
    host, pid, framework = owner_parts(owner)
    renewed = [job.lease.renewed_at or job.started_at or 0.0 for job in jobs if job.lease]
    claimed = [job.started_at for job in jobs if job.started_at is not None]
    return Worker(
        owner,
        "working",
        host,
        pid,
        framework,
        queues=sorted({job.queue for job in jobs}),
        jobs_held=len(jobs),
        oldest_claimed_at=min(claimed) if claimed else None,
        last_seen_at=max(renewed) if renewed else None,
    )
