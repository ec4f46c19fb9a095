"""A producer that is SIGKILLed right after it writes its second run, before the commit that
would refer to it (run as a script by ``test_runs.py``): prints each job id acknowledged."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from objq_broker import builders
from objq_broker.engine import Engine
from objq_broker.model.runs import RUNS_PREFIX
from objq_broker.storage import open_store
from objq_broker.storage.base import ObjectStore


class DiesAfterRuns:
    """``store``, except that the process dies as soon as its ``runs``-th run is written."""

    def __init__(self, store: ObjectStore, runs: int) -> None:
        self.store = store
        self.runs_left = runs

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def write(self, key: str, data: bytes, **condition: object) -> str:
        version = self.store.write(key, data, **condition)  # type: ignore[arg-type]
        if key.startswith(RUNS_PREFIX):
            self.runs_left -= 1
            if self.runs_left == 0:
                os.kill(os.getpid(), signal.SIGKILL)
        return version


def main() -> None:
    url, bound = sys.argv[1], int(sys.argv[2])
    engine = Engine(DiesAfterRuns(open_store(url), runs=2), spill_at=bound)  # type: ignore[arg-type]
    engine.submit(builders.declare("q", {})).result()
    for n in range(10 * bound):
        (job,) = engine.submit(builders.enqueue("q", [f"job {n}".encode()])).result()
        print(job.id, flush=True)
    engine.close()


if __name__ == "__main__":
    main()
