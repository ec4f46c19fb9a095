"""Reading runs (the backlog kept out of the state's head, ``docs/segments.md``) for the model.

Runs never change once written, so what has been read is kept for as long as the state refers
to it. A run the state refers to but storage no longer holds means the state read was older
than the commit that consumed the run: the caller reads the state again. Several runs are read
in parallel: on S3 or GCS each read is a round trip.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from objq_broker.model.records import Job, RunRef
from objq_broker.model.runs import decode_run
from objq_broker.model.state import QueueState
from objq_broker.storage.base import ObjectStore

#: Most runs read at once.
READ_THREADS = 8


def read_runs(store: ObjectStore, state: QueueState, runs: list[tuple[str, RunRef]]) -> list[str]:
    """Read those of ``runs`` (queue, ref) not read yet into ``state.run_contents``; the keys
    of those not found."""
    runs = [(queue, ref) for queue, ref in runs if ref.key not in state.run_contents]

    def read(run: tuple[str, RunRef]) -> tuple[str, list[Job] | None]:
        queue, ref = run
        blob = store.read(ref.key)
        return ref.key, None if blob is None else decode_run(ref, queue, blob.data)

    if len(runs) > 1:
        with ThreadPoolExecutor(min(READ_THREADS, len(runs)), "objq-runs") as pool:
            found = list(pool.map(read, runs))
    else:
        found = [read(run) for run in runs]
    missing: list[str] = []
    for key, jobs in found:
        if jobs is None:
            missing.append(key)
        else:
            state.run_contents[key] = jobs
    return missing
