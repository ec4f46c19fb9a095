"""A lease holder for the keeper's tests: what a consumer tells a :class:`LeaseKeeper`."""

from __future__ import annotations

from collections.abc import Set
from threading import Lock

from objq_broker.builders import Delivery


class Holder:
    """The simplest lease holder: a list of deliveries, and a record of what it was told."""

    def __init__(self, deliveries: list[Delivery]) -> None:
        self.deliveries = list(deliveries)
        self.dropped: list[set[str]] = []
        self._lock = Lock()

    def held(self) -> list[Delivery]:
        with self._lock:
            return list(self.deliveries)

    def drop(self, tokens: Set[str]) -> None:
        with self._lock:
            self.dropped.append(set(tokens))
            self.deliveries = [d for d in self.deliveries if d.token not in tokens]
