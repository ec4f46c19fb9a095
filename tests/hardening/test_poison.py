"""A job marked base64 whose body is not base64 is a poison job: no enqueue lets one in, and one
already stored (an older writer, a hand edit) is dead-lettered at its first claim, saying why,
by every consumer, while every reader shows it with its raw bytes. Real file stores, the real
``objq`` command and a real broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from objq_broker import Queue
from objq_broker.broker.client import BrokerLink
from objq_broker.broker.elected import ElectedCommitter
from objq_broker.dashboard.reading import job_detail, read_queue_page
from objq_broker.engine.snapshot import Snapshot
from objq_broker.model.ops import Enqueue, Session
from objq_broker.model.values import NewJob
from objq_broker.storage import open_store
from objq_broker.typed import TypedQueue
from tests.cli.objq_cli import run_objq

NOT_BASE64 = "this is *not* base64!"
GOOD = b'"good"'  # JSON, for the typed queue too


def _poisoned(tmp_path: Path) -> tuple[str, str]:
    """A namespace whose queue ``q`` holds a binary job whose body was then overwritten in
    the state with text that is not base64, and a good job after it; the poison's id."""
    root = tmp_path / "ns"
    with Queue(root.as_uri(), broker="off") as queue:
        (poison,) = queue.enqueue_many("q", [b"\xff\xfe binary"])
        queue.enqueue("q", GOOD)
    state = root / "state.json"
    doc = json.loads(state.read_bytes())
    text = json.dumps(doc)
    body = next(job["body"] for job in doc["jobs"] if job["id"] == poison.id)
    state.write_text(text.replace(json.dumps(body), json.dumps(NOT_BASE64), 1))
    return root.as_uri(), poison.id


def test_a_poison_job_is_dead_lettered_at_its_claim_and_the_rest_delivered(
    tmp_path: Path,
) -> None:
    url, poison = _poisoned(tmp_path)
    with Queue(url, broker="off") as queue:
        delivered = queue.claim("q", 10)
        assert [d.payload for d in delivered] == [GOOD]
        queue.flush()
        (dead,) = queue.dead_letters("q")
        assert dead.id == poison
        assert dead.error is not None and "expected a base64 body" in dead.error


def test_a_typed_queue_never_sees_a_poison_job(tmp_path: Path) -> None:
    url, poison = _poisoned(tmp_path)
    with Queue(url, broker="off") as queue:
        typed = TypedQueue("q", str, queue=queue)
        found = typed.claim(10)
        assert [d.value for d in found] == ["good"]
        queue.flush()
        assert [job.id for job in queue.dead_letters("q")] == [poison]


def test_every_reader_shows_a_poison_job_with_its_raw_bytes(tmp_path: Path) -> None:
    url, poison = _poisoned(tmp_path)
    listed = run_objq("jobs", "list", "q", url=url)
    assert listed.code == 0, listed.stderr
    assert "not base64" in listed.stdout
    shown = run_objq("jobs", "list", "q", "--json", url=url)
    assert shown.code == 0, shown.stderr

    store = open_store(url)
    page = read_queue_page(store, "q", "ready", 1, 50)
    assert any("marked base64 but not" in row.preview for row in page.rows)
    snapshot = Snapshot.read(store)
    found = snapshot.find(poison)
    assert found is not None
    detail = job_detail(found[0], found[1], snapshot.read_at)
    assert detail.payload is not None


def test_no_enqueue_lets_a_poison_job_in_and_the_rest_of_a_session_lands(
    tmp_path: Path,
) -> None:
    url = (tmp_path / "ns").as_uri()
    with Queue(url, broker="auto") as leader:
        leader.declare("q")
        committer = leader.committer
        assert isinstance(committer, ElectedCommitter) and committer.record is not None
        link = BrokerLink(committer.record.address)
        try:
            session = Session(
                "a-client",
                1,
                [
                    Enqueue([NewJob("p1", "q", NOT_BASE64, b64=True)]),
                    Enqueue([NewJob("g1", "q", "good")]),
                ],
            )
            (poison_ok, refused), (good_ok, _) = link.apply(session, timeout=10)
        finally:
            link.close()
        assert not poison_ok and "expected a base64 body" in str(refused)
        assert good_ok
        assert [job.id for _, job in leader.jobs("q")] == ["g1"]


@pytest.mark.parametrize("body", [NOT_BASE64, "QUJD=extra", "é"])
def test_the_api_never_builds_a_poison_job(body: str) -> None:
    with Queue(f"memory://poison-{len(body)}", broker="off") as queue:
        queue.enqueue("q", body.encode())  # text: stored as such, never marked base64
        (delivery,) = queue.claim("q")
        assert delivery.payload == body.encode()
