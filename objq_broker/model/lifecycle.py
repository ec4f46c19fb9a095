"""Queue lifecycle in the model: declaring, configuring, marking use, expiring, purging and
deleting queues."""

from __future__ import annotations

from objq_broker.model.backlog import BacklogState
from objq_broker.model.records import QueueConfig
from objq_broker.model.values import check_queue_name, settings_of

#: A queue that expires has its last-used mark written again once the mark is this fraction
#: of its expiry old: a consumer that polls more often than every half expiry keeps its queue,
#: and costs one write per half expiry, not one per poll.
TOUCH_FRACTION = 0.5


class QueuesState(BacklogState):
    """The layer of :class:`~objq_broker.model.state.QueueState` that declares, configures,
    touches, expires, purges and deletes queues."""

    def declare(
        self, queue: str, config: QueueConfig | None = None, now: float | None = None
    ) -> bool:
        """Declare ``queue`` if new (with ``config`` or the defaults); True if it was new.
        Declaring a queue again counts as using it (``now``: when)."""
        check_queue_name(queue)
        if queue in self.doc.queues:
            if now is not None:
                self.touch(queue, now)
            return False
        # Checked here too: a config built in code skips msgspec's constraints, and one bad
        # value in the state would stop every process that shares it.
        settings = QueueConfig() if config is None else settings_of(queue, config)
        self.doc.queues[queue] = settings
        self._members.setdefault(queue, set())
        if settings.expires_seconds is not None and now is not None:
            self.doc.used[queue] = now
        self.dirty = True
        return True

    def touch(self, queue: str, now: float) -> None:
        """Note that ``queue`` is in use (a claim, a heartbeat, a declare), if it expires.
        The mark is written only once it is :data:`TOUCH_FRACTION` of the expiry old."""
        config = self.doc.queues.get(queue)
        if config is None or config.expires_seconds is None:
            return
        last = self.doc.used.get(queue)
        if last is None or now - last >= config.expires_seconds * TOUCH_FRACTION:
            self.doc.used[queue] = now
            self.dirty = self.dirty or self.write_touches

    def hold_marks(self, now: float) -> None:
        """Keep the marks of use in memory from now on, written with the next commit that
        writes anyway, and count every queue as used ``now``. For the only writer (the elected
        broker): it sees every use, but the marks it read may be older than its predecessor's
        memory, so it gives each queue a full expiry from when it took the state over."""
        self.write_touches = False
        for queue in self.doc.used:
            self.doc.used[queue] = max(self.doc.used[queue], now)

    def touch_due(self, queue: str) -> float | None:
        """When a consumer of ``queue`` should next use it to keep it from expiring (a claim
        waiting at a broker is tried again then); None if the queue does not expire."""
        config = self.doc.queues.get(queue)
        last = self.doc.used.get(queue)
        if config is None or config.expires_seconds is None or last is None:
            return None
        return last + config.expires_seconds * TOUCH_FRACTION

    def expiring(self, now: float) -> list[str]:
        """The queues unused for their ``expires_seconds`` at ``now``: the next commit deletes
        them (their runs must have been read first)."""
        found: list[str] = []
        for queue, last in self.doc.used.items():
            expires = self.doc.queues[queue].expires_seconds if queue in self.doc.queues else None
            if expires is not None and now - last >= expires:
                found.append(queue)
        return found

    def _expire_queues(self, now: float) -> int:
        """Delete the queues unused for their expiry, with their jobs and dead letters."""
        for queue in [q for q in self.doc.used if q not in self.doc.queues]:
            del self.doc.used[queue]  # left by a release that did not know the mark
            self.dirty = True
        doomed = self.expiring(now)
        for queue in doomed:
            self.delete_queue(queue)
        return len(doomed)

    def configure(
        self, queue: str, changes: dict[str, float | int | None], now: float = 0.0
    ) -> QueueConfig:
        current = self.config(queue)
        updated = settings_of(queue, current, changes)
        if updated != current:
            self.doc.queues[queue] = updated
            self.dirty = True
            self._sweep_at = float("-inf")  # a new retention moves expiry times
            if updated.expires_seconds is None:
                self.doc.used.pop(queue, None)
            elif current.expires_seconds is None:
                self.doc.used[queue] = now
        return updated

    def purge(self, queue: str) -> int:
        """Delete the ready and delayed jobs of ``queue``; leased ones finish normally."""
        self.config(queue)
        doomed = [self.jobs[i] for i in self._members.get(queue, ()) if self.jobs[i].lease is None]
        for job in doomed:
            self._forget(job)
            self._drop_body(job)
        count = len(doomed) + self._drop_runs(queue)
        if count:
            self.dirty = True
        return count

    def delete_queue(self, queue: str) -> int:
        """Remove ``queue``, its jobs and its dead letters; returns how many jobs went."""
        self.config(queue)
        doomed = [self.jobs[i] for i in self._members.get(queue, ())]
        for job in doomed:
            self._forget(job)
            self._drop_body(job)
        dead = [i for i, job in self.dead.items() if job.queue == queue]
        for job_id in dead:
            self._drop_body(self.dead.pop(job_id))
        in_runs = self._drop_runs(queue) + self._drop_dead_runs(queue)
        self.unused_runs += [ref.key for ref in self.doc.key_runs.pop(queue, [])]
        del self.doc.queues[queue]
        self.doc.used.pop(queue, None)
        self.removed_queues.append(queue)
        self._members.pop(queue, None)
        self._ready.pop(queue, None)
        self._timed.pop(queue, None)
        self.dirty = True
        return len(doomed) + len(dead) + in_runs
