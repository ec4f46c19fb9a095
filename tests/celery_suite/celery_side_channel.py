"""How Celery's integration tests see the result backend when they ask whether it is Redis.

Copied into the unpacked suite as ``t/integration/side_channel.py`` by ``celery_upstream.py``,
which rewrites each ``manager.app.conf.result_backend.startswith(...)`` check of the suite's
modules to ``backend_for_redis_check(manager.app.conf.result_backend).startswith(...)``.

Most tests behind that check keep what their tasks did in a Redis server (``redis_echo``,
``redis_count``, ``redis_echo_group_id``): Redis is their side channel, not their result
backend. While the run has a redis-server for that (``$OBJQ_SUITE_SIDE_CHANNEL``), objq's
backend passes the check; any other backend, or a run without one, sees the URL unchanged.
"""

from __future__ import annotations

import os

#: Set by ``celery_upstream.py`` to the URL of the run's redis-server.
SIDE_CHANNEL_ENV = "OBJQ_SUITE_SIDE_CHANNEL"


def backend_for_redis_check(url: str) -> str:
    """``url``, prefixed ``redis-side-channel+`` when it is objq's and Redis is there to
    record into: a check for ``"redis"`` then lets the test run on objq."""
    if url.startswith("objq") and os.environ.get(SIDE_CHANNEL_ENV):
        return f"redis-side-channel+{url}"
    return url
