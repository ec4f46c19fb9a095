"""A fleet of idle framework workers on one objq namespace, each process counted apart.

The example apps (``integrations.dramatiq_app`` and ``integrations.celery_app``) run unchanged,
configured by environment variables: ``OBJQ_URL`` and ``CELERY_BROKER_URL`` name one S3 store,
``OBJQ_BROKER`` the broker mode. Every worker process reaches S3 through its own listener of a
:class:`~tests.support.counting_proxy.CountingProxy`, so the counts say whose requests they
were. Used by ``benchmarks/idle_requests.py`` and ``tests/broker/test_idle_framework_workers.py``.

::

    with IdleFleet(proxy, bucket="jobs-bucket", mode="elected", workdir=tmp) as fleet:
        fleet.start(dramatiq=4, celery=4)
        fleet.wait_ready(timeout=180)
        before = fleet.requests()
        ...                                # the idle window
        fleet.wake(timeout=60)             # one job per framework, run by some worker
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

from tests.support.counting_proxy import CountingProxy, Request
from tests.support.processes import Children
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
#: ``OBJQ_BROKER`` for each mode measured: every process polls storage itself, or (unset: the
#: default) the processes elect one of themselves to commit for all.
BROKER_MODES: Mapping[str, str | None] = {"direct": "off", "elected": None}
#: Key prefix of the namespace in its bucket.
PREFIX = "objq"
#: What each framework's worker logs once it consumes (Dramatiq's worker process, Celery's
#: consumer), at the INFO level both are started with.
READY_LINES: Mapping[str, re.Pattern[str]] = {
    "dramatiq": re.compile(r"Worker process is ready for action"),
    "celery": re.compile(r"@\S+ ready\."),
}
#: Seconds a wake-up producer process gets to start, send and exit.
PRODUCER_TIMEOUT_SECONDS = 120.0
#: First argument of the ``add`` jobs the wake-up check sends (Dramatiq, Celery): both apps
#: record ``add X 1 X+1``, so the numbers tell whose job ran.
WAKE_NUMBERS = {"dramatiq": 10_000, "celery": 20_000}
#: Length of the slices compared while waiting for the request rate to settle.
SETTLE_SLICE_SECONDS = 10.0
#: Two slices see the same rate when they differ by at most this share, or this many requests.
SETTLE_TOLERANCE = 0.25
SETTLE_SLACK_REQUESTS = 2

Framework = Literal["dramatiq", "celery"]


@dataclass
class Worker:
    """One worker command of the fleet (its process group holds the framework's children)."""

    label: str
    framework: Framework
    process: subprocess.Popen[bytes]
    log: Path

    def ready(self) -> bool:
        """Whether its log says it consumes; an exited worker fails the wait at once."""
        if self.process.poll() is not None:
            raise RuntimeError(
                f"{self.label} exited with code {self.process.returncode} before it was ready; "
                f"log tail: {tail(self.log)!r}"
            )
        return self.log.exists() and bool(READY_LINES[self.framework].search(self.log.read_text()))


@dataclass(frozen=True)
class Wake:
    """Seconds from a job's send until its line appeared, per framework."""

    dramatiq_seconds: float
    celery_seconds: float


class IdleFleet:
    """Dramatiq and Celery worker processes of the example apps, idle on one namespace.

    ``mode`` is a key of ``BROKER_MODES``. Listeners are named ``<mode>/<framework>-<n>``
    (and ``<mode>/producer`` for the wake-up check), so one proxy can serve several fleets.
    Leaving the ``with`` (or ``stop()``) stops every worker it started.
    """

    def __init__(self, proxy: CountingProxy, *, bucket: str, mode: str, workdir: Path) -> None:
        if mode not in BROKER_MODES:
            raise ValueError(f"expected a mode among {sorted(BROKER_MODES)}, found {mode!r}")
        self.children = Children()
        self.proxy = proxy
        self.bucket = bucket
        self.mode = mode
        self.workdir = workdir
        self.results = workdir / "results"
        self.workers: list[Worker] = []
        self._producer_url = proxy.listen(f"{mode}/producer")
        self._wakes = 0

    @property
    def listeners(self) -> set[str]:
        return {worker.label for worker in self.workers} | {f"{self.mode}/producer"}

    def environment(self, endpoint_url: str) -> dict[str, str]:
        """The environment of a process of this fleet reaching S3 at ``endpoint_url``."""
        store = f"s3://{self.bucket}/{PREFIX}?endpoint_url={endpoint_url}"
        env = {k: v for k, v in os.environ.items() if k != "OBJQ_BROKER"}
        env.update(
            OBJQ_URL=store,
            CELERY_BROKER_URL=f"objq+{store}",
            APP_RESULTS_DIR=str(self.results),
            PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p),
        )
        mode = BROKER_MODES[self.mode]
        if mode is not None:
            env["OBJQ_BROKER"] = mode
        return env

    def start(self, *, dramatiq: int, celery: int, celery_chatter: bool = False) -> None:
        """Start ``dramatiq`` single-process, single-thread Dramatiq workers and ``celery``
        solo-pool Celery workers (one consumer process each).

        Celery workers start without gossip, mingle and event heartbeats unless
        ``celery_chatter``: those are messages the workers send each other (a heartbeat event
        every 2 s per worker, fanned out to every gossiping worker), work rather than idling.
        """
        for n in range(dramatiq):
            self._start("dramatiq", n, [
                "-m", "dramatiq", "integrations.dramatiq_app",
                "--processes", "1", "--threads", "1",
            ])  # fmt: skip
        quiet = ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        for n in range(celery):
            self._start("celery", n, [
                "-m", "celery", "-A", "integrations.celery_app", "worker",
                "--pool", "solo", "--concurrency", "1", "--loglevel", "INFO",
                "--hostname", f"idle-{self.mode}-{n}@%h",
                *([] if celery_chatter else quiet),
            ])  # fmt: skip

    def _start(self, framework: Framework, n: int, arguments: list[str]) -> None:
        label = f"{self.mode}/{framework}-{n}"
        log = self.workdir / "logs" / f"{framework}-{n}.log"
        process = self.children.start(
            [sys.executable, *arguments],
            env=self.environment(self.proxy.listen(label)),
            cwd=ROOT,
            log=log,
            group=True,  # a signal reaches the framework's own children too
        )
        self.workers.append(Worker(label, framework, process, log))

    def wait_ready(self, timeout: float) -> None:
        """Wait until every worker says it consumes; fails at once if one exits."""

        def waiting() -> list[str]:
            return [worker.label for worker in self.workers if not worker.ready()]

        wait_for(
            lambda: not waiting(),
            timeout,
            f"{len(self.workers)} workers to be ready",
            interval=0.5,
            progress=lambda: f"not ready: {waiting()}",
        )

    def check_alive(self) -> None:
        """Raise if a worker exited (an idle fleet that lost a worker would look cheap)."""
        dead = [w.label for w in self.workers if w.process.poll() is not None]
        if dead:
            raise RuntimeError(f"workers exited on their own: {dead}")

    def idle(self, seconds: float) -> None:
        """Let ``seconds`` pass, checking each second that every worker still runs."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(1.0, left))
            self.check_alive()

    def settle(self, minimum: float, limit: float) -> float | None:
        """Idle ``minimum`` seconds, then until two slices of ``SETTLE_SLICE_SECONDS`` in a
        row see about as many requests (start-up is over, back-offs have grown); the seconds
        it took, or None if the rate still moved after ``limit`` seconds."""
        started = time.monotonic()
        self.idle(minimum)
        previous: int | None = None
        while True:
            before = self.requests().total()
            self.idle(SETTLE_SLICE_SECONDS)
            current = self.requests().total() - before
            if previous is not None and abs(current - previous) <= max(
                SETTLE_SLACK_REQUESTS, SETTLE_TOLERANCE * max(current, previous)
            ):
                return time.monotonic() - started
            if time.monotonic() - started >= limit:
                return None
            previous = current

    def requests(self) -> Counter[Request]:
        """The proxy's counts for this fleet's listeners so far."""
        mine = self.listeners
        return Counter({r: n for r, n in self.proxy.snapshot().items() if r.listener in mine})

    def wake(self, timeout: float) -> Wake:
        """Send one ``add`` job per app from a producer process of the namespace (in the same
        mode), and wait until a worker has run each; how long each took after its send."""
        self._wakes += 1
        numbers = {name: base + self._wakes for name, base in WAKE_NUMBERS.items()}
        script = f"""
