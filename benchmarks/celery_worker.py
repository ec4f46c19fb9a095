"""A real ``celery worker`` process for the Celery benchmarks: prefork, concurrency 1, serving
one queue of an app module of this folder, which reads its URLs from the environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: Where the worker's app module finds its broker and result backend.
BROKER_ENV, BACKEND_ENV = "BENCH_BROKER_URL", "BENCH_BACKEND_URL"


def start_worker(
    module: str, queue: str, broker_url: str, backend_url: str, logs: Path, *, loglevel: str
) -> subprocess.Popen[bytes]:
    """Start ``celery -A module worker`` on ``queue``, its output appended to ``logs``."""
    env = {
        **os.environ,
        BROKER_ENV: broker_url,
        BACKEND_ENV: backend_url,
        # A tree given on PYTHONPATH first (to measure another checkout), then this one's.
        "PYTHONPATH": os.pathsep.join(
            [*filter(None, [os.environ.get("PYTHONPATH")]), str(HERE), str(ROOT)]
        ),
    }
    command = [
        sys.executable, "-m", "celery", "-A", module, "worker", "--pool", "prefork",
        "--concurrency", "1", "--queues", queue, "--loglevel", loglevel, "--without-gossip",
        "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    with logs.open("ab") as out:
        return subprocess.Popen(command, env=env, cwd=HERE, stdout=out, stderr=out)


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """Warm shutdown (SIGTERM), killed after a minute."""
    worker.terminate()
    try:
        worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
