"""Results and rate limits on the same storage as the queue: Celery's result backend
(:mod:`objq_broker.results.celery`) and Dramatiq's result and rate-limiter backends
(:mod:`objq_broker.results.dramatiq`), over :class:`~objq_broker.results.store.ResultStore`.
Never in the queue's state object."""

from objq_broker.results.store import ResultStore

__all__ = ["ResultStore"]
