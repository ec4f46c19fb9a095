"""The engine's settings and shared state: its defaults, the attributes every layer of
:class:`~objq_broker.engine.commit.Engine` uses, and the store's reports of writes to the state.

The engine is built in layers, a module each, each using only the ones before it: this base,
:mod:`~objq_broker.engine.writing` (a try's objects and state written),
:mod:`~objq_broker.engine.loading` (the cached state, and a batch applied to it),
:mod:`~objq_broker.engine.loop` (the writer thread, retries and their failure handling), and
:mod:`~objq_broker.engine.commit` (what callers use).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from objq_broker.engine.archive import DEFAULT_ARCHIVE_TAIL_BYTES
from objq_broker.engine.batch import Attempt, EngineMetrics, Pending, StandingClaims
from objq_broker.engine.batcher import Batcher
from objq_broker.engine.bodies import BodyCache
from objq_broker.engine.garbage import (
    DEFAULT_GC_INTERVAL_SECONDS,
    DEFAULT_OLDER_THAN_SECONDS,
    Sweeper,
)
from objq_broker.engine.guard import STATE_KEY, StateGuard
from objq_broker.engine.janitor import Janitor
from objq_broker.engine.options import EngineLimits, check_engine_settings
from objq_broker.engine.runs import MergeReads
from objq_broker.errors import QueueError, WriterFenced
from objq_broker.model.encoding import DEFAULT_MAX_STATE_BYTES
from objq_broker.model.records import Job, KeyRecord
from objq_broker.model.runs import MAX_RUN_JOBS
from objq_broker.model.state import QueueState
from objq_broker.storage.base import ObjectStore
from objq_broker.storage.notify import folder_of, watch_folder

log = logging.getLogger("objq_broker.engine")

#: Most operations one commit applies.
DEFAULT_MAX_BATCH_OPS = 5000
#: Most payload bytes one commit adds.
DEFAULT_MAX_BATCH_BYTES = 16 * 1024 * 1024
#: How long a batch keeps retrying storage errors and conflicts before its ops fail.
DEFAULT_COMMIT_DEADLINE_SECONDS = 30.0
#: How old the cached state may be before a claim or a read fetches it again.
DEFAULT_MAX_STALENESS_SECONDS = 0.2
#: How often an idle consumer engine looks for stale leases to expire (at first: the interval
#: doubles while nothing happens, up to ``MAX_IDLE_TICK_SECONDS``).
DEFAULT_IDLE_TICK_SECONDS = 1.0
MAX_IDLE_TICK_SECONDS = 16.0
#: Ready (or delayed) jobs a queue keeps in the state's head before they move to a run; dead
#: letters and idempotency keys likewise (``docs/segments.md``).
DEFAULT_SPILL_AT = 1_000
#: While the state is smaller than this, payloads larger than the model's inline limit stay in
#: it too: a bodies object would cost a second write per commit and a read per consumer, more
#: than the bytes cost while the state is small. Past it, they go out of line (``bodies/``).
DEFAULT_INLINE_STATE_BYTES = 64 * 1024


class EngineBase:
    """The bottom layer of :class:`~objq_broker.engine.commit.Engine`: its settings, its cache
    of the state, and who is told of its commits."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        key: str = STATE_KEY,
        archive: bool = True,
        max_batch_ops: int = DEFAULT_MAX_BATCH_OPS,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        linger_seconds: float = 0.0,
        commit_deadline_seconds: float = DEFAULT_COMMIT_DEADLINE_SECONDS,
        max_staleness_seconds: float = DEFAULT_MAX_STALENESS_SECONDS,
        idle_tick_seconds: float = DEFAULT_IDLE_TICK_SECONDS,
        epoch: int | None = None,
        exclusive: bool = False,
        bodies: BodyCache | None = None,
        clock: Callable[[], float] = time.time,
        seed: int | None = None,
        spill_at: int | None = DEFAULT_SPILL_AT,
        run_jobs: int = MAX_RUN_JOBS,
        gc_interval_seconds: float | None = DEFAULT_GC_INTERVAL_SECONDS,
        gc_older_than_seconds: float = DEFAULT_OLDER_THAN_SECONDS,
        inline_state_bytes: int = DEFAULT_INLINE_STATE_BYTES,
        max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
        archive_tail_bytes: int = DEFAULT_ARCHIVE_TAIL_BYTES,
    ) -> None:
        check_engine_settings(
            {
                name: value
                for name, value in locals().items()
                if name in EngineLimits.__struct_fields__
            }
        )
        self.inline_state_bytes = inline_state_bytes
        #: A larger state is refused unread (a hostile one would exhaust memory).
        self.max_state_bytes = max_state_bytes
        # Sizes of the state as last read or written, and of the archive tail it holds.
        self._state_bytes = self._tail_bytes = 0
        self._contended_until = 0.0  # monotonic time until which other writers seem active
        self.store = store
        self.key = key
        #: Archive finished jobs (False: drop their records), through a tail kept in the state
        #: until it holds this many bytes (``engine.archive``).
        self.archive, self.archive_tail_bytes = archive, archive_tail_bytes
        self.linger_seconds = linger_seconds
        self.commit_deadline_seconds = commit_deadline_seconds
        self.max_staleness_seconds = max_staleness_seconds
        self.idle_tick_seconds = idle_tick_seconds
        #: The epoch this engine writes under (an elected broker's); a state with a higher one
        #: means it was replaced, and it stops. None: not elected, never fenced.
        self.epoch = epoch
        #: This engine is the namespace's only writer (a broker): its cached state is the
        #: stored one, so it reads only after a conflict, never to look for others' changes.
        self.exclusive = exclusive
        #: Move a queue's ready or delayed jobs, dead letters and idempotency keys out of the
        #: head into runs past this many (``docs/segments.md``); None: never, so the state
        #: stays readable by releases before runs (format 1).
        self.spill_at = spill_at
        #: Most jobs in one run (small in tests, to make many).
        self.run_jobs = run_jobs
        self._run_cache: dict[str, list[Job]] = {}  # runs read or written; they never change
        self._key_cache: dict[str, dict[str, KeyRecord]] = {}  # the same for key runs
        self._runs_missing: list[str] | None = None  # runs found gone by the last try
        self._next_run_sweep = float("-inf")  # monotonic time to look for orphan runs again
        self.clock = clock
        self.metrics = EngineMetrics()
        #: Payload bodies kept out of the state, cached by bodies object.
        self.bodies = bodies if bodies is not None else BodyCache(store)
        self._janitor = Janitor(store)
        #: Refuses a state that went back or vanished (``engine.guard``).
        self._guard = StateGuard(store, key)
        self._merge_reads = MergeReads(store, self._janitor, run_jobs)
        #: Collects unreferenced objects now and then (``docs/deploy.md``); None: never.
        self.sweeper = (
            None
            if gc_interval_seconds is None
            else Sweeper(
                store,
                self._janitor,
                interval=gc_interval_seconds,
                older_than=gc_older_than_seconds,
            )
        )
        self._rng = random.Random(seed)
        self._state: QueueState | None = None
        self._version: str | None = None
        self._synced_at = float("-inf")  # monotonic time the cache last matched storage
        #: Operations waiting for the writer thread, which it takes a batch at a time.
        self._batcher: Batcher[Pending] = Batcher(
            f"objq-writer {store.url}",
            self._run,
            size=_size,
            max_items=max_batch_ops,
            max_bytes=max_batch_bytes,
        )
        self._closing = False
        self._fenced: WriterFenced | None = None
        self._broken: QueueError | None = None  # why the writer thread stopped, if it did
        self._consumer = False
        self._commit_listeners: list[Callable[[], None]] = []
        self._standing: StandingClaims | None = None
        #: This batch's tries whose state write failed: any one of them may yet have landed.
        self._failed_tries: list[Attempt] = []
        self._last_commit_seconds = 0.0
        self._idle_tick = idle_tick_seconds
        self._lost_against: str | None = None  # the version a conflicting write expected
        self._others_moved = False  # the state changed since that conflict: progress
        self._watch_state()

    def _run(self) -> None:
        """The writer thread (:mod:`~objq_broker.engine.loop`)."""
        raise NotImplementedError

    def _watch_state(self) -> None:
        # Writes to the state the store reported (a local folder does), and how many of them
        # the cache had seen when it was last read: a claim after a newer one reads again.
        self._told_changes = self._synced_changes = 0
        # The only writer learns nothing from reports of its own writes.
        self._watch = (
            None if self.exclusive else watch_folder(self.store, folder_of(self.key), self._told)
        )

    def _told(self, key: str | None) -> None:
        """The store reported a write under the state's folder (on its own thread): if it
        was the state, by another process or by this one, claims read it again and claimers
        look at once instead of at their next poll."""
        if key is not None and key != self.key:
            return
        self._told_changes += 1
        self._tell_listeners()

    def _tell_listeners(self) -> None:
        """Call the commit listeners (on the writer's or the store's thread); one that
        raises must stop neither."""
        for listener in self._commit_listeners:
            try:
                listener()
            except Exception:
                log.exception("a commit listener failed")

    def __repr__(self) -> str:
        role = "" if self.epoch is None else f", epoch={self.epoch}"
        return f"Engine({self.store.url!r}{role})"


def _size(pending: Pending) -> int:
    return pending.size
