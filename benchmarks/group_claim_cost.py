"""What a claim costs in the model with 100,000 groups, against the same jobs without groups.

The queue holds 200,000 ready jobs, two per group (or none named); 10,000 claims of one job
each, every tenth acked, are timed on the pure model (no storage, no engine), so the figure
is the index's own cost per claim: O(log n + log g) with groups, O(log n) without.

    python benchmarks/group_claim_cost.py
    python benchmarks/group_claim_cost.py --groups 10000 --claims 5000
"""

from __future__ import annotations

import argparse
import time

from objq_broker.model.state import QueueState
from objq_broker.model.values import NewJob

QUEUE = "q"


def build(groups: int, grouped: bool) -> QueueState:
    state = QueueState()
    jobs = [
        NewJob(f"j{g}-{n}", QUEUE, "x", group=f"tenant-{g}" if grouped else None)
        for n in range(2)
        for g in range(groups)
    ]
    state.enqueue(jobs, 1000.0)
    return state


def claims_per_second(state: QueueState, claims: int) -> float:
    started = time.perf_counter()
    for n in range(claims):
        [job] = state.claim(QUEUE, [f"t{n}"], "w", 1001.0)
        if n % 10 == 0:
            assert job.lease is not None
            state.ack(job.id, job.lease.token, 1001.0, None)
    return claims / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=10_000)
    args = parser.parse_args()
    for grouped in (True, False):
        state = build(args.groups, grouped)
        rate = claims_per_second(state, args.claims)
        name = f"{args.groups:,} groups" if grouped else "no groups"
        print(f"{name:>16}: {rate:10,.0f} claims/s ({1e6 / rate:6.1f} us each)", flush=True)


if __name__ == "__main__":
    main()
