"""Root ``conftest.py`` for Celery's integration suite, run against the objq kombu transport.

Copied next to the unpacked ``t/`` by ``celery_upstream.py``; edit it here. Celery's own
``t/integration/conftest.py`` does the rest (app, in-process worker, ``TEST_BROKER``).

``DESELECT`` lists every test of ``test_tasks.py`` that does not run, each with its reason.
With ``$OBJQ_SUITE_REPORT`` set, a JSON summary of the run is written there.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import celery
import pytest

import objq_broker.kombu  # noqa: F401  (registers the objq+... broker URLs with kombu)

REPORT_ENV = "OBJQ_SUITE_REPORT"

#: Fails identically on Celery's own Redis transport on this machine (checked with
#: ``celery_upstream.py --broker-url redis://...``): not something objq can pass or fail.
_FAILS_ON_REDIS_TOO = "fails the same way on Celery's Redis transport here"

#: test class::test name -> why it does not run on objq. A broker-generic test that fails on
#: objq is a failure to fix, not an entry here.
DESELECT: dict[str, str] = {
    "test_tasks::test_revoked_by_headers_complex_canvas": (
        f"{_FAILS_ON_REDIS_TOO}: its own 20 s timeout is shorter than the 22 canvases of 2-4 s "
        "sleeping tasks take with the suite's one-process worker (~120 s here)"
    ),
    "test_trace_log_arguments::test_task_success": (
        f"{_FAILS_ON_REDIS_TOO}: caplog holds none of the worker's INFO records"
    ),
    "test_trace_log_arguments::test_task_failed": (
        f"{_FAILS_ON_REDIS_TOO}: caplog holds none of the worker's INFO records"
    ),
    "test_tasks::test_multiprocess_producer": (
        "Celery skips it itself ('Broken test') from 5.5 on; under Celery 5.4, which runs it, "
        "it hung on objq (the test waits in multiprocessing Pool.map for 20 forked producers "
        "that never return, though a plain fork-and-publish works on objq)"
    ),
    "test_tasks::test_multithread_producer": (
        "Celery itself skips it as 'Broken test' from 5.6 on. Under Celery 5.4 it once hung "
        "until the run was killed (four reruns of it passed in 15 s each). On 5.5 it found "
        "wakeups lost after a fork of the prefork pool, since fixed and covered by "
        "tests/integrations/test_kombu_event_loop.py"
    ),
    "test_tasks::test_expired": (
        "the objq transport drops a message whose AMQP 'expiration' (which Celery sets from "
        "'expires') has passed, as RabbitMQ does, so the worker never sees it and never stores "
        "REVOKED; the test then waits forever in result.get() without a timeout. Celery's "
        "Redis transport ignores 'expiration' and passes it"
    ),
}


#: test class::test name -> the objq transport defect it shows. These run as strict xfails: the
#: run stays green while the defect is known, and turns red the day the test passes.
EXPECTED_FAILURES: dict[str, str] = {}

#: test class::test name -> why it passes or fails by timing on objq. These run as non-strict
#: xfails: either outcome is reported, neither fails the run.
TIMING_DEPENDENT: dict[str, str] = {
    "test_tasks::test_revoked_by_headers_simple_canvas": (
        "the revoke_by_stamped_headers broadcast (to the worker's pidbox queue) is published "
        "just before the task (to the celery queue). Each queue is claimed by its own channel, "
        "and nothing orders claims across channels, so the worker may run the task before it "
        "handles the broadcast. On the event-loop transport it passes in some runs and fails "
        "in others (on Celery's Redis transport it passes)"
    ),
}


#: Test classes whose ``@flaky`` tests Celery reruns on failure and so does this run, with the
#: reason. Every other flaky-marked test runs once: a rerun would hide a broker fault.
RERUN_CLASSES: dict[str, str] = {
    "test_task_redis_result_backend": (
        "they check the Redis result backend's pub/sub subscriptions (PUBSUB CHANNELS right "
        "after publishing), which race with the backend's own subscription bookkeeping: "
        "Celery reruns them on its own Redis broker too"
    ),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped, matched = [], [], set()
    for item in items:
        cls = item.cls if isinstance(item, pytest.Function) else None
        owner = cls.__name__ if cls is not None else item.path.name
        key = f"{owner}::{getattr(item, 'originalname', item.name)}"
        if owner not in RERUN_CLASSES:
            item.own_markers[:] = [m for m in item.own_markers if m.name != "flaky"]
        _cap_timeout(config, item)
        if key in EXPECTED_FAILURES:
            item.add_marker(pytest.mark.xfail(reason=EXPECTED_FAILURES[key], strict=True))
            matched.add(key)
        if key in TIMING_DEPENDENT:
            item.add_marker(pytest.mark.xfail(reason=TIMING_DEPENDENT[key], strict=False))
            matched.add(key)
        if key in DESELECT:
            dropped.append(item)
            matched.add(key)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    listed = set(DESELECT) | set(EXPECTED_FAILURES) | set(TIMING_DEPENDENT)
    config.stash[_unmatched_key] = sorted(listed - matched)


_unmatched_key = pytest.StashKey[list[str]]()


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
                    "failures": self.failures,
                    "skips": self.skips,
                    "reruns": self.reruns,
                    "unmatched_deselects": session.config.stash.get(_unmatched_key, []),
                    "deselect_reasons": DESELECT,
                    "expected_failures": EXPECTED_FAILURES,
                    "timing_dependent": TIMING_DEPENDENT,
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
