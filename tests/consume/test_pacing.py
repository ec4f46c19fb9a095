"""The pauses between reads of something only another process changes."""

from __future__ import annotations

import pytest

from objq_broker.consume.pacing import Pacer


def test_pauses_grow_by_the_factor_up_to_the_ceiling_and_start_again_after_a_reset() -> None:
    pacer = Pacer(ceiling=0.05, first=0.01, factor=2.0)
    assert [pacer.next() for _ in range(5)] == [0.01, 0.02, 0.04, 0.05, 0.05]
    pacer.reset()
    assert pacer.peek() == 0.01
    assert pacer.next() == 0.01


def test_a_change_is_seen_at_most_the_factor_later_than_it_happened() -> None:
    # Given reads at the default pace, and a change after each of these times
    for changed_at in (0.003, 0.05, 0.1, 0.35, 0.9):
        pacer = Pacer(ceiling=10.0)
        elapsed = 0.0
        while elapsed < changed_at:
            elapsed += pacer.next()
        # Then the read that sees it comes within the growth factor of the time waited (plus
        # the first pause, for changes sooner than it)
        assert elapsed <= changed_at * pacer.factor + pacer.first


def test_a_ceiling_below_the_first_pause_is_the_first_pause() -> None:
    pacer = Pacer(ceiling=0.0, first=0.004)
    assert [pacer.next() for _ in range(3)] == [0.004, 0.004, 0.004]


def test_a_factor_below_one_is_refused_with_what_was_found() -> None:
    with pytest.raises(ValueError, match=r"expected 1.0 or more, got 0.5"):
        Pacer(ceiling=1.0, factor=0.5)
