"""The engine: the only layer that reads and writes the state object.

:mod:`~objq_broker.engine.commit` (the group-commit loop), :mod:`~objq_broker.engine.bodies`
(payloads kept out of line), :mod:`~objq_broker.engine.archive` (finished jobs by hour),
:mod:`~objq_broker.engine.janitor` (deletes off the commit path),
:mod:`~objq_broker.engine.snapshot` (a read-only view of a namespace) and
:mod:`~objq_broker.engine.options` (opening the store a URL names).
"""

from __future__ import annotations

from objq_broker.engine.batch import EngineMetrics
from objq_broker.engine.commit import Engine
from objq_broker.engine.guard import STATE_KEY

__all__ = ["STATE_KEY", "Engine", "EngineMetrics"]
