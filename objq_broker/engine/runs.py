"""Reading runs (the backlog kept out of the state's head, ``docs/segments.md``) for the model.

Runs never change once written, so what has been read is kept for as long as the state refers
to it. A run the state refers to but storage no longer holds means the state read was older
than the commit that consumed the run: the caller reads the state again.
"""

from __future__ import annotations

from objq_broker.model.records import RunRef
from objq_broker.model.runs import decode_run
from objq_broker.model.state import QueueState
from objq_broker.storage.base import ObjectStore


def read_runs(store: ObjectStore, state: QueueState, runs: list[tuple[str, RunRef]]) -> list[str]:
    """Read ``runs`` (queue, ref) into ``state.run_contents``; the keys of those not found."""
    missing: list[str] = []
    for queue, ref in runs:
        blob = store.read(ref.key)
        if blob is None:
            missing.append(ref.key)
        else:
            state.run_contents[ref.key] = decode_run(ref, queue, blob.data)
    return missing
