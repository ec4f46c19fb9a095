"""Command jobs: the payload format, and running one command with a timeout.

A command job's payload is one JSON object::

    {"argv": ["convert", "in.png", "out.jpg"], "timeout": 120, "env": {"LANG": "C"}, "cwd": "/srv"}
    {"argv": ["gzip -9 /var/log/app/*.log"], "shell": true}

``argv`` (required) is run as is, without a shell, unless ``shell`` is true: then it holds one
string, run by ``/bin/sh -c``. ``timeout`` (seconds) overrides the worker's ``--timeout``.
``env`` is added to the worker's environment; ``cwd`` is the directory to run in. Unknown
fields are refused, so a misspelt option is never silently ignored.

Each command runs in a process group of its own. On timeout the whole group gets SIGTERM, then
SIGKILL after :data:`KILL_GRACE_SECONDS`, so children a command started cannot outlive it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import IO

import msgspec

from objq_broker.errors import ConfigurationError

#: Seconds a timed-out command's process group gets between SIGTERM and SIGKILL.
KILL_GRACE_SECONDS = 3.0
#: Bytes of a failed command's stderr kept as the job's error.
STDERR_TAIL_BYTES = 2000
#: How often a running command is checked for its deadline and for a forced stop.
POLL_SECONDS = 0.05


class CommandJob(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The payload of a command job (see the module docstring)."""

    argv: list[str]
    shell: bool = False
    timeout: float | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)
    cwd: str | None = None

    def encode(self) -> bytes:
        check(self)
        return msgspec.json.encode(self)

    def command(self) -> list[str]:
        return ["/bin/sh", "-c", self.argv[0]] if self.shell else list(self.argv)


_decoder = msgspec.json.Decoder(CommandJob)


def check(job: CommandJob) -> CommandJob:
    if not job.argv:
        raise ConfigurationError("command job: expected a non-empty argv, found []")
    if job.shell and len(job.argv) != 1:
        raise ConfigurationError(
            f"command job: with shell, expected argv to hold one script, found {len(job.argv)} "
            "strings"
        )
    if job.timeout is not None and job.timeout <= 0:
        raise ConfigurationError(f"command job: expected a positive timeout, found {job.timeout}")
    return job


def decode(payload: bytes) -> CommandJob:
    """The command job in ``payload``, or :class:`ConfigurationError` saying what is wrong."""
    try:
        return check(_decoder.decode(payload))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigurationError(
            f'command job: expected a JSON object like {{"argv": ["cmd", "arg"]}}, found '
            f"{payload[:60]!r} ({exc})"
        ) from exc


@dataclass(frozen=True)
class Outcome:
    """How one run of a command ended."""

    exit_code: int | None  # None when it could not start
    seconds: float
    error: str | None  # None on success

    @property
    def ok(self) -> bool:
        return self.error is None


def run(
    job: CommandJob,
    *,
    default_timeout: float | None,
    stdout: int | IO[bytes] | None,
    abort: threading.Event,
) -> Outcome:
    """Run ``job`` to its end, its timeout, or ``abort`` (which kills it like a timeout)."""
    timeout = job.timeout if job.timeout is not None else default_timeout
    env = {**os.environ, **job.env} if job.env else None
    started = time.monotonic()
    with tempfile.TemporaryFile() as stderr:
        try:
            process = subprocess.Popen(
                job.command(),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=env,
                cwd=job.cwd,
                start_new_session=True,  # its own process group: a timeout kills all of it
            )
        except OSError as exc:
            return Outcome(
                None, time.monotonic() - started, f"could not start {job.argv[0]}: {exc}"
            )
        reason = _wait(process, None if timeout is None else started + timeout, abort)
        if reason is not None:
            _kill_group(process)
        seconds = time.monotonic() - started
        code = process.returncode
        if reason is None and code == 0:
            return Outcome(0, seconds, None)
        tail = _tail(stderr)
        if reason == "timeout":
            what = f"timed out after {timeout:g} s; its process group was killed"
        elif reason == "abort":
            what = "stopped by the worker's shutdown; its process group was killed"
        elif code < 0:
            what = f"killed by {signal.Signals(-code).name}"
        else:
            what = f"exit code {code}"
        return Outcome(code, seconds, f"{what}: {tail}" if tail else what)


def _wait(
    process: subprocess.Popen[bytes], deadline: float | None, abort: threading.Event
) -> str | None:
    while True:
        try:
            process.wait(POLL_SECONDS)
            return None
        except subprocess.TimeoutExpired:
            pass
        if abort.is_set():
            return "abort"
        if deadline is not None and time.monotonic() >= deadline:
            return "timeout"


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_SECONDS), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):  # the group may be gone already
            os.killpg(process.pid, sig)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            continue
        if sig is signal.SIGTERM:
            # The leader is gone, but members of its group may linger: finish them too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        return


def _tail(stream: IO[bytes]) -> str:
    stream.seek(0, os.SEEK_END)
    length = stream.tell()
    stream.seek(max(length - STDERR_TAIL_BYTES, 0))
    text = stream.read().decode("utf-8", errors="replace").strip()
    return ("…" + text) if length > STDERR_TAIL_BYTES else text