import json, time
import integrations.dramatiq_app as dramatiq_app
import integrations.celery_app as celery_app
dramatiq_app.add.send({numbers["dramatiq"]}, 1)
sent = {{"dramatiq": time.time()}}
celery_app.add.apply_async(({numbers["celery"]}, 1))
sent["celery"] = time.time()
dramatiq_app.add.broker.close()
print(json.dumps(sent))
"""
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            env=self.environment(self._producer_url),
            capture_output=True,
            text=True,
            timeout=PRODUCER_TIMEOUT_SECONDS,
            check=False,  # a failure is raised below, with the producer's own output
        )
        if done.returncode != 0:
            raise RuntimeError(f"the wake-up producer failed: {done.stderr[-2000:]}")
        sent: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
        seen: dict[str, float] = {}

        def both_ran() -> bool:
            self.check_alive()
            lines = self.result_lines()
            for name, x in numbers.items():
                if name not in seen and f"add {x} 1 {x + 1}" in lines:
                    seen[name] = time.time()
            return len(seen) == len(numbers)

        wait_for(
            both_ran,
            timeout,
            f"the wake-up jobs {numbers} to run",
            progress=lambda: f"ran: {sorted(seen)}",
        )
        return Wake(seen["dramatiq"] - sent["dramatiq"], seen["celery"] - sent["celery"])

    def result_lines(self) -> set[str]:
        """Every line the workers' jobs recorded."""
        return {
            line
            for log in self.results.glob("*.log")
            for line in log.read_text().splitlines()
            if line
        }

    def stop(self) -> list[str]:
        """SIGTERM every worker group at once (SIGKILL after the grace) and reap them; the
        workers that had to be killed."""
        killed = self.children.stop_all()
        return [w.label for w in self.workers if w.process in killed]

    def __enter__(self) -> IdleFleet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def tail(path: Path, size: int = 2000) -> str:
    """The last ``size`` characters of a log ('' if it does not exist)."""
    return path.read_text(errors="replace")[-size:] if path.exists() else ""
