"""Message groups (``docs/groups.md``) under Hypothesis' stateful testing: jobs of a few
groups (and of none) enqueued, claimed, acked, nacked, released, expired and dead-lettered,
with the queue's ready jobs spilled into runs past a tiny bound. Every claim is checked
against the rules, from the jobs as the state shows them just before it:

* priority first: no job of a better priority was ready;
* order: no job of the claimed job's group (same priority) with a smaller seq was ready;
* caps: its group held fewer than ``group_concurrency`` jobs leased or backing off;
* fairness: among jobs ready at that priority, no other group (with a job ready that the
  claim could take) held fewer jobs in flight (checked while the queue has no runs: the
  runs are one line in their own order);

and after every step no group holds more than its cap, and the state's stored form reads back
as the same state.
"""

from __future__ import annotations

import functools
import itertools

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from objq_broker.errors import LeaseLost
from objq_broker.model.encoding import decode_state
from objq_broker.model.ops.jobs import Claim
from objq_broker.model.records import Job
from objq_broker.model.runs import decode_run, run_key
from objq_broker.model.state import QueueState
from objq_broker.model.values import NewJob
from tests.model.test_state_model import SETTINGS, same_state
from tests.model.test_state_transitions import _watch

GROUPS = ["g1", "g2", "g3", None]
Q = "q"


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = QueueState()
        self.now = 1000.0
        self.ids = itertools.count()
        self.stored: dict[str, bytes] = {}
        self.commits = itertools.count()
        self.held: dict[str, str] = {}  # job id -> token
        self.cap: int | None = None
        self.fair = True
        self.state.declare(Q, now=self.now)

    # --- what the state shows ---------------------------------------------------------

    def read_runs(self) -> None:
        for queue, ref in [*self.state.runs_of(), *self.state.dead_runs_of()]:
            if ref.key not in self.state.run_contents:
                data = self.stored[ref.key]
                self.state.run_contents[ref.key] = decode_run(ref, queue, data)

    def live(self) -> list[Job]:
        return [*self.state.jobs.values(), *self.state.run_jobs(Q)]

    def ready(self) -> list[Job]:
        return [j for j in self.live() if j.lease is None and j.visible_at <= self.now]

    def holding(self, group: str) -> tuple[int, int]:
        """(leased, leased or backing off after an attempt) of ``group``, from the jobs."""
        jobs = [j for j in self.state.jobs.values() if j.group == group]
        leased = sum(j.lease is not None for j in jobs)
        backing = sum(j.lease is None and j.attempts > 0 and j.visible_at > self.now for j in jobs)
        return leased, leased + (backing if self.cap is not None else 0)

    # --- rules ------------------------------------------------------------------------

    @rule(cap=st.sampled_from([None, None, 1, 2]), fair=st.booleans())
    @precondition(lambda self: not self.state.jobs and not self.state.run_jobs(Q))
    def configure(self, cap: int | None, fair: bool) -> None:
        self.state.configure(Q, {"group_concurrency": cap, "fairness": None if fair else False})
        self.cap, self.fair = cap, fair

    @rule(
        items=st.lists(
            st.tuples(
                st.sampled_from(GROUPS), st.sampled_from([0, 0, 1]), st.sampled_from([0, 0, 3])
            ),
            min_size=1,
            max_size=6,
        )
    )
    def enqueue(self, items: list[tuple[str | None, int, int]]) -> None:
        new = [
            NewJob(
                f"j{next(self.ids)}", Q, "x", priority=p, delay_seconds=d, max_attempts=3, group=g
            )
            for g, p, d in items
        ]
        self.state.enqueue(new, self.now)

    @rule(n=st.integers(1, 4))
    def claim(self, n: int) -> None:
        self.state.expire(self.now)  # leases past their time go back first, as a commit does
        self.read_runs()
        for _ in range(n):
            before = {j.id: j for j in self.ready()}
            shares = {g: self.holding(g) for g in GROUPS if g is not None}
            had_runs = bool(self.state.runs_of(Q))
            got = self.state.claim(Q, [f"t{next(self.ids)}"], "w", self.now)
            if not got:
                takeable = [
                    j
                    for j in before.values()
                    if j.group is None or self.cap is None or shares[j.group][1] < self.cap
                ]
                assert not takeable, (
                    f"claim found nothing but {[j.id for j in takeable]} were ready"
                )
                return
            [job] = got
            self.check_claim(job, before, shares, had_runs)
            self.held[job.id] = job.lease.token if job.lease else ""

    def at_cap(self, job: Job, shares: dict[str, tuple[int, int]]) -> bool:
        return job.group is not None and self.cap is not None and shares[job.group][1] >= self.cap

    def check_claim(
        self, job: Job, before: dict[str, Job], shares: dict[str, tuple[int, int]], had_runs: bool
    ) -> None:
        assert job.id in before, f"claimed {job.id}, which was not ready"
        ready = [j for j in before.values() if not self.at_cap(j, shares)]
        best = min(j.priority for j in ready)
        assert job.priority == best, f"claimed priority {job.priority} while {best} was ready"
        if job.group is not None:
            earlier = [
                j.id
                for j in ready
                if j.group == job.group and j.priority == job.priority and j.seq < job.seq
            ]
            assert not earlier, f"claimed {job.id} of {job.group} before {earlier}"
            if self.cap is not None:
                assert shares[job.group][1] < self.cap, f"{job.group} was at its cap"
        if self.fair and not had_runs:
            mine = 0 if job.group is None else shares[job.group][0]
            for other in ready:
                if other.priority != best or other.group == job.group:
                    continue
                theirs = 0 if other.group is None else shares[other.group][0]
                if (
                    other.group is not None
                    and self.cap is not None
                    and shares[other.group][1] >= self.cap
                ):
                    continue
                assert theirs >= mine, (
                    f"claimed {job.id} of {job.group} ({mine} in flight) while {other.id} of "
                    f"{other.group} ({theirs} in flight) waited"
                )
        event("claimed a job of a group" if job.group else "claimed a job of no group")

    @rule(data=st.data(), how=st.sampled_from(["ack", "nack", "nack", "dead", "release"]))
    @precondition(lambda self: bool(self.held))
    def settle(self, data: st.DataObject, how: str) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.held)))
        token = self.held.pop(job_id)
        try:
            if how == "ack":
                self.state.ack(job_id, token, self.now)
            elif how == "release":
                self.state.release([(job_id, token)], self.now)
            else:
                result = self.state.nack(
                    job_id, token, self.now, error="e", retry=how == "nack", jitter=0.5
                )
                event(f"nack: {result}")
        except LeaseLost:
            event("settled a lost lease")

    @rule(seconds=st.sampled_from([1, 2, 5, 70]))
    def advance(self, seconds: int) -> None:
        self.now += seconds

    @rule(bound=st.integers(0, 3), run_jobs=st.integers(1, 3))
    def spill(self, bound: int, run_jobs: int) -> None:
        for key in self.state.unused_runs:
            self.stored.pop(key, None)
        self.state.unused_runs.clear()
        number = next(self.commits)
        self.state.spill(bound, functools.partial(run_key, number, f"c{number}"), run_jobs=run_jobs)
        for key, data in self.state.new_runs:
            self.stored[key] = data
            event("spilled a run")
        self.state.new_runs.clear()
        self.read_runs()

    @rule()
    def reload(self) -> None:
        """The stored state, read back by another process, goes on as this one would."""
        data = self.state.encode()
        state = QueueState(decode_state(data, "test"))
        state.run_contents = self.state.run_contents
        assert same_state(state.encode(), data)
        self.state = state

    @invariant()
    def line_entries_are_counted(self) -> None:
        # The count that spares each commit a walk of the lines (``ready_past``)
        for lines in self.state.index._lines.values():
            assert lines.entries == sum(len(line) for line in lines.lines.values())

    @invariant()
    def caps_hold(self) -> None:
        if self.cap is None:
            return
        for group in GROUPS:
            if group is not None:
                leased = sum(
                    j.lease is not None for j in self.state.jobs.values() if j.group == group
                )
                assert leased <= self.cap, f"{group} holds {leased} leases, over its cap {self.cap}"


