"""Where a session goes: the routes an :class:`~objq_broker.broker.elected.ElectedCommitter` holds.

A route is one of three: this process's own broker engine (it holds the broker record, and
serves the others through :class:`~objq_broker.broker.server.BrokerServer`), a link to the
process that holds it, or a direct engine that commits by compare-and-set. :class:`BrokerRouting`
reads the record, follows the broker it names, asks an unreachable one who it is, takes over
when it is gone for ``takeover_seconds`` (``auto`` mode), steps down when fenced, and relays
the broker's commit notices to this process's claimers. The committer that holds it batches
sessions, sends them along :meth:`BrokerRouting.commit`, and waits claims at the route
(:meth:`BrokerRouting.claim_at_route`); see :mod:`~objq_broker.broker.elected`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from objq_broker.broker import wire
from objq_broker.broker.client import BrokerLink
from objq_broker.broker.keys import is_loopback
from objq_broker.broker.server import BrokerServer
from objq_broker.broker.settings import BrokerSettings
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
from objq_broker.model.ops import Outcomes, ResignBroker, Session, TakeBroker
from objq_broker.model.records import BrokerRecord
from objq_broker.storage.base import ObjectStore

log = logging.getLogger("objq_broker.broker")

#: Pause between looks while the broker is unreachable (hello, then the record).
RETRY_PAUSE_SECONDS = 0.25
#: How long a read of the broker record is trusted while no broker can be reached.
RECORD_RECHECK_SECONDS = 1.0

Target = Engine | BrokerLink

#: What a waiting claim gets where it cannot wait: direct commits, or an older broker.
CANNOT_WAIT: Outcomes = []


def host_id() -> str:
    """Which loopback this process shares: its host's name and network namespace (processes
    in two containers of one machine reach each other's loopback no more than two hosts do)."""
    try:
        namespace = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        namespace = 0
    return f"{socket.gethostname()}/{namespace}"


