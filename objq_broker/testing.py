"""The storage contract, as tests anyone can run against their own store or adapter.

objq needs one thing of a store: the :class:`~objq_broker.storage.ObjectStore` protocol
(``docs/storage-adapters.md``), with conditional writes that really are conditional. This
module is the contract objq's own suite runs against memory, file, S3 (moto, SeaweedFS) and
GCS (fake-gcs-server); point it at yours.

From code, a report::

    >>> from objq_broker.testing import check_store
    >>> report = check_store("memory://contract-doc")
    >>> report.passed
    True

From pytest, one test per case (``url=`` adds the cases that open a second handle by URL)::

    import pytest
    from objq_broker.testing import ContractCase, contract_cases

    @pytest.mark.parametrize("case", contract_cases(with_url=False), ids=str)
    def test_my_store(case: ContractCase) -> None:
        case.run(MyStore(...))  # raises ContractViolation (an AssertionError) on a breach

Every case works inside its own scratch folder (``objq-contract-<random id>/``) of the store
and deletes what it wrote, so a store that already holds a namespace can be checked; the
forbidden-key case sends nothing (a key is refused before any request). On a ``file://`` store
the scratch folder's empty directories stay behind.

The first cases prove that conditions are enforced: a store that silently ignores them fails,
never passes.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from objq_broker.errors import (
    ConfigurationError,
    InvalidKey,
    ObjectNotFound,
    ObjqError,
    PreconditionFailed,
)
from objq_broker.storage.base import Blob, Listing, ObjectStore
from objq_broker.storage.probe import probe_increments
from objq_broker.storage.url import open_store

#: Writers racing from one version in the racing cases.
RACERS = 8
#: Keys every adapter must refuse, before any request.
FORBIDDEN_KEYS = ("", "../escape", "a/../../b", "/etc/passwd", "a\x00b", "a//b", "a/./b", "a\\b")
#: The scratch folders' names start with this.
SCRATCH_FOLDER = "objq-contract-"
#: Seconds a listed modification time may differ from this host's clock (S3 keeps whole
#: seconds).
CLOCK_SLACK_SECONDS = 1.5


class ContractViolation(AssertionError):
    """A store broke the storage contract; the message says what was expected and found."""


def expect(condition: bool, message: str) -> None:
    """:class:`ContractViolation` with ``message`` unless ``condition`` holds (not ``assert``,
    which ``python -O`` removes)."""
    if not condition:
        raise ContractViolation(message)


@contextmanager
def refused(error: type[Exception], what: str) -> Iterator[None]:
    """The block must raise ``error``; :class:`ContractViolation` saying ``what`` if not."""
    try:
        yield
    except error:
        return
    except Exception as exc:
        raise ContractViolation(
            f"{what}: expected {error.__name__}, found {type(exc).__name__}: {exc}"
        ) from exc
    raise ContractViolation(f"{what}: expected {error.__name__}, found the call accepted")


class Scratch:
    """``store`` seen through a folder of its own: keys and listings are relative to it."""

    def __init__(self, store: ObjectStore, folder: str) -> None:
        self.inner = store
        self.folder = folder.rstrip("/") + "/"

    @property
    def url(self) -> str:
        return self.inner.url

    def _key(self, key: str) -> str:
        # The adapter judges the key as given: a scratch folder must not make a bad key good.
        return self.folder + key if key else key

    def read(self, key: str) -> Blob | None:
        return self.inner.read(self._key(key))

    def write(
        self, key: str, data: bytes, *, if_version: str | None = None, if_absent: bool = False
    ) -> str:
        return self.inner.write(self._key(key), data, if_version=if_version, if_absent=if_absent)

    def put(self, key: str, data: bytes) -> str:
        return self.inner.put(self._key(key), data)

    def get(self, key: str) -> bytes:
        return self.inner.get(self._key(key))

    def delete(self, key: str) -> None:
        self.inner.delete(self._key(key))

    def list(self, prefix: str = "") -> list[str]:
        return [key.removeprefix(self.folder) for key in self.inner.list(self.folder + prefix)]

    def list_meta(self, prefix: str = "") -> Listing:
        listed = self.inner.list_meta(self.folder + prefix)
        return [
            type(meta)(meta.key.removeprefix(self.folder), meta.size, meta.modified)
            for meta in listed
        ]

    def close(self) -> None:
        """The inner store belongs to the caller."""

    def clear(self) -> None:
        for key in self.inner.list(self.folder):
            self.inner.delete(key)


@dataclass(frozen=True)
class ContractCase:
    """One rule of the contract. ``run(store)`` raises :class:`ContractViolation` when the
    store breaks it; a case that ``needs_url`` also opens the store again from ``url``."""

    name: str
    check: Callable[[Scratch, str | None], None]
    needs_url: bool = False

    def __str__(self) -> str:
        return self.name

    def run(self, store: ObjectStore, *, url: str | None = None) -> None:
        if self.needs_url and url is None:
            raise ConfigurationError(
                f"contract case {self.name!r}: expected a store URL, found none"
            )
        scratch = Scratch(store, f"{SCRATCH_FOLDER}{uuid.uuid4().hex}")
        try:
            self.check(scratch, url)
        finally:
            scratch.clear()


@dataclass(frozen=True)
class CaseResult:
    name: str
    outcome: Literal["passed", "failed", "skipped"]
    detail: str = ""


@dataclass(frozen=True)
class ContractReport:
    """What :func:`check_store` found: one result per case."""

    url: str
    results: tuple[CaseResult, ...]

    @property
    def passed(self) -> bool:
        return all(result.outcome != "failed" for result in self.results)

    @property
    def failed(self) -> tuple[CaseResult, ...]:
        return tuple(result for result in self.results if result.outcome == "failed")


# --- the cases, in order: conditions first ----------------------------------------------------


def stale_version_write_fails(store: Scratch, url: str | None) -> None:
    v1 = store.write("cas.json", b"one", if_absent=True)
    v2 = store.write("cas.json", b"two", if_version=v1)
    expect(v2 != v1, f"expected a new version after an update, found {v1!r} again")
    with refused(PreconditionFailed, f"a write conditioned on the replaced version {v1!r}"):
        store.write("cas.json", b"three", if_version=v1)
    found = store.read("cas.json")
    expect(found == Blob(b"two", v2), f"expected b'two' at {v2!r} to stay, found {found!r}")


def create_over_existing_fails(store: Scratch, url: str | None) -> None:
    store.write("cas.json", b"first", if_absent=True)
    with refused(PreconditionFailed, "a create-only write over an existing object"):
        store.write("cas.json", b"second", if_absent=True)
    found = store.read("cas.json")
    expect(found is not None and found.data == b"first", f"expected b'first', found {found!r}")


def if_version_on_missing_object_fails(store: Scratch, url: str | None) -> None:
    version = store.write("other.json", b"x")
    with refused(PreconditionFailed, "a write conditioned on a version of a missing object"):
        store.write("cas.json", b"x", if_version=version)
    expect(store.read("cas.json") is None, "expected the missing object to stay missing")


def _race(count: int, attempt: Callable[[int], None]) -> list[int]:
    """Run ``attempt(n)`` on ``count`` threads released together; the ``n`` that won."""
    barrier = threading.Barrier(count, timeout=60)
    wins: list[int] = []
    failures: list[BaseException] = []

    def run(n: int) -> None:
        barrier.wait()
        try:
            attempt(n)
            wins.append(n)
        except PreconditionFailed:
            pass
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    if failures:
        raise failures[0]
    return wins


def exactly_one_of_racing_writers_wins(store: Scratch, url: str | None) -> None:
    base = store.write("counter", b"0", if_absent=True)
    for round_no in range(3):

        def write(n: int, version: str = base, r: int = round_no) -> None:
            store.write("counter", f"{r}:{n}".encode(), if_version=version)

        wins = _race(RACERS, write)
        expect(len(wins) == 1, f"round {round_no}: expected 1 winner of {RACERS}, found {wins}")
        blob = store.read("counter")
        expected = f"{round_no}:{wins[0]}".encode()
        expect(blob is not None and blob.data == expected, f"expected {expected!r}, found {blob!r}")
        assert blob is not None
        base = blob.version


def racing_creates_have_one_winner(store: Scratch, url: str | None) -> None:
    def create(n: int) -> None:
        store.write("lock", str(n).encode(), if_absent=True)

    wins = _race(RACERS, create)
    expect(len(wins) == 1, f"expected 1 of {RACERS} racing creates to win, found {wins}")
    found = store.get("lock")
    expect(found == str(wins[0]).encode(), f"expected the winner's bytes, found {found!r}")


def concurrent_increments_lose_nothing(store: Scratch, url: str | None) -> None:
    report = probe_increments(store)
    for check in report.failed:
        raise ContractViolation(f"{check.name}: {check.detail}")


def read_returns_data_with_the_written_version(store: Scratch, url: str | None) -> None:
    expect(store.read("missing.json") is None, "expected None for a missing object")
    version = store.write("q/cas.json", b'{"a": 1}')
    blob = store.read("q/cas.json")
    found = None if blob is None else (blob.data, blob.version)
    expect(found == (b'{"a": 1}', version), f"expected the bytes at {version!r}, found {found!r}")


def version_never_repeats_for_new_content(store: Scratch, url: str | None) -> None:
    v1 = store.write("k", b"A")
    store.write("k", b"B")
    v3 = store.write("k", b"A")
    if v3 == v1:
        # Allowed: an S3 ETag is the content's MD5, so the same bytes give the same version
        # (objq's state carries a counter, so its bytes never repeat).
        return
    with refused(PreconditionFailed, f"a write conditioned on the old version {v1!r}"):
        store.write("k", b"C", if_version=v1)


def large_object_round_trip(store: Scratch, url: str | None) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB
    version = store.write("big.bin", data, if_absent=True)
    blob = store.read("big.bin")
    expect(
        blob is not None and blob.data == data and blob.version == version,
        f"expected 1 MiB back at version {version!r}, found {blob!r}",
    )
    with refused(PreconditionFailed, "a write conditioned on a version never written"):
        store.write("big.bin", data[:10], if_version="1" if version != "1" else "2")


def plain_put_get_delete_list(store: Scratch, url: str | None) -> None:
    keys = ("archive/2026/01/a.jsonl", "archive/2026/02/b.jsonl", "other/c", "arch")
    for key in keys:
        store.put(key, key.encode())
    expect(store.get("other/c") == b"other/c", "expected get to return what put stored")
    archive = ["archive/2026/01/a.jsonl", "archive/2026/02/b.jsonl"]
    for prefix, expected in (
        ("archive/", archive),
        ("arch", ["arch", *archive]),
        ("archive/2026/02", ["archive/2026/02/b.jsonl"]),
        ("", sorted(keys)),
    ):
        found = store.list(prefix)
        expect(found == expected, f"list({prefix!r}): expected {expected}, found {found}")
    store.delete("other/c")
    store.delete("other/c")  # deleting a missing object is not an error
    expect(store.read("other/c") is None, "expected a deleted object to read as None")
    with refused(ObjectNotFound, "get of a deleted object"):
        store.get("other/c")
    expect(store.list("nothing/") == [], "expected an empty listing for an unused prefix")


def listing_with_sizes_and_modification_times(store: Scratch, url: str | None) -> None:
    before = time.time()
    store.put("bodies/a.json", b"x" * 300)
    store.write("bodies/b.json", b"", if_absent=True)
    store.put("bodiesx", b"12")
    after = time.time()
    listed = store.list_meta("bodies/")
    sizes = [(meta.key, meta.size) for meta in listed]
    expected = [("bodies/a.json", 300), ("bodies/b.json", 0)]
    expect(sizes == expected, f"list_meta: expected {expected}, found {sizes}")
    for meta in listed:
        expect(
            before - CLOCK_SLACK_SECONDS <= meta.modified <= after + CLOCK_SLACK_SECONDS,
            f"expected {meta.key!r} modified between {before} and {after}, found {meta.modified}",
        )
    expect(
        [meta.key for meta in store.list_meta()] == store.list(),
        "expected list_meta() and list() to name the same keys",
    )
    time.sleep(1.1)  # whole seconds on S3: a rewrite must show a later time
    store.put("bodies/a.json", b"y")
    rewritten = [meta for meta in store.list_meta("bodies/a") if meta.key == "bodies/a.json"]
    expect(
        len(rewritten) == 1
        and rewritten[0].size == 1
        and rewritten[0].modified > listed[0].modified,
        f"expected the rewrite to show size 1 and a later time, found {rewritten}",
    )
    store.delete("bodies/b.json")
    keys = [meta.key for meta in store.list_meta("bodies/")]
    expect(keys == ["bodies/a.json"], f"expected only bodies/a.json after a delete, found {keys}")


def forbidden_keys_are_refused(store: Scratch, url: str | None) -> None:
    for key in FORBIDDEN_KEYS:
        with refused(InvalidKey, f"write of the key {key!r}"):
            store.inner.write(key, b"x")
        with refused(InvalidKey, f"read of the key {key!r}"):
            store.inner.read(key)


def over_determined_write_mode_is_refused(store: Scratch, url: str | None) -> None:
    version = store.write("k", b"x")
    with refused(ConfigurationError, "a write with both if_version and if_absent"):
        store.write("k", b"y", if_version=version, if_absent=True)
    expect(store.get("k") == b"x", "expected a refused write to change nothing")


def errors_name_the_store_and_key(store: Scratch, url: str | None) -> None:
    store.write("named/key", b"x", if_absent=True)
    try:
        store.write("named/key", b"y", if_absent=True)
    except PreconditionFailed as exc:
        message = str(exc)
    else:
        raise ContractViolation("a create-only write over an existing object: accepted")
    scheme = store.url.split("://", 1)[0].lower()
    expect("named/key" in message, f"expected the error to name the key, found {message!r}")
    expect(scheme in message.lower(), f"expected the error to name {scheme}, found {message!r}")


def two_handles_on_one_url_share_objects(store: Scratch, url: str | None) -> None:
    assert url is not None
    first, second = Scratch(open_store(url), store.folder), Scratch(open_store(url), store.folder)
    try:
        version = first.write("shared", b"1", if_absent=True)
        blob = second.read("shared")
        expect(
            blob is not None and blob.version == version, f"expected {version!r}, found {blob!r}"
        )
        second.write("shared", b"2", if_version=version)
        with refused(PreconditionFailed, "a stale write through the other handle"):
            first.write("shared", b"3", if_version=version)
    finally:
        first.inner.close()
        second.inner.close()


def url_round_trips(store: Scratch, url: str | None) -> None:
    reopened = open_store(store.url)
    try:
        store.write("x", b"1")
        found = Scratch(reopened, store.folder).get("x")
        expect(found == b"1", f"expected {store.url} to open the same store, found {found!r}")
    finally:
        reopened.close()


#: Every case, in order: a store that ignores conditions fails the first ones.
CONTRACT: tuple[ContractCase, ...] = (
    *(
        ContractCase(check.__name__, check)
        for check in (
            stale_version_write_fails,
            create_over_existing_fails,
            if_version_on_missing_object_fails,
            exactly_one_of_racing_writers_wins,
            racing_creates_have_one_winner,
            concurrent_increments_lose_nothing,
            read_returns_data_with_the_written_version,
            version_never_repeats_for_new_content,
            large_object_round_trip,
            plain_put_get_delete_list,
            listing_with_sizes_and_modification_times,
            forbidden_keys_are_refused,
            over_determined_write_mode_is_refused,
            errors_name_the_store_and_key,
        )
    ),
    ContractCase(
        "two_handles_on_one_url_share_objects", two_handles_on_one_url_share_objects, True
    ),
    ContractCase("url_round_trips", url_round_trips, True),
)


def contract_cases(*, with_url: bool = True) -> list[ContractCase]:
    """The cases to run: all of them, or (``with_url=False``, for a store that no URL opens)
    those that need no second handle opened by URL."""
    return [case for case in CONTRACT if with_url or not case.needs_url]


def check_store(target: ObjectStore | str) -> ContractReport:
    """Run every case against ``target`` (a store, or a URL ``open_store`` takes) and report.
    A store given as an object skips the cases that open it again by URL."""
    url = target if isinstance(target, str) else None
    store = open_store(target) if isinstance(target, str) else target
    results: list[CaseResult] = []
    try:
        for case in CONTRACT:
            if case.needs_url and url is None:
                results.append(CaseResult(case.name, "skipped", "needs the store's URL"))
                continue
            try:
                case.run(store, url=url)
            except (ContractViolation, ObjqError) as exc:
                results.append(CaseResult(case.name, "failed", f"{type(exc).__name__}: {exc}"))
            else:
                results.append(CaseResult(case.name, "passed"))
    finally:
        if url is not None:
            store.close()
    return ContractReport(store.url, tuple(results))
