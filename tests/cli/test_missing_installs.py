"""A missing optional install (boto3, google-cloud-storage, pyspark) is a setup to fix: one line
that names what to install, exit status 1, from the command and from the Python API alike.

Each case runs in a child process whose ``sitecustomize`` hides the modules, as an install
without the extra would: ``import boto3`` fails with "No module named 'boto3'", and without
google-cloud-storage ``from google.cloud import storage`` fails with a plain ImportError
(``google.cloud`` is still there, a namespace package of the other google-cloud libraries).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.objq_cli import (
    COMMAND_TIMEOUT_SECONDS,
    Result,
    environment,
    objq_command,
    one_line_error,
)

HIDING = '''
import sys

HIDDEN = {hidden!r}


class _NotInstalled:
    """Finds nothing, as if the hidden modules had never been installed."""

    def find_spec(self, name, path=None, target=None):
        if any(name == top or name.startswith(top + ".") for top in HIDDEN):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
'''


def run_without(tmp_path: Path, hidden: list[str], command: list[str]) -> Result:
    """Run ``command`` with ``hidden`` modules (and their submodules) not importable."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(HIDING.format(hidden=hidden))
    env = environment(None)
    env["PYTHONPATH"] = str(site)
    done = subprocess.run(
        command,
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=COMMAND_TIMEOUT_SECONDS,
    )
    return Result(done.returncode, done.stdout, done.stderr)


@pytest.mark.parametrize(
    ("hidden", "url", "fragments"),
    [
        (
            ["boto3"],
            "s3://jobs-bucket/q?region=eu-west-1",
            ["s3:// needs boto3", "No module named 'boto3'", "pip install 'objq-broker[s3]'"],
        ),
        (
            ["google.cloud.storage"],
            "gs://jobs-bucket/q",
            ["gs:// needs google-cloud-storage", "pip install 'objq-broker[gcs]'"],
        ),
        (
            ["google"],
            "gs://jobs-bucket/q",
            ["gs:// needs google-cloud-storage", "pip install 'objq-broker[gcs]'"],
        ),
    ],
)
def test_a_store_sdk_that_is_not_installed(
    tmp_path: Path, hidden: list[str], url: str, fragments: list[str]
) -> None:
    # Given the SDK of the URL's scheme cannot be imported
    # When the command opens the store
    result = run_without(tmp_path, hidden, [*objq_command(), "status", "--url", url])

    # Then one line says what to install, and it is not reported as a bug
    one_line_error(result, 1, *fragments)
    assert "unexpected" not in result.stderr and "please report" not in result.stderr

    # And the Python API raises the same ConfigurationError
    opened = run_without(
        tmp_path,
        hidden,
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from objq_broker import Queue\n"
            "from objq_broker.errors import ConfigurationError\n"
            "try:\n"
            "    Queue(sys.argv[1])\n"
            "except ConfigurationError as exc:\n"
            "    print(exc)\n",
            url,
        ],
    )
    assert opened.code == 0, opened.stderr
    assert opened.stdout.strip() in result.stderr


def test_report_without_the_spark_extra(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()

    result = run_without(tmp_path, ["pyspark"], [*objq_command(), "report", "--url", url])

    one_line_error(result, 1, "objq report needs pyspark", "pip install 'objq-broker[spark]'")
    assert "unexpected" not in result.stderr
