"""No byte, bug or outside writer can make objq hang, or write a state it cannot read back.

Hostile bytes in ``state.json`` or a ``bodies/`` object become :class:`StateCorrupt` naming the
object, for every call, within its timeout, and the object is never written over. An operation
that crashes fails alone. The engine refuses to write a state its decoder would refuse, even
for an operation built past every check. A state put back from an older copy, deleted, or
given a forged epoch is recognised (``docs/security.md``).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from objq_broker import Queue, StateCorrupt
from objq_broker.engine import STATE_KEY, Engine
from objq_broker.engine.guard import NAMESPACE_KEY
from objq_broker.engine.snapshot import Snapshot
from objq_broker.model import ops as op_types
from objq_broker.model.encoding import decode_state
from objq_broker.model.records import BrokerRecord
from objq_broker.model.values import NewJob
from objq_broker.storage import MemoryStore, open_store
from objq_broker.storage.base import Blob
from objq_broker.storage.file import STALE_TEMP_SECONDS

#: Longest any call below may take: every one must answer, with a result or an error.
ANSWER_SECONDS = 10.0


def answered(call: Callable[[], Any]) -> tuple[bool, Any]:
    """Run ``call`` on a thread; (True, result) or (False, exception). Fails the test if it
    has not returned within :data:`ANSWER_SECONDS`."""
    outcome: Future[Any] = Future()

    def run() -> None:
        try:
            outcome.set_result(call())
        except BaseException as exc:
            outcome.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    try:
        return True, outcome.result(ANSWER_SECONDS)
    except TimeoutError:
        pytest.fail(f"no answer within {ANSWER_SECONDS} s: the call hangs")
    except Exception as exc:
        return False, exc


def _namespace(tmp_path: Path) -> str:
    url = (tmp_path / "ns").as_uri()
    with Queue(url) as queue:
        queue.enqueue("q", b"first")
        queue.enqueue("q", b"x" * 2000)  # kept out of line once the state is large
        queue.enqueue("q", b"third", delay=60)
    return url


# --- hostile bytes ------------------------------------------------------------------------


def _mutations() -> st.SearchStrategy[Callable[[bytes], bytes]]:
    def flip(at: int, byte: int) -> Callable[[bytes], bytes]:
        return lambda data: data[: at % len(data)] + bytes([byte]) + data[at % len(data) + 1 :]

    def cut(at: int) -> Callable[[bytes], bytes]:
        return lambda data: data[: at % len(data)]

    def nest(depth: int) -> Callable[[bytes], bytes]:
        return lambda data: b"[" * depth + b"]" * depth

    return st.one_of(
        st.builds(flip, st.integers(0, 10**6), st.integers(0, 255)),
        st.builds(cut, st.integers(0, 10**6)),
        st.builds(nest, st.sampled_from([10, 100_000, 200_000])),
        st.just(lambda data: data.replace(b'"version":', b'"version":-', 1)),
        st.just(lambda data: data.replace(b'"q"', b'"a/b"', 1)),
        st.just(lambda data: b"\xff" + data[1:]),
    )


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(mutate=_mutations())
def test_hostile_state_bytes_become_state_corrupt_and_are_never_written_over(
    tmp_path_factory: pytest.TempPathFactory, mutate: Callable[[bytes], bytes]
) -> None:
    url = _namespace(tmp_path_factory.mktemp("hostile"))
    store = open_store(url)
    original = store.read(STATE_KEY)
    assert original is not None
    hostile = mutate(original.data) or b" "
    store.write(STATE_KEY, hostile, if_version=original.version)
    try:
        decode_state(hostile, "probe")
        readable = True
    except StateCorrupt:
        readable = False
    with Queue(url) as queue:
        calls: list[Callable[[], Any]] = [
            lambda: queue.claim("q"),
            lambda: queue.enqueue("q", b"new"),
            lambda: queue.stats("q"),
            lambda: queue.dead_letters("q"),
            queue.flush,
        ]
        for call in calls:
            ok, value = answered(call)
            if not ok:
                assert isinstance(value, StateCorrupt | msgspec.ValidationError) or (
                    readable and isinstance(value, Exception)
                ), repr(value)
                assert "state.json" in str(value) or readable
    stored = store.read(STATE_KEY)
    assert stored is not None
    if not readable:
        assert stored.data == hostile  # refused, never overwritten
    else:
        decode_state(stored.data, "after")  # whatever was written reads back


@pytest.mark.parametrize(
    "hostile",
    [b"\xff\xfe not json", b'[["\xff"]]', b"not json at all", b'[{"a": "\xc3\x28"}]'],
    ids=["binary", "invalid-utf8-in-string", "text", "invalid-utf8-sequence"],
)
def test_a_hostile_bodies_object_dead_letters_its_job_alone(tmp_path: Path, hostile: bytes) -> None:
    url = (tmp_path / "ns").as_uri()
    good = [f"good-{n}".encode() * 200 for n in range(20)]
    with Queue(url, inline_state_bytes=0) as queue:
        queue.enqueue("q", b"poison" * 200)
        queue.flush()
        store = open_store(url)
        [poison_key] = store.list("bodies/")
        queue.enqueue_many("q", good)
    store.write(poison_key, hostile)
    with Queue(url, inline_state_bytes=0) as queue:
        ok, delivered = answered(lambda: queue.claim("q", 21))
        assert ok, delivered
        assert sorted(d.payload for d in delivered) == sorted(good)
        queue.flush()
        for delivery in delivered:
            queue.ack(delivery)
        [dead] = queue.dead_letters("q")  # listings still work, showing it
        assert dead.attempts == 1 and dead.error and poison_key in dead.error
        assert [job for state, job in queue.jobs("q") if state != "dead"] == []


# --- operations that crash ----------------------------------------------------------------


class _Crashes(op_types.Op[None], frozen=True):
    """An operation whose apply raises something objq does not expect (a bug)."""

    def apply(self, state: Any, now: float) -> None:
        raise RuntimeError("a bug in one operation")


def test_an_operation_that_crashes_fails_alone_and_the_writer_goes_on() -> None:
    engine = Engine(MemoryStore())
    try:
        crashed = engine.submit(_Crashes())
        with pytest.raises(RuntimeError, match="a bug"):
            crashed.result(ANSWER_SECONDS)
        assert engine.call(op_types.Declare("q")) is True
    finally:
        engine.close()


def test_an_sdk_error_objq_does_not_translate_is_retried_then_fails_the_batch_not_the_writer() -> (
    None
):
    class Exploding(MemoryStore):
        failures = 0  # writes of the state still to fail

        def write(self, key: str, data: bytes, **condition: Any) -> str:
            if self.failures and key == STATE_KEY:
                self.failures -= 1
                raise KeyError("an SDK's own exception")
            return super().write(key, data, **condition)

    store = Exploding()
    engine = Engine(store, commit_deadline_seconds=0.5)
    try:
        store.failures = 1  # once: the commit tries again and lands
        assert engine.call(op_types.Declare("q")) is True
        store.failures = 10**6  # for good: the batch fails at its deadline
        ok, error = answered(lambda: engine.call(op_types.Declare("r")))
        assert not ok and "KeyError" in str(error)
        store.failures = 0
        assert engine.call(op_types.Declare("s")) is True  # the writer carries on
    finally:
        engine.close()


# --- the last line of defence -------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_the_engine_never_writes_a_state_its_decoder_would_refuse(bad: float) -> None:
    """An operation built past every check (as a bug could): its NaN would be written as
    ``null`` and brick the namespace. The write is refused, and the state stays readable."""
    store = MemoryStore()
    engine = Engine(store)
    try:
        engine.call(op_types.Declare("q"))
        before = store.read(STATE_KEY)
        forged = op_types.Enqueue([NewJob("j1", "q", "body", delay_seconds=bad)])
        with pytest.raises(StateCorrupt, match="refusing to write"):
            engine.call(forged)
        after = store.read(STATE_KEY)
        assert before is not None and after is not None and after.data == before.data
        engine.call(op_types.Enqueue([NewJob("j2", "q", "fine")]))  # and it goes on
    finally:
        engine.close()
    stored = store.read(STATE_KEY)
    assert stored is not None
    assert [job.id for job in decode_state(stored.data, "t").jobs] == ["j2"]


# --- an outside writer --------------------------------------------------------------------


def test_a_state_put_back_from_an_older_copy_is_refused_by_a_process_that_saw_newer(
    tmp_path: Path,
) -> None:
    url = (tmp_path / "ns").as_uri()
    store = open_store(url)
    with Queue(url) as queue:
        queue.enqueue("q", b"one")
        old = store.read(STATE_KEY)
        assert old is not None
        [delivery] = queue.claim("q")
        queue.ack(delivery)  # acknowledged: must not come back
        current = store.read(STATE_KEY)
        assert current is not None
        store.write(STATE_KEY, old.data, if_version=current.version)
        ok, error = answered(lambda: queue.enqueue("q", b"two"))  # its write finds it
        assert not ok and isinstance(error, StateCorrupt), error
        assert "older copy" in str(error) and "version" in str(error)
    assert store.read(STATE_KEY).data == old.data  # type: ignore[union-attr]
    with Queue(url) as fresh:  # a process that never saw the newer one cannot tell
        assert [d.payload for d in fresh.claim("q")] == [b"one"]


def test_a_deleted_state_is_refused_not_recreated_empty(tmp_path: Path) -> None:
    url = (tmp_path / "ns").as_uri()
    store = open_store(url)
    with Queue(url) as queue:
        queue.enqueue("q", b"one")
        assert store.read(NAMESPACE_KEY) is not None
        store.delete(STATE_KEY)
        ok, error = answered(lambda: queue.enqueue("q", b"two"))
        assert not ok and isinstance(error, StateCorrupt) and "deleted" in str(error)
    with Queue(url) as later:  # another process: the marker tells
        ok, error = answered(lambda: later.enqueue("q", b"two"))
        assert not ok and isinstance(error, StateCorrupt) and NAMESPACE_KEY in str(error)
    assert store.read(STATE_KEY) is None
    store.delete(NAMESPACE_KEY)  # starting afresh on purpose
    with Queue(url) as afresh:
        afresh.enqueue("q", b"three")
        assert [d.payload for d in afresh.claim("q")] == [b"three"]


class CreatedMeanwhile(MemoryStore):
    """A fresh namespace whose state another process creates (with its marker) right after
    the first read of it here found none: processes starting together on a new namespace."""

    def __init__(self) -> None:
        super().__init__()
        self.created_by_other = False

    def read(self, key: str) -> Blob | None:
        blob = super().read(key)
        if key == STATE_KEY and blob is None and not self.created_by_other:
            self.created_by_other = True
            with Queue(store=self) as other:
                other.enqueue("q", b"theirs")
        return blob


def test_a_state_created_by_another_process_meanwhile_is_not_taken_for_a_deleted_one() -> None:
    store = CreatedMeanwhile()
    with Queue(store=store) as queue:
        queue.enqueue("q", b"mine")
        assert store.created_by_other
        assert sorted(d.payload for d in queue.claim("q", 10)) == [b"mine", b"theirs"]


def test_a_state_created_meanwhile_is_read_by_a_read_only_call_too() -> None:
    # Reads answer outside the commit loop's retries: they must take the new state as found.
    store = CreatedMeanwhile()
    with Queue(store=store) as queue:
        assert queue.stats("q").ready == 1
        assert store.created_by_other
    assert Snapshot.read(CreatedMeanwhile()).queue_names() == ["q"]


def test_a_forged_epoch_is_reported_and_does_not_fence_the_recorded_broker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    record = BrokerRecord("b1", "127.0.0.1:1", 0, 0.0)
    setup = Engine(store)
    won = setup.call(op_types.TakeBroker(record, None))
    setup.close()
    broker = Engine(store, epoch=won.epoch, exclusive=True)
    try:
        broker.call(op_types.Declare("q"))
        blob = store.read(STATE_KEY)
        assert blob is not None
        doc = decode_state(blob.data, "t")
        doc.epoch = 1_000_000
        store.write(STATE_KEY, msgspec.json.encode(doc), if_version=blob.version)
        broker._cache.invalidate()  # as after a conflict: it reads the forged state
        with caplog.at_level(logging.ERROR, logger="objq_broker.engine"):
            assert broker.call(op_types.Declare("r")) is True  # not fenced
        assert "not written by objq" in caplog.text
        assert broker.fenced is None
    finally:
        broker.close()
    # A real takeover (the record moves to the new epoch) still fences it.
    taker = Engine(store)
    taker.call(op_types.TakeBroker(BrokerRecord("b2", "127.0.0.1:2", 0, 0.0), won.epoch))
    taker.close()
    old = Engine(store, epoch=won.epoch, exclusive=True)
    try:
        ok, error = answered(lambda: old.call(op_types.Declare("s")))
        assert not ok and "took over" in str(error)
    finally:
        old.close()


def test_a_state_larger_than_the_limit_is_refused_unread(tmp_path: Path) -> None:
    url = (tmp_path / "ns").as_uri()
    with Queue(url) as queue:
        queue.enqueue_many("q", [b"x" * 100] * 200)
    with Queue(url, max_state_bytes=1024) as small:
        ok, error = answered(lambda: small.claim("q"))
        assert not ok and isinstance(error, StateCorrupt)
        assert "at most 1024 bytes" in str(error) and "max_state_bytes" in str(error)
    with Queue(url) as default:
        assert len(default.claim("q", 10)) == 10


def test_temporary_files_left_by_killed_writers_are_swept_when_a_store_opens(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ns"
    with Queue(root.as_uri()) as queue:
        queue.enqueue("q", b"one")
    stale = root / ".objq-tmp" / "left-by-a-killed-writer.tmp"
    young = root / ".objq-tmp" / "being-written-now.tmp"
    for leftover in (stale, young):
        leftover.write_bytes(b"half a state")
    old = time.time() - 2 * STALE_TEMP_SECONDS
    os.utime(stale, (old, old))
    with Queue(root.as_uri()) as queue:
        assert [d.payload for d in queue.claim("q")] == [b"one"]
    assert not stale.exists() and young.exists()
