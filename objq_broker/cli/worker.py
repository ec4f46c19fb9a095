"""``objq worker``: run command jobs from a queue.

One process runs ``count`` commands at a time, each in a runner thread, and holds up to
``prefetch`` more claimed jobs waiting for a runner. Every job it holds, waiting or running, is
a lease; one heartbeat thread (:class:`~objq_broker.consume.LeaseKeeper`) extends them all in one
operation every third of the lease, so a long command is never handed to another worker while
this one lives, and a killed worker's jobs run again once their leases expire. A waiting job
whose lease was lost anyway (storage out of reach for a whole lease) is not started here.

Exit code 0 acks the job; anything else nacks it with the tail of its stderr as the error
(secrets redacted, see :mod:`objq_broker.cli.redact`), and the queue retries it after its
exponential backoff or dead-letters it once its attempts are spent. A payload that is not a
command job, or whose env sets a variable the worker does not allow
(:func:`~objq_broker.cli.cmdjob.check_env`), is dead-lettered at once (no retry can fix it).

SIGTERM or SIGINT: claim nothing more, give back the waiting jobs (no attempt counted), let the
running commands finish within the stop grace, kill and give back those that do not, then exit
0. Stopping is bounded even when storage does not answer: :mod:`objq_broker.cli.stopping`.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import time
from collections.abc import Set
from dataclasses import dataclass, field
from typing import Any

import click

from objq_broker.builders import default_owner
from objq_broker.cli import cmdjob
from objq_broker.cli.commands import command, objq
from objq_broker.cli.context import Context
from objq_broker.cli.inspect import parse_duration
from objq_broker.cli.output import (
    EscapingFormatter,
    UsageError,
    counted,
    print_json,
    printable,
)
from objq_broker.cli.redact import Redactor
from objq_broker.cli.stopping import DEFAULT_GRACE_SECONDS, Shutdown
from objq_broker.cli.values import DURATION, LISTEN, MAX_THREADS, POSITIVE_DURATION, whole
from objq_broker.consume import LeaseKeeper, interval_for
from objq_broker.errors import ConfigurationError, LeaseLost, ObjqError
from objq_broker.model.checks import MAX_CLAIM
from objq_broker.queue import Delivery, Queue

log = logging.getLogger("objq_broker.worker")

#: Seconds one claim waits for a job before the worker looks at its signals again.
CLAIM_WAIT_SECONDS = 1.0
#: How often a ``--burst`` worker looks again while the jobs left are delayed or held elsewhere.
BURST_POLL_SECONDS = 0.2


@dataclass
class Tally:
    done: int = 0
    retry: int = 0
    dead: int = 0
    lost: int = 0
    released: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class CommandWorker:
    """Runs the command jobs of ``queue_name`` until stopped (or, with ``burst``, until the
    queue has nothing ready, delayed or in flight)."""

    queue: Queue
    queue_name: str
    count: int = 1
    prefetch: int = 1
    default_timeout: float | None = None
    burst: bool = False
    json: bool = False
    #: Loader variables (``PATH``, ``LD_PRELOAD``, ...) that jobs may set all the same.
    allowed_env: frozenset[str] = frozenset()
    #: Stop requests and the running commands' process groups.
    shutdown: Shutdown = field(default_factory=Shutdown)
    #: What takes secrets out of stored errors: built from this process's environment.
    redactor: Redactor = field(default_factory=lambda: Redactor(os.environ))
    tally: Tally = field(default_factory=Tally)

    def __post_init__(self) -> None:
        self._cv = threading.Condition()
        self._waiting: collections.deque[Delivery] = collections.deque()
        self._running: dict[str, Delivery] = {}
        self._lost: set[str] = set()  # lease tokens of running jobs whose leases were lost
        self._stopping = self.shutdown.stopping
        self._claiming_done = False
        self._lease_seconds = self.queue.config(self.queue_name).lease_seconds

    def stop(self) -> None:
        """Claim nothing more; finish what runs (as the first SIGTERM does)."""
        self._stopping.set()

    # --- main loop -------------------------------------------------------------------------

    def run(self) -> Tally:
        runners = [
            threading.Thread(target=self._runner, name=f"objq-runner-{i}", daemon=True)
            for i in range(self.count)
        ]
        keeper = LeaseKeeper(self.queue, interval_seconds=interval_for(self._lease_seconds))
        keeper.register(self)
        for thread in runners:
            thread.start()
        try:
            self._claim_loop()
        finally:
            self._give_back_waiting()
            with self._cv:
                self._claiming_done = True
                self._cv.notify_all()
            for thread in runners:
                thread.join()
            self._stopping.set()
            keeper.stop()
            self.queue.flush()
        return self.tally

    def _claim_loop(self) -> None:
        capacity = self.count + self.prefetch
        while not self._stopping.is_set():
            with self._cv:
                room = capacity - len(self._waiting) - len(self._running)
                if room <= 0:
                    self._cv.wait(CLAIM_WAIT_SECONDS)
                    continue
            # A burst worker must notice an empty queue at once, not after a claim's wait.
            wait = None if self.burst else CLAIM_WAIT_SECONDS
            claimed = self.queue.claim(self.queue_name, room, timeout=wait)
            with self._cv:
                self._waiting.extend(claimed)
                self._cv.notify_all()
                idle = not self._waiting and not self._running
                if not claimed and self.burst and not idle:
                    self._cv.wait(BURST_POLL_SECONDS)  # woken when a runner finishes
            if self._stopping.is_set():
                return
            if not claimed and idle and self.burst:
                if self._queue_empty():
                    return
                time.sleep(BURST_POLL_SECONDS)  # delayed or others' jobs: look again soon

    def _queue_empty(self) -> bool:
        stats = self.queue.stats(self.queue_name)
        return stats.ready + stats.delayed + stats.in_flight == 0

    def _give_back_waiting(self) -> None:
        with self._cv:
            waiting = list(self._waiting)
            self._waiting.clear()
        if waiting:
            try:
                released = self.queue.release(waiting) or []
            except ObjqError as exc:
                log.warning("could not give back %d prefetched jobs: %s", len(waiting), exc)
                return
            self.tally.released += sum(released)
            self._event({"event": "released", "ids": [d.id for d in waiting]})

    # --- runners ---------------------------------------------------------------------------

    def _runner(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._claiming_done:
                    if self._stopping.is_set():
                        return
                    self._cv.wait(CLAIM_WAIT_SECONDS)
                if not self._waiting or self._stopping.is_set():
                    return  # stopping: what waits is given back, not started
                delivery = self._waiting.popleft()
                self._running[delivery.id] = delivery
                self._cv.notify_all()
            try:
                self._process(delivery)
            except Exception:  # a runner must outlive a failure: the lease brings the job back
                log.exception("job %s: could not be settled", delivery.id)
            finally:
                with self._cv:
                    self._running.pop(delivery.id, None)
                    self._lost.discard(delivery.token)
                    self._cv.notify_all()

    def _process(self, delivery: Delivery) -> None:
        try:
            job = cmdjob.check_env(cmdjob.decode(delivery.payload), self.allowed_env)
        except ConfigurationError as exc:
            self._settle(delivery, cmdjob.Outcome(None, 0.0, str(exc)), retry=False)
            return
        self._event({"event": "started", "id": delivery.id, "attempt": delivery.job.attempts})
        stdout = sys.stderr.fileno() if self.json else None  # keep --json output parseable
        outcome = cmdjob.run(
            job,
            default_timeout=self.default_timeout,
            stdout=stdout,
            abort=self.shutdown.abort,
            redactor=self.redactor,
            groups=self.shutdown.commands,
        )
        self._settle(delivery, outcome, retry=True)

    def _settle(self, delivery: Delivery, outcome: cmdjob.Outcome, *, retry: bool) -> None:
        # Whatever the error quotes goes to the state and the archive: no secrets, bounded.
        error = None if outcome.error is None else self.redactor.stored(outcome.error)
        result: str
        try:
            if outcome.ok:
                self.queue.ack(delivery)
                result = "done"
            elif outcome.stopped:  # killed by the worker's stop: given back, no attempt counted
                [held] = self.queue.release([delivery]) or [True]
                result = "released" if held else "lost"
            else:
                result = self.queue.nack(delivery, error=error, retry=retry) or "retry"
        except LeaseLost as exc:
            result = "lost"
            log.warning("job %s: %s", delivery.id, exc)
        with self._cv:  # runners finish at the same time
            setattr(self.tally, result, getattr(self.tally, result) + 1)
        self._event(
            {
                "event": "finished",
                "id": delivery.id,
                "attempt": delivery.job.attempts,
                "outcome": result,
                "exit_code": outcome.exit_code,
                "seconds": round(outcome.seconds, 3),
                "error": error,
            }
        )

    # --- leases (the LeaseKeeper's holder) ------------------------------------------------

    def held(self) -> list[Delivery]:
        """Every job this worker holds: waiting for a runner, and running."""
        with self._cv:
            running = [d for d in self._running.values() if d.token not in self._lost]
            return [*self._waiting, *running]

    def drop(self, tokens: Set[str]) -> None:
        """Leases lost (another worker may run these jobs): waiting ones are not started here,
        running ones are no longer heartbeated (their settling will say ``lost``)."""
        with self._cv:
            kept = [d for d in self._waiting if d.token not in tokens]
            self.tally.lost += len(self._waiting) - len(kept)
            self._waiting = collections.deque(kept)
            self._lost.update(d.token for d in self._running.values() if d.token in tokens)

    # --- output ----------------------------------------------------------------------------

    def _event(self, event: dict[str, Any]) -> None:
        event["at"] = round(time.time(), 3)
        if self.json:
            print_json(event)
            return
        if event["event"] == "finished":
            message = (
                f"job {event['id']} attempt {event['attempt']}: ran {event['seconds']:.2f} s, "
                f"{event['outcome']}"
            )
            if event["error"]:
                message += f" ({event['error'].splitlines()[0][:120]})"
        elif event["event"] == "started":
            message = f"job {event['id']} attempt {event['attempt']}: started"
        else:
            message = f"gave back {counted(len(event['ids']), 'prefetched job')}"
        # One write (runners print at once), escaped: ids and errors come from the store.
        sys.stderr.write(f"objq worker: {printable(message)}\n")
        sys.stderr.flush()


# --- the command -------------------------------------------------------------------------------


@command(objq, "worker", "run command jobs")
@click.option("--queue", required=True)
@click.option("--count", type=whole(1, MAX_THREADS), default=1, help="commands run at once (1)")
@click.option(
    "--prefetch",
    type=whole(0, MAX_CLAIM - MAX_THREADS),  # one claim asks for --count + --prefetch
    help="jobs claimed ahead (default: --count)",
)
@click.option("--timeout", type=POSITIVE_DURATION, metavar="SECONDS", help="for jobs that set none")
@click.option("--burst", is_flag=True, help="exit once the queue is empty")
@click.option("--declare", is_flag=True, help="declare the queue if missing (else: an error)")
@click.option(
    "--metrics-listen",
    type=LISTEN,
    metavar="HOST:PORT",
    help="serve this worker's Prometheus metrics at http://HOST:PORT/metrics",
)
@click.option(
    "--stop-grace",
    type=DURATION,
    metavar="SECONDS",
    help="after SIGTERM, how long running commands may go on before they are killed and their jobs "
    "given back (25s)",
)
@click.option(
    "--allow-env",
    multiple=True,
    metavar="NAME",
    help="let jobs set NAME in their env although it changes what runs (PATH, LD_*, PYTHONPATH, "
    "...); repeatable",
)
def cmd_worker(ctx: Context) -> int:
    """``objq worker``: options are checked here, before anything is read; the worker itself
    runs under a :class:`Shutdown` that keeps it stoppable."""
    handler = logging.StreamHandler()
    handler.setFormatter(EscapingFormatter("objq worker: %(message)s"))
    logging.basicConfig(handlers=[handler], level=logging.WARNING)
    a = ctx.args
    timeout = None if a.timeout is None else parse_duration(a.timeout)
    grace = DEFAULT_GRACE_SECONDS if a.stop_grace is None else parse_duration(a.stop_grace)
    if (a.prefetch is not None and a.prefetch < 0) or timeout == 0 or grace < 0:
        raise UsageError(
            f"worker: expected --prefetch >= 0, --timeout > 0 and --stop-grace >= 0, found "
            f"{a.prefetch}, {a.timeout} and {a.stop_grace}"
        )
    allowed = frozenset(a.allow_env or ())
    for name in allowed:
        if not name or "=" in name:
            raise UsageError(f"--allow-env: expected a variable name, found {name!r}")
    shutdown = Shutdown(grace_seconds=grace)
    shutdown.install()  # before the first read: a store that never answers must not hold it
    return shutdown.run(lambda: _serve(ctx, shutdown, timeout, allowed))


def _serve(ctx: Context, shutdown: Shutdown, timeout: float | None, allowed: frozenset[str]) -> int:
    a = ctx.args
    try:
        # A worker may well start before the first job is enqueued: it creates a missing
        # directory as Dramatiq and Celery workers on the same URL do. It does not create its
        # queue unless asked (--declare): a mistyped name must fail, not wait for ever.
        ctx.snapshot(create=True)
        queue = ctx.queue(create=True, serves=True, owner=default_owner("objq-worker"))
        if a.declare:
            queue.declare(a.queue)
        worker = CommandWorker(
            queue,
            a.queue,
            count=a.count,
            prefetch=a.count if a.prefetch is None else a.prefetch,
            default_timeout=timeout,
            burst=a.burst,
            json=ctx.json,
            allowed_env=allowed,
            shutdown=shutdown,
        )
        tally = _run_with_metrics(ctx, worker)
    finally:
        ctx.close()  # here, under the shutdown's deadlines: closing flushes to storage
    ctx.emit({"event": "stopped", **tally.as_dict()}, "")
    if not ctx.json:
        print(
            "objq worker: stopped; " + ", ".join(f"{k} {v}" for k, v in tally.as_dict().items()),
            file=sys.stderr,
        )
    return 0


def _run_with_metrics(ctx: Context, worker: CommandWorker) -> Tally:
    if ctx.args.metrics_listen is None:
        return worker.run()
    from objq_broker.cli.exporter import metrics_module, serve_metrics

    registry = metrics_module("objq worker --metrics-listen").worker_registry(worker.queue)
    server = serve_metrics(registry, ctx.args.metrics_listen, "--metrics-listen")
    ctx.emit({"event": "metrics", "metrics": server.url}, f"objq worker: metrics at {server.url}")
    try:
        return worker.run()
    finally:
        server.stop()
