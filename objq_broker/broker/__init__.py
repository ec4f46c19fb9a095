"""The broker: one process commits for a whole namespace, the others forward their operations.

:mod:`~objq_broker.broker.wire` (operations and outcomes as JSON),
:mod:`~objq_broker.broker.server` (the libzmq service in front of the broker's engine) and
:mod:`~objq_broker.broker.client` (a :class:`~objq_broker.engine.port.Committer` that forwards).
This package imports ``pyzmq`` (a dependency of objq); nothing imports it unless a queue
commits through a broker.
"""
