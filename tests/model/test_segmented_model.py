"""The segmented state against the same reference model: every rule and invariant of
:mod:`tests.model.test_state_model`, with a rule that moves each queue's ready jobs into runs
of 1 to 3 jobs past a tiny bound (0 to 3) and one that merges small runs, so claims, stats,
lookups, idempotency keys, purges, queue deletion and round trips through the stored form all
meet runs. Runs are kept as
their stored bytes and read back through the checked codec; a consumed run is deleted as the
engine's janitor would, so a state that still referred to one would fail to read it."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from objq_broker.model.records import Job, StateDoc
from objq_broker.model.runs import decode_key_run, decode_run, run_key
from objq_broker.model.state import QueueState
from tests.model.test_state_model import SETTINGS, QueueMachine


class SegmentedMachine(QueueMachine):
    def __init__(self) -> None:
        self.stored: dict[str, bytes] = {}
        self.commits = itertools.count()
        super().__init__()

    def new_state(self, doc: StateDoc | None = None) -> QueueState:
        state = QueueState(doc)
        self.read_runs(state)
        return state

    def read_runs(self, state: QueueState) -> None:
        """As the engine does before a batch, read the runs it refers to (here, all of them:
        each is read once, so every later operation finds what it needs)."""
        for queue, ref in [*state.runs_of(), *state.dead_runs_of()]:
            if ref.key not in state.run_contents:
                state.run_contents[ref.key] = decode_run(ref, queue, self.stored[ref.key])
        for queue in state.doc.key_runs:
            for _, keys in state.key_runs_of(queue):
                if keys.key not in state.key_contents:
                    data = self.stored[keys.key]
                    state.key_contents[keys.key] = decode_key_run(keys, queue, data)

    def live_jobs(self) -> dict[str, Job]:
        in_runs = {job.id: job for job in self.state.run_jobs()}
        assert not in_runs.keys() & self.state.jobs.keys(), "a job both in a run and the head"
        return {**self.state.jobs, **in_runs}

    def dead_jobs(self) -> dict[str, Job]:
        in_runs = {job.id: job for job in self.state.dead_run_jobs(None)}
        assert not in_runs.keys() & self.state.dead.keys(), "a dead letter in a run and the head"
        return {**self.state.dead, **in_runs}

    @rule(bound=st.integers(0, 3), run_jobs=st.integers(1, 3))
    def spill(self, bound: int, run_jobs: int) -> None:
        self.commit(lambda key_for: self.state.spill(bound, key_for, run_jobs=run_jobs), "spilled")

    @rule(run_jobs=st.integers(2, 8), at_least=st.integers(2, 3))
    def merge(self, run_jobs: int, at_least: int) -> None:
        self.commit(lambda key_for: self.state.merge_runs(key_for, run_jobs, at_least), "merged")

    def commit(self, change: Callable[[Callable[[int], str]], object], what: str) -> None:
        """Apply ``change`` (given the keys of the runs it makes) as a commit: what the last
        one left unused is deleted, and the runs it makes are stored."""
        for key in self.state.unused_runs:  # the last "commit" landed: the janitor's turn
            del self.stored[key]
        self.state.unused_runs.clear()
        number = next(self.commits)
        change(functools.partial(run_key, number, f"c{number}"))
        kinds = {ref.key: ref.kind for refs in self.state.doc.runs.values() for ref in refs}
        kinds |= {ref.key: "dead" for refs in self.state.doc.dead_runs.values() for ref in refs}
        for key, data in self.state.new_runs:
            self.stored[key] = data
            event(f"{what} a {kinds.get(key, 'key')} run")
        self.state.new_runs.clear()
        self.read_runs(self.state)


def test_segmented_state_matches_reference_model() -> None:
    # Twice the plain model's examples: spilling is one rule among many.
    run_state_machine_as_test(SegmentedMachine, settings=settings(SETTINGS, max_examples=300))
