"""Celery's key-value result backend over :class:`~objq_broker.results.store.ResultStore`:
storing, waiting, expiry and chords (see :mod:`objq_broker.results.celery`)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from celery import states
from celery.backends.base import KeyValueStoreBackend
from celery.canvas import maybe_signature
from celery.exceptions import ChordError
from celery.result import GroupResult, allow_join_result
from celery.utils.functional import _regen
from celery.utils.log import get_logger
from kombu.utils.encoding import bytes_to_str, ensure_bytes

from objq_broker.errors import StorageUnavailable, redacted
from objq_broker.results.celery.chords import (
    CHORD_CLAIM_SECONDS,
    ChordCounters,
    Part,
    Progress,
    chord_error,
    header_order,
)
from objq_broker.results.celery.settings import backend_settings, open_results

logger = get_logger(__name__)


class ObjqBackend(KeyValueStoreBackend):  # type: ignore[misc]
    """Celery result backend on objq storage; see :mod:`objq_broker.results.celery`."""

    key_t = staticmethod(bytes_to_str)  # object names are text
    supports_native_join = True  # a group waits on all its results in one wait
    supports_autoexpire = False  # expired records read as absent but stay until cleanup()
    supports_result_compression = True  # the bytes Celery gives are stored as they are
    supports_failure_expires = True

    def __init__(self, app: Any, url: str | None = None, **kwargs: Any) -> None:
        super().__init__(app, url=url, **kwargs)
        conf = self.app.conf
        options = conf.get("result_backend_transport_options") or {}
        self.settings = backend_settings(url, options)
        self._results = open_results(self.settings)
        failure_expires = conf.get("result_failure_expires")
        self.failure_expires = (
            self.expires if failure_expires is None else self.prepare_expires(failure_expires)
        )
        chord_expires = conf.get("result_chord_expires")
        join_timeout = float(conf.get("result_chord_join_timeout") or 0)
        self._chords = ChordCounters(
            self._results,
            ttl=_ttl(
                self.expires if chord_expires is None else self.prepare_expires(chord_expires)
            ),
            claim_seconds=max(CHORD_CLAIM_SECONDS, 2 * join_timeout),
        )

    def as_uri(self, include_password: bool = False) -> str:
        uri = f"objq+{self.settings.url}"
        return uri if include_password else redacted(uri)

    def __reduce__(self, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        return super().__reduce__(args, {**(kwargs or {}), "url": self.url})

    def exception_safe_to_retry(self, exc: BaseException) -> bool:
        return isinstance(exc, StorageUnavailable)  # with result_backend_always_retry

    # --- the key-value contract --------------------------------------------------------------

    def get(self, key: str | bytes) -> bytes | None:
        return self._results.get(bytes_to_str(key))

    def mget(self, keys: Iterable[str | bytes]) -> list[bytes | None]:
        return [self.get(key) for key in keys]

    def set(self, key: str | bytes, value: str | bytes) -> None:
        self._results.set(bytes_to_str(key), ensure_bytes(value), _ttl(self.expires))

    def _set_with_state(self, key: str | bytes, value: str | bytes, state: str) -> None:
        self._results.set(bytes_to_str(key), ensure_bytes(value), self._ttl_for(state))

    def delete(self, key: str | bytes) -> None:
        self._results.delete(bytes_to_str(key))

    def incr(self, key: str | bytes) -> int:
        stored = self._results.update(
            bytes_to_str(key), lambda old: b"%d" % (int(old or b"0") + 1), _ttl(self.expires)
        )
        return int(stored or b"0")

    def expire(self, key: str | bytes, value: float | None) -> None:
        self._results.update(bytes_to_str(key), lambda old: old, _ttl(value))

    def _store_result(
        self,
        task_id: str,
        result: Any,
        state: str,
        traceback: str | None = None,
        request: Any = None,
        **kwargs: Any,
    ) -> Any:
        meta = self._get_result_meta(
            result=result, state=state, traceback=traceback, request=request
        )
        meta["task_id"] = bytes_to_str(task_id)
        encoded: bytes = ensure_bytes(self.encode(meta))

        def unless_succeeded(old: bytes | None) -> bytes | None:
            # A task run again (its worker was lost before the ack) never replaces a success.
            if old is not None and self.decode(old).get("status") == states.SUCCESS:
                return None
            return encoded

        self._results.update(self.get_key_for_task(task_id), unless_succeeded, self._ttl_for(state))
        return result

    def _ttl_for(self, state: str) -> float | None:
        return _ttl(self.failure_expires if state == states.FAILURE else self.expires)

    def cleanup(self) -> int:
        """Delete expired records (Celery's ``backend_cleanup`` task calls this daily)."""
        deleted = self._results.purge()
        logger.info("%s: deleted %d expired results", self.as_uri(), deleted)
        return deleted

    # --- waiting -----------------------------------------------------------------------------

    def wait_for(
        self,
        task_id: str,
        timeout: float | None = None,
        interval: float = 0.5,
        no_ack: bool = True,
        on_interval: Callable[[], object] | None = None,
    ) -> Any:
        self._ensure_not_eager()
        cached = self._cache.get(task_id)
        if cached is not None and cached["status"] in states.READY_STATES:
            return cached
        ready = self._wait_ready([task_id], timeout, interval, on_interval)
        if task_id not in ready:
            raise self.TimeoutError("The operation timed out.")
        meta = ready[task_id]
        if meta["status"] == states.SUCCESS:
            self._cache[task_id] = meta
        return meta

    def get_many(  # noqa: PLR0917 (Celery's signature)
        self,
        task_ids: Iterable[str | bytes],
        timeout: float | None = None,
        interval: float | None = 0.5,
        no_ack: bool = True,
        on_message: Callable[[Any], object] | None = None,
        on_interval: Callable[[], object] | None = None,
        max_iterations: int | None = None,
        READY_STATES: frozenset[str] = states.READY_STATES,
        **kwargs: Any,
    ) -> Iterator[tuple[str, Any]]:
        """Yield ``(task id, meta)`` as results are ready. One wait covers every pending result
        and ends when all are ready, or early when one failed (so a group's ``get()`` raises at
        once), or at the timeout: waking on each result would restart the pauses between reads
        and read every pending result back to back."""
        interval = 0.5 if interval is None else interval
        pending = {bytes_to_str(task_id) for task_id in task_ids}
        for task_id in sorted(pending):
            cached = self._cache.get(task_id)
            if cached is not None and cached["status"] in READY_STATES:
                pending.discard(task_id)
                yield task_id, cached
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready = self._wait_ready(
                sorted(pending),
                0.0 if max_iterations else left,  # Celery's "read each once" (ready() checks)
                interval,
                on_interval,
                ready_states=READY_STATES,
                early_states=states.PROPAGATE_STATES,
            )
            self._cache.update(ready)
            for task_id, meta in ready.items():
                pending.discard(task_id)
                if on_message is not None:
                    on_message(meta)
                yield task_id, meta
            if max_iterations:
                return
            if pending and deadline is not None and time.monotonic() >= deadline:
                raise self.TimeoutError(f"Operation timed out ({timeout})")

    def _wait_ready(
        self,
        task_ids: list[str],
        timeout: float | None,
        interval: float,
        on_interval: Callable[[], object] | None,
        *,
        ready_states: frozenset[str] = states.READY_STATES,
        early_states: frozenset[str] = frozenset(),
    ) -> dict[str, Any]:
        """The metas of ``task_ids`` in a ready state, once all of them are, or one is in
        ``early_states``, or ``timeout`` passed. ``on_interval`` runs between reads, once per
        interval, and once more when the wait ends on ready results: as with Celery's Redis
        backend, a failed parent (the check ``AsyncResult.get`` passes) is raised before a
        ready result is returned, so a chord whose header failed raises the header's error
        rather than the ChordError."""
        task_of = {self.get_key_for_task(task_id): task_id for task_id in task_ids}
        ready: dict[str, Any] = {}
        between_reads = _every(interval, on_interval)

        def enough(found: dict[str, bytes]) -> bool:
            ended = False
            for name, data in found.items():
                task_id = task_of[name]
                if task_id not in ready:
                    meta = self.decode_result(data)
                    if meta["status"] in ready_states:
                        ready[task_id] = meta
                        ended = ended or meta["status"] in early_states
            if ended or len(ready) == len(task_of):
                if on_interval is not None:
                    on_interval()
                return True
            between_reads()
            return False

        self._results.wait(task_of, enough, timeout, interval)
        return ready

    # --- chords ------------------------------------------------------------------------------

    def apply_chord(self, header_result_args: Any, body: Any, **kwargs: Any) -> None:
        self.ensure_chords_allowed()
        group_id, results = header_result_args[0], header_result_args[1]
        # A frozen chord applied again keeps its group id: this run counts from nothing.
        self._chords.start(self.get_key_for_chord(group_id))
        # A generator header reaches here as Celery's lazy ``_regen`` (a list subclass) whose
        # items are the header's tasks being sent: walking it would send them all before the
        # chord is set up (and exhaust the generator). Its shape cannot be known yet, so it
        # is left alone, as Celery's Redis backend does.
        lazy = isinstance(results, _regen)
        if (
            not lazy
            and isinstance(results, list | tuple)
            and any(isinstance(r, GroupResult) for r in results)
        ):
            # Nested groups: the callback gets the header's shape, which only a join keeps.
            self.save_group(group_id, self.app.GroupResult(*header_result_args))

    def set_chord_size(self, group_id: str, chord_size: int) -> None:
        self._chords.set_size(self.get_key_for_chord(group_id), chord_size)

    def add_to_chord(self, group_id: str, result: Any) -> None:
        self._chords.add(self.get_key_for_chord(group_id), result.id)

    def on_chord_part_return(self, request: Any, state: str, result: Any, **kwargs: Any) -> None:
        group_id, task_id = getattr(request, "group", None), getattr(request, "id", None)
        if not group_id or not task_id or not getattr(request, "chord", None):
            return
        index = getattr(request, "group_index", None)
        value = ensure_bytes(self.encode(self.encode_result(result, state)))
        part = Part(task_id, index, state, value)
        name, token = self.get_key_for_chord(group_id), uuid.uuid4().hex
        waited = False
        while True:
            progress = self._chords.report(name, f"{task_id}:{index}", part, token)
            if progress is None or progress.done or not progress.complete():
                return
            if progress.claimed_by == token:
                if waited:
                    logger.warning("Chord %r: a claim on its callback lapsed; sending it", group_id)
                self._complete_chord(name, group_id, request, progress, token)
                return
            # Another report completed the header and holds the callback: wait until it is
            # sent, or until that claim lapses (its process died) and this one takes it over.
            self._chords.wait_settled(name, progress)
            waited = True

    def _complete_chord(
        self, name: str, group_id: str, request: Any, progress: Progress, token: str
    ) -> None:
        callback = maybe_signature(request.chord, app=self.app)
        try:
            try:
                values = self._header_values(group_id, progress)
            except ChordError as exc:
                logger.error("Chord %r: %s", group_id, exc)
                self.chord_error_from_stack(callback, exc)
                return
            except Exception as exc:
                logger.exception("Chord %r: joining the header failed", group_id)
                self.chord_error_from_stack(callback, chord_error(f"Join error: {exc!r}", exc))
                return
            if not self._chords.renew(name, token):
                logger.warning("Chord %r: another process took the callback over", group_id)
                return
            try:
                self._send_callback(callback, values)
            except Exception as exc:
                logger.exception("Chord %r: sending the callback failed", group_id)
                self.chord_error_from_stack(callback, chord_error(f"Callback error: {exc!r}", exc))
        finally:
            self._chords.finish(name, token)

    def _send_callback(self, callback: Any, values: list[Any]) -> None:
        """Send a chord's callback with its header's ``values``, through a publish batch
        where kombu has them (5.7 on): a callback that is a group sends its tasks in one
        commit of the objq transport, not one commit each."""
        with self.app.producer_or_acquire() as producer:
            batch = getattr(producer, "batch", None)
            with batch() if batch is not None else contextlib.nullcontext():
                callback.apply_async((values,), producer=producer)

    def _header_values(self, group_id: str, progress: Progress) -> list[Any]:
        """The header's results in header order; ChordError if one of them failed."""
        nested = GroupResult.restore(group_id, backend=self)  # saved for nested headers only
        if nested is not None:
            with allow_join_result():
                values: list[Any] = nested.join_native(
                    timeout=self.app.conf.result_chord_join_timeout, propagate=True
                )
            return values
        return [
            self._part_value(part) for part in sorted(progress.parts.values(), key=header_order)
        ]

    def _part_value(self, part: Part) -> Any:
        value = self.decode(part.value)
        if part.state in states.EXCEPTION_STATES:
            value = self.exception_to_python(value)
        if part.state in states.PROPAGATE_STATES:
            raise chord_error(f"Dependency {part.task_id} raised {value!r}", value)
        return value


def _ttl(expires: Any) -> float | None:
    """A record lifetime from a Celery expiry (seconds, a timedelta, or None/0 for never)."""
    seconds = expires.total_seconds() if hasattr(expires, "total_seconds") else expires
    return float(seconds) if seconds else None


def _every(seconds: float, action: Callable[[], object] | None) -> Callable[[], None]:
    """``action`` at most once per ``seconds``: Celery's checks between two reads of a result
    (a chain's parents, on ``get``) read storage too, and the reads here are frequent."""
    last = time.monotonic()

    def maybe() -> None:
        nonlocal last
        if action is not None and time.monotonic() - last >= seconds:
            last = time.monotonic()
            action()

    return maybe
