"""Random identifiers: job ids, claim tokens, commit ids.

Each is 128 random bits from the operating system, written as 32 hex digits, as
``uuid.uuid4().hex`` writes them. They are drawn from the kernel in blocks rather than one at
a time: ``os.urandom`` releases the GIL for its system call, and with many threads enqueueing,
every release is a hand-over of the GIL and a wait to take it back, which cost more than the
rest of an enqueue (see ``benchmarks/README.md``). A forked child starts with a new block, so
no two processes ever hand out the same bits.
"""

from __future__ import annotations

import os
from collections import deque

#: Identifiers drawn from the kernel at once.
BLOCK = 256
_BYTES = 16

_spare: deque[str] = deque()


def new_id() -> str:
    """A new random identifier: 32 hex digits. Safe from any thread."""
    try:
        return _spare.popleft()  # atomic under the GIL: no two callers get the same one
    except IndexError:
        block = os.urandom(BLOCK * _BYTES).hex()
        ids = [block[i : i + 2 * _BYTES] for i in range(0, len(block), 2 * _BYTES)]
        _spare.extend(ids[1:])
        return ids[0]


def _forget_spares() -> None:
    _spare.clear()


os.register_at_fork(after_in_child=_forget_spares)
