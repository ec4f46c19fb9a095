"""What ``objq`` shows people cannot drive their terminal.

Payloads, errors and queue names are chosen by whoever writes to the bucket. Shown raw, an
escape sequence in one could clear the screen, retitle the terminal or forge lines of a table.
The output for people escapes every control character (C0 with newline and tab, DEL, C1) and the
Unicode bidirectional controls; ``--json`` output stays exactly as it was.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.cli.objq_cli import COMMAND_TIMEOUT_SECONDS, environment, objq_command
from tests.cli.objq_cli import run_objq as objq

#: Retitles the terminal, clears it, turns text red, holds a C1 CSI, a DEL and a right-to-left
#: override, then forges a line of the jobs table.
HOSTILE = (
    "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x9b\x7f\u202eexe.txt\u2066"
    "\nffffffffffffffffffffffffffffffff  ready  0  0/5  forged"
)
#: What a terminal would act on, none of which may reach it raw.
RAW_CONTROLS = ["\x1b", "\x07", "\x9b", "\x7f", "\u202e", "\u2066"]
#: Writes the hostile text to stderr and fails.
HOSTILE_STDERR_SCRIPT = "import sys; sys.stderr.write(sys.argv[1]); sys.exit(2)"
#: A queue name no API call accepts, as a writer of the bucket can store it all the same.
HOSTILE_QUEUE = "t\x1b]0;pwned\x07ty\u202e"


def _assert_escaped(text: str) -> None:
    for control in RAW_CONTROLS:
        assert control not in text, (control, text)


def test_jobs_and_dead_letters_are_shown_escaped(file_url: str) -> None:
    # Given a hostile payload, and a command job that dies with a hostile error
    assert objq("declare", "tty", "--max-attempts", "1", url=file_url).code == 0
    [payload_id] = objq("enqueue", "tty", HOSTILE, "--json", url=file_url).json()["ids"]
    enqueued = objq(
        "enqueue-cmd",
        "tty",
        "--json",
        "--",
        sys.executable,
        "-c",
        HOSTILE_STDERR_SCRIPT,
        HOSTILE,
        url=file_url,
    )
    [command_id] = enqueued.json()["ids"]
    worker = subprocess.run(
        [*objq_command(), "worker", "--queue", "tty", "--burst"],
        check=False,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=environment(file_url),
        timeout=COMMAND_TIMEOUT_SECONDS,
    )
    assert worker.returncode == 0, worker.stderr
    # The worker's own lines about the job, which quote its error, are escaped too
    assert "exit code 2: \\x1b]0;pwned\\x07" in worker.stderr
    _assert_escaped(worker.stderr)

    # When people list, show and inspect them
    listed = objq("jobs", "list", "tty", url=file_url)
    dead = objq("dead", "list", "tty", url=file_url)
    shown = {
        job_id: objq("jobs", "show", job_id, url=file_url) for job_id in (payload_id, command_id)
    }

    # Then no control character reaches the terminal
    for result in [listed, dead, *shown.values()]:
        assert result.code == 0, result.stderr
        _assert_escaped(result.stdout)
    # and no line is forged: one header and the two jobs, the payload's newline added no row
    assert len(listed.stdout.splitlines()) == 3
    assert len(dead.stdout.splitlines()) == 3
    assert "\\x1b]0;pwned\\x07\\x1b[2J" in listed.stdout
    payload_line = next(
        line for line in shown[payload_id].stdout.splitlines() if "payload:" in line
    )
    assert payload_line.endswith(
        "payload: \\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mred\\x9b\\x7f\\u202eexe.txt\\u2066"
        "\\nffffffffffffffffffffffffffffffff  ready  0  0/5  forged"
    )
    # Every line of `jobs show` is one field: none came from the payload or the error
    for line in shown[command_id].stdout.splitlines():
        name, sep, _ = line.partition(": ")
        assert sep and name.strip().isidentifier(), line

    # And --json still gives the exact text stored
    as_json = objq("jobs", "show", payload_id, "--json", url=file_url).json()
    assert as_json["payload"] == HOSTILE
    [dead_json] = [
        job
        for job in objq("dead", "list", "tty", "--json", url=file_url).json()
        if job["id"] == command_id
    ]
    assert dead_json["error"] == f"exit code 2: {HOSTILE.strip()}"


def test_queue_names_from_the_state_and_error_lines_are_escaped(
    file_url: str, tmp_path: Path
) -> None:
    # Given a state in which a writer of the bucket named a queue with escape sequences (the
    # API refuses such names, but the state is just an object anyone with write access writes)
    assert objq("enqueue", "tty", "x", url=file_url).code == 0
    state = tmp_path / "store" / "state.json"
    text = state.read_text()
    assert text.count('"tty"') >= 1
    state.write_text(text.replace('"tty"', json.dumps(HOSTILE_QUEUE)))

    # When people look at the status, the settings and a job of that queue
    status = objq("status", url=file_url)
    config = objq("config", "show", url=file_url)
    listed = objq("jobs", "list", HOSTILE_QUEUE, url=file_url)
    missing = objq("jobs", "show", "\x1b[2Jno-such-job", url=file_url)

    # Then the name is shown escaped, and so is an error line that quotes input
    for result in (status, config, listed):
        assert result.code == 0, result.stderr
        _assert_escaped(result.stdout)
    assert "t\\x1b]0;pwned\\x07ty\\u202e" in status.stdout
    assert "t\\x1b]0;pwned\\x07ty\\u202e" in config.stdout
    assert missing.code == 1 and "no-such-job" in missing.stderr
    _assert_escaped(missing.stderr)
    # And --json gives the name as stored
    [queue] = objq("status", "--json", url=file_url).json()["queues"]
    assert queue["queue"] == HOSTILE_QUEUE
