"""Celery's result backend on objq's storage: ``result_backend = "objq+<storage URL>"``.

>>> import objq_broker.kombu  # registers the "objq" result backend alias with Celery
>>> from celery import Celery
>>> app = Celery(broker="objq+memory://doc", backend="objq+memory://doc")
>>> app.backend.store_result("task-1", 42, "SUCCESS")
42
>>> app.AsyncResult("task-1").get(timeout=1)
42

Each result is one object (``results/celery-task-meta-<task id>`` under the store's root), so
the backend may share the broker's store: results never enter the queue's state object. It is
Celery's key-value backend over :class:`~objq_broker.results.store.ResultStore`:

* **Storing** is a compare-and-set write that never replaces a stored ``SUCCESS``: a task run
  again after its worker was lost cannot overwrite the result of the run that finished.
* **Waiting** (``AsyncResult.get``, ``GroupResult.get``) is one :meth:`ResultStore.wait` on
  every result still pending: a result stored by this process wakes the waiter at once, others
  are read again at intervals growing from a few milliseconds to ``interval``.
* **Chords** count their header in one counter object, changed by compare-and-set, that holds
  each part's result keyed by task id and place in the header, so a header task that runs
  twice (redelivered after its worker died before acking) counts once. The report that
  completes the header claims the callback for a while
  (:data:`~objq_broker.results.celery.chords.CHORD_CLAIM_SECONDS`), sends it, and marks the
  chord done; a report arriving meanwhile waits for that, and takes the claim over only if it
  lapses (the claimant died before sending). The callback runs once, unless its claimant dies
  between sending it and the write that marks the chord done (or stalls longer than its claim)
  and a copy of a header task arrives then.
* **Expiry**: ``result_expires`` is each record's lifetime (``result_failure_expires`` that of
  failures, ``result_chord_expires`` that of chord counters); an expired record reads as
  absent, and :meth:`ObjqBackend.cleanup` (Celery's daily ``backend_cleanup`` task) deletes it.
"""

from __future__ import annotations

from objq_broker.results.celery.backend import ObjqBackend
from objq_broker.results.celery.settings import (
    BackendConfigurationError,
    BackendSettings,
    backend_settings,
)

__all__ = ["BackendConfigurationError", "BackendSettings", "ObjqBackend", "backend_settings"]
