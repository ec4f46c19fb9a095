"""Each writer's mark in the state (its last commit): how a writer whose write failed finds
out whether it landed, however many commits others made since."""

from __future__ import annotations

from objq_broker.model.records import MAX_WRITER_MARKS, WRITER_MARK_TTL_SECONDS
from objq_broker.model.state import QueueState

NOW = 1000.0


def test_a_writer_mark_names_its_last_commit_and_moves_to_the_end() -> None:
    state = QueueState()
    state.mark_writer("a", "a1", NOW)
    state.mark_writer("b", "b1", NOW + 1)
    state.mark_writer("a", "a2", NOW + 2)
    assert [(w, m.commit_id) for w, m in state.doc.writers.items()] == [("b", "b1"), ("a", "a2")]
    assert state.dirty


def test_the_least_recent_writer_past_the_bound_is_forgotten() -> None:
    state = QueueState()
    for n in range(MAX_WRITER_MARKS):
        state.mark_writer(f"w{n}", f"c{n}", NOW + n)
    # Given the least recent writer committing again, and then a new one
    state.mark_writer("w0", "c0-again", NOW + 1000)
    state.mark_writer("new", "n1", NOW + 1001)
    # Then the least recent one then (w1) is forgotten; the one that committed again stays
    marks = state.doc.writers
    assert len(marks) == MAX_WRITER_MARKS
    assert "w1" not in marks
    assert list(marks)[-2:] == ["w0", "new"]
    assert marks["w0"].commit_id == "c0-again"


def test_a_writer_silent_for_the_mark_ttl_is_forgotten() -> None:
    state = QueueState()
    state.mark_writer("gone", "g1", NOW)
    state.mark_writer("here", "h1", NOW + 10)
    state.mark_writer("here", "h2", NOW + WRITER_MARK_TTL_SECONDS + 1)
    assert list(state.doc.writers) == ["here"]