def test_groups_keep_priority_order_caps_and_fairness() -> None:
    run_state_machine_as_test(GroupMachine, settings=settings(SETTINGS, max_examples=200))


# --- claim cost ----------------------------------------------------------------------------


def test_claiming_among_100000_groups_touches_a_few_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given 100,000 groups of two jobs each, one of each group in flight under a cap of 2,
    # and a group that holds nothing with one job, enqueued last
    state = QueueState()
    state.declare(Q, now=1000.0)
    state.configure(Q, {"group_concurrency": 2})
    groups = 100_000
    state.enqueue(
        [NewJob(f"j{i}-{n}", Q, "x", group=f"g{i}") for n in range(2) for i in range(groups)],
        1000.0,
    )
    assert len(state.claim(Q, [f"t{i}" for i in range(groups)], "w", 1000.0)) == groups
    state.enqueue([NewJob("quiet", Q, "x", group="quiet")], 1001.0)
    counting, watched = _watch(state, monkeypatch)

    # When one job is claimed
    [job] = state.claim(Q, ["t"], "w", 1002.0)

    # Then it is the quiet group's (it holds nothing in flight), found with a few heap
    # operations and look-ups, and no scan
    assert job.id == "quiet"
    assert counting.pops <= 4 and counting.pushes <= 4 and watched.lookups <= 4

    # And the next claim, a busy group's second job, costs as little
    [job] = state.claim(Q, ["t2"], "w", 1003.0)
    assert job.id == "j0-1"
    assert counting.pops <= 10 and counting.pushes <= 10 and watched.lookups <= 8


