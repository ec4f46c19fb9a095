"""The namespace's write budget: at most N state writes per second, by every process together.

Object storage bills per request, and a busy namespace writes its state once per batch: a
budget trades latency for cost. It is a setting of the namespace (``StateDoc.write_budget``,
set by ``Queue.set_write_budget`` or ``objq budget``), so every process and the broker obey
the one value.

It works as a token bucket holding one token, measured from the namespace's last commit
(``committed_at``, which every state records) rather than from this process's own: before it
takes a batch that may write, an engine waits until ``1 / N`` seconds after the last commit it
knows of. Operations submitted meanwhile join that batch, so under a budget latency rises and
batches grow, and nothing is lost. With an elected broker (the one writer) the budget holds
exactly; processes committing directly each see the others' commits when they read the state,
so together they stay close to it (two that both wait for the same commit may each write once).

>>> budget_wait(1.0, last_commit=100.0, now=100.25)
0.75
>>> budget_wait(None, last_commit=100.0, now=100.25)
0.0
"""

from __future__ import annotations


def budget_wait(writes_per_second: float | None, *, last_commit: float, now: float) -> float:
    """Seconds to wait before the next state write (0: write now). Never more than one
    interval: a clock that runs behind another host's must not stop the writes."""
    if writes_per_second is None:
        return 0.0
    interval = 1.0 / writes_per_second
    return min(max(last_commit + interval - now, 0.0), interval)
