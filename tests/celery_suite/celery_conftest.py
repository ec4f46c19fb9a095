"""Root ``conftest.py`` for Celery's integration suite, run on objq's kombu transport and
result backend.

Copied next to the unpacked ``t/`` by ``celery_upstream.py``; edit it here. Celery's own
``t/integration/conftest.py`` does the rest (app, in-process worker, ``TEST_BROKER``,
``TEST_BACKEND``).

``DESELECT`` lists every test of ``test_tasks.py`` and ``test_canvas.py`` that does not run,
each with its reason, keyed ``module::class::test``. With ``$OBJQ_SUITE_REPORT`` set, a JSON
summary of the run is written there; with ``$OBJQ_SUITE_SHARD`` = ``k/n``, the run keeps every
n-th test from the k-th (after the lists above are applied to all of them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import celery
import pytest

import objq_broker.kombu  # noqa: F401  (registers the objq+... broker and result backend URLs)

# Celery 5.4's and 5.5's test_canvas.py import pytest_subtests for its `subtests` fixture, which
# pytest has itself from 9.0 on (pytest.Subtests): an empty module satisfies the import there.
if importlib.util.find_spec("pytest_subtests") is None and hasattr(pytest, "Subtests"):
    sys.modules["pytest_subtests"] = types.ModuleType("pytest_subtests")

REPORT_ENV = "OBJQ_SUITE_REPORT"
SHARD_ENV = "OBJQ_SUITE_SHARD"

#: Fails identically on Celery's own Redis transport on this machine (checked with
#: ``celery_upstream.py --broker-url redis://...``): not something objq can pass or fail.
_FAILS_ON_REDIS_TOO = "fails the same way on Celery's Redis transport here"

#: A test behind the widened Redis check that reads the Redis result backend's own state.
_READS_REDIS_BACKEND = (
    "reads the Redis result backend's own state ({}), which objq's backend does not have: "
    "Redis is not a side channel here"
)

#: module::test class::test name -> why it does not run on objq. A broker- or backend-generic
#: test that fails on objq is a failure to fix, not an entry here.
DESELECT: dict[str, str] = {
    "test_tasks.py::test_trace_log_arguments::test_task_success": (
        f"{_FAILS_ON_REDIS_TOO}: caplog holds none of the worker's INFO records"
    ),
    "test_tasks.py::test_trace_log_arguments::test_task_failed": (
        f"{_FAILS_ON_REDIS_TOO}: caplog holds none of the worker's INFO records"
    ),
    "test_tasks.py::test_tasks::test_multiprocess_producer": (
        "Celery skips it itself ('Broken test') from 5.5 on; under Celery 5.4, which runs it, "
        "it hung on objq (the test waits in multiprocessing Pool.map for 20 forked producers "
        "that never return, though a plain fork-and-publish works on objq)"
    ),
    "test_tasks.py::test_tasks::test_multithread_producer": (
        "Celery itself skips it as 'Broken test' from 5.6 on. Under Celery 5.4 it once hung "
        "until the run was killed (four reruns of it passed in 15 s each). On 5.5 it found "
        "wakeups lost after a fork of the prefork pool, since fixed and covered by "
        "tests/integrations/test_kombu_event_loop.py"
    ),
    "test_canvas.py::test_chain::test_chord_header_id_duplicated_on_rabbitmq_msg_duplication": (
        "RabbitMQ only: its before_task_publish handler republishes each message with the "
        "signal's own arguments (a Signal object) as message properties, which only AMQP drops "
        "(Celery xfails it on its Redis broker); it also keeps what it compares in Redis "
        "(redis_echo_group_id) without checking for a Redis backend. With Celery's Redis "
        "result backend on objq it fails the same way"
    ),
    # The harness lets objq's backend through the suite's "Requires redis result backend"
    # checks (celery_side_channel.py); these read the Redis backend itself, not a side channel.
    "test_tasks.py::test_task_redis_result_backend::test_ignoring_result_no_subscriptions": (
        _READS_REDIS_BACKEND.format("its pub/sub channels (PUBSUB CHANNELS)")
    ),
    "test_tasks.py::test_task_redis_result_backend::test_asyncresult_forget_cancels_subscription": (
        _READS_REDIS_BACKEND.format("its pub/sub channels (PUBSUB CHANNELS)")
    ),
    "test_tasks.py::test_task_redis_result_backend::test_asyncresult_get_cancels_subscription": (
        _READS_REDIS_BACKEND.format("its pub/sub channels (PUBSUB CHANNELS)")
    ),
    "test_canvas.py::test_chord::test_redis_subscribed_channels_leak": (
        _READS_REDIS_BACKEND.format("its result consumer and pub/sub channels")
    ),
    "test_canvas.py::test_chord::test_chord_on_error": (
        _READS_REDIS_BACKEND.format("the chord's '.j' key, a list or sorted set of its results")
    ),
    "test_canvas.py::test_chord::test_disabling_flag_allow_error_cb_on_chord_header": (
        "takes about 155 s on Celery's Redis transport and backend and on objq alike (sleeping "
        "header tasks, one at a time on the suite's one-process worker): over the 120 s cap "
        "per test"
    ),
}


#: module::test class::test name -> the known defect it shows (objq's, or Celery's own). These
#: run as strict xfails: the run stays green while the defect is known, and turns red the day
#: the test passes.
EXPECTED_FAILURES: dict[str, str] = {
    "test_canvas.py::test_chord::test_error_propagates_from_chord": (
        "Celery's own defect, issue #6437 (Celery marks it xfail on its Redis backend): in "
        "add | fail | group(...), the group never runs and nothing stores a result for its "
        "tasks, so GroupResult.get() waits out the test's 60 s timeout on any backend"
    ),
}

#: module::test class::test name -> (seconds, why): a test whose own timeout mark is shorter
#: than it takes here on any broker, run with this one instead (below the run's 120 s cap).
LONGER_TIMEOUTS: dict[str, tuple[float, str]] = {
    "test_tasks.py::test_tasks::test_revoked_by_headers_complex_canvas": (
        100.0,
        "its own 20 s mark is shorter than its 22 canvases of sleeping tasks take on the "
        "suite's one-process worker, on Celery's Redis transport too; it takes about 45 s here",
    ),
    "test_canvas.py::test_chord::test_enabling_flag_allow_error_cb_on_chord_header": (
        115.0,
        "no mark of its own, and the run's 60 s default is shorter than its sleeping header "
        "tasks take one at a time: about 90 s on Celery's Redis transport and on objq alike",
    ),
    "test_canvas.py::test_chord::test_flag_allow_error_cb_on_chord_header_on_upgraded_chord": (
        115.0,
        "as the one above: about 72 s on Celery's Redis transport and on objq alike",
    ),
}

#: module::test class::test name -> why it passes or fails by timing on objq. These run as
#: non-strict xfails: either outcome is reported, neither fails the run.
TIMING_DEPENDENT: dict[str, str] = {
    "test_tasks.py::test_task_replacement::test_replaced_task_nesting_level_0": (
        "a race in the test: it sets its flag to False after sending the task, so a worker "
        "that receives the task (and sets the flag in task_received) before the test's next "
        "line runs fails it. Failed once under Celery 5.4 here (get() returned 6, the flag "
        "read False), passed in the other runs"
    ),
}


#: module::test class::test name -> why a test Celery 5.4 and 5.5 mark xfail passes here. Those
#: marks are strict under this run's settings; in the versions that have one it is made
#: non-strict, so either outcome passes the run. Where Celery dropped the mark (5.7 fixed the
#: cause), the test runs as any other and must pass.
PASSING_XFAILS: dict[str, str] = {
    "test_canvas.py::test_chain::test_group_results_in_chain": (
        "marked xfail(raises=TimeoutError, 'Task is timeout'): the Redis backend's result "
        "consumer never fulfilled this group's promise; objq's backend reads the results"
    ),
    "test_canvas.py::test_chain::test_nested_chain_group_lone": (
        "marked xfail(raises=TimeoutError, 'Task is timeout'), 'Fails with Redis 5.x': objq's "
        "backend returns the lone group's results"
    ),
    "test_canvas.py::test_group::test_nested_group_chord_body_chain": (
        "issue #6734: the test expects get() to time out (a promise of the Redis backend's "
        "result consumer that was never fulfilled) and fails its own pytest.raises when objq's "
        "backend returns the result at once"
    ),
}


#: Test classes whose ``@flaky`` tests Celery reruns on failure and so does this run, with the
#: reason. Every other flaky-marked test runs once: a rerun would hide a broker or backend
#: fault. (The one class that was here checks the Redis result backend's pub/sub subscriptions;
#: with objq's backend it skips itself.)
RERUN_CLASSES: dict[str, str] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped, matched = [], [], set()
    modules = {item.path.name for item in items}  # each module runs on its own
    for item in items:
        cls = item.cls if isinstance(item, pytest.Function) else None
        owner = "" if cls is None else f"{cls.__name__}::"
        key = f"{item.path.name}::{owner}{getattr(item, 'originalname', item.name)}"
        if cls is None or cls.__name__ not in RERUN_CLASSES:
            item.own_markers[:] = [m for m in item.own_markers if m.name != "flaky"]
        _cap_timeout(config, item)
        if key in LONGER_TIMEOUTS:
            seconds = LONGER_TIMEOUTS[key][0]
            item.add_marker(pytest.mark.timeout(timeout=seconds), append=False)
            matched.add(key)
        if key in EXPECTED_FAILURES:
            item.add_marker(pytest.mark.xfail(reason=EXPECTED_FAILURES[key], strict=True))
            matched.add(key)
        if key in TIMING_DEPENDENT:
            item.add_marker(pytest.mark.xfail(reason=TIMING_DEPENDENT[key], strict=False))
            matched.add(key)
        if key in PASSING_XFAILS:
            if item.get_closest_marker("xfail") is not None:  # first: it wins over Celery's
                relaxed = pytest.mark.xfail(reason=PASSING_XFAILS[key], strict=False)
                item.add_marker(relaxed, append=False)
            matched.add(key)
        if key in DESELECT:
            dropped.append(item)
            matched.add(key)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = _shard(config, kept)
    # Every entry for a module this run collected must match one of its tests.
    listed = {
        key
        for key in (
            *DESELECT,
            *EXPECTED_FAILURES,
            *TIMING_DEPENDENT,
            *PASSING_XFAILS,
            *LONGER_TIMEOUTS,
        )
        if key.split("::", 1)[0] in modules
    }
    config.stash[_unmatched_key] = sorted(listed - matched)


_unmatched_key = pytest.StashKey[list[str]]()
_shard_key = pytest.StashKey[str]()


#: Seconds the slowest tests take (measured on objq as on Redis: they wait on purpose), so
#: that no share gets two of them; every other test counts as one second.
SLOW_TESTS = {
    "test_enabling_flag_allow_error_cb_on_chord_header": 172.0,
    "test_flag_allow_error_cb_on_chord_header_on_upgraded_chord": 136.0,
    "test_error_propagates_from_chord": 61.0,
    "test_nested_chord_header_link_error": 44.0,
    "test_chain_to_a_chord_with_large_header": 37.0,
}


def _shard(config: pytest.Config, items: list[pytest.Item]) -> list[pytest.Item]:
    """With ``$OBJQ_SUITE_SHARD`` = ``k/n``, the k-th of n shares of about equal time: n runs
    side by side share a module whose tests mostly wait (Celery's manager waits a second
    after each). The longest tests are dealt first, each to the share with the least time so
    far; each share keeps the module's order."""
    shard = os.environ.get(SHARD_ENV, "")
    if not shard:
        return items
    k, n = (int(part) for part in shard.split("/"))
    config.stash[_shard_key] = f"{shard} ({len(items)} tests in all)"
    weight = {id(item): SLOW_TESTS.get(item.name.split("[")[0], 1.0) for item in items}
    loads = [0.0] * n
    share: dict[int, int] = {}
    for item in sorted(items, key=lambda item: -weight[id(item)]):  # stable: ties in order
        lightest = loads.index(min(loads))
        share[id(item)] = lightest
        loads[lightest] += weight[id(item)]
    return [item for item in items if share[id(item)] == k - 1]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("max_test_timeout", "cap on Celery's per-test timeout marks (seconds)")


