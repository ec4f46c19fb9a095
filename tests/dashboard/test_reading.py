"""What the pages read, without a browser: archive pages that follow one another, and payloads
that are never decoded."""

from __future__ import annotations

import base64
import json
import pickle

import pytest

from objq_broker import Queue
from objq_broker.dashboard.archived import read_archived_job, search_archive
from objq_broker.dashboard.decode import decode_message, show_payload
from objq_broker.engine.archive import DEFAULT_ARCHIVE_TAIL_BYTES, TAIL_KEY
from objq_broker.model.messages import celery_message
from objq_broker.storage import MemoryStore


# An object for every commit; one for every few (the newest in the state's tail); only the tail
@pytest.mark.parametrize("tail_bytes", [0, 1_500, DEFAULT_ARCHIVE_TAIL_BYTES])
def test_archive_pages_follow_one_another_without_gaps_or_repeats(tail_bytes: int) -> None:
    # Given 7 jobs of one queue finished in 7 commits, and one of another queue
    store = MemoryStore(f"archive-pages-{tail_bytes}")
    with Queue(store=store, broker="off", archive_tail_bytes=tail_bytes) as queue:
        finished = []
        for n in range(7):
            queue.enqueue("mail", b"%d" % n)
            [delivery] = queue.claim("mail")
            queue.ack(delivery)
            finished.append(delivery.id)
        queue.enqueue("other", b"x")
        queue.ack(queue.claim("other")[0])

    # When the archive of "mail" is read 3 records at a time, following each page's cursor
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        page = search_archive(
            store, queue="mail", since=None, until=None, cursor=cursor, page_size=3
        )
        seen += [row.job.id for row in page.rows]
        assert all(row.outcome == "done" and row.job.queue == "mail" for row in page.rows)
        cursor = page.next_cursor
        if cursor is None:
            break

    # Then every job came once (newest hour first; one hour's objects in the order of their keys)
    assert len(seen) == len(set(seen)) == 7
    assert set(seen) == set(finished)
    # and each one's page finds it where its row said it was: in the tail while it holds any
    rows = search_archive(store, queue=None, since=None, until=None, cursor=None, page_size=10)
    for row in rows.rows:
        detail = read_archived_job(store, row.key, row.job.id)
        assert detail is not None and detail.job.id == row.job.id
        assert detail.in_tail == (row.key == TAIL_KEY)
    assert any(row.key == TAIL_KEY for row in rows.rows) == (tail_bytes > 0)


def finish(queue: Queue, count: int) -> list[str]:
    """Enqueue, claim and ack ``count`` jobs of "mail", a commit each; their ids."""
    done = []
    for n in range(count):
        queue.enqueue("mail", b"%d" % n)
        [delivery] = queue.claim("mail")
        queue.ack(delivery)
        done.append(delivery.id)
    return done


def test_a_page_that_ended_in_the_tail_goes_on_after_it_once_the_tail_is_written_out() -> None:
    # Given 6 finished jobs, all in the state's archive tail, and a first page of 2 of them
    store = MemoryStore("archive-tail-written-out")
    with Queue(store=store, broker="off") as queue:
        first = finish(queue, 6)
    page = search_archive(store, queue="mail", since=None, until=None, cursor=None, page_size=2)
    assert [row.key for row in page.rows] == [TAIL_KEY, TAIL_KEY]
    seen = [row.job.id for row in page.rows]

    # When more jobs finish and the tail is written out to an object before the next pages
    with Queue(store=store, broker="off", archive_tail_bytes=0) as queue:
        later = finish(queue, 2)
    cursor = page.next_cursor
    assert cursor is not None
    for _ in range(10):
        page = search_archive(
            store, queue="mail", since=None, until=None, cursor=cursor, page_size=2
        )
        assert all(row.key != TAIL_KEY for row in page.rows)
        seen += [row.job.id for row in page.rows]
        cursor = page.next_cursor
        if cursor is None:
            break

    # Then the pages went on where the first ended: each of the 6 once, newest first. The jobs
    # finished since may show among them (within an hour, objects come in the order of their
    # keys, not of their times), but never twice
    assert [job for job in seen if job in first] == first[::-1]
    assert len(seen) == len(set(seen)) and set(seen) <= set(first) | set(later)


def test_a_cursor_that_is_not_one_is_refused() -> None:
    store = MemoryStore("archive-bad-cursor")
    for cursor in ("state.json:x", "state.json:@not-base64!", "nokey"):
        with pytest.raises(ValueError, match="expected KEY:NUMBER or KEY:@RECORD"):
            search_archive(store, queue=None, since=None, until=None, cursor=cursor, page_size=2)


def test_a_celery_body_that_is_not_json_is_never_unpickled() -> None:
    # Given a Celery envelope whose body is a pickle that would run code when loaded
    envelope = json.loads(celery_message("mail", "tasks.send", [1], {"to": "a@b"}))
    envelope["content-type"] = "application/x-python-serialize"
    envelope["body"] = base64.b64encode(pickle.dumps(OSError("would run"))).decode()
    decoded = decode_message(json.dumps(envelope).encode())
    # Then the page shows the task, and Celery's own repr of the arguments, not the body
    assert decoded is not None and decoded.framework == "Celery"
    assert decoded.task == "tasks.send"
    assert (decoded.args, decoded.kwargs) == ("(1,)", "{'to': 'a@b'}")


def test_payloads_are_shown_as_json_text_or_hex() -> None:
    assert show_payload(b'{"a": [1, 2]}').text == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    assert show_payload(b"plain words").kind == "text"
    binary = show_payload(b"\x00\xff" * 3000)
    assert binary.kind == "binary" and binary.cut and binary.text.startswith("00 ff 00 ff")
    assert decode_message(b"plain words") is None
