"""Bad values on the Spark write path are refused where they enter: a writer option when the
write is planned, a column's type then too, and a column's values in the task that reads them.
Each error names the option or column, what was expected and what was found, and nothing is
committed: the queue's stored state still decodes and holds only what it held before."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from objq_broker import Queue
from objq_broker.engine import STATE_KEY
from objq_broker.model.encoding import decode_state
from objq_broker.storage import open_store

#: Rows of the DataFrame written; the last one holds the bad values of the per-row cases.
ROWS = 20
#: Every column a case may name (Spark DDL); "bad_*" columns are fine but in their last row.
COLUMNS = (
    "payload string, n int, flag boolean, ratio double, label string, "
    "numbered map<int,string>, bad_rank bigint, bad_nan double, bad_inf double, "
    "bad_far double, bad_payload string, bad_actor string"
)
LAST = ROWS - 1

Option = str | int | float | bool


def _row(i: int) -> tuple[Any, ...]:
    last = i == LAST
    return (
        f"row-{i}",
        i,
        i % 2 == 0,
        i / 4,
        f"label-{i}",
        {i: "x"},
        2**40 if last else i,
        float("nan") if last else 1.0,
        float("inf") if last else 1.0,
        1e12 if last else 1.0,
        None if last else f"payload-{i}",
        "" if last else "add",
    )


#: (options, what the error must say). The options are given as a user would, as Python values:
#: Spark turns them into text (True -> "true", nan -> "nan").
OPTIONS: dict[str, tuple[dict[str, Option], str]] = {
    "priority NaN": (
        {"priority": float("nan")},
        "objq writer option: priority: expected int, found 'nan'",
    ),
    "priority bool": (
        {"priority": True},
        "objq writer option: priority: expected int, found 'true'",
    ),
    "priority fraction": (
        {"priority": 2.5},
        "objq writer option: priority: expected int, found '2.5'",
    ),
    "priority past 32 bits": (
        {"priority": 2**40},
        "objq writer option: priority: expected int <= 2147483647, found 1099511627776",
    ),
    "delay inf": (
        {"delay_seconds": float("inf")},
        "objq writer option: delay_seconds: expected float <= 3153600000.0, found inf",
    ),
    "delay NaN": (
        {"delay_seconds": float("nan")},
        "objq writer option: delay_seconds: expected float >= -3153600000.0, found nan",
    ),
    "delay past a century": (
        {"delay_seconds": 1e12},
        "objq writer option: delay_seconds: expected float <= 3153600000.0, found 1000000000000.0",
    ),
    "delay bool": (
        {"delay_seconds": False},
        "objq writer option: delay_seconds: expected float, found 'false'",
    ),
    "max_attempts zero": (
        {"max_attempts": 0},
        "objq writer option: max_attempts: expected int >= 1, found 0",
    ),
    "max_attempts bool": (
        {"max_attempts": True},
        "objq writer option: max_attempts: expected int, found 'true'",
    ),
    "max_attempts fraction": (
        {"max_attempts": 2.5},
        "objq writer option: max_attempts: expected int, found '2.5'",
    ),
    "max_attempts too many": (
        {"max_attempts": 10**7},
        "objq writer option: max_attempts: expected int <= 1000000, found 10000000",
    ),
    "rows_per_object zero": (
        {"rows_per_object": 0},
        "objq writer option: rows_per_object: expected int >= 1, found 0",
    ),
    "rows_per_object past a run": (
        {"rows_per_object": 10**6},
        "objq writer option: rows_per_object: expected int <= 10000, found 1000000",
    ),
    "queue with a slash": (
        {"queue": "a/b"},
        "objq writer option: queue: expected a queue name "
        "(1-255 printable characters without '/'), found 'a/b'",
    ),
    "queue empty": ({"queue": ""}, "objq writer: option 'queue' is required, found none"),
    "unknown option": (
        {"priorty": 1},
        "objq writer: unknown option(s) ['priorty']; accepted: ['url',",
    ),
    "unknown scheme": (
        {"url": "ftp://jobs"},
        "storage URL 'ftp://jobs': unknown scheme 'ftp'; accepted:",
    ),
}

#: Options naming a column whose Spark type cannot be what the option needs.
COLUMN_TYPES: dict[str, tuple[dict[str, Option], str]] = {
    "priority from double": (
        {"priority_column": "ratio"},
        "objq writer: option 'priority_column' names column 'ratio'; "
        "expected tinyint, smallint, int or bigint, found double",
    ),
    "priority from boolean": (
        {"priority_column": "flag"},
        "objq writer: option 'priority_column' names column 'flag'; "
        "expected tinyint, smallint, int or bigint, found boolean",
    ),
    "delay from boolean": (
        {"delay_column": "flag"},
        "objq writer: option 'delay_column' names column 'flag'; "
        "expected seconds as tinyint, smallint, int, bigint, float or double, found boolean",
    ),
    "payload from int": (
        {"payload_column": "n"},
        "objq writer: option 'payload_column' names column 'n'; "
        "expected string or binary, found int",
    ),
    "actor from int": (
        {"actor_column": "n"},
        "objq writer: option 'actor_column' names column 'n'; expected string, found int",
    ),
    "task from boolean": (
        {"task_column": "flag"},
        "objq writer: option 'task_column' names column 'flag'; expected string, found boolean",
    ),
    "args from text": (
        {"dramatiq_actor": "add", "args_column": "label"},
        "objq writer: option 'args_column' names column 'label'; expected an array, found string",
    ),
    "kwargs from a map of ints": (
        {"celery_task": "tasks.add", "kwargs_column": "numbered"},
        "objq writer: option 'kwargs_column' names column 'numbered'; "
        "expected a map with string keys, or a struct, found map<int,string>",
    ),
}

#: Columns of the right type with one bad value, in the last row: refused by the task.
VALUES: dict[str, tuple[dict[str, Option], str]] = {
    "priority past 32 bits": (
        {"priority_column": "bad_rank"},
        "objq writer: column 'bad_rank': priority: expected int <= 2147483647, found 1099511627776",
    ),
    "delay NaN": (
        {"delay_column": "bad_nan"},
        "objq writer: column 'bad_nan': delay: expected float >= -3153600000.0, found nan",
    ),
    "delay inf": (
        {"delay_column": "bad_inf"},
        "objq writer: column 'bad_inf': delay: expected float <= 3153600000.0, found inf",
    ),
    "delay past a century": (
        {"delay_column": "bad_far"},
        "objq writer: column 'bad_far': delay: "
        "expected float <= 3153600000.0, found 1000000000000.0",
    ),
    "payload null": (
        {"payload_column": "bad_payload"},
        "objq writer: column 'bad_payload': expected a payload, found null",
    ),
    "actor empty": (
        {"actor_column": "bad_actor"},
        "objq writer: column 'bad_actor': expected a task name, found ''",
    ),
}


@pytest.fixture(scope="module")
def frame(spark: Any) -> Any:
    """One partition, read as two Arrow batches (the session's batches hold 10 rows): the
    first is staged before the second, whose last row is bad, fails the task."""
    return spark.createDataFrame([_row(i) for i in range(ROWS)], COLUMNS).coalesce(1)


def _store(tmp_path: Path) -> str:
    """A store whose queue ``q`` holds one job."""
    url = (tmp_path / "store").as_uri()
    with Queue(url) as queue:
        queue.enqueue("q", b"before")
    return url


def _write(frame: Any, url: str, options: dict[str, Option]) -> None:
    writer = frame.write.format("objq").mode("append")
    # Five rows per staged object: the first batch's rows are staged before the second fails.
    for name, value in {"url": url, "queue": "q", "rows_per_object": 5, **options}.items():
        writer = writer.option(name, value)
    writer.save()


def _assert_nothing_committed(url: str) -> None:
    store = open_store(url)
    try:
        blob = store.read(STATE_KEY)
        assert blob is not None
        state = decode_state(blob.data, "test")  # still decodes
        assert [job.body for job in state.jobs] == ["before"]
        assert state.run_keys() == set() and dict(state.bodies) == {}
        staged = [k for k in store.list("staging/") if not k.endswith("/_closed")]
        assert staged == []
    finally:
        store.close()


def _refused(frame: Any, tmp_path: Path, options: dict[str, Option], message: str) -> None:
    url = _store(tmp_path)
    # The error reaches the caller through Spark (the analyser or a failed job), which
    # quotes the Python exception: the objq error's text must be in it.
    with pytest.raises(Exception, match=re.escape(message)) as raised:
        _write(frame, url, options)
    assert "ConfigurationError" in str(raised.value)
    _assert_nothing_committed(url)


@pytest.mark.parametrize(("options", "message"), OPTIONS.values(), ids=OPTIONS.keys())
def test_a_bad_option_is_refused_before_any_task(
    frame: Any, tmp_path: Path, options: dict[str, Option], message: str
) -> None:
    _refused(frame, tmp_path, options, message)


@pytest.mark.parametrize(("options", "message"), COLUMN_TYPES.values(), ids=COLUMN_TYPES.keys())
def test_a_column_of_the_wrong_type_is_refused_before_any_task(
    frame: Any, tmp_path: Path, options: dict[str, Option], message: str
) -> None:
    _refused(frame, tmp_path, options, message)


@pytest.mark.parametrize(("options", "message"), VALUES.values(), ids=VALUES.keys())
def test_a_bad_value_in_a_column_fails_the_write_and_commits_nothing(
    frame: Any, tmp_path: Path, options: dict[str, Option], message: str
) -> None:
    _refused(frame, tmp_path, options, message)


def test_values_at_the_limits_are_accepted(frame: Any, tmp_path: Path) -> None:
    # The same constraints admit their bounds: nothing above is refused for being exact.
    url = _store(tmp_path)
    limits: dict[str, Option] = {
        "priority": -(2**31),
        "delay_seconds": -5.0,
        "max_attempts": 1_000_000,
        "rows_per_object": 10_000,
        "priority_column": "n",
    }
    _write(frame.where(f"n < {LAST}"), url, limits)
    with Queue(url) as queue:
        jobs = [job for _, job in queue.jobs("q")]
    added = [job for job in jobs if job.payload != b"before"]
    assert sorted(job.payload for job in added) == sorted(f"row-{i}".encode() for i in range(LAST))
    assert {job.max_attempts for job in added} == {1_000_000}
    assert sorted(job.priority for job in added) == list(range(LAST))
