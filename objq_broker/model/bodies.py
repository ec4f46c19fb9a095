"""Payload bodies kept out of the state object: their format and references (pure).

A commit rewrites the whole state, so every byte in it is paid for on every commit. Payloads
larger than :data:`INLINE_MAX_BYTES` therefore leave it: the commit that adds them first writes
them, all together, into one immutable object ``bodies/<commit id>.json`` (a JSON list of
``[body, base64?]`` pairs), and the jobs keep only a reference ``<key>#<index>``. The state
counts the live jobs of each bodies object; the commit that drops the count to zero deletes
the object once it has landed (:mod:`objq_broker.engine.bodies` reads and caches them).
"""

from __future__ import annotations

import msgspec

#: Payloads up to this size stay inside the state (a separate read would cost more).
INLINE_MAX_BYTES = 256
#: Folder of the bodies objects.
BODIES_PREFIX = "bodies/"

BodyEntry = tuple[str, bool]  # (body, is base64)
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(list[tuple[str, bool]])


def bodies_key(commit_id: str) -> str:
    return f"{BODIES_PREFIX}{commit_id}.json"


def encode_bodies(entries: list[BodyEntry]) -> bytes:
    return _encoder.encode(entries)


def decode_bodies(data: bytes) -> list[BodyEntry]:
    """The entries of a bodies object; raises msgspec's errors on anything else."""
    return _decoder.decode(data)


def split_ref(ref: str) -> tuple[str, int]:
    key, _, index = ref.rpartition("#")
    return key, int(index)
