"""Whether a namespace's stored state still decodes, read as every process sharing it reads it.

A state its decoder refuses is never overwritten, so one bad value committed stops every
process of the namespace. Tests that drive an entry point with bad input finish with
:func:`assert_state_decodes`.
"""

from __future__ import annotations

from objq_broker.engine import STATE_KEY
from objq_broker.engine.snapshot import Snapshot
from objq_broker.model.encoding import decode_state
from objq_broker.storage import ObjectStore


def assert_state_decodes(store: ObjectStore) -> Snapshot:
    """Decode the stored state as the commit loop does (``StateCorrupt`` if it is refused),
    then read it as another process would; returns that reading. Flush the queue (or engine)
    that wrote to ``store`` first, so that what it accepted has landed."""
    blob = store.read(STATE_KEY)
    if blob is not None:
        decode_state(blob.data, f"state under test at {store.url}")
    return Snapshot.read(store)
