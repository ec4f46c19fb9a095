"""Changes to a local folder as the kernel reports them (Linux inotify), so that a process
waiting for an object of a ``file://`` store wakes when it is written, instead of reading it
again and again.

The file store writes an object by renaming a finished file into place, or by linking a new
one in, so every write is one ``IN_MOVED_TO`` or ``IN_CREATE`` event in the object's folder,
carrying the object's name; a delete is one ``IN_DELETE``. One inotify instance and one
daemon thread serve the whole process: a :class:`Subscription` names a folder and a callback,
and the thread calls the callback with each name written or deleted there, or with None when
the kernel dropped events (its queue overflowed) or the folder went away, meaning "anything may
have changed".

Where there is no inotify (macOS, Windows), where the folder does not exist yet, or where the
user's inotify limits are reached, :func:`subscribe` returns None and the caller reads at
intervals as it would anyway. Writes made on another host (a folder shared over NFS) raise no
event here: one more reason a file store serves one host.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

log = logging.getLogger("objq_broker.storage")

#: What a subscriber is told: the name written or deleted, or None for "anything may have".
OnChange = Callable[[str | None], None]

# From <sys/inotify.h>.
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_CLOEXEC = os.O_CLOEXEC
#: struct inotify_event: watch descriptor, mask, cookie, length of the name that follows.
_EVENT = struct.Struct("iIII")
_READ_BYTES = 64 * 1024


class Subscription:
    """Calls ``on_change`` for the changes in one folder until :meth:`close`."""

    def __init__(self, watcher: _Watcher, wd: int, on_change: OnChange) -> None:
        self._watcher = watcher
        self.wd = wd
        self.on_change = on_change

    def close(self) -> None:
        self._watcher.unsubscribe(self)


class _Watcher:
    """The process's inotify instance and the thread that reads it."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._libc = libc
        fd = libc.inotify_init1(IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.fd = fd
        self._lock = threading.Lock()
        self._subscribers: dict[int, list[Subscription]] = {}  # by watch descriptor
        threading.Thread(target=self._run, name="objq-notify", daemon=True).start()

    def subscribe(self, folder: Path, on_change: OnChange) -> Subscription | None:
        with self._lock:
            # Watching a folder watched already returns its descriptor again.
            wd = self._libc.inotify_add_watch(
                self.fd, os.fsencode(folder), IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_ONLYDIR
            )
            if wd < 0:  # no such folder, not a folder, or the user's limit of watches
                return None
            subscription = Subscription(self, wd, on_change)
            self._subscribers.setdefault(wd, []).append(subscription)
            return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            subscribers = self._subscribers.get(subscription.wd, [])
            with contextlib.suppress(ValueError):  # closed twice
                subscribers.remove(subscription)
            if not subscribers and self._subscribers.pop(subscription.wd, None) is not None:
                # The kernel then reports IN_IGNORED for it, which finds nobody.
                self._libc.inotify_rm_watch(self.fd, subscription.wd)

    def abandon(self) -> None:
        """In a forked child, the copy of the parent's watcher: its descriptor is closed, and
        closing a subscription inherited with it (an engine the child closes) does nothing,
        even if a thread of the parent held the lock at the fork."""
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1
        self._lock = threading.Lock()
        self._subscribers = {}

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self.fd, _READ_BYTES)
            except InterruptedError:
                continue
            except OSError:  # closed: this process forked and this is the child's copy
                return
            try:
                self._dispatch(data)
            except Exception:  # a bug here must not end every process's wakeups
                log.exception("folder changes could not be passed on")

    def _dispatch(self, data: bytes) -> None:
        changes: list[tuple[int | None, str | None]] = []  # (None, None): every folder
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size
            named = os.fsdecode(data[offset : offset + length].rstrip(b"\0"))
            offset += length
            if mask & IN_Q_OVERFLOW:  # events were lost, in any folder
                changes.append((None, None))
            elif mask & IN_IGNORED:  # the folder was deleted or moved: nothing more from it
                changes.append((wd, None))
            elif mask & IN_ISDIR:  # a folder made or deleted in the watched one: no object
                continue
            else:
                changes.append((wd, named))
        with self._lock:
            calls = [
                (subscription, name)
                for wd, name in changes
                for watched, subscriptions in self._subscribers.items()
                if wd is None or wd == watched
                for subscription in subscriptions
            ]
        for subscription, name in calls:
            try:
                subscription.on_change(name)
            except Exception:  # one subscriber's bug must not keep the others from being told
                log.exception("a folder change could not be passed on")


@runtime_checkable
class WatchableStore(Protocol):
    """A store that can report the writes to its objects as they happen (the file store)."""

    def watch_folder(self, folder: str, on_change: OnChange) -> Subscription | None:
        """Call ``on_change`` with the key of each object written or deleted directly under
        the folder key ``folder`` ("" for the top), or None for "anything may have changed";
        None when it cannot."""
        ...

    def version(self, key: str) -> str | None:
        """``key``'s version as a read would give it, without reading the object (None: no
        such object): what a watcher compares a report with, to tell a write it has not seen
        from one it made or read."""
        ...


def folder_of(key: str) -> str:
    """The folder key holding ``key`` ("" for the top)."""
    return key.rpartition("/")[0]


def watch_folder(store: object, folder: str, on_change: OnChange) -> Subscription | None:
    """``store.watch_folder(...)`` when ``store`` can report writes; else None (read at
    intervals)."""
    if isinstance(store, WatchableStore):
        return store.watch_folder(folder, on_change)
    return None


def version(store: object, key: str) -> str | None:
    """``store.version(key)`` when ``store`` can report writes; else None (unknown)."""
    if isinstance(store, WatchableStore):
        return store.version(key)
    return None


class _Shared:
    """The process's watcher, made on first use; a forked child starts again."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watcher: _Watcher | None = None
        self.unavailable = False

    def get(self) -> _Watcher | None:
        with self.lock:
            if self.watcher is None and not self.unavailable:
                try:
                    self.watcher = _Watcher(_libc())
                except (OSError, AttributeError) as exc:  # no inotify, or no instance left
                    log.debug("folder changes are not reported here: %s", exc)
                    self.unavailable = True
            return self.watcher

    def forget_in_child(self) -> None:
        """A forked child has the parent's inotify descriptor but not its thread: it closes
        the descriptor (reading it would take the parent's events) and makes its own on
        first use. The lock is new: a thread of the parent may have held it at the fork."""
        if self.watcher is not None:
            self.watcher.abandon()
        self.lock = threading.Lock()
        self.watcher, self.unavailable = None, False


_shared = _Shared()
os.register_at_fork(after_in_child=_shared.forget_in_child)


def subscribe(folder: Path, on_change: OnChange) -> Subscription | None:
    """Call ``on_change`` from another thread for each object written or deleted in
    ``folder`` (see the module docstring), until the subscription is closed; None when this
    process cannot be told (then read at intervals)."""
    watcher = _shared.get()
    return None if watcher is None else watcher.subscribe(folder, on_change)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
