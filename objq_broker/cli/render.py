"""How jobs look in ``objq`` output: ``--json`` records, payload fields and previews."""

from __future__ import annotations

from typing import Any

from objq_broker.cli.output import printable
from objq_broker.errors import PayloadInvalid
from objq_broker.model.records import Job


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
        "group": job.group,
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
    """The start of the payload on one line, escaped for a terminal (see ``printable``)."""
    if job.ref is not None and not job.body:
        return printable(f"<{job.ref}>")
    if not job.b64:
        text = job.body
    else:
        try:
            text = f"<{len(job.payload)} bytes>"
        except PayloadInvalid:  # a poison job: its raw text, said so
            text = f"<not base64> {job.body}"
    text = printable(text.replace("\n", " "))
    return text if len(text) <= width else text[: width - 1] + "…"
