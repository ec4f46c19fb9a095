"""Random identifiers drawn in blocks: unique across threads and across a fork."""

from __future__ import annotations

import os
import threading

from objq_broker.model.ids import BLOCK, new_id


def test_ids_from_many_threads_are_all_different() -> None:
    found: list[list[str]] = []

    def draw() -> None:
        found.append([new_id() for _ in range(3 * BLOCK)])

    threads = [threading.Thread(target=draw) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = [i for ids in found for i in ids]
    assert len(set(ids)) == len(ids) == 8 * 3 * BLOCK
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_a_forked_child_never_hands_out_its_parents_spares() -> None:
    new_id()  # the parent holds spares now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it draws, and leave at once
        os.close(read)
        os.write(write, "".join(new_id() for _ in range(BLOCK)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child = pipe.read().decode()
    os.waitpid(pid, 0)
    child_ids = {child[i : i + 32] for i in range(0, len(child), 32)}
    parent_ids = {new_id() for _ in range(BLOCK)}
    assert len(child_ids) == BLOCK
    assert not child_ids & parent_ids
