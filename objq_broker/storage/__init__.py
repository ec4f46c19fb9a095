"""Object storage with compare-and-set writes: the port and its adapters.

``open_store(url)`` picks an adapter by URL scheme. The S3 and GCS adapters import their SDKs
only when opened, so ``import objq_broker.storage`` needs neither installed.
"""

from __future__ import annotations

from objq_broker.storage.base import Blob, ObjectMeta, ObjectStore
from objq_broker.storage.memory import MemoryStore
from objq_broker.storage.url import open_store

__all__ = ["Blob", "MemoryStore", "ObjectMeta", "ObjectStore", "open_store"]