def _cap_timeout(config: pytest.Config, item: pytest.Item) -> None:
    """Lower a timeout mark above the cap, so a hung test fails alone, with pytest-timeout's
    dump of every thread, instead of being killed with the whole run."""
    cap = float(config.getini("max_test_timeout") or 0)
    mark = item.get_closest_marker("timeout")
    if not cap or mark is None:
        return
    seconds = mark.kwargs.get("timeout", mark.args[0] if mark.args else None)
    if seconds is not None and float(seconds) > cap:
        item.add_marker(pytest.mark.timeout(timeout=cap), append=False)


class _Report:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.counts: Counter[str] = Counter()
        self.failures: list[dict[str, str]] = []
        self.skips: list[str] = []
        self.reruns: list[str] = []
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.counts["deselected"] += len(items)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration
        # pytest-rerunfailures adds an outcome that pytest's own type does not list.
        reported: str = report.outcome
        if reported == "rerun":  # failed, and runs again
            self.counts["rerun"] += 1
            self.reruns.append(f"{report.nodeid}: {_crash(report)}")
        elif hasattr(report, "wasxfail"):
            self.counts["xfailed" if report.skipped else "xpassed"] += 1
        elif report.failed:
            outcome = "failed" if report.when == "call" else "error"
            self.counts[outcome] += 1
            self.failures.append(
                {"nodeid": report.nodeid, "outcome": outcome, "message": _crash(report)}
            )
        elif report.skipped:
            self.counts["skipped"] += 1
            self.skips.append(f"{report.nodeid}: {_crash(report)}")
        elif report.when == "call":
            self.counts["passed"] += 1

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.path.write_text(
            json.dumps(
                {
                    "celery": celery.__version__,
                    "exitstatus": int(exitstatus),
                    "counts": dict(self.counts),
                    "shard": session.config.stash.get(_shard_key, None),
                    "failures": self.failures,
                    "skips": self.skips,
                    "reruns": self.reruns,
                    "unmatched_deselects": session.config.stash.get(_unmatched_key, []),
                    "deselect_reasons": DESELECT,
                    "expected_failures": EXPECTED_FAILURES,
                    "timing_dependent": TIMING_DEPENDENT,
                    "passing_xfails": PASSING_XFAILS,
                    "slowest": [
                        {"nodeid": n, "seconds": round(s, 2)} for n, s in _slowest(self.seconds, 15)
                    ],
                },
                indent=2,
            )
        )


def _slowest(seconds: dict[str, float], count: int) -> list[tuple[str, float]]:
    return sorted(seconds.items(), key=lambda pair: pair[1], reverse=True)[:count]


def _crash(report: pytest.TestReport) -> str:
    longrepr: Any = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        return str(longrepr[2])
    crash: Any = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        first = crash.message.splitlines()[0] if crash.message else ""
        return f"{first} ({Path(crash.path).name}:{crash.lineno})"
    return str(longrepr).strip().splitlines()[-1] if longrepr else ""


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get(REPORT_ENV)
    if path:
        config.pluginmanager.register(_Report(Path(path)), "objq-suite-report")
