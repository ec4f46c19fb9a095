"""A kombu transport on objq, so Celery keeps every task and setting and changes its broker line.

Importing this package registers the ``objq`` transport alias, so ``objq+<storage URL>`` broker
URLs work; ``broker_transport = "objq_broker.kombu:Transport"`` names the class without it. With
Celery installed it also registers the ``objq`` result backend alias
(:mod:`objq_broker.results.celery`), so ``result_backend = "objq+<storage URL>"`` works too.
The modules: :mod:`~objq_broker.kombu.transport` (the transport and its mapping onto objq),
:mod:`~objq_broker.kombu.channel`, :mod:`~objq_broker.kombu.routing` (exchanges and bindings kept
in the store), :mod:`~objq_broker.kombu.settings` (URL forms and ``transport_options``),
:mod:`~objq_broker.kombu.events` (joining kombu's event loop).
"""

from __future__ import annotations

from objq_broker.kombu.transport import Transport

__all__ = ["Transport"]
