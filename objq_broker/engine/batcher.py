"""Operations submitted by many threads, taken in batches by one worker thread: the engine's
writer (a batch is one commit) and a broker client's sender (a batch is one session).

A batch is taken when its worker is free, so the operations submitted while it committed the
last one form the next: that is the group commit. Before taking one, the worker may linger
(:meth:`Batcher.linger`) for the callers the last batch released, which are still submitting
their next operations; otherwise half of them would ride every other batch.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

P = TypeVar("P")


class Batcher(Generic[P]):
    """Pending operations (items of any kind: ``size`` says how many bytes one carries) and
    the worker thread that takes them, started by the first :meth:`add`.

    ``cv`` guards the pending items, :attr:`closing`, and whatever state of its owner goes with
    them (fencing): :meth:`add`, :meth:`linger` and :meth:`take` are called holding it."""

    def __init__(
        self,
        name: str,
        work: Callable[[], None],
        *,
        size: Callable[[P], int],
        max_items: int,
        max_bytes: int,
    ) -> None:
        self.cv = threading.Condition()
        self.pending: deque[P] = deque()
        self._name, self._work, self._size = name, work, size
        self.max_items, self.max_bytes = max_items, max_bytes
        self.thread: threading.Thread | None = None
        #: :meth:`close` was called: the owner takes no more items, and its worker stops once
        #: it has worked off those pending.
        self.closing = False
        #: A batch is being worked on, by the worker or by a caller that took its own item
        #: (:meth:`take_alone`): one batch at a time.
        self.busy = False
        self._taken = 0  # items of the batch being worked on
        self._callers = 0  # most items pending or being worked on since the last batch left
        self._expected = 0  # ... as of the last batch done: how many the next one waits for
        self._want = 1  # pending items that wake the worker: more while it lingers

    def add(self, *items: P) -> None:
        """Queue ``items`` for the next batch and wake the worker (starting it, the first
        time). Call holding :attr:`cv`."""
        self.pending.extend(items)
        self._callers = max(self._callers, len(self.pending) + self._taken)
        self._start()
        if len(self.pending) >= self._want:
            # A lingering worker is woken once, when its batch is full, not by every item.
            self.cv.notify()

    def take_alone(self, item: P) -> bool:
        """Let the caller work on ``item`` itself, as a batch of one, when nothing else is
        pending or being worked on and the last batch had no other caller (True: it must call
        :meth:`done` after); else queue it (:meth:`add`). Call holding :attr:`cv`. Nobody is
        waiting to join a batch then, so a hand-off to the worker thread and back would only
        add two thread switches; with several callers about, the worker lingers for them as
        before, so batches stay as full."""
        if self.take_nothing_alone():
            return True
        self.add(item)
        return False

    def take_nothing_alone(self, items: int = 1) -> bool:
        """What :meth:`take_alone` does, for ``items`` the caller holds, except that nothing
        is queued when it may not work on them alone (False). Call holding :attr:`cv`."""
        if self.pending or self.busy or self.closing or self._expected > items:
            return False
        self.busy = True
        self._taken = self._callers = items
        self._start()  # the worker still keeps the idle ticks
        return True

    def begin(self) -> None:
        """Mark a batch the worker made itself (an idle tick) as being worked on."""
        self.busy = True

    def _start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._work, name=self._name, daemon=True)
            self.thread.start()

    def close(self) -> None:
        """Set :attr:`closing` and wake the worker (which may be lingering) to finish up."""
        with self.cv:
            self.closing = True
            self.cv.notify()

    def linger(self, span: float, *, target: int | None = None) -> None:
        """Wait up to ``span`` seconds for ``target`` items to be pending (by default as
        many as were pending or worked on at once during the last batch: the callers it
        released), or until closing. Call holding :attr:`cv`."""
        want = self._expected if target is None else target
        end = time.monotonic() + span
        self._want = max(want, 1)
        try:
            while len(self.pending) < want and not self.closing:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return
                self.cv.wait(remaining)
        finally:
            self._want = 1

    @property
    def full(self) -> bool:
        """Whether as many items are pending as the last batch's callers (holding :attr:`cv`)."""
        return len(self.pending) >= self._expected

    def take(self) -> list[P]:
        """The next batch (holding :attr:`cv`): up to ``max_items`` items and ``max_bytes``
        bytes, but at least one, so an item larger than a batch travels alone."""
        batch = [self.pending.popleft()]
        size = self._size(batch[0])
        while self.pending and len(batch) < self.max_items:
            size += self._size(self.pending[0])
            if size > self.max_bytes:
                break
            batch.append(self.pending.popleft())
        self._taken = self._callers = len(batch)
        self.busy = True
        return batch

    def done(self) -> None:
        """The batch taken last was worked on: the next lingers for its callers, and the
        worker (waiting while a caller worked on its own) may take it. The worker is woken
        only when there is something for it to do: after a caller's own batch with nothing
        behind it, waking it would cost a thread switch for nothing."""
        with self.cv:
            self._taken = 0
            self._expected = self._callers
            self.busy = False
            if self.pending or self.closing:
                self.cv.notify()

    def drain(self) -> list[P]:
        """Every pending item, taken out (holding :attr:`cv`): a worker that stops fails them."""
        items, self.pending = list(self.pending), deque()
        return items
