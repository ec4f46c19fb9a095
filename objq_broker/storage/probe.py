"""Whether a store really compares and sets: a probe of its conditional writes.

objq's whole safety rests on one promise of the store: a write conditioned on a version (or on
the object's absence) fails when the condition does not hold. Some S3-compatible stores accept
``If-Match`` and ``If-None-Match`` and ignore them, answering 200: on such a store two writers
racing from one state both "win", the later silently overwrites the earlier, and the jobs of
one commit vanish without an error anywhere. So a store is probed before it is trusted:

* :func:`probe_conditions`, the cheap part: on one scratch object, a create-over-existing
  and a stale-version write must both fail, and an update from the current version must land.
  Five requests (four writes and a delete).
* :func:`probe_increments`: writers racing in rounds from one version, each round of which
  exactly one must win, and the counter they increment must lose nothing. A few dozen
  requests; ``objq check-store`` runs it (:func:`probe_store` runs both parts).
* :func:`require_conditions`: what a namespace's first commit runs (when its state object is
  about to be created): the cheap part, once per store object (each ``Queue`` meters its
  store through a wrapper of its own: once per queue and namespace), refusing a store that
  fails it with :class:`~objq_broker.errors.UnsafeStore`, which names the store and the check.

The probe writes only its own scratch objects, named :data:`SCRATCH_PREFIX` plus a random id,
beside the namespace's state (so a policy that allows the namespace's prefix allows them), and
deletes them when it is done. A process killed mid-probe leaves one small object behind.

Skipping the check (``check_conditions=false`` in the store URL or ``open_store``, or
:func:`skip_condition_check` for a store built in code) is **dangerous**: it is for a store
already checked with ``objq check-store``, where the five requests matter.

>>> from objq_broker.storage.memory import MemoryStore
>>> probe_conditions(MemoryStore("probe-doc")).passed
True
"""

from __future__ import annotations

import contextlib
import threading
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from objq_broker.errors import PreconditionFailed, StorageError, UnsafeStore
from objq_broker.storage.base import ObjectStore, join_key

#: The scratch objects' names start with this (then a random id), beside the state.
SCRATCH_PREFIX = "store-check-"
#: The checks, by name: what each proves.
CREATE_ONLY = "create-only write"
CREATE_OVER_EXISTING = "create over an existing object"
UPDATE_FROM_CURRENT = "update from the current version"
STALE_VERSION = "stale-version write"
CONCURRENT_INCREMENTS = "concurrent increments"
#: Writers and rounds of :func:`probe_increments` by default: 4 x 5 racing writes.
DEFAULT_WRITERS = 4
DEFAULT_ROUNDS = 5
#: Seconds a racing writer waits for the others at a round's start before the probe gives up.
_ROUND_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class Check:
    """One check of a probe: its name, whether the store passed it, and what was seen."""

    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class ProbeReport:
    """What a probe found on the store at ``url``, and how many requests it cost."""

    url: str
    checks: tuple[Check, ...]
    requests: int

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(check for check in self.checks if not check.passed)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values (``objq check-store --json``)."""
        return {
            "url": self.url,
            "passed": self.passed,
            "requests": self.requests,
            "checks": [
                {"name": c.name, "passed": c.passed, "detail": c.detail} for c in self.checks
            ],
        }


class _Counted:
    """Counts the requests a probe sends, so its report says what it cost."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.requests = 0
        self._lock = threading.Lock()

    def count(self) -> None:
        with self._lock:
            self.requests += 1

    def write(self, key: str, data: bytes, **condition: Any) -> str:
        self.count()
        return self.store.write(key, data, **condition)

    def read_version(self, key: str) -> tuple[bytes, str] | None:
        self.count()
        blob = self.store.read(key)
        return None if blob is None else (blob.data, blob.version)

    def delete_quietly(self, key: str) -> None:
        """Delete a scratch object; a failure leaves it behind rather than hide the result."""
        self.count()
        with contextlib.suppress(StorageError):
            self.store.delete(key)


def scratch_key(folder: str = "") -> str:
    """A fresh scratch object's key in ``folder`` ('' for the store's top)."""
    return join_key(folder, f"{SCRATCH_PREFIX}{uuid.uuid4().hex}")


