"""Reading runs (the backlog kept out of the state's head, ``docs/segments.md``) for the model.

Runs never change once written, so what has been read is kept for as long as the state refers
to it. A run the state refers to but storage no longer holds means the state read was older
than the commit that consumed the run: the caller reads the state again. Several runs are read
in parallel: on S3 or GCS each read is a round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from objq_broker.model.records import KeyRunRef, RunRef
from objq_broker.model.runs import decode_key_run, decode_run
from objq_broker.model.state import QueueState
from objq_broker.storage.base import ObjectStore

#: Most runs read at once.
READ_THREADS = 8


def read_runs(
    store: ObjectStore, state: QueueState, runs: Sequence[tuple[str, RunRef | KeyRunRef]]
) -> list[str]:
    """Read those of ``runs`` (queue, ref) not read yet into ``state.run_contents`` (key runs
    into ``state.key_contents``); the keys of those not found."""
    unread = [
        (queue, ref)
        for queue, ref in runs
        if ref.key not in state.run_contents and ref.key not in state.key_contents
    ]

    def read(run: tuple[str, RunRef | KeyRunRef]) -> tuple[RunRef | KeyRunRef, bytes | None]:
        blob = store.read(run[1].key)
        return run[1], None if blob is None else blob.data

    if len(unread) > 1:
        with ThreadPoolExecutor(min(READ_THREADS, len(unread)), "objq-runs") as pool:
            found = list(pool.map(read, unread))
    else:
        found = [read(run) for run in unread]
    missing: list[str] = []
    for (queue, _), (ref, data) in zip(unread, found, strict=True):
        if data is None:
            missing.append(ref.key)
        elif isinstance(ref, KeyRunRef):
            state.key_contents[ref.key] = decode_key_run(ref, queue, data)
        else:
            state.run_contents[ref.key] = decode_run(ref, queue, data)
    return missing
