"""The per-key lock files of a directory store (:mod:`objq_broker.storage.file`).

A write holds an exclusive ``flock`` on its key's lock file in ``.objq-locks/`` around its
check-and-rename. ``flock`` locks belong to an open file description, so they exclude other
threads of this process as well as other processes on this host.

A lock file lives as long as its key: deleting the key deletes its lock file, while holding it.
A writer that opened the file before it was deleted then gets a lock nobody else can see, so
whoever takes a lock checks that its file still has a name, and opens the new one if not.
Releases before 2026-11-28 neither deleted lock files nor made that check: they left one empty
file for every key they ever wrote (every result, every archive object), which
:meth:`KeyLocks.sweep` deletes once their keys are gone. Such a release, still running, does
not expect its lock file to go: a key deleted while it writes may see two writers at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

#: Folder (under the store's root) holding one lock file per key written conditionally.
LOCK_DIR = ".objq-locks"
#: A lock file is swept only once made this long ago: a key written now may exist only
#: after its writer's lock, and the margin keeps a sweep from racing it.
STALE_LOCK_SECONDS = 3600.0


def lock_name(key: str) -> str:
    """The name of ``key``'s lock file: a hash, so lock files stay flat and short whatever
    the key looks like."""
    return hashlib.sha256(key.encode()).hexdigest()[:40]


@runtime_checkable
class LockingStore(Protocol):
    """A store that keeps lock files beside its objects (the file store)."""

    def sweep_locks(self, older_than: float = STALE_LOCK_SECONDS, *, dry_run: bool = False) -> int:
        """Delete the lock files of keys that no longer exist (see :meth:`KeyLocks.sweep`)."""
        ...


def sweep_locks(
    store: object, older_than: float = STALE_LOCK_SECONDS, *, dry_run: bool = False
) -> int:
    """``store.sweep_locks(...)`` for a store that keeps lock files; 0 for any other."""
    if isinstance(store, LockingStore):
        return store.sweep_locks(older_than, dry_run=dry_run)
    return 0


class KeyLocks:
    """The lock files in ``folder`` (which exists)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @contextlib.contextmanager
    def held(self, key: str, *, forget: bool = False) -> Iterator[None]:
        """Hold ``key``'s lock. ``forget``: the key is being deleted, so its lock file is
        deleted too, while held."""
        lock = self.folder / lock_name(key)
        with fork_gate().open():
            while True:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except BaseException:
                    os.close(fd)
                    raise
                if os.fstat(fd).st_nlink:
                    break
                os.close(fd)  # deleted while we waited for it: take the one there now
            try:
                yield
                if forget:
                    os.unlink(lock)
            finally:
                os.close(fd)  # closing the descriptor releases the lock

    def sweep(self, existing: Iterable[str], older_than: float, *, dry_run: bool = False) -> int:
        """Delete the lock files of keys not in ``existing`` that were made over
        ``older_than`` seconds ago and that nobody holds now; how many (``dry_run``: would
        be). A lock file is deleted holding it, as a key's delete does, so a writer waiting
        for it takes a new one."""
        live = {lock_name(key) for key in existing}
        cutoff = time.time() - older_than
        swept = 0
        with os.scandir(self.folder) as entries:
            stale = [
                entry.path
                for entry in entries
                if entry.name not in live and _made_before(entry, cutoff)
            ]
        for path in stale:
            if self._sweep_one(path, dry_run=dry_run):
                swept += 1
        return swept

    @staticmethod
    def _sweep_one(path: str, *, dry_run: bool) -> bool:
        with fork_gate().open():
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                return False  # its key was deleted, or another sweep took it
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False  # in use: its key is being written
                if not os.fstat(fd).st_nlink:
                    return False
                if not dry_run:
                    os.unlink(path)
                return True
            finally:
                os.close(fd)


def _made_before(entry: os.DirEntry[str], cutoff: float) -> bool:
    try:
        return entry.stat().st_mtime < cutoff  # never written to: made then
    except FileNotFoundError:
        return False


class ForkGate:
    """Keeps ``fork()`` out of the moments a lock file is open in this process.

    A child forked while a thread holds a key's ``flock`` shares that lock (it belongs to the
    open file, and the child has a copy of the descriptor that it never closes): the lock stays
    held while the child lives, and every writer of the key on this host, the child included,
    waits for it. Celery's prefork pool forks children from a process that commits, all the
    time (``--max-tasks-per-child``, a child that died). So a fork waits for the lock files
    open now to be closed, and none is opened until the fork is done.
    """

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._open = 0
        self._forking = False
        os.register_at_fork(
            before=self._before_fork,
            after_in_parent=self._after_fork,
            after_in_child=self._after_fork,
        )

    @contextlib.contextmanager
    def open(self) -> Iterator[None]:
        """Around the life of a lock file's descriptor."""
        with self._cv:
            while self._forking:
                self._cv.wait()
            self._open += 1
        try:
            yield
        finally:
            with self._cv:
                self._open -= 1
                self._cv.notify_all()

    def _before_fork(self) -> None:
        self._cv.acquire()  # held through the fork, released on both sides after it
        self._forking = True
        while self._open:
            self._cv.wait()

    def _after_fork(self) -> None:
        self._forking = False
        self._cv.notify_all()
        self._cv.release()


@functools.cache
def fork_gate() -> ForkGate:
    """The process's gate, made (and its fork hooks registered) on first use. Two callers
    racing the first call may make two: both are registered, so forks still wait for both."""
    return ForkGate()
