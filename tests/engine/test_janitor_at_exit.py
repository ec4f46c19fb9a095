"""The janitor at interpreter exit: a queue closed then (``atexit``) commits what was pending
and tidies up after it, when no thread may start any more."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from objq_broker.storage import open_store

#: At exit: a delete is made in the exiting thread, a background read is left, nothing raises.
AT_EXIT = """
import atexit, pathlib, sys
from objq_broker.engine.janitor import Janitor
from objq_broker.storage import open_store

store = open_store(sys.argv[1])
janitor = Janitor(store)

def tidy():
    janitor.delete(["bodies/unused"], "unused bodies object")
    janitor.run(lambda: pathlib.Path(sys.argv[2]).touch(), "runs to merge")
    janitor.sweep(lambda: ["bodies/swept"], "garbage")

atexit.register(tidy)
"""


def test_at_exit_a_delete_is_made_in_place_and_nothing_raises(tmp_path: Path) -> None:
    # Given objects a commit at exit leaves unused
    url = (tmp_path / "store").as_uri()
    store = open_store(url)
    for key in ("bodies/unused", "bodies/swept"):
        store.write(key, b"x", if_absent=True)
    marker = tmp_path / "read"
    # When the janitor is asked to tidy up after the interpreter began to exit
    ran = subprocess.run(
        [sys.executable, "-c", AT_EXIT, url, str(marker)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Then the delete is made, the optional work is skipped, and nothing is printed
    assert (ran.returncode, ran.stderr) == (0, "")
    assert store.read("bodies/unused") is None
    assert not marker.exists()
    assert store.read("bodies/swept") is not None  # a sweep may wait for the next process
