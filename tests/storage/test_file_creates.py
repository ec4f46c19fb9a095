"""Create-only writes to a directory store: an unnamed file linked in under the key's name.

A create (a result, an archive object, a run) is written and fsynced as an unnamed file in the
key's folder and linked in; the link fails if the name is taken. It needs no lock file and no
temporary name, the kernel reports it like a rename, and a file system without unnamed files
(or a process without ``/proc``) stages and renames creates as every other write.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from objq_broker.errors import PreconditionFailed
from objq_broker.storage.file import TMP_DIR, FileStore
from objq_broker.storage.locks import LOCK_DIR

pytestmark = pytest.mark.skipif(not hasattr(os, "O_TMPFILE"), reason="Linux only: O_TMPFILE")


def test_a_create_is_linked_in_with_no_lock_file_and_no_temporary_name(tmp_path: Path) -> None:
    # Given a store
    store = FileStore(tmp_path)

    # When an object is created, then created again, then replaced
    version = store.write("results/a", b"first", if_absent=True)
    with pytest.raises(PreconditionFailed, match=f"existing object \\(version {version}\\)"):
        store.write("results/a", b"second", if_absent=True)
    created = store.read("results/a")

    # Then the first create holds, as its own version, and left nothing else behind
    assert created is not None and (created.data, created.version) == (b"first", version)
    assert os.listdir(tmp_path / TMP_DIR) == [] and os.listdir(tmp_path / LOCK_DIR) == []
    assert store.write("results/a", b"third", if_version=version) != version
    assert store.get("results/a") == b"third"


def test_a_created_file_has_the_permissions_of_a_staged_one(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.write("created", b"x", if_absent=True)
    store.put("staged", b"x")
    modes = {stat.S_IMODE((tmp_path / name).stat().st_mode) for name in ("created", "staged")}
    assert len(modes) == 1


def test_of_many_processes_creating_one_key_exactly_one_wins(tmp_path: Path) -> None:
    """Threads stand in for processes here: the link is one system call either way."""
    store = FileStore(tmp_path, fsync=False)
    start = threading.Barrier(8)
    won: list[bytes] = []
    lost: list[str] = []

    def create(n: int) -> None:
        start.wait()
        try:
            store.write("chord/counter", b"%d" % n, if_absent=True)
            won.append(b"%d" % n)
        except PreconditionFailed as exc:
            lost.append(str(exc))

    threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(won) == 1 and len(lost) == 7
    assert store.get("chord/counter") == won[0]


def test_the_kernel_reports_a_create(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.write("results/old", b"x", if_absent=True)  # the folder exists to be watched
    seen: list[str | None] = []
    subscription = store.watch_folder("results/", seen.append)
    assert subscription is not None
    try:
        store.write("results/new", b"y", if_absent=True)
        deadline = time.monotonic() + 5
        while "results/new" not in seen and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        subscription.close()
    assert "results/new" in seen


@pytest.mark.parametrize(
    ("step", "error"),
    [
        ("open", errno.EOPNOTSUPP),
        ("open", errno.EISDIR),
        ("link", errno.EPERM),
        ("link", errno.ENOENT),
    ],
    ids=["no unnamed files", "a kernel before them", "no hard links", "no /proc"],
)
def test_where_unnamed_files_cannot_be_made_creates_are_staged_and_renamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, error: int
) -> None:
    # Given a file system (or a process) that refuses one step of a linked create
    real_open, real_link = os.open, os.link
    if error == errno.ENOENT:
        real_isdir = os.path.isdir
        monkeypatch.setattr(os.path, "isdir", lambda p: p != "/proc/self/fd" and real_isdir(p))

    def refusing_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if step == "open" and flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(error, os.strerror(error))
        return real_open(path, flags, *args, **kwargs)

    def refusing_link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if step == "link" and str(src).startswith("/proc/self/fd/"):
            raise OSError(error, os.strerror(error))
        real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    monkeypatch.setattr(os, "link", refusing_link)
    store = FileStore(tmp_path)

    # When objects are created
    version = store.write("a", b"1", if_absent=True)
    store.write("b", b"2", if_absent=True)

    # Then they are there all the same, and refuse a second create, the staged way (which
    # takes each key's lock file)
    assert (store.get("a"), store.get("b")) == (b"1", b"2")
    with pytest.raises(PreconditionFailed, match=version):
        store.write("a", b"again", if_absent=True)
    assert len(os.listdir(tmp_path / LOCK_DIR)) == 2
    assert os.listdir(tmp_path / TMP_DIR) == []


def test_any_other_error_of_a_create_is_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def full_disk(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(path, flags, *args, **kwargs)

    store = FileStore(tmp_path)
    monkeypatch.setattr(os, "open", full_disk)
    with pytest.raises(Exception, match="No space left") as raised:
        store.write("a", b"1", if_absent=True)
    assert type(raised.value).__module__ == "objq_broker.errors"
    assert store.read("a") is None


def test_a_create_whose_folder_went_away_fails_and_later_creates_still_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a link that finds its folder gone once (deleted by hand under the store)
    real_link = os.link
    failures = [errno.ENOENT]

    def vanished_once(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if failures:
            raise OSError(failures.pop(), "No such file or directory")
        real_link(src, dst, *args, **kwargs)

    store = FileStore(tmp_path)
    monkeypatch.setattr(os, "link", vanished_once)

    # When a create meets it, and another comes after
    with pytest.raises(Exception, match="No such file") as raised:
        store.write("a", b"1", if_absent=True)
    store.write("b", b"2", if_absent=True)

    # Then the first failed as a storage error (a commit retries it), and the next one was
    # still linked in: it took no lock file
    assert type(raised.value).__module__ == "objq_broker.errors"
    assert store.get("b") == b"2" and os.listdir(tmp_path / LOCK_DIR) == []
