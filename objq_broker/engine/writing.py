"""Writing a commit: the objects a try needs stored before the state (payload bodies, runs,
archive objects), the state itself with its ``if_version`` condition, and the tidying once it
landed (freed objects deleted, orphan runs swept, run merges planned).

Everything is written before the state that refers to it, so a state never names a missing
object. :class:`TryWriter` keeps the tries of the batch being committed whose state write
failed (any one of them may yet land): what they wrote ahead is reused by the next try when it
holds the same, and deleted once another try landed.
"""

from __future__ import annotations

import functools
import logging
import time

from objq_broker.engine.archive import plan_archive, tail_due
from objq_broker.engine.batch import Attempt, EngineMetrics
from objq_broker.engine.bindings import unbind_queues
from objq_broker.engine.bodies import BodyCache
from objq_broker.engine.garbage import Sweeper
from objq_broker.engine.janitor import Janitor
from objq_broker.engine.loading import StateCache
from objq_broker.engine.oversize import StateTooLarge, check_size
from objq_broker.engine.runs import MERGE_AT, MergeReads
from objq_broker.errors import ObjqError
from objq_broker.model.bodies import BODIES_PREFIX, bodies_key, encode_bodies
from objq_broker.model.checks import STAGING_PREFIX
from objq_broker.model.encoding import check_encoded, encode_archive
from objq_broker.model.ids import new_id
from objq_broker.model.records import ArchiveRecord, Job
from objq_broker.model.runs import RUNS_PREFIX, orphan_runs, run_key
from objq_broker.model.state import QueueState
from objq_broker.storage.base import ObjectStore

log = logging.getLogger("objq_broker.engine")

#: How often an engine whose namespace has runs lists them to delete orphans (one LIST
#: request per thousand runs on S3 or GCS).
RUN_SWEEP_SECONDS = 600.0
#: A writer's id in the state: 64 random bits, so no two writers' marks collide.
WRITER_ID_CHARS = 16


