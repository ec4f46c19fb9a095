"""The results core: one record object per result or counter, on every storage backend."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from objq_broker.errors import InvalidKey, StateCorrupt
from objq_broker.results import store as store_module
from objq_broker.results.store import ResultStore
from objq_broker.storage import ObjectStore, open_store
from tests.support.clock import ManualClock


def test_a_result_is_read_back_until_it_expires(store: ObjectStore) -> None:
    clock = ManualClock()
    results = ResultStore(store, clock=clock)
    results.set("a", b"first", ttl=10)
    results.set("b", b"kept", ttl=None)
    results.set("a", b"again", ttl=10)  # a task run again stores its new result
    assert results.get("a") == b"again" and results.get("b") == b"kept"
    assert results.get("missing") is None
    clock.now += 10
    assert results.get("a") is None, "an expired result still read"
    assert results.get("b") == b"kept"
    # Expired records, and those older than asked, are deleted; nothing else is
    results.set("c", b"new", ttl=None)
    assert results.purge() == 1
    assert sorted(results.names()) == ["b", "c"]
    clock.now += 100
    assert results.purge(older_than=50) == 2
    assert results.names() == []


def test_add_stores_only_where_nothing_live_is(store: ObjectStore) -> None:
    clock = ManualClock()
    results = ResultStore(store, clock=clock)
    assert results.add("k", b"1", ttl=5)
    assert not results.add("k", b"2", ttl=5)
    assert results.get("k") == b"1"
    clock.now += 5
    assert results.add("k", b"3", ttl=5), "an expired record blocked add"
    assert results.get("k") == b"3"


def test_concurrent_updates_lose_no_increment(store: ObjectStore) -> None:
    results = ResultStore(store)

    def bump(_: int) -> None:
        results.update("counter", lambda old: str(int(old or b"0") + 1).encode(), ttl=None)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(bump, range(80)))
    assert results.get("counter") == b"80"


def test_updates_from_several_processes_lose_none(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    code = (
        "import sys\n"
        "from objq_broker.results.store import ResultStore\n"
        "from objq_broker.storage import open_store\n"
        "r = ResultStore(open_store(sys.argv[1]))\n"
        "for _ in range(40):\n"
        "    r.update('n', lambda old: str(int(old or b'0') + 1).encode(), ttl=None)\n"
    )
    workers = [subprocess.Popen([sys.executable, "-c", code, url]) for _ in range(3)]
    for worker in workers:
        assert worker.wait(timeout=120) == 0
    assert ResultStore(open_store(url)).get("n") == b"120"


def test_a_local_store_wakes_a_waiter_at_once(store: ObjectStore) -> None:
    results = ResultStore(store)
    started = time.monotonic()
    timer = threading.Timer(0.3, results.set, args=("r", b"done", None))
    timer.start()
    # A long poll interval: only the local wake-up can end the wait soon after the store.
    found = results.wait(["r"], lambda got: "r" in got, timeout=10, interval=5.0)
    took = time.monotonic() - started
    timer.join()
    assert found == {"r": b"done"}
    assert took < 3, f"the waiter slept {took:.1f} s past a local store"


#: Stores result ``x`` in the store at argv[1] half a second after it starts.
STORE_X_LATER = (
    "import sys, time\n"
    "from objq_broker.results.store import ResultStore\n"
    "from objq_broker.storage import open_store\n"
    "time.sleep(0.5)\n"
    "ResultStore(open_store(sys.argv[1])).set('x', b'remote', None)\n"
)


def _store_x_from_another_process(url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", STORE_X_LATER, url])


def test_a_result_stored_by_another_process_is_found_and_a_wait_times_out(
    tmp_path: Path,
) -> None:
    url = (tmp_path / "store").as_uri()
    results = ResultStore(open_store(url))
    started = time.monotonic()
    assert results.wait(["x"], lambda got: "x" in got, timeout=0.3) == {}
    assert 0.25 <= time.monotonic() - started < 2
    writer = _store_x_from_another_process(url)
    try:
        found = results.wait(["x", "y"], lambda got: "x" in got, timeout=30, interval=0.2)
    finally:
        writer.wait(timeout=60)
    assert found == {"x": b"remote"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reported on Linux only")
def test_a_local_folder_wakes_a_waiter_on_another_process_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a directory the kernel reports the write: a waiter that would read again only after
    a minute (here) has the result as soon as another process stored it."""
    for pause in ("WATCHED_FIRST_PAUSE_SECONDS", "LOCAL_FIRST_PAUSE_SECONDS"):
        monkeypatch.setattr(store_module, pause, 60.0)
    url = (tmp_path / "store").as_uri()
    results = ResultStore(open_store(url))
    results.set("earlier", b"makes the folder", None)
    writer = _store_x_from_another_process(url)
    started = time.monotonic()
    try:
        found = results.wait(["x"], lambda got: "x" in got, timeout=30, interval=60.0)
    finally:
        writer.wait(timeout=60)
    took = time.monotonic() - started
    assert found == {"x": b"remote"}
    # Unreported, it is found only by the last read, when the 30 s wait runs out.
    assert took < 20, f"the waiter slept {took:.1f} s: the write was not reported"


def test_a_corrupt_record_is_reported_and_never_overwritten(store: ObjectStore) -> None:
    results = ResultStore(store)
    store.put("results/broken", b"not a record")
    with pytest.raises(StateCorrupt, match="expected a result record of format 1"):
        results.get("broken")
    with pytest.raises(StateCorrupt):
        results.update("broken", lambda old: b"1", ttl=None)
    assert store.get("results/broken") == b"not a record"
    assert results.purge() == 0  # not ours to judge: left alone


def test_a_name_that_is_not_a_key_is_refused(store: ObjectStore) -> None:
    with pytest.raises(InvalidKey):
        ResultStore(store).set("../escape", b"x", ttl=None)
