"""Multi-process soak: 3 producers, 3 consumers, one consumer SIGKILLed and restarted."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from objq_broker import Queue
from objq_broker.storage import open_store
from tests.support.processes import Children
from tests.support.waiting import wait_for

WORKER = Path(__file__).with_name("soak_worker.py")
PRODUCERS = 3
CONSUMERS = 3
#: Seconds the whole soak may take, from the first process started to the last one stopped.
SOAK_TIMEOUT_SECONDS = 240.0


def run_soak(
    url: str,
    tmp_path: Path,
    children: Children,
    jobs: int,
    *,
    faults: float = 0.0,
    spill_at: int | None = None,
) -> dict[str, int]:
    """Run the soak and return {'jobs', 'delivered', 'duplicates'}; asserts nothing is lost.

    The workers are ``children`` of the test: a failed run does not leave them behind."""
    stop = tmp_path / "stop"
    per_producer = jobs // PRODUCERS
    fault_args = ["--faults", str(faults)]
    if spill_at is not None:
        fault_args += ["--spill-at", str(spill_at)]
    deadline = time.monotonic() + SOAK_TIMEOUT_SECONDS

    def spawn(*args: str) -> subprocess.Popen[bytes]:
        return children.start([sys.executable, str(WORKER), *args, "--url", url, *fault_args])

    def consumer(name: str) -> subprocess.Popen[bytes]:
        log = str(tmp_path / f"{name}.log")
        return spawn("consume", "--name", name, "--log", log, "--stop", str(stop))

    def left() -> float:
        return max(deadline - time.monotonic(), 1.0)

    producers = [
        spawn("produce", "--name", f"p{n}", "--count", str(per_producer),
              "--batch", str(1 if n == 0 else 100))
        for n in range(PRODUCERS)
    ]  # fmt: skip
    consumers = {name: consumer(name) for name in (f"c{n}" for n in range(CONSUMERS))}

    def log_sizes() -> dict[str, int]:
        logs = {name: tmp_path / f"{name}.log" for name in consumers}
        return {name: log.stat().st_size if log.exists() else 0 for name, log in logs.items()}

    # When a consumer has done some work, kill it mid-run and start a replacement. Whichever
    # one: nothing shares the jobs out evenly, and one consumer may get none for a whole run.
    victim = wait_for(
        lambda: next((name for name, size in log_sizes().items() if size > 2000), None),
        left(),
        "a consumer to log some deliveries",
        progress=lambda: f"log sizes {log_sizes()}",
    )
    spilled = len(open_store(url).list("runs/")) if spill_at is not None else 0
    children.kill(consumers[victim])
    consumers[victim] = consumer(f"{victim}b")
    for producer in producers:
        assert producer.wait(timeout=left()) == 0
    with Queue(url) as queue:

        def drained() -> bool:
            stats = queue.stats("soak")
            return stats.ready == stats.delayed == stats.in_flight == 0

        wait_for(
            drained,
            left(),
            "the soak queue to drain",
            interval=0.5,
            progress=lambda: queue.stats("soak"),
        )
        stop.touch()
        for process in consumers.values():
            assert process.wait(timeout=left()) == 0
        stats = queue.stats("soak")
        assert (stats.ready, stats.delayed, stats.in_flight, stats.dead) == (0, 0, 0, 0)
        assert queue.jobs("soak") == []
    if spill_at is not None:
        assert spilled, "no runs were written while the soak was under way"
        # The next process to commit deletes runs left by faults and by the killed consumer.
        with Queue(url, spill_at=spill_at) as queue:
            queue.enqueue("after-soak", b"x")
            queue.flush()
            assert queue.store.list("runs/") == [], "a consumed or orphan run was left"
    delivered = Counter(
        line for log in tmp_path.glob("c*.log") for line in log.read_text().splitlines() if line
    )
    expected = {f"p{p}-{i}" for p in range(PRODUCERS) for i in range(per_producer)}
    assert set(delivered) == expected, f"lost {len(expected - set(delivered))} jobs"
    duplicates = sum(count - 1 for count in delivered.values())
    backend = url.split(":", maxsplit=1)[0]
    print(f"\nsoak {backend}: {len(expected)} jobs, {duplicates} duplicate deliveries")
    return {"jobs": len(expected), "delivered": sum(delivered.values()), "duplicates": duplicates}


@pytest.mark.slow
def test_soak_file(tmp_path: Path, children: Children) -> None:
    result = run_soak((tmp_path / "store").as_uri(), tmp_path, children, jobs=10_200)
    assert result["jobs"] == 10_200


@pytest.mark.slow
def test_soak_s3(tmp_path: Path, children: Children, s3_url_factory: Callable[[], str]) -> None:
    """As many jobs as on SeaweedFS: moto serialises every request, so the long soak is the
    file store's."""
    result = run_soak(s3_url_factory(), tmp_path, children, jobs=3_000)
    assert result["jobs"] == 3_000


@pytest.mark.slow
def test_soak_seaweedfs(
    tmp_path: Path, children: Children, seaweedfs_url_factory: Callable[[], str]
) -> None:
    """On a real S3 server that enforces If-Match itself, where moto serialises requests."""
    result = run_soak(seaweedfs_url_factory(), tmp_path, children, jobs=3_000)
    assert result["jobs"] == 3_000


@pytest.mark.slow
def test_soak_file_with_faults(tmp_path: Path, children: Children) -> None:
    result = run_soak((tmp_path / "store").as_uri(), tmp_path, children, jobs=3_000, faults=0.05)
    assert result["jobs"] == 3_000


@pytest.mark.slow
def test_soak_file_spilling_runs_with_faults(tmp_path: Path, children: Children) -> None:
    """The same, with the backlog spilled into runs of a few dozen jobs: runs are written,
    retried, orphaned by faults and by the killed consumer, and consumed across processes."""
    url = (tmp_path / "store").as_uri()
    result = run_soak(url, tmp_path, children, jobs=3_000, faults=0.05, spill_at=50)
    assert result["jobs"] == 3_000
