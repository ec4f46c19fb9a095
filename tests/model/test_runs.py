"""Runs (the first part of the segmented state): their codec refuses what it cannot trust, and
the merge across runs claims in exactly the order one sorted list would."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from objq_broker.errors import StateCorrupt
from objq_broker.model.records import Job, Lease, RunKind, RunRef
from objq_broker.model.runs import (
    RunMerge,
    build_run,
    decode_run,
    merged_jobs,
    orphan_runs,
    run_key,
    small_runs,
)


def job(seq: int, priority: int = 0, visible_at: float = 0.0, queue: str = "q") -> Job:
    return Job(
        id=f"job-{seq}",
        queue=queue,
        body=f"body {seq}",
        seq=seq,
        enqueued_at=0.0,
        visible_at=visible_at,
        max_attempts=3,
        priority=priority,
    )


def test_a_run_is_stored_in_order_and_read_back() -> None:
    ref, data = build_run("runs/q/1", "q", "ready", [job(3, 1), job(1, 1), job(2, 0)])
    assert (ref.count, ref.taken, ref.next) == (3, 0, (0, 2))
    assert [j.seq for j in decode_run(ref, "q", data)] == [2, 1, 3]
    timed, data = build_run("runs/q/2", "q", "timed", [job(1, visible_at=9.0), job(2, 0, 5.0)])
    assert timed.next == (5.0, 2)
    assert [j.seq for j in decode_run(timed, "q", data)] == [2, 1]


def test_a_run_takes_only_unleased_jobs_of_its_queue() -> None:
    with pytest.raises(ValueError, match="expected at least one job, found none"):
        build_run("runs/q/1", "q", "ready", [])
    with pytest.raises(ValueError, match=r"found job job-1 of 'other'"):
        build_run("runs/q/1", "q", "ready", [job(1, queue="other")])
    leased = msgspec.structs.replace(job(1), lease=Lease("token", "me", 10.0))
    with pytest.raises(ValueError, match="under a lease"):
        build_run("runs/q/1", "q", "ready", [leased])


def test_a_run_that_does_not_match_its_reference_is_refused() -> None:
    ref, data = build_run("runs/q/1", "q", "ready", [job(1), job(2)])
    with pytest.raises(StateCorrupt, match=r"expected a run object of format 1, found 7 bytes"):
        decode_run(ref, "q", b"garbage")
    with pytest.raises(StateCorrupt, match=r"expected .* \(1, 'other', 'ready', 2\), found "):
        decode_run(ref, "other", data)
    fewer, _ = build_run("runs/q/1", "q", "ready", [job(1)])
    with pytest.raises(StateCorrupt, match=r"\(1, 'q', 'ready', 1\), found \(1, 'q', 'ready', 2\)"):
        decode_run(fewer, "q", data)
    shuffled = data.replace(b'"seq":1', b'"seq":9')
    with pytest.raises(StateCorrupt, match="in order, found otherwise"):
        decode_run(ref, "q", shuffled)


@given(
    priorities=st.lists(st.integers(0, 3), min_size=1, max_size=60),
    cuts=st.lists(st.integers(0, 60), max_size=6),
    n=st.integers(1, 70),
    first=st.integers(0, 20),
)
def test_claims_across_runs_follow_one_sorted_order(
    priorities: list[int], cuts: list[int], n: int, first: int
) -> None:
    """``first`` jobs are taken before, so the runs the next claim needs are bounded over
    runs partly taken."""
    jobs = [job(seq, priority) for seq, priority in enumerate(priorities)]
    bounds = sorted({0, len(jobs), *(c for c in cuts if c < len(jobs))})
    refs, contents = [], {}
    for number, (start, end) in enumerate(itertools.pairwise(bounds)):
        ref, data = build_run(f"runs/q/{number}", "q", "ready", jobs[start:end])
        refs.append(ref)
        contents[ref.key] = decode_run(ref, "q", data)
    merge = RunMerge(refs)
    earlier = [merge.take(contents) for _ in range(min(first, len(jobs)))]
    needed = set(merge.needed(n))
    touched: set[str] = set()
    taken: list[Job] = []
    while merge.best() is not None and len(taken) < n:
        before = {ref.key: ref.taken for ref in merge.refs}
        taken.append(merge.take(contents))
        touched |= {ref.key for ref in merge.refs if ref.taken != before[ref.key]}
    expected = sorted(jobs, key=lambda j: (j.priority, j.seq))[: len(earlier) + n]
    assert [j.id for j in earlier + taken] == [j.id for j in expected]
    assert touched <= needed, "a claim reached a run the engine was not told to read"
    assert len(merge) == len(jobs) - len(earlier) - len(taken)


def test_a_deep_fifo_backlog_needs_only_the_runs_a_claim_reaches() -> None:
    runs = [
        build_run(f"runs/q/{r}", "q", "ready", [job(10 * r + i) for i in range(10)])
        for r in range(50)
    ]
    merge = RunMerge([ref for ref, _ in runs])
    assert merge.needed(5) == ["runs/q/0"]
    assert merge.needed(15) == ["runs/q/0", "runs/q/1"]


def test_a_run_that_was_not_read_is_never_guessed() -> None:
    ref, _ = build_run("runs/q/1", "q", "ready", [job(1)])
    with pytest.raises(KeyError, match="was not read before the claim"):
        RunMerge([ref]).take({})


def test_orphan_runs_are_those_no_commit_can_land_with() -> None:
    listed = [
        run_key(7, "a1", 0),  # referred to
        run_key(7, "a1", 1),  # consumed since, its delete lost
        run_key(8, "b2", 0),  # its commit lost the race for version 8
        run_key(9, "c3", 0),  # a commit for version 9 may be in flight
        "runs/notes.txt",  # not ours
    ]
    assert orphan_runs(listed, 8, {run_key(7, "a1", 0)}) == listed[1:3]


def sized(key: str, count: int, taken: int = 0, kind: RunKind = "ready") -> RunRef:
    return RunRef(key=key, kind=kind, count=count, taken=taken, next=(0, 0), oldest=0.0)


def test_small_runs_are_merged_smallest_first_only_when_several_fit() -> None:
    refs = [sized("a", 5), sized("b", 2), sized("c", 9, taken=7), sized("d", 6), sized("e", 1)]
    # At most half full (of 10): a (5), b (2), c (2 left), e (1); d (6) is not small.
    assert [r.key for r in small_runs(refs, "ready", 10, at_least=2)] == ["e", "b", "c", "a"]
    # Smallest first while they fit in one run of 6: e, b, c (5 jobs); a would make 10.
    assert [r.key for r in small_runs(refs, "ready", 6, at_least=2)] == ["e", "b", "c"]
    # Fewer than asked for are left alone, and so is another kind, and a single one.
    assert small_runs(refs, "ready", 6, at_least=4) == []
    assert small_runs(refs, "timed", 10, at_least=2) == []
    assert small_runs([sized("x", 1), sized("y", 9, 9)], "ready", 10, at_least=1) == []


def test_merged_runs_keep_the_order_of_what_is_left() -> None:
    first = [job(1, priority=1), job(4, priority=0), job(6, priority=1)]
    second = [job(2, priority=0), job(3, priority=2)]
    for jobs in (first, second):
        jobs.sort(key=lambda j: (j.priority, j.seq))
    refs = [sized("a", 3, taken=1), sized("b", 2)]
    merged = merged_jobs("ready", [(refs[0], first), (refs[1], second)])
    assert [(j.priority, j.seq) for j in merged] == [(0, 2), (1, 1), (1, 6), (2, 3)]
