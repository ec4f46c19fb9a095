"""Typed queues: payloads that are values of one type, encoded on enqueue and validated on
claim.

* :class:`~objq_broker.typed.schema.Schema`: a type's JSON payloads, validated both ways
  (msgspec for ``msgspec.Struct``, dataclasses and ``TypedDict``; pydantic 2 models through
  their own methods, pydantic never imported by objq).
* :class:`~objq_broker.typed.queue.TypedQueue` and
  :class:`~objq_broker.typed.aio.AsyncTypedQueue`: one queue of a ``Queue`` or ``AsyncQueue``,
  whose claims return :class:`~objq_broker.typed.queue.TypedDelivery` objects with a
  ``value``. A payload that does not validate is dead-lettered at once with the validation
  error, never retried, and the claim returns the others.

Two classes, as ``Queue`` and ``AsyncQueue`` are two: one class over both would need its
return types to depend on which queue it holds, which type checkers show less plainly than
``list[TypedDelivery[Order]]`` and ``Awaitable`` of it. See ``docs/typed.md``.
"""

from __future__ import annotations

from objq_broker.typed.aio import AsyncTypedQueue
from objq_broker.typed.queue import TypedDelivery, TypedQueue
from objq_broker.typed.schema import PayloadInvalid, Schema

__all__ = ["AsyncTypedQueue", "PayloadInvalid", "Schema", "TypedDelivery", "TypedQueue"]
