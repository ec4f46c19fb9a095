"""Secrets in what the command line shows: a URL with credentials is refused redacted by
every command, and ``--debug`` tracebacks drop an endpoint's ``user:password@``, the SDK's own
messages in the exception chain included."""

from __future__ import annotations

import io
import logging

import pytest

from objq_broker.cli.output import EscapingFormatter
from objq_broker.cli.redact import Redactor
from objq_broker.errors import redacted
from tests.cli.objq_cli import Objq, one_line_error

SECRET = "PASSWORD-5e1f"


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["jobs", "list", "q"],
        ["gc", "--dry-run"],
        ["results", "purge"],
        ["check-store"],
        ["enqueue", "q", "x"],
    ],
)
@pytest.mark.parametrize("url", [f"file://user:{SECRET}@/x", f"file://user:{SECRET}@x"])
def test_credentials_in_a_file_url_are_refused_redacted(
    objq: Objq, args: list[str], url: str
) -> None:
    # Readers check the URL as writers do: never read as a path holding the password
    result = objq(*args, url=url)
    one_line_error(result, 2, "expected file:///absolute/dir", "found a host part")
    assert SECRET not in result.stderr


def test_debug_tracebacks_drop_an_endpoints_password(
    objq: Objq, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given credentials (so botocore gets as far as connecting) and nothing listening
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    url = f"s3://jobs-bucket/q?endpoint_url=http://user:{SECRET}@127.0.0.1:9&max_attempts=1"
    result = objq("status", "--debug", url=url)
    assert result.code == 1
    assert "EndpointConnectionError" in result.stderr  # botocore's own error, in the chain
    assert "http://127.0.0.1:9/jobs-bucket/q/state.json" in result.stderr
    assert SECRET not in result.stderr


def test_logged_tracebacks_are_redacted() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(EscapingFormatter("%(message)s"))
    log = logging.getLogger("tests.cli.secrets")
    log.addHandler(handler)
    try:
        try:
            raise ConnectionError(f'Could not connect to "http://u:{SECRET}@10.0.0.1/b"')
        except ConnectionError:
            log.exception("reading u:%s@10.0.0.1:9000 failed", SECRET)
    finally:
        log.removeHandler(handler)
    shown = stream.getvalue()
    assert SECRET not in shown
    assert "***@10.0.0.1:9000" in shown and '"http://10.0.0.1/b"' in shown


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"file://user:{SECRET}@/x", "file:///x"),
        (f"file store '/tmp/user:{SECRET}@/x'", "file store '/tmp/***@/x'"),
        (f"at user:{SECRET}@127.0.0.1:9000 now", "at ***@127.0.0.1:9000 now"),
        (f'("u:{SECRET}@h")', '("***@h")'),
        # Not credentials: kept
        ("KeyError: a@b", "KeyError: a@b"),
        ("mail ops@example.org at 10:30", "mail ops@example.org at 10:30"),
    ],
)
def test_userinfo_is_redacted_with_or_without_a_scheme(text: str, shown: str) -> None:
    assert redacted(text) == shown
    assert redacted(shown) == shown


def test_the_workers_redactor_masks_userinfo_without_a_scheme() -> None:
    redactor = Redactor({})
    assert redactor.redact(f"db app:{SECRET}@db:5432 down") == "db app:***@db:5432 down"
    assert redactor.redact(f"postgres://app:{SECRET}@db/x") == "postgres://app:***@db/x"
