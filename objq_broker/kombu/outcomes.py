"""True task outcomes for Celery: a task that raised is archived as failed, not done.

Celery acks a task message when a worker takes it (unless ``acks_late``), before it runs, so
the ack cannot say how the run went. The transport marks each message it hands out with its
objq job and queue (in the message properties, which Celery passes to the task's request), and
these signal handlers, run where the task ran (a prefork child, or the worker itself), note the
outcome in the archive: ``failed`` when the task raised (its retries spent, or none asked for),
``retried`` when it asked to run again (``self.retry``, ``autoretry_for``), each with the
error. The job's own record keeps "done"; readers of the archive take the note's outcome.

A note is submitted, not waited for: the task's own result is already stored, and a failing
task must not wait a commit more than it would on another broker (a chord of failing tasks
ran each in half the time). The process waits for the notes it submitted when it stops
(Celery's ``worker_process_shutdown`` in a pool child, ``worker_shutdown`` in the worker), so
a child that leaves with ``os._exit`` loses none.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any

from objq_broker.errors import MAX_JOB_ERROR_CHARS, job_error

if TYPE_CHECKING:
    from objq_broker.queue import Queue

log = logging.getLogger(__name__)

#: Message properties the transport adds on hand-out: which objq job and queue a message is,
#: and the lease token it was delivered under (a note must show it).
JOB_PROPERTY = "objq_job"
QUEUE_PROPERTY = "objq_queue"
TOKEN_PROPERTY = "objq_token"
#: One connection of the signal handlers, however many times the transport is imported.
_DISPATCH_UID = "objq_broker.kombu.outcomes"
#: The longest a stopping process waits for its notes to be committed, per queue.
NOTES_FLUSH_SECONDS = 10.0
#: Queues this process submitted notes to since it last waited for them.
_noted: weakref.WeakSet[Queue] = weakref.WeakSet()
_noted_lock = threading.Lock()


def connect() -> None:
    """Listen for Celery's failure and retry signals (Celery is installed: checked by the
    caller)."""
    from celery import signals

    signals.task_failure.connect(_on_failure, weak=False, dispatch_uid=_DISPATCH_UID)
    signals.task_retry.connect(_on_retry, weak=False, dispatch_uid=_DISPATCH_UID)
    signals.worker_process_shutdown.connect(flush_notes, weak=False, dispatch_uid=_DISPATCH_UID)
    signals.worker_shutdown.connect(flush_notes, weak=False, dispatch_uid=_DISPATCH_UID)


def flush_notes(**_: Any) -> None:
    """Wait until the notes this process submitted are committed (or failed, logged by
    their queue); never raises, as a handler of a stopping worker."""
    with _noted_lock:
        queues = list(_noted)
        _noted.clear()
    for queue in queues:
        try:
            queue.flush(NOTES_FLUSH_SECONDS)
        except Exception as exc:
            log.warning("could not wait for the outcome notes sent to %s: %s", queue, exc)


def error_text(exc: object) -> str | None:
    """What the archive keeps of the error (Celery may hand over a non-exception reason)."""
    if exc is None or isinstance(exc, BaseException):
        return job_error(exc)
    return str(exc)[:MAX_JOB_ERROR_CHARS]


def _on_failure(sender: Any = None, exception: object = None, **_: Any) -> None:
    _note(sender, getattr(sender, "request", None), "failed", error_text(exception))


def _on_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
    # ``reason`` is Celery's Retry; the error that made the task retry is its ``exc``.
    cause = getattr(reason, "exc", None) or reason
    _note(sender, request, "retried", error_text(cause))


def _note(task: Any, request: Any, outcome: str, error: str | None) -> None:
    """Archive ``outcome`` for the objq job ``request`` ran, if an objq transport handed it
    out; never raises (a signal handler's error would be logged as the task's own)."""
    if request is None or getattr(request, "is_eager", False):
        return
    properties = getattr(request, "properties", None) or {}
    job_id, queue = properties.get(JOB_PROPERTY), properties.get(QUEUE_PROPERTY)
    token = properties.get(TOKEN_PROPERTY)
    if not isinstance(job_id, str) or not isinstance(queue, str) or not isinstance(token, str):
        return  # not delivered by an objq transport
    try:
        with task.app.pool.acquire(block=True) as connection:
            transport = connection.transport
            if getattr(transport, "driver_type", None) != "objq":
                return
            objq = transport.open_queue()
            objq.note_outcome(job_id, queue, outcome, token=token, error=error, wait=False)
            with _noted_lock:
                _noted.add(objq)
    except Exception as exc:  # the outcome is lost, the task's own result is not
        log.warning("could not archive outcome %s of job %s: %s", outcome, job_id, exc)
