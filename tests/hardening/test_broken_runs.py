"""A run the state refers to but that storage does not hold, or that does not decode, never
stops its queue: its jobs are dropped with an archived record that names the run and how many
it held, the other jobs flow, purge and delete succeed, and readers show the rest. A staged
write naming such a run is refused before it commits, alone in its batch. Real file stores."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from objq_broker import ConfigurationError, Queue, builders
from objq_broker.engine.archive import iter_archive
from objq_broker.engine.snapshot import Snapshot
from objq_broker.storage import open_store
from tests.spark.test_staged_enqueue import _stage_runs

#: Jobs keep to the head up to this many per queue; the rest go to a run.
OPTIONS: dict[str, Any] = {"spill_at": 10}


def _runs(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file() and "runs" in path.parts)


def _spilled(tmp_path: Path, jobs: int = 300) -> tuple[str, Path]:
    root = tmp_path / "ns"
    url = root.as_uri()
    with Queue(url, broker="off", **OPTIONS) as queue:
        queue.enqueue_many("q", [f"job {n}".encode() for n in range(jobs)])
        queue.enqueue("other", b"unrelated")
    assert len(_runs(root)) == 1
    return url, root


@pytest.mark.parametrize("damage", ["deleted", "overwritten"])
def test_a_damaged_run_drops_its_jobs_with_a_record_and_the_queue_flows(
    tmp_path: Path, damage: str
) -> None:
    url, root = _spilled(tmp_path)
    with Queue(url, broker="off", **OPTIONS) as holder:
        held = holder.claim("q", 20)  # taken from the run into the head before the damage
        assert len(held) == 20
        victim = _runs(root)[0]
        if damage == "deleted":
            victim.unlink()
        else:
            victim.write_bytes(b"[1,2,3")

        with Queue(url, broker="off", **OPTIONS) as queue:
            # The run's other jobs are gone, and a claim says so by finding nothing, not
            # by failing; what was held is acked; other queues never noticed
            assert queue.claim("q", 100) == []
            for delivery in held:
                holder.ack(delivery)
            stats = queue.stats("q")
            assert (stats.ready, stats.in_flight) == (0, 0)
            assert len(queue.claim("other", 1)) == 1
            queue.enqueue("q", b"after")
            assert [d.payload for d in queue.claim("q", 10)] == [b"after"]

    # And the archive names the run and how many jobs it held
    records = [
        record
        for record in iter_archive(open_store(url))
        if record.outcome == "dead" and record.job.queue == "q"
    ]
    assert any(
        victim.name in record.job.id and "of 280 jobs lost" in (record.job.error or "")
        for record in records
    ), [(r.job.id, r.job.error) for r in records]


def test_a_queue_with_a_damaged_run_can_be_purged_deleted_and_listed(tmp_path: Path) -> None:
    url, root = _spilled(tmp_path)
    _runs(root)[0].write_bytes(b"[1,2,3")

    # Listing shows what can be read (here: nothing), not an error that says "try again"
    snapshot = Snapshot.read(open_store(url))
    assert snapshot.jobs("q") == []
    assert [job.payload for _, job in snapshot.jobs("other")] == [b"unrelated"]

    with Queue(url, broker="off", **OPTIONS) as queue:
        queue.purge("q")
        assert queue.stats("q").ready == 0
        queue.enqueue_many("q", [b"again"] * 100)
    _runs(root)[0].unlink()
    with Queue(url, broker="off", **OPTIONS) as queue:
        queue.delete_queue("q")
        assert "q" not in queue.queues()


def test_a_staged_write_naming_a_missing_or_broken_run_is_refused_alone(tmp_path: Path) -> None:
    url = (tmp_path / "ns").as_uri()
    store = open_store(url)
    with Queue(url, broker="off") as queue:
        missing = _stage_runs(store, "staging/a/0", [("a", 0, 0.0)])  # type: ignore[arg-type]
        store.delete(missing[0].key)
        broken = _stage_runs(store, "staging/b/0", [("b", 0, 0.0)])  # type: ignore[arg-type]
        store.put(broken[0].key, b"[1,2,3")
        good = _stage_runs(store, "staging/c/0", [("c", 0, 0.0)])  # type: ignore[arg-type]

        futures: list[Future[Any]] = [
            queue.submit(builders.enqueue("q", [b"before"])),
            queue.submit(builders.enqueue_runs("q", missing, write_id="a")),
            queue.submit(builders.enqueue_runs("q", broken, write_id="b")),
            queue.submit(builders.enqueue_runs("q", good, write_id="c")),
            queue.submit(builders.enqueue("q", [b"after"])),
        ]
        with pytest.raises(ConfigurationError, match="found none"):
            futures[1].result(timeout=30)
        with pytest.raises(ConfigurationError, match="do not decode"):
            futures[2].result(timeout=30)
        assert futures[3].result(timeout=30) == 1
        for future in (futures[0], futures[4]):
            future.result(timeout=30)
        assert queue.stats("q").ready == 3
        # No reference to a run that cannot be read entered the state
        found = sorted(d.payload for d in queue.claim("q", 10))
        assert found == [b"after", b"before", b"c"]
