"""When a commit's archive object is stored: ahead of the state, or just after it.

A job leaves the state only once its record is safe. The plain way is to store the commit's
archive object first and the state second; then every call of the batch waits for two writes,
although only the acks and rejects finished anything. A publish that shares its commit with the
previous task's ack (as a worker's ack and the next publish do under a broker) would wait for
an archive it has nothing to do with.

So a small archive object rides in the state instead (``StateDoc.archiving``): the state write
makes the records durable, the engine answers every call that finished no job, stores the
object, and only then answers the calls that did. Whoever commits next drops the records from
the state, storing the object first unless it knows it is stored (the writer died between the
two writes; another process's commit). A record is therefore always in the state or in the
archive, and an ack returns only once its record is in the archive, as before. A reader of the
archive may miss, for about one write's time, jobs whose acks have not returned yet.

Large archive objects (past :data:`IN_STATE_MAX_BYTES`) are still stored ahead of the state:
carrying them in the state would cost more in every commit than the write they save.
"""

from __future__ import annotations

import logging

from objq_broker.errors import PreconditionFailed, StorageError
from objq_broker.model.records import ArchiveRecord, PendingArchive, StateDoc, encode_archive
from objq_broker.storage.base import ObjectStore

log = logging.getLogger("objq_broker.engine")

#: Archive objects up to this size ride in the state until stored just after it.
IN_STATE_MAX_BYTES = 64 * 1024
#: How many archive objects an engine remembers having stored (only the latest matter: the
#: state holds those of its last commit or two).
REMEMBERED = 64


class Archiving:
    """One engine's archive objects carried in the state: which are stored already."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._stored: dict[str, None] = {}  # keys known stored, oldest first

    def carry(self, key: str, records: list[ArchiveRecord]) -> PendingArchive | None:
        """``records`` to be kept in the state under ``key`` until stored, or None when they
        are too large for that (store them ahead of the state)."""
        if len(encode_archive(records)) > IN_STATE_MAX_BYTES:
            return None
        return PendingArchive(key, records)

    def settle(self, doc: StateDoc) -> int:
        """Before writing ``doc``: store what it carries that may not be stored yet, then drop
        it all; how many objects were written. A storage error propagates: the commit is tried
        again, and the records are still in the stored state."""
        written = sum(self._store(p) for p in doc.archiving if p.key not in self._stored)
        doc.archiving = []
        return written

    def store_after(self, pending: PendingArchive) -> bool:
        """Just after the state holding ``pending`` landed; whether the object was written. A
        failure loses nothing (the state holds the records, and the next commit stores them),
        so it is only logged."""
        try:
            return self._store(pending)
        except StorageError as exc:
            log.warning(
                "%s: archive object %s not stored yet, the next commit stores it: %s",
                self.store.url,
                pending.key,
                exc,
            )
            return False

    def _store(self, pending: PendingArchive) -> bool:
        try:
            self.store.write(pending.key, encode_archive(pending.records), if_absent=True)
            wrote = True
        except PreconditionFailed:
            wrote = False  # stored already: by the writer that committed it, or by another
        self._stored[pending.key] = None
        while len(self._stored) > REMEMBERED:
            del self._stored[next(iter(self._stored))]
        return wrote
