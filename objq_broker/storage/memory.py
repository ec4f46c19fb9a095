"""In-process object store: thread-safe, for tests and single-process use.

Two ``open_store("memory://NAME")`` calls in one process share one store; nothing is shared
between processes and nothing survives the process. Versions come from one counter per store,
so they never repeat, even across delete and re-create.
"""

from __future__ import annotations

import itertools
import threading
import time

from objq_broker.errors import PreconditionFailed
from objq_broker.storage.base import (
    Blob,
    Listing,
    LocalStoreOps,
    ObjectMeta,
)


class MemoryStore(LocalStoreOps):
    """A dict of objects behind one lock.

    >>> store = MemoryStore("demo")
    >>> version = store.write("a", b"1", if_absent=True)
    >>> store.read("a").data
    b'1'
    """

    def __init__(self, name: str = "default") -> None:
        self._name = name
        self._objects: dict[str, Blob] = {}
        self._modified: dict[str, float] = {}  # when each object was last written
        self._lock = threading.Lock()
        self._versions = itertools.count(1)

    @property
    def url(self) -> str:
        return f"memory://{self._name}"

    def _where(self, key: str) -> str:
        return f"memory store {self._name!r}, key {key!r}"

    def read(self, key: str) -> Blob | None:
        self._key(key)
        with self._lock:
            return self._objects.get(key)

    def write(
        self, key: str, data: bytes, *, if_version: str | None = None, if_absent: bool = False
    ) -> str:
        self._key(key)
        self._write_mode(key, if_version, if_absent)
        with self._lock:
            current = self._objects.get(key)
            if if_absent and current is not None:
                raise PreconditionFailed(
                    f"{self._where(key)}: create-only write found an existing object "
                    f"(version {current.version})"
                )
            if if_version is not None and (current is None or current.version != if_version):
                found = "no object" if current is None else f"version {current.version}"
                raise PreconditionFailed(
                    f"{self._where(key)}: expected version {if_version}, found {found}"
                )
            version = str(next(self._versions))
            self._objects[key] = Blob(bytes(data), version)
            self._modified[key] = time.time()
            return version

    def delete(self, key: str) -> None:
        self._key(key)
        with self._lock:
            self._objects.pop(key, None)
            self._modified.pop(key, None)

    def list(self, prefix: str = "") -> list[str]:
        self._prefix(prefix)
        with self._lock:
            return sorted(k for k in self._objects if k.startswith(prefix))

    def list_meta(self, prefix: str = "") -> Listing:
        self._prefix(prefix)
        with self._lock:
            return [
                ObjectMeta(key, len(blob.data), self._modified[key])
                for key, blob in sorted(self._objects.items())
                if key.startswith(prefix)
            ]

    def close(self) -> None:
        """Nothing to release; the objects stay for other users of the same name."""
