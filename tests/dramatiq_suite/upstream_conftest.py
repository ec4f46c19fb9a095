"""``tests/conftest.py`` for Dramatiq's own test suite, with ``stub_broker`` an ObjqBroker and
``result_backend`` / ``rate_limiter_backend`` objq's result and rate-limiter backends.

Copied into the unpacked suite by ``dramatiq_upstream.py``; edit it here. The fixtures must live
in the suite's own conftest: a plugin's fixture loses to a closer one.

``--objq-backend memory|file`` (repeatable; default both) picks the storage; every test that
uses ``stub_broker``, ``result_backend`` or ``rate_limiter_backend`` runs once per backend, on
a fresh store (the broker and the backends share it, as an application would). ``DESELECT``
lists the tests that cannot run on any broker but StubBroker (or need a server), each with its
reason.
With ``$OBJQ_SUITE_REPORT`` set, a JSON summary of the run is written there.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.middleware import TimeLimit, default_middleware

from objq_broker.dramatiq import ObjqBroker, ObjqRateLimiterBackend, ObjqResultBackend

BACKENDS = ("memory", "file")
#: Long enough that no test's message is redelivered while its worker lives (the heartbeat
#: keeps leases anyway); a lease that ran out would show up as a duplicate run.
LEASE_SECONDS = 30.0
#: TimeLimit's monitor looks at deadlines every ``interval`` ms, 1,000 by default. The suite's
#: time-limit tests give a limit of 1 s to an actor that sleeps 2 s, so with the default the
#: monitor has exactly one look inside that window; a look that a busy machine delays by a
#: few milliseconds lands after the actor returned and the test sees no TimeLimitExceeded.
#: A tenth of that interval leaves ten looks in the window.
TIME_LIMIT_INTERVAL_MS = 100
REPORT_ENV = "OBJQ_SUITE_REPORT"

#: module::test -> why it cannot run on ObjqBroker. Only StubBroker internals and servers
#: belong here; a broker-generic test that fails on ObjqBroker is a failure to fix, not a skip.
DRAMATIQ_MAJOR = int(dramatiq.__version__.split(".")[0])
#: Dramatiq 2's StubBroker.join re-raises dead-lettered failures by default; 1.x's does not.
FAIL_FAST_DEFAULT = DRAMATIQ_MAJOR >= 2

DESELECT: dict[str, str] = {
    "test_actors.py::test_actors_can_be_sent_messages": (
        "reads the raw message back with StubBroker.queues[q].get()"
    ),
    "test_actors.py::test_worker_handles_non_numeric_eta_and_logs_warning": (
        "injects a raw message with StubBroker.queues[q].put()"
    ),
    "test_actors.py::test_worker_handles_none_eta": (
        "injects a raw message with StubBroker.queues[q].put()"
    ),
    "test_worker.py::test_exception_from_actor_doesnt_leak": (
        "patches StubBroker's _StubMessageProxy; objq's no-retention check is in "
        "tests/integrations/test_dramatiq_broker.py"
    ),
}

#: Tests (and test names) that differ between Dramatiq majors.
if DRAMATIQ_MAJOR >= 2:
    DESELECT["test_worker.py::test_workers_process_messages_in_order"] = (
        "expects each message in the worker's memory 1 ms after its send(): objq's waiting "
        "claim usually takes it in the send's own commit, but not within 1 ms on a loaded "
        "machine; Dramatiq's RedisBroker, whose consumer polls, fails it too"
    )
else:
    for newer in (  # added in Dramatiq 2
        "test_worker.py::test_exception_from_actor_doesnt_leak",
        "test_actors.py::test_worker_handles_non_numeric_eta_and_logs_warning",
        "test_actors.py::test_worker_handles_none_eta",
    ):
        DESELECT.pop(newer, None)
    DESELECT["test_actors.py::test_actors_can_prioritize_work"] = (
        "relies on 1.x StubBroker's unbounded prefetch (all 20 messages in the worker at once); "
        "a broker that honours the worker's prefetch of 2 hands them over 2 at a time"
    )

_memory_stores = itertools.count()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--objq-backend",
        action="append",
        choices=BACKENDS,
        help=f"storage for ObjqBroker (repeatable; default: all of {', '.join(BACKENDS)})",
    )
    parser.addoption(
        "--objq-run-deselected",
        action="store_true",
        help="run the DESELECT tests too (to see how they fare on ObjqBroker)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "objq_backend" in metafunc.fixturenames:
        backends = metafunc.config.getoption("objq_backend") or list(BACKENDS)
        metafunc.parametrize("objq_backend", backends)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("objq_run_deselected"):
        return
    kept, dropped, matched = [], [], set()
    for item in items:
        key = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        if key in DESELECT:
            dropped.append(item)
            matched.add(key)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    config.stash[_unmatched_key] = sorted(set(DESELECT) - matched)


_unmatched_key = pytest.StashKey[list[str]]()


# --- fixtures the suite uses ------------------------------------------------------------------


@pytest.fixture
def objq_url(objq_backend: str, tmp_path: Path) -> str:
    if objq_backend == "memory":
        return f"memory://dramatiq-suite-{os.getpid()}-{next(_memory_stores)}"
    return (tmp_path / "objq").as_uri()


@pytest.fixture
def stub_broker(objq_url: str) -> Iterator[ObjqBroker]:
    middleware = [
        TimeLimit(interval=TIME_LIMIT_INTERVAL_MS) if kind is TimeLimit else kind()
        for kind in default_middleware
    ]
    broker = ObjqBroker(
        url=objq_url,
        lease_seconds=LEASE_SECONDS,
        fail_fast_default=FAIL_FAST_DEFAULT,
        middleware=middleware,
    )
    broker.emit_after("process_boot")  # as the CLI does: starts TimeLimit's monitor thread
    dramatiq.set_broker(broker)
    yield broker
    try:
        broker.flush_all()
    finally:
        broker.close()
        # Tests without fixtures declare actors on the global broker: leave an open one there
        # (a closed StubBroker keeps working; a closed ObjqBroker refuses, as it should).
        dramatiq.set_broker(ObjqBroker(url=f"memory://after-{next(_memory_stores)}"))


@pytest.fixture
def stub_worker(stub_broker: ObjqBroker) -> Iterator[Worker]:
    worker = Worker(stub_broker, worker_timeout=100, worker_threads=32)
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture
def result_backend(objq_url: str) -> ObjqResultBackend:
    return ObjqResultBackend(url=objq_url)


@pytest.fixture
def redis_result_backend(objq_url: str) -> ObjqResultBackend:
    """Dramatiq's suite names this fixture after Redis; its one test
    (``test_messages_without_actor_not_crashing_lookup_options``) needs any result backend
    that is not the stub, so objq's stands in."""
    return ObjqResultBackend(url=objq_url)


