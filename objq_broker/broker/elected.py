"""The elected broker: one process of a namespace commits for all, chosen among those running.

:class:`ElectedCommitter` is the :class:`~objq_broker.engine.port.Committer` of a queue opened
with ``broker="auto"``, ``"client"`` or an address (:mod:`objq_broker.broker.settings`). Its
one sender thread takes whatever operations are pending, numbers them as one
:class:`~objq_broker.model.ops.Session`, and commits it along one of three routes:

* **Leader**: this process holds the broker record. The session goes to its own exclusive
  engine, which also serves the other processes (:class:`~objq_broker.broker.server.BrokerServer`)
  and reads the state only after a conflict.
* **Follower**: another process holds it. The session goes there over gRPC; claimers wait on
  the broker's commit notices, not on storage.
* **Direct**: no broker can be had (``client`` mode with none reachable): the session is
  committed by compare-and-set, as with no broker at all.

When the broker cannot be reached, the same session is sent again, to it or to whoever holds the
record next, or committed directly: the state remembers each client's last applied session,
so it is applied once whatever happened to the answer. A process in ``auto`` mode that finds no
broker, or one unreachable for ``takeover_seconds``, takes over with one compare-and-set that
raises the epoch; the broker it replaced, if only paused, is fenced on its next write and steps
down. A broker that closes clears the record, so the next process takes over at once.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import logging
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, TypeVar

from objq_broker.broker import wire
from objq_broker.broker.client import BrokerLink
from objq_broker.broker.parking import LANE_STRIDE
from objq_broker.broker.server import BrokerServer, require_token
from objq_broker.broker.settings import BrokerSettings
from objq_broker.engine.base import DEFAULT_COMMIT_DEADLINE_SECONDS
from objq_broker.engine.batch import NOT_READIED, EngineMetrics, ReadyMark
from objq_broker.engine.bodies import BodyCache
from objq_broker.engine.commit import Engine
from objq_broker.engine.snapshot import Snapshot
from objq_broker.errors import (
    BrokerTaken,
    BrokerUnreachable,
    ConfigurationError,
    ObjqError,
    QueueClosed,
    StorageUnavailable,
    WriterFenced,
)
from objq_broker.model.ops import (
    Claim,
    Nothing,
    Op,
    Outcomes,
    ResignBroker,
    Session,
    TakeBroker,
)
from objq_broker.model.records import BrokerRecord, Job
from objq_broker.model.tally import job_events
from objq_broker.storage.base import ObjectStore

T = TypeVar("T")
log = logging.getLogger("objq_broker.broker")

#: Most operations one session carries.
MAX_SESSION_OPS = 5000
#: Longest wait for a session to fill (see ``ElectedCommitter._linger``).
SESSION_LINGER_MAX_SECONDS = 0.005
#: Pause between looks while the broker is unreachable (hello, then the record).
RETRY_PAUSE_SECONDS = 0.25
#: How long a read of the broker record is trusted while no broker can be reached.
RECORD_RECHECK_SECONDS = 1.0

Target = Engine | BrokerLink


class ElectedCommitter:
    """Commits through the namespace's elected broker (see the module's description).

    ``settings``: the mode and ``broker_*`` options. ``engine_options``: for the engines this
    process runs (as the broker, or directly).
    """

    def __init__(
        self,
        store: ObjectStore,
        settings: BrokerSettings,
        *,
        commit_deadline_seconds: float = DEFAULT_COMMIT_DEADLINE_SECONDS,
        engine_options: dict[str, Any] | None = None,
    ) -> None:
        _check_serving(settings)
        _open_at_exit.add(self)
        self.store = store
        self.settings = settings
        self.commit_deadline_seconds = commit_deadline_seconds
        self.bodies = BodyCache(store)
        self._sent = EngineMetrics()  # sessions and operations this client sent
        self._retired: list[Engine] = []  # engines this process led with before
        self.client_id = uuid.uuid4().hex
        self._engine_options = dict(engine_options or {})
        self._engine_options["commit_deadline_seconds"] = commit_deadline_seconds
        self._pending: deque[tuple[Op[Any], Future[Any]]] = deque()
        self._cv = threading.Condition()
        self._closing = False
        self._closed = False  # close() has run (or is running)
        self._thread: threading.Thread | None = None
        self._listeners: list[Callable[[], None]] = []
        self._seq = 0
        self._lanes: list[_Lane] = []  # lanes of waiting claims not in use
        self._lane_ids = itertools.count(1)
        self._in_flight = 0  # operations in the session being sent
        self._callers = 0  # most operations pending or in flight since the last session left
        self._expected = 0  # ... as of the last round trip: how many the next session waits for
        self._round_trip = 0.0  # of the last session
        self._leader: Engine | None = None
        self._server: BrokerServer | None = None
        self._direct: Engine | None = None
        self._link: BrokerLink | None = None
        self._record: BrokerRecord | None = None  # the broker _link (or _leader) stands for
        self._record_read_at = float("-inf")
        self._unreachable_since: float | None = None
        self._last_error: Exception | None = None
        self._used: Target | None = None  # the route the last session took
        self._readied_seen: ReadyMark = NOT_READIED  # the leader engine's mark at the last wake-up
        self._readied_notices = 0  # commits known to have made jobs claimable (see readied)

    def __repr__(self) -> str:
        return f"ElectedCommitter({self.store.url!r}, {self.role})"

    @property
    def role(self) -> str:
        """Where the last session went: 'leader' (this process's own engine), 'follower of
        <address>', 'direct', or 'unresolved' before the first."""
        used = self._used
        if used is None:
            return "unresolved"
        if isinstance(used, BrokerLink):
            return f"follower of {used.address}"
        return "leader" if used is self._leader else "direct"

    @property
    def record(self) -> BrokerRecord | None:
        """The broker this process last used (its own record when it leads)."""
        return self._record

    @property
    def readied(self) -> int:
        """A mark that moves whenever this process learns of a commit that made jobs
        claimable: its broker's notice, or a commit of its own engine (leading, or direct).
        Not moved by the mere return of a session, which wakes local claimers all the same."""
        return self._readied_notices

    @property
    def parked_claims(self) -> int:
        """Claims waiting for jobs at this process, when it is the broker (0 otherwise)."""
        server = self._server
        return 0 if server is None else len(server.park)

    @property
    def leader_engine(self) -> Engine | None:
        return self._leader

    @property
    def metrics(self) -> EngineMetrics:
        """Sessions and operations this process sent, with the storage requests of the engines
        it committed them with (as the broker, those include other processes' sessions)."""
        total = EngineMetrics(ops=self._sent.ops, batches=self._sent.batches)
        total.add_job_events(self._sent)
        engines = [*self._retired, self._leader, self._direct]
        for engine in (e for e in engines if e is not None):
            counts = engine.metrics
            total.expired += counts.expired  # the leases its commits expired on their own
            total.state_writes += counts.state_writes
            total.state_reads += counts.state_reads
            total.archive_writes += counts.archive_writes
            total.bodies_writes += counts.bodies_writes
            total.conflicts += counts.conflicts
            total.storage_errors += counts.storage_errors
            total.max_batch_ops = max(total.max_batch_ops, counts.max_batch_ops)
            total.commit_seconds_total += counts.commit_seconds_total
            total.commit_durations = total.commit_durations.merged(counts.commit_durations)
        return total

    @property
    def _patience(self) -> float:
        """How long a call waits on the broker before asking whether it is still there."""
        return max(self.settings.takeover_seconds, 1.0)

    # --- the Committer interface -----------------------------------------------------------

    def submit(self, op: Op[T]) -> Future[T]:
        future: Future[T] = Future()
        with self._cv:
            if self._closing:
                raise QueueClosed(f"the queue for {self.store.url} is closed")
            self._pending.append((op, future))
            self._callers = max(self._callers, len(self._pending) + self._in_flight)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"objq-elected {self.store.url}", daemon=True
                )
                self._thread.start()
            self._cv.notify()
        return future

    def claim_waiting(self, claim: Claim, wait_seconds: float) -> list[Job] | None:
        """Claim, waiting up to ``wait_seconds`` at the broker for jobs if none are ready
        (:mod:`objq_broker.broker.parking`). None, having claimed nothing, when there is no
        broker to wait at (commits are direct, or the broker predates waiting claims): the
        caller waits its own way.

        The claim travels as a session of a lane of this client (one waiting claim at a
        time each), so after a lost broker the same session goes to the next one and is
        answered from the state, never applied twice."""
        with self._cv:
            if self._closing:
                raise QueueClosed(f"the queue for {self.store.url} is closed")
            lane = self._lanes.pop() if self._lanes else self._new_lane()
            lane.seq += LANE_STRIDE
        session = Session(lane.client, lane.seq, [claim])
        end = time.monotonic() + wait_seconds
        give_up = end + self.commit_deadline_seconds
        try:
            while (outcomes := self._claim_once(session, end)) is None:
                if time.monotonic() >= give_up:
                    raise BrokerUnreachable(
                        f"{self.store.url}: no broker took the claim within "
                        f"{self.commit_deadline_seconds:g} s; last error: {self._last_error}"
                    )
                self.submit(Nothing()).result()  # the sender finds the route (fails over)
        finally:
            with self._cv:
                self._lanes.append(lane)
        if outcomes is _CANNOT_WAIT:
            return None
        ok, value = outcomes[0]
        if not ok:
            raise value
        found: list[Job] = value
        self._sent.count({"claimed": len(found)})
        return found

    def _claim_once(self, session: Session, end: float) -> Outcomes | None:
        """One try of a waiting claim on the current route; None when there is none, or it
        failed (the sender thread must find one first); :data:`_CANNOT_WAIT` when the route
        takes no waiting claims."""
        left = max(end - time.monotonic(), 0.0)
        server, leader, link = self._server, self._leader, self._link
        try:
            if server is not None and leader is not None and leader.fenced is None:
                return server.park.claim(session, left)
            if link is not None and self._unreachable_since is None:
                return link.claim(session, left, left + self._patience) or _CANNOT_WAIT
        except (BrokerUnreachable, WriterFenced) as exc:
            log.info("waiting claim at %s failed, sending it again: %s", link, exc)
            return None
        except QueueClosed:  # this process's broker engine, closed as it stepped down
            if self._closing:
                raise
            return None
        if self._used is not None and self._used is self._direct:
            return _CANNOT_WAIT
        return None

    def _new_lane(self) -> _Lane:
        return _Lane(f"{self.client_id}.{next(self._lane_ids)}")

    def flush(self, timeout: float | None = None) -> None:
        with self._cv:
            if self._thread is None:
                return
        self.submit(Nothing()).result(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Send what is pending, then stop. A leader clears its record first, so the next
        process to need a broker takes over without waiting for it to be found gone."""
        with self._cv:
            if self._closed:
                return
            self._closing = self._closed = True
            self._cv.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        if self._leader is not None and self._leader.fenced is None:
            with contextlib.suppress(ObjqError):
                epoch = self._leader.epoch
                if epoch is not None:
                    self._leader.submit(ResignBroker(epoch)).result(timeout)
        self._drop_leader(grace=1.0)
        self._drop_link()
        if self._direct is not None:
            self._direct.close(timeout)
        self.bodies.close()

    def on_commit(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    @property
    def closed(self) -> bool:
        return self._closing

    def check(self, timeout: float | None = None) -> str:
        """Send an empty session and wait for it: an idle standby finds a lost broker (and
        takes over) this way. Returns :attr:`role`."""
        self.submit(Nothing()).result(timeout)
        return self.role

    # --- the sender thread -----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closing:
                    self._cv.wait()
                if not self._pending:
                    return
                self._linger()
                count = min(len(self._pending), MAX_SESSION_OPS)
                batch = [self._pending.popleft() for _ in range(count)]
                self._in_flight = self._expected = self._callers = count
            live = [(op, future) for op, future in batch if future.set_running_or_notify_cancel()]
            if not live:
                continue
            self._seq += 1
            session = Session(self.client_id, self._seq, [op for op, _ in live])
            sent_at = time.monotonic()
            try:
                outcomes = self._commit(session)
            except Exception as exc:  # every op learns why; nothing hangs
                outcomes = [(False, exc)] * len(live)
            self._sent.batches += 1
            self._sent.ops += len(live)
            self._count_job_events(live, outcomes)
            with self._cv:
                self._in_flight = 0
                self._expected = self._callers
            self._round_trip = time.monotonic() - sent_at
            for (_, future), (ok, value) in zip(live, outcomes, strict=True):
                with contextlib.suppress(InvalidStateError):
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
            self._notify()

    def _count_job_events(
        self, live: list[tuple[Op[Any], Future[Any]]], outcomes: Outcomes
    ) -> None:
        """Count what this client's operations did to jobs, from the outcomes the broker (or
        a direct commit) gave back. Never fails a session that was answered."""
        try:
            for (op, _), (ok, value) in zip(live, outcomes, strict=False):
                if ok:
                    self._sent.count(job_events(op, value))
        except Exception:
            log.exception("counting a session's job events failed")

    def _linger(self) -> None:
        """Let a session fill before sending it (called holding ``_cv``). As many callers had
        an operation pending or in flight during the last round trip; those it released are
        still submitting their next ones, so wait (a fraction of a round trip at most) for
        all of them: otherwise half the callers ride every other session. One caller never
        waits."""
        end = time.monotonic() + min(SESSION_LINGER_MAX_SECONDS, self._round_trip / 4)
        while len(self._pending) < self._expected and not self._closing:
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            self._cv.wait(remaining)

    def _commit(self, session: Session) -> Outcomes:
        """Commit ``session`` by whichever route works, sending it again after a broker was
        lost (the state's session marks make that safe)."""
        deadline = time.monotonic() + self.commit_deadline_seconds
        while True:
            target = self._used = self._route(deadline)
            started = time.monotonic()
            try:
                if isinstance(target, BrokerLink):
                    # Past the takeover time, the next route asks the broker who it is: a
                    # slow broker answers and gets the same session again; a paused one is
                    # replaced, counting from when this request was sent.
                    return target.apply(session, self._patience)
                return target.submit(session).result()
            except WriterFenced as exc:  # that broker (maybe this process) was replaced
                log.info("broker replaced: %s", exc)
                self._lost(exc, since=started, fenced=True)
            except BrokerUnreachable as exc:
                self._lost(exc, since=started)

    # --- finding the route -----------------------------------------------------------------

    def _route(self, deadline: float) -> Target:
        """The engine or link the next session goes to, electing or waiting as needed."""
        while True:
            if self._closing and self._unreachable_since is not None:
                return self._direct_engine()  # what is left on the way out: commit it here
            if self._leader is not None:
                if self._leader.fenced is None:
                    return self._leader
                self._drop_leader(grace=0.5)
            if self._link is not None and self._unreachable_since is None:
                return self._link
            if time.monotonic() >= deadline:
                raise BrokerUnreachable(
                    f"{self.store.url}: no broker reachable within "
                    f"{self.commit_deadline_seconds:g} s; last error: {self._last_error}"
                )
            try:
                target = self._resolve()
            except StorageUnavailable as exc:  # transient: look again until the deadline
                log.info("looking for the broker of %s, retrying: %s", self.store.url, exc)
                self._last_error = exc
                target = None
            if target is not None:
                return target
            time.sleep(RETRY_PAUSE_SECONDS)

    def _resolve(self) -> Target | None:
        """One look for a route; None to look again after a pause."""
        if self.settings.mode == "fixed":
            return self._fixed_link()
        record = self._read_record()
        if record != self._record or (record is not None and self._link is None):
            self._follow(record)
            if self._link is not None and self._reachable(self._link, record):
                return self._link
        elif self._link is not None and self._reachable(self._link, record):
            return self._link  # slow, not gone: it gets the same session again
        if record is not None and not self._waited_out():
            return None
        if self.settings.mode == "auto":
            return self._take_over(record)
        return self._direct_engine()

    def _fixed_link(self) -> Target | None:
        address = self.settings.address or ""
        if self._link is None:
            self._link = self._open_link(address)
        if self._unreachable_since is None:
            return self._link
        self._unreachable_since = None  # try it again after the pause
        return None

    def _follow(self, record: BrokerRecord | None) -> None:
        """Point at ``record``'s broker (or at none)."""
        self._drop_link()
        self._record = record
        self._unreachable_since = None
        if record is not None:
            self._link = self._open_link(record.address, tls=record.tls)
            threading.Thread(
                target=self._watch, args=(self._link,), name="objq-broker-watch", daemon=True
            ).start()

    def _reachable(self, link: BrokerLink, record: BrokerRecord | None) -> bool:
        """Whether ``link`` answers as ``record``'s broker (another process on a reused port,
        or a broker of another namespace, does not count)."""
        try:
            hello = link.hello()
        except BrokerUnreachable as exc:
            self._lost(exc)
            return False
        if record is not None and hello.broker != record.id:
            self._lost(
                BrokerUnreachable(
                    f"{link.address} answers as broker {hello.broker!r} of "
                    f"{hello.namespace!r}, not {record.id!r} of {self.store.url!r}"
                )
            )
            return False
        self._unreachable_since = None
        return True

    def _lost(self, exc: Exception, *, since: float | None = None, fenced: bool = False) -> None:
        """The current broker failed us (``since``: when the failed call began)."""
        self._last_error = exc
        if fenced:
            self._record = None  # read the record again at once
            self._record_read_at = float("-inf")
        if self._unreachable_since is None:
            self._unreachable_since = time.monotonic() if since is None else since

    def _waited_out(self) -> bool:
        since = self._unreachable_since
        return since is not None and time.monotonic() - since >= self.settings.takeover_seconds

    def _read_record(self) -> BrokerRecord | None:
        fresh = time.monotonic() - self._record_read_at >= RECORD_RECHECK_SECONDS
        if not fresh and (self._unreachable_since is not None or self._link is None):
            return self._record  # no broker to be had a moment ago: not worth a read per batch
        # A plain read: a commit here would also requeue expired leases, and the operation
        # this route is found for (``expire()``, say) would then report what it did as done.
        record = Snapshot.read(self.store).broker
        self._record_read_at = time.monotonic()
        return record

    def _direct_engine(self) -> Engine:
        if self._direct is None:
            self._direct = Engine(self.store, bodies=self.bodies, **self._engine_options)
            self._direct.on_commit(functools.partial(self._notify_if_readied, self._direct))
        return self._direct

    def _take_over(self, seen: BrokerRecord | None) -> Target | None:
        """Become the broker, if the record still says ``seen``; None when another won."""
        engine = Engine(self.store, exclusive=True, bodies=self.bodies, **self._engine_options)
        settings = self.settings
        server = BrokerServer(
            engine, listen=settings.listen, token=settings.token, tls=settings.tls
        )
        server.start()
        record = BrokerRecord(
            id=uuid.uuid4().hex,
            address=settings.advertise or server.address,
            epoch=0,
            since=0.0,
            tls=settings.tls is not None,
        )
        try:
            won = engine.submit(TakeBroker(record, None if seen is None else seen.epoch)).result()
        except (BrokerTaken, WriterFenced) as exc:
            log.info("another process became the broker first: %s", exc)
            server.stop(grace=0)
            self._record_read_at = float("-inf")
            return None
        except BaseException:
            server.stop(grace=0)
            raise
        engine.epoch = won.epoch
        server.hello = wire.Hello(won.id, self.store.url, won.epoch)
        engine.on_commit(functools.partial(self._notify_if_readied, engine))
        self._drop_link()
        self._leader, self._server, self._record = engine, server, won
        self._unreachable_since = None
        log.info("broker of %s at %s (epoch %d)", self.store.url, won.address, won.epoch)
        return engine

    def _open_link(self, address: str, *, tls: bool = False) -> BrokerLink:
        ca: str | bool | None = self.settings.tls_ca
        if ca == "system" or (tls and not ca):
            ca = True
        return BrokerLink(address, token=self.settings.token, tls_ca=ca if (tls or ca) else None)

    def _drop_link(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.close()

    def _drop_leader(self, grace: float) -> None:
        """Stop serving: requests in progress are answered (fenced ones with the error that
        sends their clients elsewhere), then the engine closes."""
        server, self._server = self._server, None
        leader, self._leader = self._leader, None
        if server is not None:
            server.stop(grace)
        elif leader is not None:
            leader.close()
        if leader is not None:
            self._retired.append(leader)
            self._record = None
            self._record_read_at = float("-inf")

    def _watch(self, link: BrokerLink) -> None:
        """Relay the broker's commit notices to this process's claimers while ``link`` is the
        current one; a broken stream is opened again after a pause."""
        while link is self._link and not self._closing:
            try:
                link.watch(self._notify_readied)
            except ObjqError as exc:
                log.debug("watch on %s ended: %s", link.address, exc)
            time.sleep(RETRY_PAUSE_SECONDS)

    def _notify_if_readied(self, engine: Engine) -> None:
        """After a commit of this process's broker engine (most are other processes'
        sessions): wake this process's claimers only if jobs became claimable."""
        mark = engine.readied
        if mark != self._readied_seen:
            self._readied_seen = mark
            self._notify_readied()

    def _notify_readied(self) -> None:
        self._readied_notices += 1
        self._notify()

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()


@dataclass
class _Lane:
    """A client id for one waiting claim at a time, and the number of its last request."""

    client: str
    seq: int = 0


#: What a waiting claim gets where it cannot wait: direct commits, or an older broker.
_CANNOT_WAIT: Outcomes = []


#: Committers still open. A process that exits without closing its queue (Celery's
#: ``app.close()`` leaves the transport's open) would leave its broker record behind, and every
#: other process would wait ``takeover_seconds`` to find it gone; its pipelined acks would be
#: lost. At exit, each is closed: what is pending is sent, and a broker resigns.
_open_at_exit: weakref.WeakSet[ElectedCommitter] = weakref.WeakSet()
#: How long closing one committer may hold up the exit of its process.
AT_EXIT_CLOSE_SECONDS = 5.0


@atexit.register
def _close_at_exit() -> None:
    for committer in list(_open_at_exit):
        with contextlib.suppress(Exception):  # exiting anyway: never raise from here
            committer.close(AT_EXIT_CLOSE_SECONDS)


def _check_serving(settings: BrokerSettings) -> None:
    """Refuse, before anything starts, settings under which this process could not serve."""
    if settings.mode != "auto":
        return
    require_token(settings.listen, settings.token)
    host = settings.listen.rsplit(":", 1)[0].strip("[]")
    if host in ("0.0.0.0", "::", "") and not settings.advertise:
        raise ConfigurationError(
            f"broker_listen {settings.listen!r} listens on every interface: set "
            "broker_advertise (or $OBJQ_BROKER_ADVERTISE) to the host:port other hosts reach"
        )
