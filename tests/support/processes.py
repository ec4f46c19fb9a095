"""Child processes of a test: started, signalled, stopped and reaped in one way.

A test that starts workers or servers registers each process with a ``Children`` (the
``children`` fixture gives every test its own), which stops and reaps whatever is still running
when the test ends, passed or failed. A process started in a session of its own (``group=True``)
is signalled as a process group, so a signal reaches everything it started too (a Dramatiq or
Celery worker's pool, a command's own children).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

#: Seconds a process gets to exit after SIGTERM before it is killed.
STOP_GRACE_SECONDS = 30.0
#: Seconds to wait for a killed process to be reaped (SIGKILL cannot be ignored).
REAP_TIMEOUT_SECONDS = 10.0

P = TypeVar("P", bound="subprocess.Popen[Any]")


def send_signal(process: subprocess.Popen[Any], sig: int, *, group: bool = False) -> None:
    """Send ``sig`` to a process, or to its whole process group; nothing once it is reaped.

    A group is signalled even when its leader has exited but is not reaped yet, so whatever the
    leader started still gets the signal. After reaping, the pid may belong to another process.
    """
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        if group:
            os.killpg(process.pid, sig)
        else:
            process.send_signal(sig)  # a no-op once it has exited


def reap(process: subprocess.Popen[Any], timeout: float = REAP_TIMEOUT_SECONDS) -> int:
    """Wait for ``process`` to exit, close our ends of its pipes, and return its exit status.

    Output nobody read is dropped, never waited for: a process it started (a command orphaned by
    a killed worker, say) may keep those pipes open long after it exited.
    """
    returncode = process.wait(timeout=timeout)
    for stream in (process.stdout, process.stderr, process.stdin):
        if stream is not None:
            with contextlib.suppress(BrokenPipeError):  # stdin: unsent input, nobody to read it
                stream.close()
    return returncode


def kill(process: subprocess.Popen[Any], *, group: bool = False) -> int:
    """SIGKILL a process (or its group, as a crashed host would) and reap it."""
    send_signal(process, signal.SIGKILL, group=group)
    return reap(process)


def terminate(
    process: subprocess.Popen[Any],
    grace_seconds: float = STOP_GRACE_SECONDS,
    *,
    group: bool = False,
) -> bool:
    """SIGTERM, then SIGKILL if the process still runs after the grace; reaped either way.

    Returns whether it exited on SIGTERM within the grace (False: it had to be killed).
    """
    send_signal(process, signal.SIGTERM, group=group)
    return _exited_within(process, grace_seconds, group=group)


def _exited_within(process: subprocess.Popen[Any], seconds: float, *, group: bool) -> bool:
    """Reap ``process`` if it exits within ``seconds``; otherwise kill it. Whether it did."""
    try:
        reap(process, timeout=max(seconds, 0.0))
    except subprocess.TimeoutExpired:
        kill(process, group=group)
        return False
    return True


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (not a child of ours), if it still exists."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody reaped yet counts as gone). Linux only."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


class Children:
    """The processes one test started; ``stop_all`` (or leaving the ``with``) stops them all.

    ::

        with Children() as children:
            worker = children.start([sys.executable, "-m", "dramatiq", "app"], group=True)
            ...
            children.stop(worker)  # SIGTERM to its group, SIGKILL after the grace
    """

    def __init__(self) -> None:
        self._started: list[tuple[subprocess.Popen[Any], bool]] = []

    def start(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        log: Path | None = None,
        quiet: bool = False,
        group: bool = False,
    ) -> subprocess.Popen[bytes]:
        """Run ``command`` with no stdin, its output appended to ``log``, else dropped if
        ``quiet``, else on the test's own output (which pytest shows when the test fails).

        ``group=True`` makes it the leader of a new session and process group, signalled whole.
        """
        if log is None:
            output = subprocess.DEVNULL if quiet else None
            return self.adopt(self._popen(command, env, cwd, output, group), group)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as file:  # the child keeps its own copy of the descriptor
            return self.adopt(self._popen(command, env, cwd, file, group), group)

    def adopt(self, process: P, group: bool = False) -> P:
        """Track a process started elsewhere (to give it pipes, say) like one from ``start``."""
        self._started.append((process, group))
        return process

    def send_signal(self, process: subprocess.Popen[Any], sig: int) -> None:
        """Send ``sig`` to a tracked process, to its whole group if it was started as one."""
        send_signal(process, sig, group=self._group_of(process))

    def kill(self, process: subprocess.Popen[Any]) -> int:
        """SIGKILL a tracked process (its whole group if it leads one) and reap it."""
        return kill(process, group=self._group_of(process))

    def stop(
        self, process: subprocess.Popen[Any], grace_seconds: float = STOP_GRACE_SECONDS
    ) -> bool:
        """Terminate a tracked process (see ``terminate``); whether it exited on SIGTERM."""
        return terminate(process, grace_seconds, group=self._group_of(process))

    def stop_all(self, grace_seconds: float = STOP_GRACE_SECONDS) -> list[subprocess.Popen[Any]]:
        """SIGTERM every tracked process at once, then SIGKILL the ones still running after
        the grace; all are reaped. Returns the ones that had to be killed."""
        started, self._started = self._started, []
        for process, group in started:
            send_signal(process, signal.SIGTERM, group=group)
        deadline = time.monotonic() + grace_seconds
        return [
            process
            for process, group in started
            if not _exited_within(process, deadline - time.monotonic(), group=group)
        ]

    def __enter__(self) -> Children:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop_all()

    def _group_of(self, process: subprocess.Popen[Any]) -> bool:
        for tracked, group in self._started:
            if tracked is process:
                return group
        raise ValueError(f"process {process.pid} ({process.args!r}) was not started here")

    @staticmethod
    def _popen(
        command: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: Path | None,
        output: int | IO[bytes] | None,
        group: bool,
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(command),
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=group,
        )
