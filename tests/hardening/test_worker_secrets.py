"""``objq worker`` keeps its secrets out of the bucket, and jobs out of its loader.

A failed command's stderr becomes the job's error, stored in the state and the archive where
whoever reads the bucket reads it: the worker's secret-looking environment values and known
secret patterns must not get there. A job's ``env`` may not change which program runs or what
code it loads unless the worker allows it. Every test runs real ``objq`` processes.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from objq_broker.storage import open_store
from tests.cli.objq_cli import COMMAND_TIMEOUT_SECONDS, Result, environment, objq_command
from tests.cli.objq_cli import run_objq as objq

#: Prints a file to stderr, then the worker's own secret again, then a harmless variable, and
#: fails: the secrets come from the file and the environment, never from the payload.
LEAKING_SCRIPT = """
import os, sys
for name, value in sorted(os.environ.items()):
    print(f"{name}={value}", file=sys.stderr)
sys.stderr.write(open(sys.argv[1]).read())
print("token again:", os.environ["OBJQ_TEST_API_TOKEN"], file=sys.stderr)
print("greeting:", os.environ["OBJQ_TEST_GREETING"], file=sys.stderr)
sys.exit(3)
"""
#: Writes about ``argv[1]`` bytes of filler to stderr, the worker's secret in the middle of them
#: and at the end, then a last line; fails.
FLOODING_SCRIPT = """
import os, sys
size = int(sys.argv[1]) // 2
secret = os.environ["OBJQ_TEST_API_TOKEN"]
sys.stderr.write(("filler " * 20 + "\\n") * (size // 141) + f"middle {secret}\\n")
sys.stderr.write(("filler " * 20 + "\\n") * (size // 141) + f"end {secret}\\nthe last line\\n")
sys.exit(1)
"""


def _secrets() -> dict[str, str]:
    return {
        "OBJQ_TEST_API_TOKEN": f"tok-{uuid.uuid4().hex}",
        "DB_PASSWORD": f"pw-{uuid.uuid4().hex}",
        "MY_PRIVATE_THING": f"priv-{uuid.uuid4().hex}",
    }


def _worker(url: str, queue: str, extra_env: dict[str, str], *args: str) -> Result:
    """One ``objq worker --burst --json`` run with ``extra_env`` in its environment."""
    done = subprocess.run(
        [*objq_command(), "worker", "--queue", queue, "--burst", "--json", *args],
        check=False,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env={**environment(url), **extra_env},
        timeout=COMMAND_TIMEOUT_SECONDS,
    )
    return Result(done.returncode, done.stdout, done.stderr)


def _everything_stored(url: str) -> bytes:
    """Every object of the store, concatenated: state, archive, bodies, all of it."""
    store = open_store(url)
    try:
        keys = store.list("")
        assert keys, "the store holds nothing"
        return b"\n".join(store.get(key) for key in keys)
    finally:
        store.close()


def test_a_failed_commands_stored_error_holds_no_secret(cli_url: str, tmp_path: Path) -> None:
    # Given a worker whose environment holds secrets, and a command that prints them all
    secrets = _secrets()
    url_password = f"upw{uuid.uuid4().hex[:12]}"
    bearer = f"eyJ{uuid.uuid4().hex}"
    access_key_id = "AKIA" + uuid.uuid4().hex[:16].upper()
    file_secret = uuid.uuid4().hex
    pem_body = uuid.uuid4().hex
    printed = tmp_path / "printed.txt"
    printed.write_text(
        f"connecting to postgres://app:{url_password}@db:5432/orders\n"
        f"Authorization: Bearer {bearer}\n"
        f"key id {access_key_id}\n"
        f"aws_secret_access_key = {file_secret}\n"
        f"-----BEGIN RSA PRIVATE KEY-----\n{pem_body}\n-----END RSA PRIVATE KEY-----\n"
    )
    assert objq("declare", "leaky", "--max-attempts", "1", url=cli_url).code == 0
    enqueued = objq(
        "enqueue-cmd",
        "leaky",
        "--json",
        "--",
        sys.executable,
        "-c",
        LEAKING_SCRIPT,
        str(printed),
        url=cli_url,
    )
    [job_id] = enqueued.json()["ids"]

    # When the worker runs it into the dead letters
    env = {**secrets, "OBJQ_TEST_GREETING": "hello-from-the-worker"}
    ran = _worker(cli_url, "leaky", env)

    # Then the error says what happened, with every secret replaced by ***
    assert ran.code == 0, ran.stderr
    [dead] = objq("dead", "list", "leaky", "--json", url=cli_url).json()
    error = dead["error"]
    assert dead["id"] == job_id and error.startswith("exit code 3: "), error
    assert "greeting: hello-from-the-worker" in error  # what is not secret stays
    assert "token again: ***" in error
    assert "postgres://app:***@db:5432/orders" in error
    assert "Authorization: ***" in error
    assert "aws_secret_access_key = ***" in error
    assert "[private key ***]" in error
    [archived] = objq("archive", "cat", "--queue", "leaky", url=cli_url).json_lines()
    assert (archived["id"], archived["state"], archived["error"]) == (job_id, "dead", error)
    # And no secret is anywhere in the store, nor in what the worker printed
    stored = _everything_stored(cli_url)
    for secret in [*secrets.values(), url_password, bearer, access_key_id, file_secret, pem_body]:
        assert secret.encode() not in stored, secret
        assert secret not in ran.stdout, secret


def test_a_long_stderr_is_cut_to_its_end_and_says_so(file_url: str, tmp_path: Path) -> None:
    # Given a command that writes 300 kB to stderr, its worker's secret inside and at the end
    secrets = _secrets()
    assert objq("declare", "noisy", "--max-attempts", "1", url=file_url).code == 0
    enqueued = objq(
        "enqueue-cmd",
        "noisy",
        "--",
        sys.executable,
        "-c",
        FLOODING_SCRIPT,
        "300000",
        url=file_url,
    )
    assert enqueued.code == 0, enqueued.stderr

    ran = _worker(file_url, "noisy", secrets)

    # Then the stored error is the end of stderr, bounded, saying it was cut, with no secret
    assert ran.code == 0, ran.stderr
    [dead] = objq("dead", "list", "noisy", "--json", url=file_url).json()
    error: str = dead["error"]
    assert error.startswith("exit code 1: [stderr cut to its last 2,000 characters of 299,"), error
    assert error.endswith("end ***\nthe last line")
    assert len(error) < 2200
    assert secrets["OBJQ_TEST_API_TOKEN"].encode() not in _everything_stored(file_url)


def test_env_that_changes_what_runs_is_refused_unless_allowed(
    file_url: str, tmp_path: Path
) -> None:
    # Given jobs that set LD_PRELOAD, PATH and PYTHONPATH, then a plain job, with 3 attempts
    assert objq("declare", "envs", "--max-attempts", "3", url=file_url).code == 0
    marker = tmp_path / "ran"

    def enqueue(*env: str) -> str:
        options = [item for pair in (("--env", e) for e in env) for item in pair]
        command = [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write('x')"]
        result = objq(
            "enqueue-cmd", "envs", "--json", *options, "--", *command, str(marker), url=file_url
        )
        assert result.code == 0, result.stderr
        ids: list[str] = result.json()["ids"]
        return ids[0]

    preload = enqueue("LD_PRELOAD=/tmp/evil.so", "LANG=C")
    path = enqueue("PATH=/tmp/evil-bin")
    pythonpath = enqueue("PYTHONPATH=/tmp/evil-lib")
    plain = enqueue("LANG=C")

    # When a worker runs them, allowing PYTHONPATH only
    ran = _worker(file_url, "envs", {}, "--allow-env", "PYTHONPATH")

    # Then the two refused jobs are dead at their first attempt, their errors naming the key,
    # and the worker went on: the allowed one and the plain one ran
    assert ran.code == 0, ran.stderr
    finished = {e["id"]: e["outcome"] for e in ran.json_lines() if e["event"] == "finished"}
    assert finished == {preload: "dead", path: "dead", pythonpath: "done", plain: "done"}
    dead = {job["id"]: job for job in objq("dead", "list", "envs", "--json", url=file_url).json()}
    assert set(dead) == {preload, path}
    assert dead[preload]["attempts"] == 1 and dead[path]["attempts"] == 1
    assert "'LD_PRELOAD'" in dead[preload]["error"] and "--allow-env" in dead[preload]["error"]
    assert "'PATH'" in dead[path]["error"]
    assert marker.read_text() == "xx"