def probe_conditions(store: ObjectStore, folder: str = "") -> ProbeReport:
    """The cheap part of the probe, on one scratch object in ``folder``: five requests. Storage
    errors (unreachable, access denied) propagate: they say nothing about the conditions."""
    counted = _Counted(store)
    key = scratch_key(folder)
    nonce = uuid.uuid4().hex.encode()
    try:
        checks = _conditions(counted, key, nonce)
    finally:
        counted.delete_quietly(key)
    return ProbeReport(store.url, tuple(checks), counted.requests)


def _conditions(counted: _Counted, key: str, nonce: bytes) -> list[Check]:
    # Every write's bytes differ: an S3 ETag is the content's MD5, and a version that
    # repeated would make a stale version current again.
    try:
        first = counted.write(key, b"1 " + nonce, if_absent=True)
    except PreconditionFailed as exc:
        return [
            Check(CREATE_ONLY, False, f"expected a create of a new object to land, found {exc}")
        ]
    checks = [Check(CREATE_ONLY, True, f"created {key!r} at version {first}")]
    current = first
    try:
        current = counted.write(key, b"2 " + nonce, if_absent=True)
        checks.append(
            Check(
                CREATE_OVER_EXISTING,
                False,
                "expected PreconditionFailed (If-None-Match: * on an existing object), found "
                f"the write accepted at version {current}",
            )
        )
    except PreconditionFailed:
        checks.append(Check(CREATE_OVER_EXISTING, True, "refused"))
    try:
        latest = counted.write(key, b"3 " + nonce, if_version=current)
    except PreconditionFailed as exc:
        checks.append(
            Check(
                UPDATE_FROM_CURRENT,
                False,
                f"expected a write conditioned on the current version {current} to land, "
                f"found {exc}",
            )
        )
        return checks
    checks.append(Check(UPDATE_FROM_CURRENT, True, f"landed at version {latest}"))
    try:
        stale = counted.write(key, b"4 " + nonce, if_version=first)
        checks.append(
            Check(
                STALE_VERSION,
                False,
                f"expected PreconditionFailed (If-Match on version {first}, replaced by "
                f"{latest}), found the write accepted at version {stale}",
            )
        )
    except PreconditionFailed:
        checks.append(Check(STALE_VERSION, True, "refused"))
    return checks


def probe_increments(
    store: ObjectStore,
    folder: str = "",
    *,
    writers: int = DEFAULT_WRITERS,
    rounds: int = DEFAULT_ROUNDS,
) -> ProbeReport:
    """Racing writers: in each round all ``writers`` read the counter, then all write its
    next value conditioned on the version they read. Exactly one must win each round, and the
    counter must end at the number of writes that were told they landed (none lost)."""
    if writers < 2 or rounds < 1:
        raise ValueError(f"expected writers >= 2 and rounds >= 1, found {writers} and {rounds}")
    counted = _Counted(store)
    key = scratch_key(folder)
    try:
        counted.write(key, b"0", if_absent=True)
        wins_per_round = _race(counted, key, writers, rounds)
        final = counted.read_version(key)
    finally:
        counted.delete_quietly(key)
    landed = sum(wins_per_round)
    value = -1 if final is None else int(final[0].split()[0])
    passed = value == landed == rounds and all(wins == 1 for wins in wins_per_round)
    detail = (
        f"expected exactly 1 winner in each of {rounds} rounds of {writers} writers and a "
        f"counter of {rounds}, found winners {wins_per_round} and a counter of {value}"
    )
    if value < landed:
        detail += f": {landed - value} acknowledged writes were lost"
    check = Check(CONCURRENT_INCREMENTS, passed, "nothing lost" if passed else detail)
    return ProbeReport(store.url, (check,), counted.requests)


