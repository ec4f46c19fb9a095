"""``objq dashboard`` on the command line: its options, and the errors it stops with (one line
each, as every objq command)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from objq_broker import Queue
from objq_broker.dashboard.settings import TOKEN_ENV
from tests.cli.objq_cli import objq_command, one_line_error, run_objq
from tests.cli.test_missing_installs import run_without
from tests.support.processes import Children
from tests.support.waiting import wait_for


def filled(tmp_path: Path) -> str:
    url = (tmp_path / "store").as_uri()
    with Queue(url, broker="off") as queue:
        queue.enqueue("mail", b"x")
    return url


def test_help_names_the_listen_address_and_the_token() -> None:
    result = run_objq("dashboard", "--help", url=None)
    assert result.code == 0
    assert "127.0.0.1:7702" in result.stdout
    assert "--token" in result.stdout and TOKEN_ENV in result.stdout


def test_without_the_extra_it_names_what_to_install(tmp_path: Path) -> None:
    url = filled(tmp_path)
    for hidden in ("starlette", "uvicorn", "jinja2"):
        result = run_without(tmp_path, [hidden], [*objq_command(), "dashboard", "--url", url])
        one_line_error(result, 1, f"objq dashboard needs {hidden}", "objq-broker[dashboard]")


def test_a_short_token_is_refused_without_being_echoed(tmp_path: Path) -> None:
    url = filled(tmp_path)
    result = run_objq("dashboard", "--token", "hunter2", url=url)
    one_line_error(result, 2, "expected at least 16 characters, found 7", "secrets.token_urlsafe")
    assert "hunter2" not in result.stderr


def test_an_address_in_use_is_one_line(tmp_path: Path) -> None:
    url = filled(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_objq("dashboard", "--listen", f"127.0.0.1:{port}", url=url)
    one_line_error(result, 1, f"--listen 127.0.0.1:{port}")


def test_a_missing_directory_is_refused(tmp_path: Path) -> None:
    result = run_objq("dashboard", url=(tmp_path / "typo").as_uri())
    one_line_error(result, 1, "expected an existing directory")


def test_a_serving_dashboard_says_one_line_and_one_when_it_stops(
    tmp_path: Path, children: Children
) -> None:
    url = filled(tmp_path)
    log = tmp_path / "dashboard.log"
    command = [*objq_command(), "dashboard", "--url", url, "--listen", "127.0.0.1:0"]
    process = children.start(command, log=log)
    wait_for(lambda: "serving" in log.read_text() or "at http" in log.read_text(), 30, "serving")
    time.sleep(1.0)  # what a server says after it started comes within this
    serving = log.read_text().splitlines()
    children.stop(process)
    assert len(serving) == 1, serving
    assert serving[0].startswith(f"objq dashboard: {url} at http://127.0.0.1:"), serving
    assert log.read_text().splitlines()[1:] == ["objq dashboard: stopped"]
