"""What every ``objq`` command gets: its parsed options, the store, and the output mode."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from objq_broker.broker.settings import broker_settings
from objq_broker.cli.output import UsageError, print_json
from objq_broker.engine.options import URL_ENV, url_settings
from objq_broker.engine.snapshot import Snapshot
from objq_broker.errors import BucketNotFound
from objq_broker.queue import Queue
from objq_broker.storage import ObjectStore, open_store
from objq_broker.storage.url import file_directory


def open_existing(url: str) -> ObjectStore:
    """Open ``url`` for a command that only reads or changes what is already stored,
    refusing a local directory that does not exist: a file store would create it (when its
    parent exists), and the command would then report an empty queue, or leave an empty
    directory behind, for what is most likely a typo."""
    if urlsplit(url).scheme.lower() == "file":
        # Checked as a writer's open_store checks it (no credentials, no host part) before
        # the path is built: a refused URL is quoted redacted, never as a path.
        folder = file_directory(url)
        if not folder.is_dir():
            raise BucketNotFound(
                f"file store {str(folder.absolute())!r}: expected an existing directory, "
                "found none (objq declare, enqueue, worker or demo creates one)"
            )
    return open_store(url)


@dataclass
class Context:
    """One run of one command. Opens the store and the queue lazily and closes them at the end."""

    #: The command's options and arguments, and the options of every command (url, json,
    #: debug, yes), by name.
    args: SimpleNamespace
    _store: ObjectStore | None = field(default=None, init=False)
    _queue: Queue | None = field(default=None, init=False)

    @property
    def json(self) -> bool:
        return bool(getattr(self.args, "json", False))

    @property
    def yes(self) -> bool:
        return bool(getattr(self.args, "yes", False))

    @property
    def url(self) -> str:
        url: str | None = getattr(self.args, "url", None) or os.environ.get(URL_ENV)
        if not url:
            raise UsageError(
                f"no store given: pass --url (file:///var/lib/objq, s3://bucket/prefix, "
                f"gs://bucket/prefix) or set ${URL_ENV}"
            )
        return url

    def store(self, *, create: bool = False) -> ObjectStore:
        """The store. A local directory must already exist unless ``create``; then it is
        created as the Python API creates it (only in an existing parent directory)."""
        if self._store is None:
            url, _ = url_settings(self.url, "objq")  # the engine's settings are the queue's
            self._store = open_store(url) if create else open_existing(url)
        return self._store

    def snapshot(self, *, create: bool = False) -> Snapshot:
        """The state as stored now (read-only). Reading it first makes an unreachable store,
        a missing bucket or a corrupt state fail at once, before anything is submitted."""
        return Snapshot.read(self.store(create=create))

    def queue(
        self, *, create: bool = False, serves: bool = False, owner: str | None = None
    ) -> Queue:
        """The queue API on the store. Through the namespace's broker unless ``OBJQ_BROKER``
        says otherwise; only a long-running command (``serves``) may become the broker: a
        one-shot command would take the role only to resign it a moment later. ``owner``
        names the lease holder (``objq workers`` shows it)."""
        if self._queue is None:
            broker = broker_settings(None, {}, default="auto" if serves else "client")
            _, engine = url_settings(self.url, "objq")
            store = self.store(create=create)
            self._queue = Queue(store=store, broker=broker, owner=owner, **engine)
        return self._queue

    def emit(self, value: Any, text: str) -> None:
        """Print ``value`` as JSON with ``--json``, else ``text``."""
        if self.json:
            print_json(value)
        elif text:
            print(text, flush=True)

    def close(self) -> None:
        """Close the queue and the store; closing again does nothing."""
        queue, store, self._queue, self._store = self._queue, self._store, None, None
        if queue is not None:
            queue.close()
        if store is not None:
            store.close()
