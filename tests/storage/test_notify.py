"""A directory store reports the writes to a folder as they happen, so waiters wake on them
instead of reading at intervals; where it cannot, it says so and callers poll as before."""

from __future__ import annotations

import os
import queue
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from objq_broker import Queue
from objq_broker.storage import open_store
from objq_broker.storage.file import FileStore
from objq_broker.storage.metered import MeteredStore
from objq_broker.storage.notify import (
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    Subscription,
    _Watcher,
    subscribe,
    version,
    watch_folder,
)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="folder changes are reported on Linux only"
)

#: Longest a report may take to arrive; it comes in well under a millisecond.
REPORT_SECONDS = 10.0
#: How long to be sure nothing more comes.
QUIET_SECONDS = 0.3


def _reports(store: object, folder: str) -> tuple[Subscription, queue.Queue[str | None]]:
    seen: queue.Queue[str | None] = queue.Queue()
    watch = watch_folder(store, folder, seen.put)
    assert watch is not None
    return watch, seen


def test_a_write_by_another_process_is_reported_with_its_key(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.put("results/first", b"1")  # the folder exists
    watch, seen = _reports(store, "results")
    try:
        code = (
            "import sys; from objq_broker.storage import open_store; "
            "open_store(sys.argv[1]).put('results/from-child', b'2')"
        )
        subprocess.run([sys.executable, "-c", code, tmp_path.as_uri()], check=True)
        assert seen.get(timeout=REPORT_SECONDS) == "results/from-child"
        store.delete("results/first")
        assert seen.get(timeout=REPORT_SECONDS) == "results/first"
    finally:
        watch.close()


def test_writes_elsewhere_are_not_reported_and_a_closed_watch_hears_nothing(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path)
    store.put("ns/state.json", b"{}")
    store.put("other/x", b"0")
    watch, seen = _reports(store, "ns")
    store.put("other/x", b"1")  # another folder
    store.put("ns/deeper/y", b"1")  # a folder below: not the watched one
    store.put("ns/state.json", b"{}")
    assert seen.get(timeout=REPORT_SECONDS) == "ns/state.json"
    watch.close()
    watch.close()  # closing twice is harmless
    store.put("ns/state.json", b"{}")
    with pytest.raises(queue.Empty):
        seen.get(timeout=QUIET_SECONDS)


def test_two_watches_of_one_folder_are_both_told_and_closed_one_at_a_time(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path)
    store.put("f/a", b"0")
    first, seen_first = _reports(store, "f")
    second, seen_second = _reports(store, "f")
    store.put("f/a", b"1")
    assert seen_first.get(timeout=REPORT_SECONDS) == "f/a"
    assert seen_second.get(timeout=REPORT_SECONDS) == "f/a"
    first.close()  # the kernel's watch is shared: the second must still hear
    store.put("f/b", b"1")
    assert seen_second.get(timeout=REPORT_SECONDS) == "f/b"
    second.close()


def test_a_watch_whose_callback_raises_keeps_no_other_watch_from_being_told(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path)
    store.put("f/a", b"0")

    def broken(key: str | None) -> None:
        raise RuntimeError(f"broken watcher: {key}")

    failing = watch_folder(store, "f", broken)  # subscribed first: it is called first
    assert failing is not None
    second, seen = _reports(store, "f")
    try:
        store.put("f/a", b"1")
        assert seen.get(timeout=REPORT_SECONDS) == "f/a"
        store.put("f/b", b"1")  # and the watcher thread goes on
        assert seen.get(timeout=REPORT_SECONDS) == "f/b"
    finally:
        failing.close()
        second.close()


def test_the_top_folder_and_a_metered_store_report_too(tmp_path: Path) -> None:
    store = MeteredStore(FileStore(tmp_path))
    store.put("top", b"0")
    watch, seen = _reports(store, "")
    store.put("top", b"1")
    assert seen.get(timeout=REPORT_SECONDS) == "top"
    watch.close()
    assert store.meter.snapshot().requests["read"] == 0  # a report costs no request


def test_no_report_where_it_cannot_be_had(tmp_path: Path) -> None:
    assert watch_folder(FileStore(tmp_path), "not-yet", print) is None  # no such folder
    assert watch_folder(open_store("memory://notify"), "", print) is None  # not a folder
    assert subscribe(tmp_path / "missing", print) is None


def test_lost_events_are_reported_as_anything_may_have_changed() -> None:
    """The kernel drops events when its queue overflows; a subscriber then reads again."""
    watcher = _Watcher.__new__(_Watcher)  # its parsing alone, without a kernel instance
    watcher._lock = threading.Lock()
    heard: list[str | None] = []
    sub = Subscription(watcher, 7, heard.append)
    watcher._subscribers = {7: [sub]}
    name = b"state.json".ljust(16, b"\0")
    event = struct.pack("iIII", 7, IN_MOVED_TO, 0, len(name)) + name
    overflow = struct.pack("iIII", -1, IN_Q_OVERFLOW, 0, 0)
    elsewhere = struct.pack("iIII", 8, IN_MOVED_TO, 0, len(name)) + name  # nobody's
    watcher._dispatch(event + elsewhere + overflow)
    assert heard == ["state.json", None]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX only")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_is_told_by_its_own_watcher_and_the_parent_still_is(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path)
    store.put("f/a", b"0")
    watch, seen = _reports(store, "f")  # the parent's watcher exists before the fork
    try:
        pid = os.fork()
        if pid == 0:  # the child: its own watch must hear its own write
            code = 1
            try:
                watch.close()  # the parent's, inherited: closing it here does nothing
                child_seen: queue.Queue[str | None] = queue.Queue()
                child_watch = watch_folder(FileStore(tmp_path), "f", child_seen.put)
                if child_watch is not None:
                    FileStore(tmp_path).put("f/child", b"1")
                    code = 0 if child_seen.get(timeout=REPORT_SECONDS) == "f/child" else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert seen.get(timeout=REPORT_SECONDS) == "f/child"  # the child's read took none
        store.put("f/a", b"2")
        assert seen.get(timeout=REPORT_SECONDS) == "f/a"
    finally:
        watch.close()


def test_a_version_is_told_without_a_read_as_a_read_would_give_it(tmp_path: Path) -> None:
    store = MeteredStore(FileStore(tmp_path))
    assert version(store, "f/state.json") is None
    written = store.write("f/state.json", b"{}", if_absent=True)
    assert version(store, "f/state.json") == written == store.read("f/state.json").version  # type: ignore[union-attr]
    assert version(open_store("memory://versions"), "x") is None  # cannot tell: unknown


def test_a_queue_reads_the_state_again_for_another_writers_writes_not_for_its_own(
    tmp_path: Path,
) -> None:
    url = tmp_path.as_uri() + "?fsync=false"
    with Queue(url, broker="off") as mine, Queue(url, broker="off") as other:
        mine.declare("q")
        mine.declare("r")
        mine.claim("q")  # the state read once
        reads = mine.metrics().state_reads
        for _ in range(30):
            mine.enqueue("q", b"mine")
            [delivery] = mine.claim("q")
            mine.ack(delivery)
        time.sleep(QUIET_SECONDS)  # every report of those writes has come
        assert mine.metrics().state_reads == reads
        other.enqueue("r", b"other's")
        # The report of it wakes the claim, which reads the state again to find the job.
        [delivery] = mine.claim("r", timeout=REPORT_SECONDS)
        assert delivery.payload == b"other's"
        assert mine.metrics().state_reads > reads
