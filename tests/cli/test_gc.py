"""``objq gc``: a dry run deletes nothing, a run deletes old unreferenced objects and says how
many and how big by kind, young ones and the queue's own stay, a short margin asks first."""

from __future__ import annotations

import time
import uuid

from objq_broker import Queue
from objq_broker.storage import open_store
from tests.cli.objq_cli import Objq

#: The margin given on the command line, and how long the old orphans wait past it.
OLDER_THAN_SECONDS = 5
#: S3 keeps whole seconds, and the command takes a moment to start.
WAIT_SECONDS = OLDER_THAN_SECONDS + 2.5


def test_gc_dry_run_then_collect(objq: Objq, cli_url: str) -> None:
    # Given a queue with out-of-line payloads, and orphans written a while ago
    with Queue(cli_url, broker="off", gc_interval_seconds=None) as queue:
        queue.enqueue_many("q", [b"x" * 400 for _ in range(3)])
    store = open_store(cli_url)
    old = [f"bodies/{uuid.uuid4().hex}.json", f"bodies/{uuid.uuid4().hex}.json"]
    for key in old:
        store.put(key, b"[" + b" " * 98 + b"]")  # 100 bytes each
    time.sleep(WAIT_SECONDS)
    young = f"bodies/{uuid.uuid4().hex}.json"
    store.put(young, b"[]")
    before = store.list()
    margin = f"--older-than={OLDER_THAN_SECONDS}s"

    # When a dry run looks, then a run collects
    dry = objq("gc", margin, "--dry-run", "--json", url=cli_url)
    assert dry.code == 0, dry.stderr
    assert store.list() == before
    refused = objq("gc", margin, url=cli_url)  # a margin under an hour needs --yes
    assert refused.code == 2 and "--yes" in refused.stderr
    done = objq("gc", margin, "--yes", url=cli_url)
    assert done.code == 0, done.stderr

    # Then the dry run named what the run deleted: the old orphans only
    report = dry.json()
    assert report["dry_run"] is True and report["deleted"] == 0
    assert report["garbage"]["bodies"] == {"objects": 2, "bytes": 200}
    assert report["kept_young"]["bodies"] == {"objects": 1, "bytes": 2}
    assert report["garbage"]["runs"]["objects"] == report["garbage"]["staging"]["objects"] == 0
    assert "deleted 2 unreferenced objects (200 B)" in done.stdout
    assert "bodies" in done.stdout and "kept (younger)" in done.stdout
    assert sorted(store.list()) == sorted(set(before) - set(old))
    assert store.read(young) is not None
    # And the queue's jobs still read their payloads
    with Queue(cli_url, broker="off", gc_interval_seconds=None) as queue:
        deliveries = queue.claim("q", 10)
        assert [d.payload for d in deliveries] == [b"x" * 400] * 3
    store.close()


def test_gc_of_a_store_without_state_collects_nothing(objq: Objq, file_url: str) -> None:
    store = open_store(file_url)
    store.put(f"bodies/{uuid.uuid4().hex}.json", b"[]")
    result = objq("gc", "--json", url=file_url)
    assert result.code == 0, result.stderr
    assert result.json()["state_found"] is False and result.json()["objects"] == 0
    assert len(store.list("bodies/")) == 1
