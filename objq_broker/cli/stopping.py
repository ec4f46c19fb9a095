"""Stopping ``objq worker`` on time, whatever its storage does.

The first SIGTERM or SIGINT asks the worker to stop: it claims nothing more, gives back the jobs
it prefetched, and lets its running commands go on for up to ``grace_seconds``
(``--stop-grace``); the commands still running then are killed, process group and all, as on a
timeout, and their jobs given back. The worker then settles what it holds and exits 0.

Its storage may not answer meanwhile: a claim, an ack or the last flush can block for as long as
a store accepts connections and never replies. So the worker's own work runs in a thread, and
the main thread (the one Python runs signal handlers in) only waits for it, handles the signals
and keeps the deadlines:

- once no command runs, the worker has ``settle_seconds`` (:data:`SETTLE_SECONDS`) to settle
  what it holds and close;
- a second signal kills the running commands at once and leaves :data:`FORCE_SECONDS`;
- a third signal, or a deadline that passes, ends the process at once with status 1, after
  killing what is left of its commands. The jobs it still held run again once their leases
  expire, as those of a worker that was killed.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from objq_broker.cli.cmdjob import KILL_GRACE_SECONDS, ProcessGroups
from objq_broker.cli.output import counted

log = logging.getLogger("objq_broker.worker")

#: Seconds running commands may go on after the first signal (``objq worker --stop-grace``):
#: under the 30 s a Kubernetes pod gets before SIGKILL, so that the jobs are given back.
DEFAULT_GRACE_SECONDS = 25.0
#: Seconds the worker has, once no command runs, to settle what it holds and close.
SETTLE_SECONDS = 10.0
#: Seconds the worker has after a second signal (its commands get KILL_GRACE_SECONDS of them).
FORCE_SECONDS = KILL_GRACE_SECONDS + 2.0
#: How often the main thread looks at the signals and the deadlines.
CHECK_SECONDS = 0.1
#: Exit status of a worker that could not stop cleanly in time.
FORCED_EXIT_STATUS = 1


class Shutdown:
    """The stop requests of one worker process, and their deadlines.

    The worker reads :attr:`stopping` (claim nothing more) and :attr:`abort` (kill the running
    commands), and registers its commands in :attr:`commands`. :meth:`run` runs the worker in a
    thread and keeps the deadlines from the main thread::

        shutdown = Shutdown(grace_seconds=25.0)
        shutdown.install()  # SIGTERM and SIGINT
        status = shutdown.run(serve)  # serve() -> int runs the worker
    """

    def __init__(
        self,
        *,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        settle_seconds: float = SETTLE_SECONDS,
    ) -> None:
        self.grace_seconds = grace_seconds
        self.settle_seconds = settle_seconds
        self.stopping = threading.Event()
        self.abort = threading.Event()
        self.commands = ProcessGroups()
        self._signals = 0  # counted by the handler, acted on by check()
        self._handled = 0
        self._stop_at: float | None = None
        self._deadline = math.inf
        self._idle_since: float | None = None

    def install(self) -> None:
        """Handle SIGTERM, and SIGINT unless it is ignored (``objq worker &`` in a script)."""
        signal.signal(signal.SIGTERM, self._on_signal)
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only count: a handler runs between two bytecodes of the main thread, which may hold
        # any lock at that moment. check() acts on it within CHECK_SECONDS.
        self._signals += 1

    def run(self, body: Callable[[], int]) -> int:
        """Run ``body`` in a thread until it returns (its result) or raises (re-raised here),
        or until a deadline passes (then the process exits)."""
        returned: list[int] = []
        raised: list[BaseException] = []

        def target() -> None:
            try:
                returned.append(body())
            except BaseException as exc:  # handed to the main thread
                raised.append(exc)

        thread = threading.Thread(target=target, name="objq-worker", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(CHECK_SECONDS)
            self.check(time.monotonic())
        if raised:
            raise raised[0]
        return returned[0]

    def check(self, now: float) -> None:
        """Act on the signals received since the last check, and on the deadlines."""
        while self._handled < self._signals:
            self._handled += 1
            self._request(self._handled, now)
        if self._stop_at is None:
            return
        if len(self.commands):
            self._idle_since = None
            if not self.abort.is_set() and now >= self._stop_at + self.grace_seconds:
                log.warning(
                    "stop grace of %g s over: killing %d running commands and giving their "
                    "jobs back",
                    self.grace_seconds,
                    len(self.commands),
                )
                self.abort.set()
        elif self._idle_since is None:
            self._idle_since = now
        deadline = self._deadline
        if self._idle_since is not None:
            deadline = min(deadline, self._idle_since + self.settle_seconds)
        if now >= deadline:
            self.exit_now("could not settle its jobs and close in time (is the storage answering?)")

    def _request(self, count: int, now: float) -> None:
        if count == 1:
            self._stop_at = now
            self._deadline = now + self.grace_seconds + KILL_GRACE_SECONDS + self.settle_seconds
            self.stopping.set()
        elif count == 2:
            self._deadline = min(self._deadline, now + FORCE_SECONDS)
            self.abort.set()
        else:
            self.exit_now("a third signal")

    def exit_now(self, why: str) -> None:
        """Kill the running commands and end the process, status 1."""
        killed = self.commands.kill()
        sys.stderr.write(
            f"objq worker: {why}: exiting now, status {FORCED_EXIT_STATUS}"
            + (f", {counted(killed, 'command')} killed" if killed else "")
            + "; the jobs it still holds run again once their leases expire\n"
        )
        sys.stderr.flush()
        os._exit(FORCED_EXIT_STATUS)
