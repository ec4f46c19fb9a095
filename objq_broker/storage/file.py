"""A local directory as an object store, with compare-and-set that holds across processes.

Each key is a file under the root. A write that may replace an object goes to a temporary file
in ``.objq-tmp/``, is fsynced, given a modification time strictly later than the one it
replaces, renamed over the key's file, and the directory is fsynced, so a reader sees the old
bytes or the new ones, never a torn mix, and a crash never leaves a half-written object. A
create-only write (a result, an archive object, a run) is written and fsynced as an unnamed
file in the key's folder (``O_TMPFILE``, Linux) and linked in under the key's name, which fails
if the name is taken: one step that needs no lock and leaves nothing behind after a crash.
File systems without unnamed files stage and rename creates too.

Writes that may replace an object take an exclusive ``flock`` on a per-key lock file in
``.objq-locks/`` around check-and-rename, and a delete removes the key's lock file with the key
(:mod:`~objq_broker.storage.locks`). (Over NFS, ``flock`` semantics depend on the server; use
S3 or GCS to share a queue between hosts.)

A version is ``<mtime_ns>-<inode>``, read with ``fstat`` on the same descriptor the data is
read from. Writes push mtime strictly forward per key, so a version never repeats even when an
inode number is reused.

Every write renames or links a file into its key's folder, so the kernel can report it as it
happens:
:meth:`FileStore.watch_folder` (see :mod:`~objq_broker.storage.notify`) lets a waiter wake on
another process's write instead of reading again at intervals.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from objq_broker.errors import (
    AccessDenied,
    BucketNotFound,
    PreconditionFailed,
    StorageError,
)
from objq_broker.storage.base import (
    Blob,
    Listing,
    LocalStoreOps,
    ObjectMeta,
    join_key,
)
from objq_broker.storage.locks import LOCK_DIR, STALE_LOCK_SECONDS, KeyLocks
from objq_broker.storage.notify import OnChange, Subscription, subscribe

#: (key, path) of listed objects.
_Paths = list[tuple[str, Path]]
log = logging.getLogger("objq_broker.storage")

#: Folder (under the root) holding temporary files until they are renamed into place.
TMP_DIR = ".objq-tmp"
#: A temporary file this old is left by a write whose process died (swept when a store opens).
STALE_TEMP_SECONDS = 3600.0
#: How a file system says it has no unnamed files (``O_TMPFILE``; a kernel before them reads
#: the flag as ``O_DIRECTORY``), and how a link to one fails where there is no ``/proc`` or no
#: hard links: creates are staged and renamed instead, from then on.
_NO_UNNAMED_FILES = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL})
_NO_LINKS = frozenset({errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM, errno.EXDEV})
_PROC_FDS = "/proc/self/fd"


def _version_of(stat: os.stat_result) -> str:
    return f"{stat.st_mtime_ns:x}-{stat.st_ino:x}"


def _mtime_of(version: str) -> int:
    return int(version.split("-", 1)[0], 16)


class FileStore(LocalStoreOps):
    """Objects as files under ``root``, which is created if it is missing and its parent
    directory exists; a missing parent raises :class:`~objq_broker.errors.BucketNotFound`.

    >>> import tempfile
    >>> store = FileStore(tempfile.mkdtemp())
    >>> v1 = store.write("q/state.json", b"{}", if_absent=True)
    >>> store.write("q/state.json", b"{}", if_version=v1) != v1
    True
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self._root = Path(root).absolute()
        self._fsync = fsync
        #: Creates are written as unnamed files and linked in (until the file system refuses).
        self._link_creates = hasattr(os, "O_TMPFILE")
        self._locks = KeyLocks(self._root / LOCK_DIR)
        self._tmp = str(self._root / TMP_DIR)
        self._make_root()
        try:
            for folder in (TMP_DIR, LOCK_DIR):
                (self._root / folder).mkdir(exist_ok=True)
        except OSError as exc:
            raise self._translate(exc, "") from exc
        self._sweep_temp_files()

    def _sweep_temp_files(self) -> None:
        """Delete the temporary files of writes that never finished: a process killed
        between staging a write and renaming it into place leaves one behind. A write lasts
        milliseconds, so one older than :data:`STALE_TEMP_SECONDS` has no writer left."""
        cutoff = time.time() - STALE_TEMP_SECONDS
        try:
            with os.scandir(self._root / TMP_DIR) as entries:
                for entry in entries:
                    if entry.name.endswith(".tmp") and entry.stat().st_mtime < cutoff:
                        with contextlib.suppress(FileNotFoundError):  # another sweeper's
                            os.unlink(entry.path)
        except OSError as exc:  # never a reason to refuse the store
            log.warning("%s: could not sweep %s: %s", self.url, TMP_DIR, exc)

    def _make_root(self) -> None:
        """Create the root if it is missing, but not its parent.

        One level is what a new queue needs (``./objq-data``, ``/var/lib/objq``); a missing
        parent is far more often a mistyped path (``/var/lib/objqq/prod``) than a wish for a
        tree of new folders, and a store created there would look like an empty queue.
        """
        try:
            self._root.mkdir(exist_ok=True)
        except FileNotFoundError as exc:
            missing = self._root.parent  # name the outermost folder that is not there
            while missing.parent != missing and not missing.parent.exists():
                missing = missing.parent
            raise BucketNotFound(
                f"file store {str(self._root)!r}: expected an existing directory, or one to "
                f"create in an existing directory; found no directory {str(missing)!r} "
                "(create it first if the path is right)"
            ) from exc
        except FileExistsError as exc:  # mkdir(exist_ok=True) still refuses a file
            raise StorageError(
                f"file store {str(self._root)!r}: expected a directory, found a file"
            ) from exc
        except OSError as exc:
            raise self._translate(exc, "") from exc

    @property
    def url(self) -> str:
        return self._root.as_uri()

    @property
    def root(self) -> Path:
        return self._root

    def _where(self, key: str) -> str:
        return f"file store {str(self._root)!r}, key {key!r}"

    def _path(self, key: str) -> Path:
        self._key(key)
        return self._root / key

    def _translate(self, exc: OSError, key: str) -> StorageError:
        """The one place OS errors become objq storage errors."""
        where = self._where(key)
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return AccessDenied(f"{where}: permission denied ({exc.strerror})")
        if exc.errno == errno.ENOENT and not self._root.exists():
            return BucketNotFound(f"{where}: the root directory does not exist")
        if exc.errno in (errno.ENOTDIR, errno.EISDIR):
            return StorageError(
                f"{where}: a path component is a file where a folder is needed, or the "
                f"reverse ({exc.strerror})"
            )
        return StorageError(f"{where}: {exc.strerror or exc}")

    @contextlib.contextmanager
    def _errors(self, key: str) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            raise self._translate(exc, key) from exc

    def _locked(self, key: str, *, forget: bool = False) -> contextlib.AbstractContextManager[None]:
        """Hold the key's lock file (``forget``: the key is being deleted; see
        :meth:`KeyLocks.held`)."""
        return self._locks.held(key, forget=forget)

    def _current(self, path: Path) -> os.stat_result | None:
        try:
            return path.stat()
        except FileNotFoundError:
            return None

    def read(self, key: str) -> Blob | None:
        path = self._path(key)
        with self._errors(key):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                return None
            try:
                stat = os.fstat(fd)
                with os.fdopen(os.dup(fd), "rb") as handle:
                    data = handle.read()
            finally:
                os.close(fd)
        return Blob(data, _version_of(stat))

    def write(
        self, key: str, data: bytes, *, if_version: str | None = None, if_absent: bool = False
    ) -> str:
        path = self._path(key)
        self._write_mode(key, if_version, if_absent)
        with self._errors(key):
            if if_version is None:  # (an update's object is there: so is its folder)
                path.parent.mkdir(parents=True, exist_ok=True)
            if self._fsync or if_absent:
                # A write bound to lose is refused before its data is staged and fsynced; the
                # check that counts is repeated under the lock (or is the link of a create).
                # Without fsync, staging costs less than this look, made at every commit.
                self._check(path, if_version, if_absent, key)
            if if_absent and self._link_creates:
                version = self._create(path, data, key)
                if version is not None:
                    return version
            tmp, fd = self._stage(data)
            renamed = False
            try:
                with self._locked(key):
                    found = self._check(path, if_version, if_absent, key)
                    floor = 0 if found is None else _mtime_of(found) + 1
                    mtime = max(time.time_ns(), floor)
                    os.utime(fd, ns=(mtime, mtime))
                    # A rename keeps the file's inode and mtime: its version, read now.
                    version = _version_of(os.fstat(fd))
                    os.rename(tmp, path)
                    renamed = True
                    if self._fsync:
                        self._sync_dir(path.parent)
                    return version
            finally:
                os.close(fd)
                if not renamed:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)

    def _create(self, path: Path, data: bytes, key: str) -> str | None:
        """Create ``path`` holding ``data`` unless it exists, in one step: an unnamed file in
        the key's folder is written, fsynced and linked in under the key's name, and the link
        fails if the name is taken. None: this file system (or process) cannot, so the caller
        stages and renames instead."""
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            try:
                fd = os.open(".", os.O_WRONLY | os.O_TMPFILE, 0o666, dir_fd=folder)
            except OSError as exc:
                self._stop_linking(exc, exc.errno in _NO_UNNAMED_FILES)
                return None
            try:
                _write_all(fd, data)
                now = time.time_ns()  # the clock's full resolution, as a staged write's
                os.utime(fd, ns=(now, now))
                if self._fsync:
                    os.fsync(fd)
                try:
                    # Through /proc: linkat() follows that link to the unnamed file itself.
                    os.link(f"{_PROC_FDS}/{fd}", path.name, dst_dir_fd=folder)
                except FileExistsError:
                    self._check(path, None, True, key)  # raises, naming the version found
                    raise PreconditionFailed(
                        f"{self._where(key)}: create-only write found an existing object "
                        "(deleted since)"
                    ) from None
                except OSError as exc:
                    no_proc = exc.errno == errno.ENOENT and not os.path.isdir(_PROC_FDS)
                    self._stop_linking(exc, no_proc or exc.errno in _NO_LINKS)
                    return None
                if self._fsync:
                    os.fsync(folder)
                return _version_of(os.fstat(fd))
            finally:
                os.close(fd)
        finally:
            os.close(folder)

    def _stop_linking(self, exc: OSError, cannot: bool) -> None:
        """Creates go back to staging and renaming for good when this file system or process
        ``cannot`` link unnamed files in, as ``exc`` says; any other error is raised."""
        if not cannot:
            raise exc
        log.debug("%s: creates are staged and renamed: %s", self.url, exc)
        self._link_creates = False

    def _check(self, path: Path, if_version: str | None, if_absent: bool, key: str) -> str | None:
        """The current version of ``key`` (at ``path``), if the write's condition holds; else
        raise :class:`PreconditionFailed` saying what was found."""
        current = self._current(path)
        found = None if current is None else _version_of(current)
        if if_absent and found is not None:
            raise PreconditionFailed(
                f"{self._where(key)}: create-only write found an existing object (version {found})"
            )
        if if_version is not None and found != if_version:
            shown = "no object" if found is None else f"version {found}"
            raise PreconditionFailed(
                f"{self._where(key)}: expected version {if_version}, found {shown}"
            )
        return found

    def _stage(self, data: bytes) -> tuple[str, int]:
        """``data`` in a new temporary file: its path, and a descriptor open on it (the
        caller closes it)."""
        tmp = f"{self._tmp}/{_temp_names.next()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            _write_all(fd, data)
            if self._fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return tmp, fd

    @staticmethod
    def _sync_dir(folder: Path) -> None:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def delete(self, key: str) -> None:
        path = self._path(key)
        with (
            self._errors(key),
            self._locked(key, forget=True),
            contextlib.suppress(FileNotFoundError),  # deleting nothing is no error
        ):
            os.unlink(path)

    def list(self, prefix: str = "") -> list[str]:
        return [key for key, _ in self._walk(prefix)]

    def list_meta(self, prefix: str = "") -> Listing:
        found: Listing = []
        with self._errors(prefix):
            for key, path in self._walk(prefix):
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue  # deleted since the folder was read
                found.append(ObjectMeta(key, stat.st_size, stat.st_mtime_ns / 1e9))
        return found

    def _walk(self, prefix: str) -> _Paths:
        """(key, path) of every object whose key starts with ``prefix``, sorted by key."""
        self._prefix(prefix)
        # Walk only the folder the prefix names, not the whole tree.
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self._root / folder
        found: _Paths = []
        with self._errors(prefix):
            for dirpath, dirnames, filenames in os.walk(start):
                rel_dir = os.path.relpath(dirpath, self._root)
                if rel_dir == ".":
                    dirnames[:] = [d for d in dirnames if d not in (TMP_DIR, LOCK_DIR)]
                    rel_dir = ""
                for name in filenames:
                    key = f"{rel_dir}/{name}" if rel_dir else name
                    if key.startswith(prefix):
                        found.append((key, Path(dirpath, name)))
        return sorted(found)

    def sweep_locks(self, older_than: float = STALE_LOCK_SECONDS, *, dry_run: bool = False) -> int:
        """Delete the lock files of keys that no longer exist, made over ``older_than``
        seconds ago and not held now (releases before 2026-11-28 left one behind for every
        key they ever wrote); how many were deleted (``dry_run``: would be)."""
        with self._errors(""):
            existing = [key for key, _ in self._walk("")]
            return self._locks.sweep(existing, older_than, dry_run=dry_run)

    def watch_folder(self, folder: str, on_change: OnChange) -> Subscription | None:
        """Report each object written or deleted directly under ``folder`` by any process on
        this host, as it happens (see :mod:`~objq_broker.storage.notify`); None where the
        kernel cannot tell, or while the folder does not exist."""
        path = self._root / self._prefix(folder).strip("/")

        def changed(name: str | None) -> None:
            on_change(None if name is None else join_key(folder.strip("/"), name))

        return subscribe(path, changed)

    def version(self, key: str) -> str | None:
        """``key``'s version, from the file's status alone (see :meth:`watch_folder`)."""
        with self._errors(key):
            found = self._current(self._path(key))
        return None if found is None else _version_of(found)

    def close(self) -> None:
        """Nothing is held open between calls."""


class _TempNames:
    """Names for staged files, unique across the threads and processes of a host: a random
    prefix per process (drawn again in a forked child) and a counter. A write staged per
    commit need not ask the kernel for a random name each time."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._count = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}-{next(self._count)}"


_temp_names = _TempNames()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
