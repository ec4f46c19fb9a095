"""A broker beyond loopback takes a token of 16 characters or more (blanks not counted): a
blank or short one is refused, saying what was expected and what was found."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from objq_broker import Queue
from objq_broker.broker.keys import MIN_TOKEN_CHARS, require_token
from objq_broker.errors import ConfigurationError

GOOD = "a-random-token-of-32-characters!"


@pytest.mark.parametrize(("token", "found"), [(" ", 0), ("  short-token  ", 11), ("x" * 15, 15)])
def test_a_short_token_is_refused_beyond_loopback(token: str, found: int) -> None:
    with pytest.raises(ConfigurationError) as refused:
        require_token("0.0.0.0:7700", token)
    message = str(refused.value)
    assert f"expected at least {MIN_TOKEN_CHARS} characters" in message
    assert f"found {found}" in message and "'0.0.0.0:7700'" in message
    assert token.strip() not in message or not token.strip()  # the token itself is never shown


def test_enough_characters_or_loopback_pass() -> None:
    require_token("0.0.0.0:7700", "x" * MIN_TOKEN_CHARS)
    require_token("10.1.2.3:7700", GOOD)
    for listen in ("127.0.0.1:0", "localhost:7700", "[::1]:7700"):
        require_token(listen, " ")  # loopback: the token only encrypts; any will do
        require_token(listen, None)


def test_the_broker_command_refuses_a_blank_token(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    done = subprocess.run(
        [sys.executable, "-m", "objq_broker.cli", "broker", "--url", url, "--listen", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OBJQ_BROKER_TOKEN": " "},
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "expected at least 16 characters" in done.stderr and "found 0" in done.stderr


def test_an_elected_broker_refuses_a_short_token() -> None:
    with pytest.raises(ConfigurationError, match="expected at least 16 characters"):
        Queue(
            "memory://short-token",
            broker="auto",
            broker_listen="0.0.0.0:0",
            broker_token="too-short",
        )
