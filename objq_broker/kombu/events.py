"""How the objq kombu transport joins an event loop (kombu's Hub, which Celery's worker runs).

objq has no socket that becomes readable when a message arrives: claims are commits of the
group-commit engine, which finish on its writer thread. The transport gives the loop a socket
of its own instead, and anything that may let a message be delivered writes one byte to it: a
claim that committed, an ack or reject that opened the prefetch window, a new consumer. The
loop then calls the transport, which hands out what the window allows without blocking. A
timer makes the same call so that an empty queue is looked at again (a message another process
sent directly is found by reading, unless the store is a local folder whose writes the kernel
reports, which signals the socket too) and messages that waited too long for the window are given
back. It fires a few milliseconds after a message was handed out, then less and less often
(:class:`~objq_broker.consume.pacing.Pacer`) until ``polling_interval``: a worker between
tasks finds the next one at once, an idle one costs one read per interval.

With a loop, Celery runs its event-driven consumer and the asynchronous prefork pool (tasks
go to the child processes over pipes watched by the same loop) instead of the synchronous
loop with a thread handing tasks to the pool.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from objq_broker.consume.pacing import Pacer


class Wakeup:
    """A socket pair: :meth:`signal` from any thread makes :meth:`fileno` readable.

    Only the first signal after a :meth:`clear` writes, so a burst of acks costs one byte."""

    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._pending = False
        self._lock = threading.Lock()

    def fileno(self) -> int:
        return self._reader.fileno()

    def signal(self, *_: object) -> None:
        """Make the loop call back soon (also usable as a future's done callback)."""
        with self._lock:
            if self._pending:
                return
            self._pending = True
        with contextlib.suppress(OSError):  # closed meanwhile, or the buffer is full: either way
            self._writer.send(b"\0")  # the loop has been told already or no longer listens

    def clear(self) -> None:
        """Consume the signals; call before doing the work they asked for, so none is missed.

        The byte is read before the next signal may write one: the other way round, a signal
        landing in between would write a byte read here at once and leave ``_pending`` set,
        and every later signal would then be dropped until the timer's next call."""
        with contextlib.suppress(OSError):
            while self._reader.recv(4096):
                pass
        with self._lock:
            self._pending = False

    def close(self) -> None:
        self._reader.close()
        self._writer.close()


class LoopBinding:
    """The transport's place in one event loop: its wakeup socket and its polling timer.

    ``pump(poll)`` hands out what it can and returns how many messages it handed out."""

    def __init__(self, loop: Any, interval: float, pump: Callable[[bool], int]) -> None:
        self.loop = loop
        self.wakeup = Wakeup()
        self._pump = pump
        self._pacer = Pacer(ceiling=interval)
        self._due = 0.0  # when the timer fires next (time.monotonic)
        self._look = False  # jobs may have come: the next pump claims (see look_now)
        self._closed = False
        loop.add_reader(self.wakeup.fileno(), self.on_readable)
        loop.on_tick.add(self.keep_registered)
        self._timer: Any = None
        self._schedule(self._pacer.next())

    def _schedule(self, delay: float) -> None:
        if self._closed:  # a timer that fired while the binding closed ends here
            return
        self._due = time.monotonic() + delay
        self._timer = self.loop.call_later(delay, self.on_timer)

    def _handed_out(self, count: int) -> None:
        """Look again soon after messages moved: the next one is likely close behind."""
        if not count:
            return
        self._pacer.reset()
        soon = self._pacer.next()
        if self._due - time.monotonic() > soon:  # the timer is far off: bring it forward
            with contextlib.suppress(Exception):
                self._timer.cancel()
            self._schedule(soon)

    def keep_registered(self) -> None:
        """Register the socket again on every turn of the loop (a no-op while it is there).

        A child process forked by Celery's prefork pool shares the loop's epoll instance, and
        when it closes its copy of the loop it can unregister our socket from the parent's too.
        Without this, one signal would then stay pending for ever and every later wakeup be
        lost, so messages would move only on the timer. (kombu's Redis transport also
        registers its sockets on every turn.)"""
        self.loop.add_reader(self.wakeup.fileno(), self.on_readable)

    def look_now(self) -> None:
        """Jobs may have come (a commit this process learned of, on another thread): claim
        at the loop's next turn instead of at the next poll of the timer."""
        self._look = True
        self.wakeup.signal()

    def on_readable(self) -> None:
        self.wakeup.clear()
        # After clear(): a look_now() from now on signals again, so none is lost.
        look, self._look = self._look, False
        self._handed_out(self._pump(look))

    def on_timer(self) -> None:
        self.wakeup.clear()  # also ends a signal that a lost registration left pending
        handed_out = 0
        try:
            handed_out = self._pump(True)
        finally:  # a pump that raised must not end the polling
            if handed_out:
                self._pacer.reset()
            self._schedule(self._pacer.next())

    def close(self) -> None:
        self._closed = True
        self.loop.on_tick.discard(self.keep_registered)
        with contextlib.suppress(Exception):  # the loop may be closed or reset already
            self._timer.cancel()
        with contextlib.suppress(Exception):
            self.loop.remove_reader(self.wakeup.fileno())
        self.wakeup.close()