def test_a_claim_over_several_queues_takes_from_each_in_turn() -> None:
    state = QueueState()
    state.enqueue([NewJob(f"a{i}", "a", "x") for i in range(4)], 1000.0)
    state.enqueue([NewJob(f"b{i}", "b", "x") for i in range(2)], 1000.0)
    got = Claim(queues=["a", "b"], tokens=[f"t{i}" for i in range(5)], owner="w").apply(
        state, 1000.0
    )
    assert [job.id for job in got] == ["a0", "b0", "a1", "b1", "a2"]
    weighted = Claim(queues=["a", "b"], tokens=["u"], owner="w", weights=[3, 1])
    assert [job.id for job in weighted.apply(state, 1000.0)] == ["a3"]


def test_a_state_without_groups_names_no_group_and_keeps_its_format() -> None:
    state = QueueState()
    state.enqueue([NewJob("j", Q, "x")], 1000.0)
    state.configure(Q, {"lease_seconds": 9.0})
    data = state.encode()
    assert b"group" not in data and b"fairness" not in data and b'"format":1' in data
    state.enqueue([NewJob("k", Q, "x", group="t")], 1000.0)
    assert b'"format":4' in state.encode()


def test_a_spill_writes_out_the_largest_groups_and_keeps_quiet_ones_in_the_head() -> None:
    # Given a head past the bound: one tenant's backlog, and two quiet tenants after it
    state = QueueState()
    state.enqueue([NewJob(f"a{i}", Q, "x", group="A") for i in range(30)], 1000.0)
    state.enqueue([NewJob(f"q{i}", Q, "x", group=f"T{i}") for i in range(2)], 1000.0)
    # When it spills
    state.spill(20, functools.partial(run_key, 1, "c1"), run_jobs=100)
    # Then A's jobs went to runs and the quiet tenants' stayed: with A holding one job, the
    # next claims are theirs (in runs, they would have waited behind all of A's)
    [(_, data)] = state.backlog.new_runs
    [ref] = state.doc.runs[Q]
    assert [job.group for job in decode_run(ref, Q, data)] == ["A"] * 30
    claimed = [state.claim(Q, [f"t{n}"], "w", 1001.0)[0].id for n in range(3)]
    assert claimed == ["a0", "q0", "q1"]


def test_an_ordered_claim_over_several_queues_takes_from_the_first_until_enough() -> None:
    state = QueueState()
    state.enqueue([NewJob(f"a{i}", "a", "x") for i in range(2)], 1000.0)
    state.enqueue([NewJob(f"b{i}", "b", "x") for i in range(2)], 1000.0)
    # The rotation has served "a": an ordered claim still takes from it first
    Claim(queues=["b", "a"], tokens=["t"], owner="w").apply(state, 1000.0)
    ordered = Claim(queues=["a", "b"], tokens=["u0", "u1", "u2"], owner="w", ordered=True)
    assert [job.id for job in ordered.apply(state, 1000.0)] == ["a0", "a1", "b1"]


def test_stats_count_groups_and_name_the_busiest_in_the_head_and_in_runs() -> None:
    state = QueueState()
    state.enqueue([NewJob(f"a{i}", Q, "x", group="A") for i in range(30)], 1000.0)
    state.enqueue([NewJob(f"b{i}", Q, "x", group="B") for i in range(2)], 1001.0)
    state.enqueue([NewJob(f"g{i}", Q, "x", group=f"T{i}") for i in range(8)], 1002.0)
    state.enqueue([NewJob("plain", Q, "x")], 1002.0)
    state.spill(30, functools.partial(run_key, 1, "c1"), run_jobs=100)  # A's jobs: in runs
    [b0] = [job for job in state.claim(Q, ["t0", "t1"], "w", 1003.0) if job.group == "B"]
    stats = state.stats(Q, 1010.0)
    assert (stats.groups, len(stats.busiest)) == (10, 5)
    top = stats.busiest[0]
    assert (top.group, top.ready + top.in_flight, top.oldest_ready_age_seconds) == ("A", 30, None)
    second = stats.busiest[1]
    assert (second.group, second.ready, second.in_flight) == ("B", 1, 1), b0
    assert second.oldest_ready_age_seconds == 9.0


def test_a_reloaded_state_whose_groups_are_all_in_runs_counts_what_a_claim_takes() -> None:
    # Given a queue whose grouped jobs were all spilled, read back by another process
    state = QueueState()
    state.enqueue([NewJob(f"a{i}", Q, "x", group="A") for i in range(10)], 1000.0)
    state.spill(0, functools.partial(run_key, 1, "c1"), run_jobs=100)
    [(key, data)] = state.backlog.new_runs
    reloaded = QueueState(decode_state(state.encode(), "test"))
    reloaded.run_contents = {key: decode_run(reloaded.doc.runs[Q][0], Q, data)}
    # When it claims two
    reloaded.claim(Q, ["t0", "t1"], "w", 1001.0)
    # Then A still counts ten jobs: two in flight, eight ready (none counted twice)
    [top] = reloaded.stats(Q, 1002.0).busiest
    assert (top.group, top.ready, top.in_flight) == ("A", 8, 2)
