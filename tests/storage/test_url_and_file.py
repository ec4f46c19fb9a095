"""open_store's URL handling and the file adapter's own promises."""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
from pathlib import Path

import pytest

from objq_broker.errors import (
    BucketNotFound,
    ConfigurationError,
    InvalidKey,
    PreconditionFailed,
    StorageError,
)
from objq_broker.storage import MemoryStore, open_store
from objq_broker.storage.file import TMP_DIR, FileStore
from objq_broker.storage.locks import LOCK_DIR


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("nope", "expected SCHEME://"),
        ("ftp://host/x", "unknown scheme 'ftp'"),
        ("s3://", "expected a bucket name"),
        ("gs:///prefix", "expected a bucket name"),
        ("file://", "expected a directory"),
        ("memory://x?colour=red", "unknown option 'colour'"),
        ("s3://bucket/p?colour=red", "accepted: check_conditions, connect_timeout, endpoint_url"),
        ("s3://bucket/p?connect_timeout=soon", "connect_timeout': expected a finite number"),
        ("s3://bucket/p?read_timeout=0", "read_timeout': expected a finite number"),
        ("s3://bucket/p?connect_timeout=nan", "found 'nan'"),
        ("s3://bucket/p?region=", "expected a region name"),
        ("s3://bucket/p?max_attempts=0", "max_attempts': expected a whole number"),
        ("s3://bucket?endpoint_url=http://127.0.0.1:1/?x=1", "with no query or fragment"),
        ("s3://bucket?endpoint_url=ftp://127.0.0.1:1", r"expected http\(s\)://host"),
        ("s3://KEY:SECRET@bucket", "credentials do not go in a storage URL"),
        ("s3://bad$bucket", "expected a bucket name"),
        ("file:///", "found the file system's root"),
        ("file://user:pw@/x", "found a host part with ':' or '@'"),
        ("file:///tmp/x?fsync=maybe", "expected true/false"),
    ],
)
def test_bad_urls_are_refused_with_what_is_accepted(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        open_store(url)
    assert isinstance(info.value, ValueError)


def test_unknown_keyword_and_conflicting_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="unknown option 'region' for file://"):
        open_store(tmp_path.as_uri(), region="eu")
    with pytest.raises(ConfigurationError, match="both in the URL and as a keyword"):
        open_store(f"{tmp_path.as_uri()}?fsync=false", fsync=True)
    with pytest.raises(ConfigurationError, match="accepted: memory://, file://, s3://, gs://"):
        open_store("redis://localhost")


def test_memory_urls_share_a_store_by_name() -> None:
    first = open_store("memory://shared-name")
    assert isinstance(first, MemoryStore)
    assert open_store("memory://shared-name") is first
    assert open_store("memory://other-name") is not first


def test_relative_file_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    store = open_store("file://data/objq")
    store.put("k", b"v")
    assert (tmp_path / "data" / "objq" / "k").read_bytes() == b"v"


def test_file_store_creates_its_directory_only_in_an_existing_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One missing level is created: a new queue's directory
    FileStore(tmp_path / "new")
    assert (tmp_path / "new" / TMP_DIR).is_dir()

    # A missing parent is refused, naming the outermost folder that is not there
    with pytest.raises(BucketNotFound) as refused:
        FileStore(tmp_path / "typo" / "deeper" / "objq")
    assert str(refused.value) == (
        f"file store '{tmp_path / 'typo' / 'deeper' / 'objq'}': expected an existing directory, "
        f"or one to create in an existing directory; found no directory '{tmp_path / 'typo'}' "
        "(create it first if the path is right)"
    )
    assert not (tmp_path / "typo").exists()

    # A relative URL is resolved first, so the message names the absolute path
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BucketNotFound, match=re.escape(f"no directory '{tmp_path / 'data'}'")):
        open_store("file://data/objq")


def test_file_store_root_that_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StorageError, match="expected a directory, found a file"):
        FileStore(tmp_path / "file")
    with pytest.raises(StorageError, match="Not a directory"):
        FileStore(tmp_path / "file" / "objq")


def test_file_keys_stay_inside_the_root(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "root")
    for key in ("../outside", "a/../../outside", "/tmp/outside", f"{LOCK_DIR}/x", "a\x00"):
        with pytest.raises(InvalidKey):
            store.put(key, b"x")
    assert not (tmp_path / "outside").exists()


