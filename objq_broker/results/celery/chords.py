"""Chord counters: one object per chord, changed only by compare-and-set, that holds each header
task's result keyed by task id and place in the header, so a header task that runs twice counts
once, and that the report completing the header claims for a while to send the callback (see
:mod:`objq_broker.results.celery`)."""

from __future__ import annotations

import time

import msgspec
from celery.exceptions import ChordError

from objq_broker.results.store import ResultStore

#: Least time a chord's completing report holds the callback before another report may take
#: it over (twice ``result_chord_join_timeout`` when that is longer): the claimant only joins
#: the header, sends the callback and marks the chord done in it.
CHORD_CLAIM_SECONDS = 10.0


class Part(msgspec.Struct, array_like=True):
    """One header task's report: its result as Celery encodes it."""

    task_id: str
    index: int | None  # its place in the header (None: after the numbered ones, as they came)
    state: str
    value: bytes


class Progress(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A chord's counter object."""

    size: int | None = None  # header tasks to wait for, once the publisher said
    parts: dict[str, Part] = msgspec.field(default_factory=dict)  # "task id:index" -> part
    added: list[str] = msgspec.field(default_factory=list)  # ids Task.add_to_chord added
    claimed_by: str | None = None
    claimed_until: float = 0.0
    done: bool = False

    def complete(self) -> bool:
        return self.size is not None and len(self.parts) >= self.size + len(self.added)

    def claimable(self, now: float) -> bool:
        lapsed = self.claimed_by is None or self.claimed_until <= now
        return self.complete() and not self.done and lapsed


_progress_encoder = msgspec.json.Encoder()
_progress_decoder = msgspec.json.Decoder(Progress)


def decode_progress(data: bytes | None) -> Progress:
    return Progress() if data is None else _progress_decoder.decode(data)


class ChordCounters:
    """The counter objects of chords; each change is one compare-and-set update."""

    def __init__(self, results: ResultStore, ttl: float | None, claim_seconds: float) -> None:
        self.results, self.ttl, self.claim_seconds = results, ttl, claim_seconds

    def start(self, name: str) -> None:
        self.results.set(name, _progress_encoder.encode(Progress()), self.ttl)

    def set_size(self, name: str, size: int) -> None:
        def sized(old: bytes | None) -> bytes:
            progress = decode_progress(old)
            progress.size = size
            return _progress_encoder.encode(progress)

        self.results.update(name, sized, self.ttl)

    def add(self, name: str, task_id: str) -> None:
        def added(old: bytes | None) -> bytes | None:
            progress = decode_progress(old)
            if task_id in progress.added:
                return None
            progress.added.append(task_id)
            return _progress_encoder.encode(progress)

        self.results.update(name, added, self.ttl)

    def report(self, name: str, key: str, part: Part, token: str) -> Progress | None:
        """Count ``part`` once under ``key``, and claim the callback for ``token`` when the
        header is complete and nobody holds the claim; the counter as it then is."""

        def counted(old: bytes | None) -> bytes | None:
            progress, now = decode_progress(old), time.time()
            if progress.done:
                return None  # a late copy of a header task: the chord is over
            changed = key not in progress.parts
            if changed:
                progress.parts[key] = part
            if progress.claimable(now):
                progress.claimed_by, progress.claimed_until = token, now + self.claim_seconds
                changed = True
            return _progress_encoder.encode(progress) if changed else None

        stored = self.results.update(name, counted, self.ttl)
        current = stored if stored is not None else self.results.get(name)
        return None if current is None else decode_progress(current)

    def renew(self, name: str, token: str) -> bool:
        """Hold the claim of ``token`` for another spell; False when it was taken over."""
        held = False

        def renewed(old: bytes | None) -> bytes | None:
            nonlocal held
            progress = decode_progress(old)
            held = progress.claimed_by == token and not progress.done
            if not held:
                return None
            progress.claimed_until = time.time() + self.claim_seconds
            return _progress_encoder.encode(progress)

        self.results.update(name, renewed, self.ttl)
        return held

    def finish(self, name: str, token: str) -> None:
        """Mark the chord done (its parts are no longer needed), if ``token`` holds it."""

        def finished(old: bytes | None) -> bytes | None:
            progress = decode_progress(old)
            if progress.claimed_by != token or progress.done:
                return None
            return _progress_encoder.encode(Progress(size=progress.size, done=True))

        self.results.update(name, finished, self.ttl)

    def wait_settled(self, name: str, progress: Progress) -> None:
        """Wait until the claim in ``progress`` ends: the chord is done, or the claim lapsed or
        changed hands (its holder died, or renewed it)."""

        def settled(found: dict[str, bytes]) -> bool:
            now = decode_progress(found.get(name))
            return (
                now.done
                or now.claimed_until != progress.claimed_until
                or (now.claimed_until <= time.time())
            )

        left = progress.claimed_until - time.time()
        self.results.wait([name], settled, timeout=max(left, 0.0) + 0.1, interval=1.0)


def chord_error(message: str, cause: object) -> ChordError:
    error = ChordError(message)
    if isinstance(cause, BaseException):
        error.__cause__ = cause
    return error


def header_order(part: Part) -> tuple[bool, int]:
    return part.index is None, part.index or 0
