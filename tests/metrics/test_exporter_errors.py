"""``objq exporter`` refuses what it cannot do in one line: a missing ``metrics`` extra, an
address it cannot listen on, a store that does not exist."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.cli.objq_cli import objq_command, one_line_error, run_objq
from tests.cli.test_missing_installs import run_without
from tests.metrics.exporter_process import start_exporter
from tests.support.processes import Children


def test_without_the_metrics_extra(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    (tmp_path / "store").mkdir()

    # Given prometheus_client cannot be imported
    # When the exporter starts
    result = run_without(
        tmp_path, ["prometheus_client"], [*objq_command(), "exporter", "--url", url]
    )

    # Then one line says what to install, and it is not reported as a bug
    one_line_error(
        result,
        1,
        "objq exporter needs prometheus_client",
        "No module named 'prometheus_client'",
        "pip install 'objq-broker[metrics]'",
    )
    assert "unexpected" not in result.stderr

    # And the other commands do not need it
    status = run_without(tmp_path, ["prometheus_client"], [*objq_command(), "status", "--url", url])
    assert status.code == 0, status.stderr

    # And importing the collectors names the extra too
    imported = run_without(
        tmp_path,
        ["prometheus_client"],
        [
            sys.executable,
            "-c",
            "try:\n"
            "    import objq_broker.metrics\n"
            "except ModuleNotFoundError as exc:\n"
            "    print(exc)\n",
        ],
    )
    assert "pip install 'objq-broker[metrics]'" in imported.stdout, imported.stderr


def test_an_address_already_in_use(children: Children, tmp_path: Path) -> None:
    # Given an exporter serving on a port
    url = (tmp_path / "store").as_uri()
    (tmp_path / "store").mkdir()
    first = start_exporter(children, url, tmp_path / "first.log")
    listen = first.url.removeprefix("http://").removesuffix("/metrics")

    # When a second one is asked to listen there
    result = run_objq("exporter", "--listen", listen, url=url)

    # Then it fails at once, in one line naming the address
    one_line_error(result, 1, f"--listen {listen}", "in use")


def test_a_missing_directory_is_refused_at_start(tmp_path: Path) -> None:
    url = (tmp_path / "typo").as_uri()

    result = run_objq("exporter", "--listen", "127.0.0.1:0", url=url)

    one_line_error(result, 1, "expected an existing directory")
    assert not (tmp_path / "typo").exists()


def test_a_malformed_listen_address_is_a_usage_error(tmp_path: Path) -> None:
    result = run_objq("exporter", "--listen", "7701", url=(tmp_path / "store").as_uri())

    one_line_error(result, 2, "--listen", "expected HOST:PORT", "'7701'")
