"""Two direct writers taking turns: after one lost race, a writer reads before it writes, so it
stops losing the race that follows every write of the other (each loss costs a failed write, a
read and a pause)."""

from __future__ import annotations

from pathlib import Path

from objq_broker import Queue


def test_a_writer_that_lost_a_race_reads_first_and_stops_losing(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    with Queue(url, broker="off") as mine, Queue(url, broker="off") as theirs:
        mine.declare("q")
        # Given another writer that commits between each of my commits
        for n in range(20):
            theirs.enqueue("q", b"theirs %d" % n)
            mine.enqueue("q", b"mine %d" % n)
        counts = mine.metrics()
        # Then only the first of my twenty commits lost the race (not every one)
        assert counts.conflicts <= 2, counts
        # And nothing was lost either way
        assert mine.stats("q").ready == 40
