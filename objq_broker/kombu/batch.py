# mypy: disallow-untyped-calls=False
# (kombu is only partly annotated)
"""kombu's publish batches (``Producer.batch()``, kombu 5.7 on) for the objq transport.

A message published alone is committed before ``publish`` returns: one commit, a durable state
write, each. Inside ``with producer.batch():`` the messages are held instead, and submitted
together when the batch flushes (the block ends, or ``max_size`` copies are held), so they
usually land in one commit; the flush returns once all of them are durable. A block that
raises discards what it still held, as kombu asks: nothing of it was sent. Celery's chord
callbacks go through one (see ``objq_broker.results.celery.backend``): a chord whose body is a
group of fifty tasks sends them in one commit instead of fifty in a row.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from objq_broker.builders import Enqueue

if TYPE_CHECKING:
    from objq_broker.kombu.channel import Channel

log = logging.getLogger("objq_broker.kombu")

#: The keyword kombu's channel passes down to ``_put`` and ``_put_fanout`` for a message
#: published through a batch (the name kombu's Redis transport uses too).
BATCH_KEYWORD = "_publish_batch"

#: One message's copies: the queues and the enqueue of each.
Copies = tuple[list[str], list[Enqueue]]


class PublishBatch:
    """The messages published through one ``Producer.batch()`` of one channel, until it
    flushes (the session kombu asks a channel's ``create_publish_batch`` for)."""

    def __init__(self, channel: Channel, max_size: int) -> None:
        self.channel = channel
        #: Copies held at most: reaching it flushes.
        self.max_size = max_size
        self._held: list[Copies] = []
        self._count = 0
        self._discarded = False
        self._closed = False

    def publish(self, message: Any, **kwargs: Any) -> Any:
        """Route ``message`` as the channel does and hold its copies (kombu's call)."""
        self._check_usable()
        result = self.channel.basic_publish(message, **{BATCH_KEYWORD: self}, **kwargs)
        if self._count >= self.max_size:
            self.flush()
        return result

    def hold(self, copies: Copies) -> None:
        """Keep one routed message's copies for the next flush (the channel's call)."""
        self._check_usable()
        self._held.append(copies)
        self._count += len(copies[1])

    def flush(self) -> None:
        """Submit every held copy together and wait until all are durable. If some fail, the
        others are still committed, and the first failure is raised once all are settled."""
        self._check_usable()
        held, self._held, self._count = self._held, [], 0
        if held:
            self.channel.commit_copies(held)

    def discard(self) -> None:
        """Drop what is held: none of it was sent."""
        self._held, self._count = [], 0
        self._discarded = True

    def close(self) -> None:
        if self._held:
            log.warning("a publish batch closed holding %d unsent message(s)", len(self._held))
        self._held, self._count = [], 0
        self._closed = True

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("objq publish batch: used after it was closed")
        if self._discarded:
            raise RuntimeError("objq publish batch: used after it was discarded")