class BrokerRouting:
    """The routes of an :class:`~objq_broker.broker.elected.ElectedCommitter`: what it knows
    of the namespace's broker, and how it elects, follows and fails over. It owns the engines
    this process runs (as the broker, or directly), the server and the link, and the payload
    bodies they share."""

    def __init__(
        self,
        store: ObjectStore,
        settings: BrokerSettings,
        *,
        commit_deadline_seconds: float,
        engine_options: dict[str, Any] | None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.commit_deadline_seconds = commit_deadline_seconds
        self._engine_options = dict(engine_options or {})
        self._engine_options["commit_deadline_seconds"] = commit_deadline_seconds
        self._listeners: list[Callable[[], None]] = []
        self._start()

    def start_over_as_client(self) -> None:
        """In a child forked from the process that opened these routes: none of the parent's
        engines, server or link is the child's (they are left as they are, unused), and the
        child never serves (a pool child leaves with ``os._exit``, never handing the role
        over). The listeners stay."""
        if self.settings.mode == "auto":
            self.settings = dataclasses.replace(self.settings, mode="client")
        self._start()

    def _start(self) -> None:
        """No route yet: nothing led, followed or committed directly."""
        self._closing = False
        self.bodies = BodyCache(self.store)
        #: The broker record each warning was last given about: each is said once a record.
        self._told: dict[str, str] = {}
        self._writes_when_lost: int | None = None  # the broker's writes when it was lost
        self._direct_until = float("-inf")  # commit directly until then (see _still_writing)
        self._retired: list[Engine] = []  # engines this process led with before
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
    def last_error(self) -> Exception | None:
        """Why the last route failed, if one did."""
        return self._last_error

    @property
    def patience(self) -> float:
        """How long a call waits on the broker before asking whether it is still there."""
        return max(self.settings.takeover_seconds, 1.0)

    def engines(self) -> list[Engine]:
        """The engines this process has committed with: as the broker (now or before), and
        directly."""
        return [e for e in (*self._retired, self._leader, self._direct) if e is not None]

    def metrics(self, sent: EngineMetrics) -> EngineMetrics:
        """``sent`` (what a client sent) with the storage requests of :meth:`engines` (as
        the broker, those include other processes' sessions)."""
        total = EngineMetrics(ops=sent.ops, batches=sent.batches)
        total.add_job_events(sent)
        for engine in self.engines():
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

    def on_commit(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after each session's return and each commit that readied jobs."""
        self._listeners.append(listener)

    # --- sessions along the route ----------------------------------------------------------

    def commit(self, session: Session) -> Outcomes:
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
                    return target.apply(session, self.patience)
                return target.call(session)
            except WriterFenced as exc:  # that broker (maybe this process) was replaced
                log.info("broker replaced: %s", exc)
                self._lost(exc, since=started, fenced=True)
            except BrokerUnreachable as exc:
                self._lost(exc, since=started)

    def claim_at_route(self, session: Session, end: float) -> Outcomes | None:
        """One try of a waiting claim on the current route; None when there is none, or it
        failed (a session must find one first); :data:`CANNOT_WAIT` when the route takes no
        waiting claims."""
        left = max(end - time.monotonic(), 0.0)
        server, leader, link = self._server, self._leader, self._link
        try:
            if server is not None and leader is not None and leader.fenced is None:
                return server.park.claim(session, left)
            if link is not None and self._unreachable_since is None:
                return link.claim(session, left, left + self.patience) or CANNOT_WAIT
        except (BrokerUnreachable, WriterFenced) as exc:
            log.info("waiting claim at %s failed, sending it again: %s", link, exc)
            return None
        except QueueClosed:  # this process's broker engine, closed as it stepped down
            if self._closing:
                raise
            return None
        if self._used is not None and self._used is self._direct:
            return CANNOT_WAIT
        return None

    def begin_closing(self) -> None:
        """The committer is closing: what is left on the way out commits directly if the
        broker is out of reach."""
        self._closing = True

    def close(self, timeout: float | None) -> None:
        """Stop every route. A leader clears its record first, so the next process to need a
        broker takes over without waiting for it to be found gone."""
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
        if time.monotonic() < self._direct_until:
            return self._direct_engine()
        record = self._read_record()
        if record is not None and self._out_of_reach(record):
            self._drop_link()
            self._record = record  # the record read again each RECORD_RECHECK_SECONDS
            return self._direct_engine()
        if record != self._record or (record is not None and self._link is None):
            self._follow(record)
            if self._link is not None and self._reachable(self._link, record):
                return self._link
        elif self._link is not None and self._reachable(self._link, record):
            return self._link  # slow, not gone: it gets the same session again
        if record is not None and not self._waited_out():
            return None
        if record is not None and self._still_writing(record):
            return self._direct_engine()
        if self.settings.mode == "auto":
            return self._take_over(record)
        return self._direct_engine()

    def _still_writing(self, record: BrokerRecord) -> bool:
        """Whether ``record``'s broker, unreachable from here for ``takeover_seconds``, wrote
        the state meanwhile: it lives, and serves others (a network cut this process off, or a
        firewall). Taking over would only fence it and be fenced back in turn, so this process
        commits directly for another ``takeover_seconds``, then looks again."""
        writes = self._broker_writes_now()
        baseline, self._writes_when_lost = self._writes_when_lost, writes
        if baseline is None or writes is None or writes <= baseline:
            return False
        self._tell_once(
            "still writing",
            record,
            "%s: the broker at %s (epoch %d) is unreachable from here but still commits; "
            "this process commits directly until it can reach it (check the network "
            "between them, and that broker_advertise names an address this host reaches)",
            self.store.url,
            record.address,
            record.epoch,
        )
        self._direct_until = time.monotonic() + self.settings.takeover_seconds
        self._unreachable_since = time.monotonic()
        return True

    def _out_of_reach(self, record: BrokerRecord) -> bool:
        """Whether ``record``'s broker serves only another host's loopback: alive for that
        host's processes, unreachable from here by design. This process neither waits for it
        nor takes over (each host would take it from the other in turn): it commits directly,
        and says once how to share one broker across hosts."""
        if not record.host or record.host == host_id() or not is_loopback(record.address):
            return False
        self._tell_once(
            "out of reach",
            record,
            "%s: the broker (epoch %d) serves only its own host's loopback (%s on %s); "
            "this process commits directly. To share one broker across hosts, give the "
            "processes that may serve broker_listen=0.0.0.0:PORT, broker_advertise=HOST:PORT "
            "and the same broker_token (OBJQ_BROKER_LISTEN, OBJQ_BROKER_ADVERTISE, "
            "OBJQ_BROKER_TOKEN)",
            self.store.url,
            record.epoch,
            record.address,
            record.host.split("/", 1)[0],
        )
        return True

    def _tell_once(self, warning: str, record: BrokerRecord, message: str, *args: object) -> None:
        """Log ``message`` as a warning, unless this ``warning`` was given about ``record``
        last time: a state that lasts is said once, not at every operation."""
        if self._told.get(warning) != record.id:
            self._told[warning] = record.id
            log.warning(message, *args)

    def _fixed_link(self) -> Target | None:
        address = self.settings.address or ""
        if self._link is None:
            self._link = self._open_link(address, recorded=False)
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
            self._link = self._open_link(record.address, key=record.key)
            self._link.watch(self._notify_readied)

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
            self._writes_when_lost = self._broker_writes_now()
            # Read the record again at the next look: a broker that closed cleared it, and
            # the next process to need one takes over at once instead of waiting it out.
            self._record_read_at = float("-inf")

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

    def _broker_writes_now(self) -> int | None:
        """How many commits the broker has written, as of a read now (None if it failed)."""
        try:
            return Snapshot.read(self.store).broker_writes
        except ObjqError as exc:
            log.info("reading %s to judge its broker failed: %s", self.store.url, exc)
            return None

    def _direct_engine(self) -> Engine:
        if self._direct is None:
            self._direct = Engine(self.store, bodies=self.bodies, **self._engine_options)
            self._direct.on_commit(functools.partial(self._notify_if_readied, self._direct))
        return self._direct

    def _take_over(self, seen: BrokerRecord | None) -> Target | None:
        """Become the broker, if the record still says ``seen``; None when another won."""
        engine = Engine(self.store, exclusive=True, bodies=self.bodies, **self._engine_options)
        settings = self.settings
        try:
            server = BrokerServer(engine, listen=settings.listen, token=settings.token)
        except ConfigurationError as exc:
            # Another process of this host serves (or just served) on that fixed port: this
            # one commits directly for a while instead of failing the caller's operations.
            engine.close()
            log.warning(
                "%s: cannot serve as the broker, committing directly: %s", self.store.url, exc
            )
            self._direct_until = time.monotonic() + self.settings.takeover_seconds
            return self._direct_engine()
        server.start()
        record = BrokerRecord(
            id=uuid.uuid4().hex,
            address=settings.advertise or server.address,
            epoch=0,
            since=0.0,
            key=server.public_key,
            host=host_id(),
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

    def _open_link(
        self, address: str, *, key: str | None = None, recorded: bool = True
    ) -> BrokerLink:
        return BrokerLink(address, token=self.settings.token, key=key, recorded=recorded)

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

    def _notify_if_readied(self, engine: Engine) -> None:
        """After a commit of this process's broker engine (most are other processes'
        sessions): wake this process's claimers only if jobs became claimable."""
        mark = engine.readied
        if mark != self._readied_seen:
            self._readied_seen = mark
            self._notify_readied()

    def _notify_readied(self) -> None:
        self._readied_notices += 1
        self.notify()

    def notify(self) -> None:
        """Tell the listeners: a session returned, or a commit readied jobs."""
        for listener in self._listeners:
            listener()