class TryWriter:
    """Writes one try at a commit: what its state will refer to, then the state itself
    (through the :class:`~objq_broker.engine.loading.StateCache`, which holds the version it
    writes over), then tidies up after it. Between :meth:`start_batch` and :meth:`settled`, it
    keeps the tries whose state write failed.

    ``archive``: archive finished jobs (False: drop their records), through a tail kept in the
    state until it holds ``archive_tail_bytes`` (``engine.archive``). ``spill_at``: move a
    queue's ready or delayed jobs, dead letters and idempotency keys out of the head into runs
    of at most ``run_jobs`` past this many (``docs/runs.md``); None: never, so the state
    stays readable by releases before runs (format 1). ``gc_interval_seconds``: how often to
    collect unreferenced objects (``docs/deploy.md``); None: never.
    """

    def __init__(
        self,
        store: ObjectStore,
        cache: StateCache,
        bodies: BodyCache,
        metrics: EngineMetrics,
        *,
        archive: bool,
        archive_tail_bytes: int,
        inline_state_bytes: int,
        spill_at: int | None,
        run_jobs: int,
        gc_interval_seconds: float | None,
        gc_older_than_seconds: float,
    ) -> None:
        self.store = store
        self._cache = cache
        #: Payload bodies kept out of the state, cached by bodies object.
        self.bodies = bodies
        self.metrics = metrics
        self.archive, self.archive_tail_bytes = archive, archive_tail_bytes
        self.inline_state_bytes = inline_state_bytes
        self.spill_at = spill_at
        self.run_jobs = run_jobs
        self._janitor = Janitor(store)
        self._state_where = f"state {store.url}/{cache.key}"  # for an error message
        self._merge_reads = MergeReads(store, self._janitor, run_jobs)
        #: Collects unreferenced objects now and then; None: never.
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
        self._tail_bytes = 0  # size of the archive tail the state held as last written
        self._next_run_sweep = float("-inf")  # monotonic time to look for orphan runs again
        #: This batch's tries whose state write failed: any one of them may yet have landed.
        self._failed_tries: list[Attempt] = []
        #: This writer's mark in the state (``StateDoc.writers``): its last commit.
        self._writer_id = new_id()[:WRITER_ID_CHARS]

    # --- the tries of one batch ------------------------------------------------------------

    def start_batch(self) -> None:
        """A new batch: forget the failed tries of the last one (which gave up: those writes
        may still land, so their objects stay)."""
        self._failed_tries = []

    @property
    def in_doubt(self) -> bool:
        """Whether a try of this batch failed to write its state: it may yet land."""
        return bool(self._failed_tries)

    def failed(self, attempt: Attempt) -> None:
        """``attempt``'s state write failed, perhaps only as far as its caller can tell."""
        self._failed_tries.append(attempt)

    def landed_in(self, state: QueueState) -> Attempt | None:
        """The failed try of this batch whose commit ``state`` holds, if one landed after all.
        (While none has, what they wrote ahead is kept: the next try re-applies the same ops
        and usually writes the very same archive and bodies.)"""
        if not self._failed_tries:
            return None
        # This writer's mark names its last commit, however many others committed since.
        mark = state.doc.writers.get(self._writer_id)
        if mark is None:
            return None
        return next((a for a in self._failed_tries if a.commit_id == mark.commit_id), None)

    def settled(self, landed: Attempt) -> None:
        """``landed`` is the try whose state is stored: delete what the batch's other tries
        wrote ahead of theirs (none of them can land on top of it)."""
        if not self._failed_tries:
            return
        kept = set(landed.written)
        orphans = {key for a in self._failed_tries for key in a.written} - kept
        for key in sorted(orphans):
            self._janitor.delete_now(key, "orphan object")
        self._failed_tries = []

    # --- one try -----------------------------------------------------------------------------

    def write(self, state: QueueState, attempt: Attempt) -> None:
        """Store ``attempt``'s objects and ``state``. :class:`StateTooLarge` (nothing of it
        stored) when its state would be over the limit; a storage error when its write
        failed (report the try as :meth:`failed` unless the error is final)."""
        self._cache.check_writable()
        doc = state.doc
        now = self._cache.clock()
        doc.version += 1
        epoch = self._cache.epoch
        if epoch is not None:
            doc.epoch = max(doc.epoch, epoch)
            if doc.broker is not None and doc.broker.epoch == epoch:
                doc.broker_writes += 1
        doc.commit_id = attempt.commit_id
        doc.committed_at = now
        state.mark_writer(self._writer_id, attempt.commit_id, now)
        self._write_bodies(state, attempt)
        self._write_runs(state, attempt)
        if self.archive and (
            attempt.finished or tail_due(doc.archive_tail, now, self.archive_tail_bytes)
        ):
            self._write_archive(state, attempt, now)
        data = state.encode()
        check_encoded(data, self._state_where, only=state.unchecked)
        try:
            check_size(len(data), self._cache.max_state_bytes, attempt.results, self._cache.size)
        except StateTooLarge:
            # The loop refuses what grew it and tries again: what this try wrote ahead is
            # referred to by nothing stored.
            self._drop_written(attempt)
            raise
        self._cache.write(doc, data)
        state.dirty = False
        state.finished.clear()
        try:
            self._after_write(state)
        except Exception:  # the commit landed: what follows only tidies up after it
            log.exception("tidying up after a commit on %s failed", self.store.url)

    def _drop_written(self, attempt: Attempt) -> None:
        """Delete what ``attempt`` wrote ahead of a state it will not write, except what an
        earlier failed try wrote (that try may yet land)."""
        kept = {key for tried in self._failed_tries for key in tried.contents}
        for key in attempt.written:
            if key not in kept:
                self._janitor.delete_now(key, "object of a try refused as too large")

    def _write_archive(self, state: QueueState, attempt: Attempt, now: float) -> None:
        """Put the records of the jobs this commit finishes in the state's archive tail, and
        write the archive objects its plan calls for (:func:`plan_archive`). Before the state:
        a job leaves the state only once its record is stored, here or in the state itself."""
        records = [
            ArchiveRecord(f.outcome, attempt.commit_id, self._inline(f.job))
            for f in attempt.finished
        ]
        plan = plan_archive(
            state.doc.archive_tail,
            records,
            attempt.commit_id,
            now,
            self.archive_tail_bytes,
            version=state.doc.version,
            held_lines=state.archive_lines(),
        )
        if plan is None:
            return
        state.set_archive_tail(plan.tail, plan.lines)
        self._tail_bytes = len(plan.lines)
        for planned, held in plan.objects:
            content = [(r.outcome, r.job.id) for r in held]
            key = self._spare_holding(content) or planned
            if not self._reuse(key, attempt):
                self.store.write(key, encode_archive(held), if_absent=True)
                self._wrote(attempt, key, content)
                self.metrics.archive_writes += 1

    def _after_write(self, state: QueueState) -> None:
        """Forget and delete what the landed commit freed, and plan what comes next."""
        if state.unused_bodies:
            unused, state.unused_bodies = state.unused_bodies, []
            for key in unused:
                self.bodies.forget(key)
            self._janitor.delete(_ours(unused, BODIES_PREFIX), "unused bodies object")
        if state.unused_runs:
            consumed, state.unused_runs = state.unused_runs, []
            self._cache.forget_runs(consumed)
            self._janitor.delete(_ours(consumed, RUNS_PREFIX), "consumed run")
        self._unbind_removed(state)
        self._sweep(state)
        if self.spill_at is not None and state.doc.has_runs():
            self._merge_reads.plan(state, self._cache.runs)

    def _unbind_removed(self, state: QueueState) -> None:
        """The queues this commit deleted (or found expired) lose their kombu bindings, off
        the writer thread. If that fails, what those bindings route is dropped all the same
        (a routed message never brings its queue back), and the next delete retries."""
        removed, state.removed_queues = state.removed_queues, []
        if not removed:
            return

        def unbind() -> None:
            unbind_queues(self.store, removed)

        self._janitor.run(unbind, f"the bindings of removed queues {removed}")

    def _write_bodies(self, state: QueueState, attempt: Attempt) -> None:
        """Move this commit's large payloads out of the state, unless it is small enough to
        keep them. Bodies first: the state must never refer to an object that is not stored."""
        if state.new_bodies and self._bodies_fit(state):
            state.keep_bodies_inline()
        if not state.new_bodies:
            return
        content = state.new_bodies_content()
        key = self._spare_holding(content) or bodies_key(attempt.commit_id)
        entries = state.externalize(key)
        if entries and not self._reuse(key, attempt):
            self.store.write(key, encode_bodies(entries), if_absent=True)
            self._wrote(attempt, key, content)
            self.bodies.remember(key, entries)
            self.metrics.bodies_writes += 1

    def _bodies_fit(self, state: QueueState) -> bool:
        """Whether this commit's large payloads may stay in the state: it stays under
        ``inline_state_bytes`` with them (as of its last size: close enough, and free)."""
        added = sum(len(job.body) for job in state.new_bodies)
        # The archive tail is not the state's to spend: it leaves for an object when it fills.
        return self._cache.size - self._tail_bytes + added <= self.inline_state_bytes

    def _write_runs(self, state: QueueState, attempt: Attempt) -> None:
        """Merge small runs and spill (when on), and write the runs this commit made: before
        the head, which must never refer to a run that is not stored. A try that did not land
        leaves them as orphans, deleted once a later try lands."""
        if self.spill_at is not None and (state.doc.has_runs() or state.may_spill(self.spill_at)):
            key_for = functools.partial(run_key, state.doc.version, attempt.commit_id)
            self._merge_reads.hand_over(self._cache.runs)
            self.metrics.runs_merged += state.merge_runs(key_for, self.run_jobs, MERGE_AT)
            state.spill(self.spill_at, key_for, run_jobs=self.run_jobs)
        if not state.new_runs:
            return
        for key, data in state.new_runs:
            self.store.write(key, data, if_absent=True)
            self._wrote(attempt, key, ("run", key))
        state.new_runs.clear()

    def _sweep(self, state: QueueState) -> None:
        """After a commit landed: look for orphan runs, and for garbage, when either is due."""
        self._sweep_runs(state)
        if self.sweeper is not None:
            self.sweeper.after_commit()

    def _sweep_runs(self, state: QueueState) -> None:
        """Now and then (first after this engine's first commit, so a process restarted after
        a crash cleans up after it), delete the runs no commit can refer to any more: those a
        process wrote before it died or lost its commit (:func:`orphan_runs`)."""
        if self.spill_at is None and not state.doc.has_runs():
            return
        now = time.monotonic()
        if now < self._next_run_sweep:
            return
        self._next_run_sweep = now + RUN_SWEEP_SECONDS
        version = state.doc.version
        referenced = state.doc.run_keys()

        def find() -> list[str]:
            return orphan_runs(self.store.list(RUNS_PREFIX), version, referenced)

        self._janitor.sweep(find, "orphan run")

    def _spare_holding(self, content: object) -> str | None:
        """The key of an object a failed try of this batch wrote with exactly ``content``."""
        for tried in self._failed_tries:
            for key, held in tried.contents.items():
                if held == content:
                    return key
        return None

    def _reuse(self, key: str, attempt: Attempt) -> bool:
        """Let ``attempt`` refer to ``key``, if a failed try of this batch wrote it."""
        for tried in self._failed_tries:
            if key in tried.contents:
                self._wrote(attempt, key, tried.contents[key])
                return True
        return False

    @staticmethod
    def _wrote(attempt: Attempt, key: str, content: object) -> None:
        attempt.written.append(key)
        attempt.contents[key] = content

    def _inline(self, job: Job) -> Job:
        """``job`` with its body in place, for an archive record that stands on its own."""
        try:
            return self.bodies.fill(job, inline=True)
        except ObjqError as exc:  # keep the reference rather than fail the commit
            log.warning("archiving job %s without its body: %s", job.id, exc)
            return job

    # --- off the commit path -----------------------------------------------------------------

    def wait_tidied(self, timeout: float | None = None) -> None:
        """Wait for the deletes the commits so far asked for."""
        self._janitor.wait(timeout)

    def close(self) -> None:
        """Finish the deletes asked for, and stop."""
        self._janitor.close()


def _ours(keys: list[str], prefix: str) -> list[str]:
    """Those of ``keys`` that objq wrote for this purpose (under ``prefix``) or a staged write
    wrote ahead (under ``staging/``): the only objects a commit that freed them may delete.
    Anything else a state names (a staged write of an older release could name any key) is
    left where it is, and said so."""
    kept = [key for key in keys if key.startswith((prefix, STAGING_PREFIX))]
    for key in set(keys) - set(kept):
        log.error("not deleting %s: a freed object outside %s and %s", key, prefix, STAGING_PREFIX)
    return kept
