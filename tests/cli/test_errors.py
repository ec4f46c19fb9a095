"""Bad input and broken stores: one clear line on stderr, the right exit status, and a state
that could not be read left byte for byte as it was."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.objq_cli import Objq, one_line_error


@pytest.mark.parametrize(
    ("url", "status", "fragments"),
    [
        (None, 2, ["no store given", "OBJQ_URL"]),
        ("ftp://host/x", 2, ["unknown scheme 'ftp'", "accepted: memory://, file://"]),
        ("s3://jobs-bucket/x?colour=red", 2, ["unknown option 'colour'", "endpoint_url"]),
        ("file:///nonexistent/objq-dir", 1, ["'/nonexistent/objq-dir'", "existing directory"]),
    ],
)
def test_bad_urls(objq: Objq, url: str | None, status: int, fragments: list[str]) -> None:
    one_line_error(objq("status", url=url), status, *fragments)


def test_missing_bucket_and_unreachable_storage(
    objq: Objq, moto_endpoint: str, s3_url_factory: Callable[[], str]
) -> None:
    missing = f"s3://objq-no-such-bucket/q?endpoint_url={moto_endpoint}"
    one_line_error(objq("status", url=missing), 1, "bucket does not exist")
    one_line_error(objq("enqueue", "q", "x", url=missing), 1, "bucket does not exist")

    # Nothing listens on the discard port: the error comes at once, not after retries
    started = time.monotonic()
    dead = "s3://jobs-bucket/q?endpoint_url=http://127.0.0.1:9&max_attempts=1"
    one_line_error(objq("enqueue", "q", "x", url=dead), 1, "127.0.0.1:9")
    assert time.monotonic() - started < 15


def test_corrupt_state_is_reported_and_never_overwritten(objq: Objq, file_url: str) -> None:
    assert objq("enqueue", "q", "x", url=file_url).code == 0
    state = Path(file_url.removeprefix("file://")) / "state.json"
    garbage = b'{"format": 1, "jobs": "not a list"}'
    state.write_bytes(garbage)

    for args in (
        ["status"],
        ["enqueue", "q", "y"],
        ["jobs", "list", "q"],
        ["purge", "q", "--yes"],
        ["requeue-stale"],
        ["config", "set", "q", "lease", "5"],
    ):
        one_line_error(objq(*args, url=file_url), 1, "state.json", "will not be overwritten")
        assert state.read_bytes() == garbage

    debug = objq("status", "--debug", url=file_url)
    assert debug.code == 1 and "Traceback (most recent call last)" in debug.stderr
    assert "StateCorrupt" in debug.stderr


@pytest.mark.parametrize(
    ("args", "status", "fragments"),
    [
        (["jobs", "list", "nope"], 1, ["queue 'nope' is not declared", "declared: ['q']"]),
        (["jobs", "show", "abc"], 1, ["job 'abc'", "objq archive cat"]),
        (["enqueue", "q", "x", "--delay", "soon"], 2, ["duration", "'soon'"]),
        (["enqueue", "q"], 2, ["exactly one of PAYLOAD, --file F or --jsonl F"]),
        (["enqueue", "q", "--file", "/nonexistent.txt"], 2, ["--file", "'/nonexistent.txt'"]),
        (["enqueue-cmd", "q", "echo", "hi"], 2, ["QUEUE [options] -- COMMAND"]),
        (["config", "set", "q", "colour", "red"], 2, ["setting 'colour'", "max-attempts"]),
        (["config", "set", "q", "max-attempts", "0"], 2, ["max_attempts: expected int >= 1"]),
        (["archive", "cat", "--since", "yesterday-ish"], 2, ["time: expected ISO 8601"]),
        (["dead", "purge", "q", "--all"], 2, ["stdin is not a terminal", "--yes"]),
    ],
)
def test_bad_input(
    objq: Objq, file_url: str, args: list[str], status: int, fragments: list[str]
) -> None:
    assert objq("declare", "q", url=file_url).code == 0
    one_line_error(objq(*args, url=file_url), status, *fragments)


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["bogus"], ["No such command 'bogus'", "; see objq --help"]),
        (["status", "--bogus"], ["No such option '--bogus'", "see objq status --help"]),
        (["jobs", "list", "q", "--bogus"], ["--bogus", "see objq jobs list --help"]),
        (["--bogus", "status"], ["No such option '--bogus'"]),
        (["demo", "--jobs", "0"], ["--jobs: 0 is not in the range 1<=x", "objq demo --help"]),
        (["jobs"], ["Missing command", "see objq jobs --help"]),
        ([], ["Missing command", "see objq --help"]),
    ],
)
def test_usage_errors_are_one_line(
    objq: Objq, file_url: str, args: list[str], fragments: list[str]
) -> None:
    # click's own form is several lines (the usage, a hint, then the error); objq promises one
    result = objq(*args, url=file_url)

    one_line_error(result, 2, "objq: error: ", *fragments)
    assert "usage:" not in result.stderr.lower()


def test_usage_errors_exit_2(objq: Objq, file_url: str) -> None:
    unknown = objq("bogus", url=file_url)
    assert unknown.code == 2 and "No such command 'bogus'" in unknown.stderr
    missing = objq("worker", url=file_url)
    assert missing.code == 2 and "--queue" in missing.stderr
    assert objq("--help", url=file_url).code == 0


def test_bad_jsonl_line_refuses_the_whole_file(objq: Objq, file_url: str, tmp_path: Path) -> None:
    lines = tmp_path / "jobs.jsonl"
    lines.write_text('{"ok": 1}\n{"broken": \n')
    assert objq("declare", "q", url=file_url).code == 0

    refused = objq("enqueue", "q", "--jsonl", str(lines), url=file_url)

    one_line_error(refused, 2, "jobs.jsonl, line 2: expected a JSON document")
    assert objq("status", "--json", url=file_url).json()["queues"][0]["ready"] == 0


def test_report_passes_its_arguments_through(objq: Objq, file_url: str) -> None:
    if importlib.util.find_spec("objq_broker.report") is None:
        one_line_error(
            objq("report", "--help", url=file_url), 1, "pip install 'objq-broker[spark]'"
        )
        return
    helped = objq("report", "--help", url=file_url)
    assert helped.code == 0, helped.stderr
    assert "--since" in helped.stdout and "--out" in helped.stdout


def test_a_group_field_that_is_not_a_name_refuses_the_whole_file(
    objq: Objq, file_url: str, tmp_path: Path
) -> None:
    lines = tmp_path / "jobs.jsonl"
    lines.write_text('{"t": "a"}\n{"t": 7}\n')
    assert objq("declare", "q", url=file_url).code == 0

    refused = objq("enqueue", "q", "--jsonl", str(lines), "--group-field", "t", url=file_url)
    without = objq("enqueue", "q", "--file", str(lines), "--group-field", "t", url=file_url)

    one_line_error(refused, 2, "document 2: expected 't' to be a group name")
    one_line_error(without, 2, "--group-field reads each line's group from --jsonl")
    assert objq("status", "--json", url=file_url).json()["queues"][0]["ready"] == 0
