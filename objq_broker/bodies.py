"""Payload bodies kept out of the state object.

A commit rewrites the whole state, so every byte in it is paid for on every commit. Payloads
larger than :data:`INLINE_MAX_BYTES` therefore leave it: the commit that adds them first writes
them, all together, into one immutable object ``bodies/<commit id>.json`` (a JSON list of
``[body, base64?]`` pairs), and the jobs keep only a reference ``<key>#<index>``. The state
counts the live jobs of each bodies object; the commit that drops the count to zero deletes
the object once it has landed.
"""

from __future__ import annotations

import collections
import threading

import msgspec

from objq_broker.errors import ObjectNotFound, StateCorrupt
from objq_broker.storage.base import ObjectStore

#: Payloads up to this size stay inside the state (a separate read would cost more).
INLINE_MAX_BYTES = 256
#: Folder of the bodies objects.
BODIES_PREFIX = "bodies/"
#: Bodies objects a process keeps decoded in memory.
DEFAULT_CACHED_OBJECTS = 64

_Entry = tuple[str, bool]  # (body, is base64)
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(list[tuple[str, bool]])


def bodies_key(commit_id: str) -> str:
    return f"{BODIES_PREFIX}{commit_id}.json"


def encode_bodies(entries: list[_Entry]) -> bytes:
    return _encoder.encode(entries)


def split_ref(ref: str) -> tuple[str, int]:
    key, _, index = ref.rpartition("#")
    return key, int(index)


class BodyCache:
    """Reads bodies by reference, keeping the last few bodies objects decoded. Thread-safe."""

    def __init__(self, store: ObjectStore, max_objects: int = DEFAULT_CACHED_OBJECTS) -> None:
        self.store = store
        self.max_objects = max_objects
        self._objects: collections.OrderedDict[str, list[_Entry]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def remember(self, key: str, entries: list[_Entry]) -> None:
        """Cache a bodies object this process just wrote (no read needed to use it)."""
        with self._lock:
            self._objects[key] = entries
            self._objects.move_to_end(key)
            while len(self._objects) > self.max_objects:
                self._objects.popitem(last=False)

    def load(self, ref: str) -> _Entry:
        key, index = split_ref(ref)
        with self._lock:
            entries = self._objects.get(key)
            if entries is not None:
                self._objects.move_to_end(key)
        if entries is None:
            try:
                data = self.store.get(key)
            except ObjectNotFound as exc:
                raise StateCorrupt(
                    f"{self.store.url}: the state refers to body {ref}, but {key} is missing"
                ) from exc
            try:
                entries = _decoder.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise StateCorrupt(f"{self.store.url}/{key}: not a bodies object ({exc})") from exc
            self.remember(key, entries)
        if not 0 <= index < len(entries):
            raise StateCorrupt(
                f"{self.store.url}/{key}: body {index} referenced, {len(entries)} stored"
            )
        return entries[index]
