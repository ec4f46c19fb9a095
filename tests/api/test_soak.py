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

WORKER = Path(__file__).with_name("soak_worker.py")
PRODUCERS = 3
CONSUMERS = 3


_spawned: list[subprocess.Popen[bytes]] = []


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, str(WORKER), *args])
    _spawned.append(process)
    return process


def run_soak(url: str, tmp_path: Path, jobs: int, faults: float = 0.0) -> dict[str, int]:
    """Run the soak and return {'jobs', 'delivered', 'duplicates'}; asserts nothing is lost."""
    _spawned.clear()
    try:
        return _run_soak(url, tmp_path, jobs, faults)
    finally:
        for process in _spawned:  # a failed run must not leave workers behind
            if process.poll() is None:
                process.kill()
                process.wait()


def _run_soak(url: str, tmp_path: Path, jobs: int, faults: float) -> dict[str, int]:
    stop = tmp_path / "stop"
    per_producer = jobs // PRODUCERS
    fault_args = ["--faults", str(faults)]
    producers = [
        _spawn(
            "produce",
            "--url",
            url,
            "--name",
            f"p{n}",
            "--count",
            str(per_producer),
            "--batch",
            str(1 if n == 0 else 100),
            *fault_args,
        )
        for n in range(PRODUCERS)
    ]
    consumers = {
        n: _spawn(
            "consume",
            "--url",
            url,
            "--name",
            f"c{n}",
            "--log",
            str(tmp_path / f"c{n}.log"),
            "--stop",
            str(stop),
            *fault_args,
        )
        for n in range(CONSUMERS)
    }
    victim_log = tmp_path / "c0.log"
    deadline = time.monotonic() + 240
    # When the victim has done some work, kill it mid-run and start a replacement.
    while time.monotonic() < deadline:
        if victim_log.exists() and victim_log.stat().st_size > 2000:
            break
        time.sleep(0.05)
    consumers[0].kill()
    consumers[0].wait()
    consumers[0] = _spawn(
        "consume",
        "--url",
        url,
        "--name",
        "c0b",
        "--log",
        str(tmp_path / "c0b.log"),
        "--stop",
        str(stop),
        *fault_args,
    )
    for producer in producers:
        assert producer.wait(timeout=max(deadline - time.monotonic(), 1)) == 0
    with Queue(url) as queue:
        while time.monotonic() < deadline:
            stats = queue.stats("soak")
            if stats.ready == stats.delayed == stats.in_flight == 0:
                break
            time.sleep(0.5)
        stop.touch()
        for consumer in consumers.values():
            assert consumer.wait(timeout=max(deadline - time.monotonic(), 1)) == 0
        stats = queue.stats("soak")
        assert (stats.ready, stats.delayed, stats.in_flight, stats.dead) == (0, 0, 0, 0)
        assert queue.jobs("soak") == []
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
def test_soak_file(tmp_path: Path) -> None:
    result = run_soak((tmp_path / "store").as_uri(), tmp_path, jobs=10_200)
    assert result["jobs"] == 10_200


@pytest.mark.slow
def test_soak_s3(tmp_path: Path, s3_url_factory: Callable[[], str]) -> None:
    result = run_soak(s3_url_factory(), tmp_path, jobs=10_200)
    assert result["jobs"] == 10_200


@pytest.mark.slow
def test_soak_file_with_faults(tmp_path: Path) -> None:
    result = run_soak((tmp_path / "store").as_uri(), tmp_path, jobs=3_000, faults=0.05)
    assert result["jobs"] == 3_000
