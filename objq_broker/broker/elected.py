"""The elected broker: one process of a namespace commits for all, chosen among those running.

:class:`ElectedCommitter` is the :class:`~objq_broker.engine.port.Committer` of a queue opened
with ``broker="auto"``, ``"client"`` or an address (:mod:`objq_broker.broker.settings`). Its
one sender thread takes whatever operations are pending, numbers them as one
:class:`~objq_broker.model.ops.Session`, and commits it along one of three routes:

* **Leader**: this process holds the broker record. The session goes to its own exclusive
  engine, which also serves the other processes (:class:`~objq_broker.broker.server.BrokerServer`)
  and reads the state only after a conflict.
* **Follower**: another process holds it. The session goes there over libzmq; claimers wait on
  the broker's commit notices, not on storage.
* **Direct**: no broker can be had (``client`` mode with none reachable): the session is
  committed by compare-and-set, as with no broker at all.

Which route, and electing, following and failing over to find it, is the part it holds
(:class:`~objq_broker.broker.routing.BrokerRouting`); this module batches, sends and answers
sessions.

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
import itertools
import logging
import os
import time
import uuid
import weakref
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from objq_broker.broker import wire
from objq_broker.broker.keys import require_token
from objq_broker.broker.parking import LANE_STRIDE
from objq_broker.broker.routing import CANNOT_WAIT, BrokerRouting
from objq_broker.broker.settings import BrokerSettings
from objq_broker.engine.base import DEFAULT_COMMIT_DEADLINE_SECONDS
from objq_broker.engine.batch import EngineMetrics, Settles, Waiter
from objq_broker.engine.batcher import Batcher
from objq_broker.engine.bodies import BodyCache
from objq_broker.engine.commit import Engine
from objq_broker.engine.parts import Forwarded
from objq_broker.errors import (
    BrokerUnreachable,
    ConfigurationError,
    QueueClosed,
    RequestRefused,
)
from objq_broker.model.checks import MAX_SESSION_OPS
from objq_broker.model.ops import (
    Claim,
    Nothing,
    Op,
    Outcomes,
    Session,
)
from objq_broker.model.records import BrokerRecord, Job
from objq_broker.model.tally import job_events
from objq_broker.storage.base import ObjectStore

T = TypeVar("T")
log = logging.getLogger("objq_broker.broker")

#: Most payload bytes one session carries (encoded, a third more): well under what a broker
#: takes in one request (:data:`~objq_broker.broker.wire.MAX_REQUEST_BYTES`).
MAX_SESSION_PAYLOAD_BYTES = wire.MAX_REQUEST_BYTES // 4
#: Longest wait for a session to fill (see ``ElectedCommitter._linger``).
SESSION_LINGER_MAX_SECONDS = 0.005


class ElectedCommitter:
    """Commits through the namespace's elected broker (see the module's description): a
    batcher of sessions and a sender thread, over the routes it holds.

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
        self.commit_deadline_seconds = commit_deadline_seconds
        self._routes = BrokerRouting(
            store,
            settings,
            commit_deadline_seconds=commit_deadline_seconds,
            engine_options=engine_options,
        )
        self._start_sessions()

    def _start_sessions(self) -> None:
        """This client's sessions start over: a new id (never one another process used, a
        forked child's parent included), nothing pending, no sender yet."""
        self._sent = EngineMetrics()  # sessions and operations this client sent
        self.client_id = uuid.uuid4().hex
        #: Operations waiting for the sender thread, which takes a session at a time.
        self._batcher = self._new_batcher()
        self._seq = 0
        self._lanes: list[_Lane] = []  # lanes of waiting claims not in use
        self._lane_ids = itertools.count(1)
        self._round_trip = 0.0  # of the last session

    def __repr__(self) -> str:
        return f"ElectedCommitter({self.store.url!r}, {self.role})"

    def _forked(self) -> None:
        """In a child forked from the process that opened this committer: none of the
        parent's threads, sockets, engines or locks is the child's, and its broker is the
        parent's (or another's). The child starts over as a new client of that broker."""
        if self._batcher.closing:  # nothing to start over; a lock held at the fork must not bite
            self._batcher = self._new_batcher()
            self._batcher.close()
            return
        self._routes.start_over_as_client()
        self._start_sessions()

    @property
    def metrics(self) -> EngineMetrics:
        """Sessions and operations this process sent, with the storage requests of the engines
        it committed them with (as the broker, those include other processes' sessions)."""
        return self._routes.metrics(self._sent)

    settings = Forwarded[BrokerSettings](
        "_routes", "The mode and ``broker_*`` options (a forked child's ``auto`` is ``client``)."
    )
    bodies = Forwarded[BodyCache](
        "_routes", "Payload bodies kept out of the state, shared with the engines of the routes."
    )
    role = Forwarded[str](
        "_routes",
        "Where the last session went: 'leader', 'follower of <address>', 'direct', or "
        "'unresolved' before the first.",
    )
    record = Forwarded[BrokerRecord | None](
        "_routes", "The broker this process last used (its own record when it leads)."
    )
    readied = Forwarded[int](
        "_routes",
        "A mark that moves whenever this process learns of a commit that made jobs "
        "claimable (see :attr:`BrokerRouting.readied`).",
    )
    parked_claims = Forwarded[int](
        "_routes", "Claims waiting for jobs at this process, when it is the broker (0 otherwise)."
    )
    leader_engine = Forwarded[Engine | None](
        "_routes", "This process's broker engine, while it leads."
    )

    # --- the Committer interface -----------------------------------------------------------

    def submit(self, op: Op[T]) -> Future[T]:
        future: Future[T] = Future()
        self.submit_to([(op, future)])
        return future

    def submit_to(self, items: list[tuple[Op[Any], Settles]]) -> None:
        with self._batcher.cv:
            if self._batcher.closing:
                raise QueueClosed(f"the queue for {self.store.url} is closed")
            self._batcher.add(*items)

    def commit_here(self, items: list[tuple[Op[Any], Settles]]) -> bool:
        return False  # a session travels: the sender thread's, or a blocking caller's

    def call(self, op: Op[T]) -> T:
        """Send ``op`` and wait for its outcome. When no session is pending or in flight, the
        caller sends it itself: a hand-off to the sender thread and back would only add two
        thread switches."""
        future: Waiter[T] = Waiter()
        with self._batcher.cv:
            if self._batcher.closing:
                raise QueueClosed(f"the queue for {self.store.url} is closed")
            alone = self._batcher.take_alone((op, future))
        if alone:
            self._work([(op, future)])
        return future.result()

    def claim_waiting(self, claim: Claim, wait_seconds: float) -> list[Job] | None:
        """Claim, waiting up to ``wait_seconds`` at the broker for jobs if none are ready
        (:mod:`objq_broker.broker.parking`). None, having claimed nothing, when there is no
        broker to wait at (commits are direct, or the broker predates waiting claims): the
        caller waits its own way.

        The claim travels as a session of a lane of this client (one waiting claim at a
        time each), so after a lost broker the same session goes to the next one and is
        answered from the state, never applied twice."""
        with self._batcher.cv:
            if self._batcher.closing:
                raise QueueClosed(f"the queue for {self.store.url} is closed")
            lane = self._lanes.pop() if self._lanes else self._new_lane()
            lane.seq += LANE_STRIDE
        session = Session(lane.client, lane.seq, [claim])
        end = time.monotonic() + wait_seconds
        give_up = end + self.commit_deadline_seconds
        try:
            while (outcomes := self._routes.claim_at_route(session, end)) is None:
                if time.monotonic() >= give_up:
                    raise BrokerUnreachable(
                        f"{self.store.url}: no broker took the claim within "
                        f"{self.commit_deadline_seconds:g} s; last error: "
                        f"{self._routes.last_error}"
                    )
                self.submit(Nothing()).result()  # the sender finds the route (fails over)
        finally:
            with self._batcher.cv:
                self._lanes.append(lane)
        if outcomes is CANNOT_WAIT:
            return None
        ok, value = outcomes[0]
        if not ok:
            raise value
        found: list[Job] = value
        self._sent.count({"claimed": len(found)})
        return found

    def _new_lane(self) -> _Lane:
        return _Lane(f"{self.client_id}.{next(self._lane_ids)}")

    def flush(self, timeout: float | None = None) -> None:
        with self._batcher.cv:
            if self._batcher.thread is None:
                return
        self.submit(Nothing()).result(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Send what is pending, then stop. A leader clears its record first, so the next
        process to need a broker takes over without waiting for it to be found gone."""
        with self._batcher.cv:
            if self._batcher.closing:
                return
            self._routes.begin_closing()
            self._batcher.close()
            thread = self._batcher.thread
        if thread is not None:
            thread.join(timeout)
        self._routes.close(timeout)

    def on_commit(self, listener: Callable[[], None]) -> None:
        self._routes.on_commit(listener)

    @property
    def closed(self) -> bool:
        return self._batcher.closing

    def check(self, timeout: float | None = None) -> str:
        """Send an empty session and wait for it: an idle standby finds a lost broker (and
        takes over) this way. Returns :attr:`role`."""
        self.submit(Nothing()).result(timeout)
        return self.role

    # --- the sender thread -----------------------------------------------------------------

    def _run(self) -> None:
        batcher = self._batcher
        while True:
            with batcher.cv:
                # A caller sending its own op (see ``call``) holds the batcher busy.
                while batcher.busy or not batcher.pending:
                    if batcher.closing and not batcher.pending and not batcher.busy:
                        return
                    batcher.cv.wait()
                self._linger()
                batch = batcher.take()
            self._work(batch)

    def _work(self, batch: list[tuple[Op[Any], Settles]]) -> None:
        """Send ``batch`` as one session (on the sender thread, or a caller's) and resolve
        its futures."""
        live: list[tuple[Op[Any], Settles]] = []
        sent_at = time.monotonic()
        try:
            live = [(op, future) for op, future in batch if future.set_running_or_notify_cancel()]
            if not live:
                return
            if len(live) > 1:
                # Claims last (a stable sort), as a direct commit orders its batch: a claim
                # sees the jobs enqueued in its own session, instead of missing one sent a
                # moment after it and waiting a commit more for it.
                live.sort(key=_claims)
            outcomes = self._send([op for op, _ in live])
            self._sent.batches += 1
            self._sent.ops += len(live)
            self._count_job_events(live, outcomes)
        finally:
            self._batcher.done()  # (whatever happened: the next batch may go)
        self._round_trip = time.monotonic() - sent_at
        for (_, future), (ok, value) in zip(live, outcomes, strict=True):
            with contextlib.suppress(InvalidStateError):
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
        self._routes.notify()

    def _send(self, ops: list[Op[Any]]) -> Outcomes:
        """Send ``ops`` as the next session and return their outcomes; every op learns why if
        it failed, and nothing hangs. A session refused whole, unapplied (it did not encode,
        or the broker's decoder refused a value of one operation), is sent again one
        operation per session: the bad one fails alone, as it would in a direct commit."""
        self._seq += 1
        try:
            return self._routes.commit(Session(self.client_id, self._seq, ops))
        except _REFUSED_WHOLE as exc:
            if len(ops) == 1:
                return [(False, exc)]
            log.info("session refused whole (%s); sending its operations one by one", exc)
            return [outcome for op in ops for outcome in self._send([op])]
        except Exception as exc:
            return [(False, exc)] * len(ops)

    def _count_job_events(self, live: list[tuple[Op[Any], Settles]], outcomes: Outcomes) -> None:
        """Count what this client's operations did to jobs, from the outcomes the broker (or
        a direct commit) gave back. Never fails a session that was answered."""
        try:
            for (op, _), (ok, value) in zip(live, outcomes, strict=False):
                if ok:
                    self._sent.count(job_events(op, value))
        except Exception:
            log.exception("counting a session's job events failed")

    def _linger(self) -> None:
        """Let a session fill before sending it (called holding the batcher's ``cv``): wait, a
        fraction of a round trip at most, for the callers the last session released. One
        caller never waits."""
        span = min(SESSION_LINGER_MAX_SECONDS, self._round_trip / 4)
        self._batcher.linger(span)

    def _new_batcher(self) -> Batcher[tuple[Op[Any], Settles]]:
        return Batcher(
            f"objq-elected {self.store.url}",
            self._run,
            size=_op_size,
            max_items=MAX_SESSION_OPS,
            max_bytes=MAX_SESSION_PAYLOAD_BYTES,
        )


def _op_size(pending: tuple[Op[Any], Settles]) -> int:
    """Payload bytes of a pending operation: a session holds at most
    :data:`MAX_SESSION_PAYLOAD_BYTES`, and an operation larger than a broker takes travels
    alone, and is refused alone."""
    return pending[0].size


def _claims(pending: tuple[Op[Any], Settles]) -> bool:
    return pending[0].consumer


@dataclass
class _Lane:
    """A client id for one waiting claim at a time, and the number of its last request."""

    client: str
    seq: int = 0


#: What a session refused before anything of it was applied raises: the broker's decoder
#: refused a value, or it did not encode (a lone surrogate in a string is a
#: ``UnicodeEncodeError``, a ``ValueError``).
_REFUSED_WHOLE = (RequestRefused, ValueError, TypeError, msgspec.EncodeError)

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


def _after_fork_in_child() -> None:
    for committer in list(_open_at_exit):
        committer._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


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
