"""The archive tail: the newest archive records ride in the state until they fill an object."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from objq_broker import Queue
from objq_broker.engine import STATE_KEY
from objq_broker.engine.archive import (
    CARRIED_WRITES,
    DEFAULT_ARCHIVE_TAIL_BYTES,
    TAIL_CAP,
    archive_key,
    archive_keys,
    iter_archive,
    key_hour,
    plan_archive,
    read_archive,
    read_tail,
)
from objq_broker.errors import StateCorrupt
from objq_broker.model.encoding import check_encoded, decode_state, encode_archive
from objq_broker.model.records import (
    FORMAT_VERSION,
    TAIL_FORMAT_VERSION,
    ArchiveRecord,
    ArchiveTail,
    Job,
)
from objq_broker.model.state import QueueState
from objq_broker.model.values import NewJob
from objq_broker.storage import MemoryStore, open_store
from tests.support.clock import ManualClock
from tests.support.releases import ENQUEUE_ONE, check_out, run_under


def _finish(queue: Queue, payloads: list[bytes]) -> None:
    """Enqueue, claim and ack ``payloads``, one commit each way."""
    queue.enqueue_many("q", payloads)
    for delivery in queue.claim("q", len(payloads)):
        queue.ack(delivery)
    queue.flush()


def _archived(store: MemoryStore) -> list[bytes]:
    return [record.job.payload for record in iter_archive(store)]


def _format(store: MemoryStore) -> int:
    return decode_state(store.get(STATE_KEY), "state").format


def test_acks_ride_in_the_state_until_their_records_fill_an_object() -> None:
    store = MemoryStore("tail-fills")
    with Queue(store=store, archive_tail_bytes=2_000) as queue:
        # Given acks whose records stay under the tail's size
        _finish(queue, [b"a", b"b"])
        _finish(queue, [b"c"])
        # Then no archive object was written; their records are in the state, format 3
        assert archive_keys(store) == []
        assert [r.job.payload for r in read_tail(store)] == [b"a", b"b", b"c"]
        assert _format(store) == TAIL_FORMAT_VERSION
        assert queue.metrics().archive_writes == 0
        assert _archived(store) == [b"a", b"b", b"c"]

        # When more acks bring the tail past its size
        sent = [bytes([65 + n]) * 100 for n in range(20)]
        for payload in sent:
            _finish(queue, [payload])
            if archive_keys(store):
                break
        # Then one object holds everything the tail held, and the state is back to format 1
        [key] = archive_keys(store)
        written = [r.job.payload for r in read_archive(store, key)]
        assert written[:3] == [b"a", b"b", b"c"] and len(written) > 3
        assert read_tail(store) == [] and _format(store) == FORMAT_VERSION
        # and every finished job is read back once, in the order it finished
        _finish(queue, [b"after"])
        assert _archived(store) == [*written, b"after"]


def test_the_archive_adds_at_most_one_write_to_every_ten_of_the_state() -> None:
    store = MemoryStore("tail-share")
    with Queue(store=store) as queue:
        # Given rounds whose acks each finish 50 KiB of jobs, three times the tail's size
        for round_ in range(20):
            queue.enqueue_many("q", [b"%d" % round_ * 1_000] * 50)
            for delivery in queue.claim("q", 50):
                queue.ack(delivery, wait=False)
            queue.flush()
        metrics = queue.metrics()
    # Then archive objects were written, but no more than one per ten state writes
    assert metrics.archive_writes > 0
    assert metrics.archive_writes * 10 <= metrics.state_writes, metrics
    # and every finished job is archived once, none lost to the longer tail
    archived = [record.job.id for record in iter_archive(store)]
    assert len(archived) == len(set(archived)) == 1_000
    assert len(encode_archive(read_tail(store))) < DEFAULT_ARCHIVE_TAIL_BYTES * TAIL_CAP


def test_a_tail_from_an_earlier_hour_goes_to_its_own_hour_folder() -> None:
    store = MemoryStore("tail-hours")
    ten = datetime(2026, 3, 5, 10, 30, tzinfo=UTC).timestamp()
    clock = ManualClock(ten)
    with Queue(store=store, clock=clock) as queue:
        _finish(queue, [b"at ten"])
        assert archive_keys(store) == []
        # When a job finishes in the next hour
        clock.now = ten + 3600
        _finish(queue, [b"at eleven"])
        # Then the ten o'clock record was written to the ten o'clock folder, the other waits
        [key] = archive_keys(store)
        assert key_hour(key) == datetime(2026, 3, 5, 10, tzinfo=UTC)
        assert [r.job.payload for r in read_archive(store, key)] == [b"at ten"]
        assert [r.job.payload for r in read_tail(store)] == [b"at eleven"]
        # and a range read finds each in its own hour
        found = iter_archive(store, ten, ten + 1800)
        assert [r.job.payload for r in found] == [b"at ten"]
        found = iter_archive(store, ten + 1800)
        assert [r.job.payload for r in found] == [b"at eleven"]


def _record(job_id: str, at: float) -> ArchiveRecord:
    job = Job(id=job_id, queue="q", body="x", seq=1, enqueued_at=at, visible_at=at,
              max_attempts=1, finished_at=at)  # fmt: skip
    return ArchiveRecord("done", f"c-{job_id}", job)


def test_what_a_commit_does_with_the_records_of_the_jobs_it_finishes() -> None:
    ten = datetime(2026, 3, 5, 10, 30, tzinfo=UTC).timestamp()
    one = [_record("a", ten)]
    tail = ArchiveTail(since=ten, records=one, version=1)
    # Nothing finished: nothing to do, within the tail's hour, or with no tail
    assert plan_archive(None, [], "c", ten, version=1) is None
    assert plan_archive(tail, [], "c", ten + 60, version=2) is None
    # A small record joins the tail
    plan = plan_archive(tail, [_record("b", ten + 60)], "c", ten + 60, version=2)
    assert plan is not None and plan.objects == [] and plan.tail is not None
    assert [r.job.id for r in plan.tail.records] == ["a", "b"] and plan.tail.since == ten
    # The next hour writes the tail out to its own hour, even with nothing new
    plan = plan_archive(tail, [], "c", ten + 3600, version=2)
    assert plan is not None and plan.tail is None
    assert plan.objects == [(archive_key("c", ten), one)]
    # Past the size, the tail stays until ten state writes have carried it
    big = [_record("big", ten + 60)]
    size = len(encode_archive(one + big))
    for version in range(2, CARRIED_WRITES):
        plan = plan_archive(tail, big, "c", ten + 60, size, version=version)
        assert plan is not None and plan.objects == [] and plan.tail is not None
        assert plan.tail.version == 1
    # then the tail and the new records go out together
    plan = plan_archive(tail, big, "c", ten + 60, size, version=CARRIED_WRITES)
    assert plan is not None and plan.tail is None
    assert plan.objects == [(archive_key("c", ten), one + big)]
    # as they do at once past TAIL_CAP times the size, or when the tail's start is not known
    plan = plan_archive(tail, big, "c", ten + 60, size // TAIL_CAP, version=2)
    assert plan is not None and plan.objects == [(archive_key("c", ten), one + big)]
    unknown = ArchiveTail(since=ten, records=one)
    plan = plan_archive(unknown, big, "c", ten + 60, size, version=2)
    assert plan is not None and plan.objects == [(archive_key("c", ten), one + big)]
    # and with no tail at all, every commit that finishes jobs writes an object
    plan = plan_archive(None, big, "c", ten + 60, tail_bytes=0, version=2)
    assert plan is not None and plan.objects == [(archive_key("c", ten + 60), big)]


def test_a_tail_kept_as_lines_is_stored_as_if_encoded_whole() -> None:
    ten = datetime(2026, 3, 5, 10, 30, tzinfo=UTC).timestamp()
    records = [_record("a", ten), _record("b\nc", ten + 1), _record("d", ten + 2)]
    first = plan_archive(None, records[:1], "c", ten, version=1)
    assert first is not None and first.tail is not None
    # Given a commit that adds to a tail whose lines it was handed
    plan = plan_archive(first.tail, records[1:], "c", ten + 2, version=2, held_lines=first.lines)
    assert plan is not None and plan.tail is not None
    assert plan.lines == encode_archive(records)  # counted from the lines, not re-encoded
    # The state splices the lines in: the same bytes as the whole tail encoded
    spliced, whole = QueueState(), QueueState()
    spliced.set_archive_tail(plan.tail, plan.lines)
    whole.doc.archive_tail = plan.tail
    assert spliced.encode() == whole.encode()
    assert decode_state(spliced.encode(), "test").archive_tail == plan.tail
    # A later tail is spliced in place of the one before, not beside it
    later = plan_archive(
        plan.tail, [_record("e", ten + 3)], "d", ten + 3, version=3, held_lines=plan.lines
    )
    assert later is not None and later.tail is not None
    spliced.set_archive_tail(later.tail, later.lines)
    whole.doc.archive_tail = later.tail
    assert spliced.encode() == whole.encode()
    stored = decode_state(spliced.encode(), "test").archive_tail
    assert stored is not None and [r.job.id for r in stored.records] == ["a", "b\nc", "d", "e"]
    # A tail set otherwise (a state read again) has no lines kept: it is encoded whole
    spliced.doc.archive_tail = first.tail
    assert spliced.archive_lines() is None
    assert decode_state(spliced.encode(), "test").archive_tail == first.tail


def test_the_tail_and_the_jobs_are_searched_for_nulls_once_and_a_bad_one_still_refused() -> None:
    ten = datetime(2026, 3, 5, 10, 30, tzinfo=UTC).timestamp()
    good = plan_archive(None, [_record("a", ten), _record("b", ten)], "c", ten, version=1)
    assert good is not None and good.tail is not None
    # Given a state with a job and a tail, both searched when they were made
    state = QueueState()
    state.declare("q", now=ten)
    state.enqueue([NewJob("j", "q", "payload")], ten)
    state.set_archive_tail(good.tail, good.lines)
    data = state.encode()
    # Then only the rest of the state is left to search, and it is clean
    assert b'"archive_tail"' not in state.unchecked and b'"jobs"' not in state.unchecked
    assert len(state.unchecked) < len(data) / 2
    check_encoded(data, "state.json", only=state.unchecked)
    assert decode_state(data, "test").archive_tail == good.tail
    # And a refused null in that rest is still found
    bad = state.unchecked.replace(b'"format":', b'"version":null,"format":')
    with pytest.raises(StateCorrupt, match="'version' written as null"):
        check_encoded(data.replace(state.unchecked[:-1], bad[:-1]), "state.json", only=bad)
    # But a part searched when it was made is not searched again (this is what it saves)
    poisoned = data.replace(b'"queue":"q"', b'"seq":null,"queue":"q"')
    with pytest.raises(StateCorrupt, match="'seq' written as null"):
        check_encoded(poisoned, "state.json")
    check_encoded(poisoned, "state.json", only=state.unchecked)
    # A tail holding a refused null (a NaN time) is never taken as searched: refused
    nan = _record("n", ten)
    nan.job.enqueued_at = float("nan")
    bad_tail = plan_archive(good.tail, [nan], "d", ten, version=2, held_lines=good.lines)
    assert bad_tail is not None and bad_tail.tail is not None
    state.set_archive_tail(bad_tail.tail, bad_tail.lines)
    data = state.encode()
    assert state.unchecked == data
    with pytest.raises(StateCorrupt, match="'enqueued_at' written as null"):
        check_encoded(data, "state.json", only=state.unchecked)
    # nor is a job holding one, until it changes again
    state.set_archive_tail(good.tail, good.lines)
    [job] = state.jobs.values()
    job.visible_at = float("nan")
    state.index.changed(job)
    data = state.encode()
    assert state.unchecked == data
    with pytest.raises(StateCorrupt, match="'visible_at' written as null"):
        check_encoded(data, "state.json", only=state.unchecked)
    job.visible_at = ten
    state.index.changed(job)
    state.encode()
    assert len(state.unchecked) < len(data) / 2


def test_a_tail_written_out_by_a_commit_that_never_landed_is_read_once() -> None:
    store = MemoryStore("tail-crash")
    with Queue(store=store) as queue:
        _finish(queue, [b"a", b"b"])
    # Given a writer that wrote the tail out and died before its state write landed
    tail = read_tail(store)
    store.put(archive_key("died", tail[0].job.finished_at or 0.0), encode_archive(tail))
    # Then a reader still sees each job once
    assert _archived(store) == [b"a", b"b"]
    # and so does it after the next writer wrote the tail out for good
    with Queue(store=store, archive_tail_bytes=1) as queue:
        _finish(queue, [b"c"])
    # (its next commit wrote the tail out, the ack after it its own record)
    assert read_tail(store) == []
    written = [key for key in archive_keys(store) if not key.endswith("/died.jsonl")]
    assert sorted(r.job.payload for key in written for r in read_archive(store, key)) == [
        b"a",
        b"b",
        b"c",
    ]
    # (an object a dead writer left can hold jobs twice; counting readers count ids)
    assert sorted({r.job.id: r.job.payload for r in iter_archive(store)}.values()) == [
        b"a",
        b"b",
        b"c",
    ]


def test_archive_tail_bytes_0_writes_an_object_for_every_commit() -> None:
    store = MemoryStore("tail-off")
    with Queue(store=store, archive_tail_bytes=0) as queue:
        _finish(queue, [b"a"])
        _finish(queue, [b"b"])
        assert queue.metrics().archive_writes == 2
    assert len(archive_keys(store)) == 2 and read_tail(store) == []
    assert _format(store) == FORMAT_VERSION


def test_a_tail_in_a_state_of_an_older_format_is_refused() -> None:
    store = MemoryStore("tail-format")
    with Queue(store=store) as queue:
        _finish(queue, [b"a"])
    doc = msgspec.json.decode(store.get(STATE_KEY))
    doc["format"] = 2  # what a release before the tail would write: it would drop it
    with pytest.raises(StateCorrupt, match=r"format 2 with an archive tail .*need format 3"):
        decode_state(msgspec.json.encode(doc), "state")


def test_the_tail_leaves_room_for_payloads_kept_in_the_state() -> None:
    store = MemoryStore("tail-room")
    with Queue(store=store, inline_state_bytes=4_000, archive_tail_bytes=3_000) as queue:
        _finish(queue, [b"x" * 1_000, b"y" * 1_000])  # a tail of over 2,000 bytes
        assert archive_keys(store) == [] and len(read_tail(store)) == 2
        # A payload that fits beside the rest of the state stays in it, tail or no tail
        queue.enqueue("q", b"z" * 1_500)
        queue.flush()
    [job] = decode_state(store.get(STATE_KEY), "state").jobs
    assert job.ref is None and job.payload == b"z" * 1_500


#: The last commit of the project before states with an archive tail (format 3) existed.
BEFORE_TAIL = "017b2dc"


def test_an_earlier_release_refuses_a_state_with_a_tail_and_leaves_it(tmp_path: Path) -> None:
    """The release before the tail would drop its records: it refuses the state instead."""
    earlier = check_out(BEFORE_TAIL, tmp_path)
    url = (tmp_path / "store").as_uri()
    with Queue(url) as queue:
        _finish(queue, [b"a"])
    store = open_store(url)
    before = store.get(STATE_KEY)
    assert decode_state(before, "state").format == TAIL_FORMAT_VERSION
    done = run_under(earlier, ENQUEUE_ONE, url)
    assert done.returncode != 0, done.stdout
    assert str(earlier) in done.stderr, "the earlier release was not the one run"
    assert "expected an objq state of format 1 or 2, found format 3" in done.stderr, done.stderr
    assert store.get(STATE_KEY) == before