def test_file_store_leaves_no_temp_files_and_lists_no_internals(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    version = store.write("q/state", b"1", if_absent=True)
    with pytest.raises(PreconditionFailed):
        store.write("q/state", b"2", if_absent=True)
    store.write("q/state", b"3", if_version=version)
    assert os.listdir(tmp_path / TMP_DIR) == []
    assert store.list() == ["q/state"]
    assert (tmp_path / TMP_DIR).is_dir()


def test_file_versions_never_repeat_even_in_one_clock_tick(tmp_path: Path) -> None:
    store = FileStore(tmp_path, fsync=False)
    versions = {store.write("k", b"same") for _ in range(200)}
    assert len(versions) == 200


def test_file_version_changes_when_inode_is_reused(tmp_path: Path) -> None:
    store = FileStore(tmp_path, fsync=False)
    seen = set()
    for _ in range(50):
        version = store.write("k", b"x")
        assert version not in seen
        seen.add(version)
        store.delete("k")


def test_file_write_where_a_folder_is_gives_a_clear_error(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.put("a/b", b"x")
    with pytest.raises(Exception, match="key 'a'") as info:
        store.put("a", b"y")
    assert "folder" in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "s3://KEY:SECRET@bucket",
        "s3://bucket?endpoint_url=http://user:SECRET@127.0.0.1:1&colour=red",
        "s3://bucket?endpoint_url=http://user:SECRET@127.0.0.1:1/?x=1",
        "s3://bucket?endpoint_url=http://user:SECRET@127.0.0.1:99999",
        "file://user:SECRET@/x",
        "gs://bucket?endpoint_url=http://user:SECRET@127.0.0.1:1&read_timeout=0",
    ],
)
def test_a_refused_url_is_never_repeated_with_its_secret(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        open_store(url)
    assert "SECRET" not in str(info.value)


def test_a_deleted_key_leaves_no_lock_file_behind(tmp_path: Path) -> None:
    """Every write that may replace an object takes its key's lock file (a create links its
    file in and takes none); the delete of the key removes it, so objects deleted by expiry or
    collection leave nothing to pile up."""
    store = FileStore(tmp_path)
    for n in range(50):
        store.write(f"results/{n}", b"x", if_absent=True)
        store.put(f"archive/{n}", b"y")
    locks = tmp_path / LOCK_DIR
    assert len(list(locks.iterdir())) == 50
    for n in range(50):
        store.delete(f"results/{n}")
        store.delete(f"archive/{n}")
    store.delete("never-written")  # a delete of nothing leaves nothing either
    assert list(locks.iterdir()) == []
    store.write("results/0", b"again", if_absent=True)  # and the key can be made again
    assert store.get("results/0") == b"again"


def test_a_writer_that_waited_on_a_deleted_lock_file_takes_the_new_one(tmp_path: Path) -> None:
    """A writer blocked on a key's lock file while a delete removes it must not then hold a
    lock nobody else sees: it takes the key's new lock file, after whoever holds that."""
    store = FileStore(tmp_path)
    store.put("k", b"0")
    inside: list[tuple[str, float, float]] = []
    deleting = threading.Event()

    def hold(name: str, seconds: float, forget: bool = False) -> None:
        with store._locked("k", forget=forget):
            entered = time.monotonic()
            if forget:
                deleting.set()
            time.sleep(seconds)
            inside.append((name, entered, time.monotonic()))

    deleter = threading.Thread(target=hold, args=("delete", 0.3, True))
    deleter.start()
    assert deleting.wait(10)
    waiter = threading.Thread(target=hold, args=("waited", 0.3))
    waiter.start()  # opens the lock file the delete is about to remove, and blocks on it
    time.sleep(0.1)
    deleter.join()
    newcomer = threading.Thread(target=hold, args=("newcomer", 0.3))
    newcomer.start()  # finds the lock file gone, or the waiter's new one
    waiter.join()
    newcomer.join()
    spans = sorted(inside, key=lambda span: span[1])
    for (first, _, left), (second, entered, _) in itertools.pairwise(spans):
        assert entered >= left, f"{first} and {second} held the key's lock at once"
