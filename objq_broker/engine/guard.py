"""What an engine can tell about a state someone else wrote: going back, vanishing, a forged
epoch (``docs/security.md``).

Anyone with write access to the bucket can replace ``state.json``. Most of what they could do
looks like a legitimate commit, but three things no objq process does, and an engine that has
been watching can see them:

* **The version went back.** Every commit raises ``version`` by one. A process that has seen
  version N and then reads an older one is looking at a restored copy: acknowledged jobs would
  come back and acknowledged enqueues vanish. It refuses that state (:class:`StateCorrupt`),
  as it refuses any corrupt one, and never writes over it.
* **The state vanished.** The first commit that creates a namespace's state also writes a
  small marker, :data:`NAMESPACE_KEY`. A state missing where the marker (or this process's own
  memory) says one existed was deleted, not never made: creating an empty one would silently
  drop every job, so the engine refuses. Starting afresh on purpose means deleting the marker
  too.
* **The epoch jumped.** Only a takeover raises the epoch, and it records the new broker with
  that same epoch. A state whose epoch is above its broker record's was not written by objq:
  that is reported, and the recorded broker is not fenced by it (a forged epoch of a million
  would otherwise stop every broker until the next takeover).

Each check costs nothing per commit beyond comparing integers; the marker costs one read when
an engine first finds a state missing (and one more of the state, when the marker is there: a
process that started at the same moment may have just created both), and one write when it
creates the state.
"""

from __future__ import annotations

import json
import logging
import time

from objq_broker.errors import PreconditionFailed, StateCorrupt
from objq_broker.model.records import StateDoc
from objq_broker.storage.base import Blob, ObjectStore

#: The state object's key under the store's prefix.
STATE_KEY = "state.json"

log = logging.getLogger("objq_broker.engine")

#: The marker a namespace's first commit writes beside its state (``state.json``; an engine
#: on another state key marks it with that key and ``.created`` instead).
NAMESPACE_KEY = "namespace.json"


def marker_key(state_key: str) -> str:
    return NAMESPACE_KEY if state_key == "state.json" else f"{state_key}.created"


class StateGuard:
    """Watches the states one engine reads for the signs above."""

    def __init__(self, store: ObjectStore, state_key: str) -> None:
        self.store = store
        self.state_key = state_key
        self._highest = -1  # the highest version this engine has read or written
        self._forged_epoch = -1  # the last forged epoch reported, so it is reported once
        self.marker = marker_key(state_key)

    @property
    def where(self) -> str:
        return f"{self.store.url}/{self.state_key}"

    def read(self, doc: StateDoc) -> None:
        """Check a state just decoded; :class:`StateCorrupt` if it went back."""
        if doc.version < self._highest:
            raise StateCorrupt(
                f"{self.where}: expected version {self._highest} or later (this process has "
                f"seen it), found version {doc.version}: an older copy was put back, which "
                "would bring acknowledged jobs back and lose acknowledged ones; it will not be "
                "written over. Put the newest copy back, or restart every process to accept "
                "this one"
            )
        self._highest = doc.version
        self._note_forged_epoch(doc)

    def wrote(self, doc: StateDoc) -> None:
        self._highest = max(self._highest, doc.version)

    def forged_epoch(self, doc: StateDoc, own_epoch: int) -> bool:
        """Whether ``doc``'s epoch is above ``own_epoch`` only because it was forged: the
        broker record still names this writer's epoch, so no takeover happened."""
        return doc.broker is not None and doc.broker.epoch == own_epoch < doc.epoch

    def _note_forged_epoch(self, doc: StateDoc) -> None:
        if doc.broker is None or doc.epoch <= doc.broker.epoch or doc.epoch == self._forged_epoch:
            return
        self._forged_epoch = doc.epoch
        log.error(
            "%s: epoch %d but the broker record holds epoch %d: only a takeover raises the "
            "epoch, and it records the broker with it, so this state was not written by objq "
            "(see docs/security.md); the recorded broker carries on",
            self.where,
            doc.epoch,
            doc.broker.epoch,
        )

    def missing(self) -> Blob | None:
        """The state is not there: fine for a new namespace (None), :class:`StateCorrupt` for
        one that had a state (this engine saw one, or the namespace marker says so). Returns
        the state another process created meanwhile, if that is what happened."""
        if self._highest >= 0:
            raise StateCorrupt(self._vanished(f"this process saw version {self._highest}"))
        if self.store.read(self.marker) is None:
            return None
        # The creator writes the marker right after the state: a state read just before
        # another process created it, and a marker read just after, say nothing was deleted.
        # Only a state still missing now was.
        created = self.store.read(self.state_key)
        if created is None:
            raise StateCorrupt(self._vanished(f"{self.marker} says it was created"))
        return created

    def _vanished(self, why: str) -> str:
        return (
            f"{self.where}: expected a state ({why}), found none: it was deleted, and making "
            "an empty one would drop every job. Put it back from a backup; to start this "
            f"namespace afresh on purpose, delete {self.marker} too"
        )

    def created(self) -> None:
        """This engine created the namespace's state: leave the marker. If this fails, or
        the process dies first, the namespace merely goes without one."""
        marker = json.dumps({"created_at": time.time(), "state": self.state_key}).encode()
        try:
            self.store.write(self.marker, marker, if_absent=True)
        except PreconditionFailed:
            pass  # there already
        except Exception as exc:
            log.warning("%s: could not write %s: %s", self.store.url, self.marker, exc)