def _race(counted: _Counted, key: str, writers: int, rounds: int) -> list[int]:
    barrier = threading.Barrier(writers, timeout=_ROUND_TIMEOUT_SECONDS)
    wins = [0] * rounds
    errors: list[BaseException] = []
    lock = threading.Lock()

    def writer(n: int) -> None:
        try:
            for round_no in range(rounds):
                barrier.wait()  # everyone has finished the previous round
                seen = counted.read_version(key)
                barrier.wait()  # everyone has read: now all write from what they saw
                if seen is None:
                    raise StorageError(f"{counted.store.url}: scratch object {key!r} vanished")
                value = int(seen[0].split()[0]) + 1
                try:
                    counted.write(key, f"{value} {n}".encode(), if_version=seen[1])
                except PreconditionFailed:
                    continue
                with lock:
                    wins[round_no] += 1
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=writer, args=(n,), daemon=True) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    real = [exc for exc in errors if not isinstance(exc, threading.BrokenBarrierError)]
    if errors:  # a real error first: the others only saw the barrier broken by it
        raise (real or errors)[0]
    return wins


def probe_store(
    store: ObjectStore,
    folder: str = "",
    *,
    writers: int = DEFAULT_WRITERS,
    rounds: int = DEFAULT_ROUNDS,
) -> ProbeReport:
    """The whole probe (``objq check-store``): :func:`probe_conditions`, then, if it passed,
    :func:`probe_increments` (a store that ignores conditions would only lose more)."""
    cheap = probe_conditions(store, folder)
    if not cheap.passed:
        return cheap
    race = probe_increments(store, folder, writers=writers, rounds=rounds)
    return ProbeReport(store.url, cheap.checks + race.checks, cheap.requests + race.requests)


# --- the first use of a namespace --------------------------------------------------------------

#: Stores that passed the cheap probe in this process, and stores whose check was turned off.
_verified: weakref.WeakSet[Any] = weakref.WeakSet()
_unchecked: weakref.WeakSet[Any] = weakref.WeakSet()
_registry_lock = threading.Lock()
#: Wrappers looked through for a store whose check was turned off.
_MAX_WRAPPERS = 8


def skip_condition_check(store: ObjectStore) -> None:
    """Never probe ``store`` before creating a namespace's state on it. **Dangerous**: on a
    store that ignores conditional writes, jobs are lost without an error; check it with
    ``objq check-store`` first. (A URL says the same with ``check_conditions=false``.)"""
    _remember(_unchecked, store)


def _remember(registry: weakref.WeakSet[Any], store: ObjectStore) -> None:
    # A store class with __slots__ and no __weakref__ cannot be held: it is never cached.
    with _registry_lock, contextlib.suppress(TypeError):
        registry.add(store)


def _known(registry: weakref.WeakSet[Any], store: object) -> bool:
    with _registry_lock:
        try:
            return store in registry
        except TypeError:
            return False


def _unchecked_store(store: ObjectStore) -> bool:
    """Whether the check is off for ``store`` or a store it wraps: a wrapper (the meter every
    ``Queue`` puts around its store, a fault injector) holds its store as ``inner``."""
    seen: object = store
    for _ in range(_MAX_WRAPPERS):
        if _known(_unchecked, seen):
            return True
        seen = getattr(seen, "inner", None)
        if seen is None:
            return False
    return False


def require_conditions(
    store: ObjectStore,
    state_key: str,
    probe: Callable[[ObjectStore, str], ProbeReport] = probe_conditions,
) -> None:
    """Before a namespace's state is first created on ``store``: the cheap probe, once per
    store object, beside ``state_key``. Raises :class:`UnsafeStore` naming the store and the
    failed checks; storage errors propagate (the commit retries them)."""
    # Verified is kept for the very object probed: a wrapper around a verified store may
    # change what its writes send (as the fault injector can).
    if _unchecked_store(store) or _known(_verified, store):
        return
    report = probe(store, state_key.rpartition("/")[0])
    if not report.passed:
        failed = "; ".join(f"{check.name}: {check.detail}" for check in report.failed)
        raise UnsafeStore(
            f"store {store.url}: refused before creating the namespace's state "
            f"{state_key!r}: expected a store that enforces conditional writes, found one "
            f"that does not ({failed}). On it, racing writers overwrite each other and jobs "
            "are lost without an error. Run `objq check-store URL` for the whole check; "
            "check_conditions=false turns this check off (dangerous)"
        )
    _remember(_verified, store)
