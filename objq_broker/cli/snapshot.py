"""A read-only view of a namespace: the state object read once, decoded, never written.

Inspecting commands (``status``, ``jobs``, ``dead list``, ``config show``) read through this,
not through the engine: looking at a queue must never change it, and a state that cannot be
decoded is reported with its key and left exactly as it is. Mutating commands read it first
too, so an unreachable store, a missing bucket or a corrupt state fails at once with one line.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from objq_broker.bodies import BodyCache
from objq_broker.engine import STATE_KEY
from objq_broker.errors import BucketNotFound
from objq_broker.records import Job, StateDoc, decode_state
from objq_broker.state import QueueState
from objq_broker.storage import ObjectStore, open_store


def open_existing(url: str) -> ObjectStore:
    """Open ``url``, refusing a local directory that does not exist (a file store would
    create it, and a typo would then look like an empty queue)."""
    parts = urlsplit(url)
    if parts.scheme.lower() == "file":
        folder = Path(parts.netloc + parts.path)
        if parts.netloc + parts.path and not folder.is_dir():
            raise BucketNotFound(
                f"file store {str(folder.absolute())!r}: expected an existing directory, "
                "found none (objq enqueue or objq demo creates one)"
            )
    return open_store(url)


@dataclass
class Snapshot:
    """The state of one store at one moment, with the stored object's version and size."""

    store: ObjectStore
    state: QueueState
    size_bytes: int
    read_at: float
    exists: bool
    bodies: BodyCache = field(init=False)

    def __post_init__(self) -> None:
        self.bodies = BodyCache(self.store)  # one bodies object holds many jobs' payloads

    @classmethod
    def read(cls, store: ObjectStore) -> Snapshot:
        blob = store.read(STATE_KEY)
        if blob is None:
            return cls(store, QueueState(), 0, time.time(), exists=False)
        doc = decode_state(blob.data, f"state {store.url}/{STATE_KEY}")
        return cls(store, QueueState(doc), len(blob.data), time.time(), exists=True)

    @property
    def doc(self) -> StateDoc:
        return self.state.doc

    def fill(self, job: Job) -> Job:
        """``job`` with its payload, loaded from its bodies object if kept out of line."""
        if job.ref is None or job.body:
            return job
        body, b64 = self.bodies.load(job.ref)
        return msgspec.structs.replace(job, body=body, b64=b64)


def job_dict(job: Job, state: str, *, payload: bool = True) -> dict[str, Any]:
    """A job as the ``--json`` output shows it (times are Unix seconds, as stored)."""
    out: dict[str, Any] = {
        "id": job.id,
        "queue": job.queue,
        "state": state,
        "priority": job.priority,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "enqueued_at": job.enqueued_at,
        "visible_at": job.visible_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "error": job.error,
        "key": job.key,
        "lease": None
        if job.lease is None
        else {"owner": job.lease.owner, "expires_at": job.lease.expires_at},
    }
    if payload:
        out.update(payload_fields(job))
    return out


def payload_fields(job: Job) -> dict[str, Any]:
    """The payload as text when it is UTF-8, else base64, and which of the two it is."""
    if job.ref is not None and not job.body:
        return {"payload": None, "payload_ref": job.ref}
    if job.b64:
        return {"payload": job.body, "payload_encoding": "base64"}
    return {"payload": job.body, "payload_encoding": "utf-8"}


def payload_preview(job: Job, width: int = 40) -> str:
    if job.ref is not None and not job.body:
        return f"<{job.ref}>"
    text = job.body if not job.b64 else f"<{len(base64.b64decode(job.body))} bytes>"
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"