@pytest.fixture
def rate_limiter_backend(objq_url: str) -> ObjqRateLimiterBackend:
    return ObjqRateLimiterBackend(url=objq_url)


# --- the JSON report --------------------------------------------------------------------------


class _Report:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.counts: Counter[str] = Counter()
        self.modules: set[str] = set()
        self.failures: list[dict[str, str]] = []
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.counts["deselected"] += len(items)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration
        self.modules.add(report.nodeid.split("::", 1)[0])
        if report.failed:
            outcome = "failed" if report.when == "call" else "error"
            self.counts[outcome] += 1
            self.failures.append(
                {"nodeid": report.nodeid, "outcome": outcome, "message": _crash(report)}
            )
        elif report.skipped:
            self.counts["skipped"] += 1
        elif report.when == "call":
            self.counts["passed"] += 1

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        slowest = _slowest(self.seconds, 15)
        self.path.write_text(
            json.dumps(
                {
                    "dramatiq": dramatiq.__version__,
                    "backends": session.config.getoption("objq_backend") or list(BACKENDS),
                    "exitstatus": int(exitstatus),
                    "counts": dict(self.counts),
                    "modules": sorted(self.modules),
                    "failures": self.failures,
                    "unmatched_deselects": session.config.stash.get(_unmatched_key, []),
                    "deselect_reasons": DESELECT,
                    "slowest": [{"nodeid": n, "seconds": round(s, 2)} for n, s in slowest],
                },
                indent=2,
            )
        )


def _slowest(seconds: dict[str, float], count: int) -> list[tuple[str, float]]:
    return sorted(seconds.items(), key=lambda pair: pair[1], reverse=True)[:count]


def _crash(report: pytest.TestReport) -> str:
    crash: Any = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        first = crash.message.splitlines()[0] if crash.message else ""
        return f"{first} ({Path(crash.path).name}:{crash.lineno})"
    return str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get(REPORT_ENV)
    if path:
        config.pluginmanager.register(_Report(Path(path)), "objq-suite-report")
