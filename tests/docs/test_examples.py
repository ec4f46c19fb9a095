"""The examples of the README and of the getting-started page run as a reader runs them.

Each runs in an empty folder, in a process of its own, as a file: the examples name their store
``file://objq-data`` (a folder of the working directory) or read ``$OBJQ_URL``, which points
there too. A Python block whose first line is ``# NAME.py`` is a module the reader saves (the
Dramatiq and Celery apps); the shell block after it is run line by line, a worker (``dramatiq``,
``celery``) in the background, as a reader starts one in another terminal. A Python block
followed by a ``text`` block must print what that block shows (``...`` matches anything).
"""

from __future__ import annotations

import ast
import doctest
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from objq_broker import Queue
from tests.support.processes import Children
from tests.support.servers import create_s3_bucket, new_bucket_name
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
#: The store every example names, relative to its working directory.
STORE = "objq-data"
#: Seconds an example, or a message through a worker, may take.
EXAMPLE_TIMEOUT_SECONDS = 60.0
#: Commands that run until stopped: started in the background.
WORKERS = ("dramatiq ", "celery ")

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>\w*)\n(?P<body>.*?)^(?P=indent)```$", re.M | re.S)
_MODULE = re.compile(r"^# (?P<name>\w+\.py)\n")


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    #: The line of the opening fence, for messages.
    line: int

    @property
    def module(self) -> str | None:
        """The file name a reader saves this block as, from its first line (``# app.py``)."""
        found = _MODULE.match(self.text)
        return found["name"] if found else None


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, in order, without their list indentation."""
    source = path.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(source):
        indent = len(match["indent"])
        body = "".join(line[indent:] for line in match["body"].splitlines(keepends=True))
        found.append(Block(match["lang"], body, source.count("\n", 0, match.start()) + 1))
    return found


def reader_env(folder: Path) -> dict[str, str]:
    """A reader's environment: this interpreter's scripts on PATH, no stray objq settings."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("OBJQ_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["OBJQ_URL"] = (folder / STORE).as_uri()
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_python(block: Block, folder: Path, name: str) -> str:
    script = folder / name
    script.write_text(block.text, encoding="utf-8")
    done = run_in(folder, [sys.executable, script.name])
    assert done.returncode == 0, f"the example at line {block.line} failed:\n{done.stderr}"
    return done.stdout


def run_in(folder: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` run in ``folder`` with a reader's environment, its output captured."""
    return subprocess.run(
        argv,
        cwd=folder,
        env=reader_env(folder),
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT_SECONDS,
        check=False,
    )


def assert_shows(want: str, got: str, line: int) -> None:
    checker = doctest.OutputChecker()
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    assert checker.check_output(want, got, flags), (
        f"the example at line {line} printed:\n{got}\nbut the page shows:\n{want}"
    )


def stats(folder: Path, queue: str) -> tuple[int, int, int, int]:
    with Queue((folder / STORE).as_uri(), broker="off") as q:
        counts = q.stats(queue)
    return counts.ready, counts.delayed, counts.in_flight, counts.dead


def queues(folder: Path) -> list[str]:
    if not (folder / STORE / "state.json").exists():
        return []
    with Queue((folder / STORE).as_uri(), broker="off") as q:
        return q.queues()


def app_and_commands(path: Path, module: str) -> tuple[Block, list[str]]:
    """The block saved as ``module`` and the command lines of the shell block after it."""
    found = blocks(path)
    for index, block in enumerate(found):
        if block.module == module:
            shell = next(b for b in found[index + 1 :] if b.lang == "sh")
            return block, [line for line in shell.text.splitlines() if line.strip()]
    raise AssertionError(f"{path.name} has no block saved as {module}")


def run_commands(
    commands: list[str], folder: Path, children: Children, *, before_foreground: str | None = None
) -> str:
    """Run a shell block's lines in ``folder``: workers in the background (their output in
    ``worker.log``), the rest to completion; returns what the foreground lines printed."""
    printed = []
    for command in commands:
        if command.startswith(WORKERS):
            children.start(
                ["sh", "-c", command],
                cwd=folder,
                env=reader_env(folder),
                log=folder / "worker.log",
                group=True,
            )
            continue
        if before_foreground is not None:
            wait_for(
                lambda: before_foreground in queues(folder),
                EXAMPLE_TIMEOUT_SECONDS,
                f"the worker to consume {before_foreground!r}",
            )
        done = run_in(folder, ["sh", "-c", command])
        assert done.returncode == 0, f"{command!r} failed:\n{done.stderr}"
        printed.append(done.stdout)
    return "".join(printed)


def worker_log(folder: Path) -> str:
    path = folder / "worker.log"
    return path.read_text(errors="replace") if path.exists() else ""


def test_the_pages_have_the_examples_this_test_runs() -> None:
    readme = [block for block in blocks(README) if block.lang == "python"]
    assert [block.module for block in readme] == [None, "app.py", "tasks.py"]
    assert len([b for b in blocks(GETTING_STARTED) if b.lang == "python"]) >= 3


@pytest.mark.timeout(120)
def test_the_readme_queue_example_sends_one_job_and_delays_the_other(tmp_path: Path) -> None:
    [example] = [b for b in blocks(README) if b.lang == "python" and b.module is None]
    # When the example runs in an empty folder
    printed = run_python(example, tmp_path, "example.py")
    # Then it did the ready job, and the delayed one waits (nothing held, nothing dead)
    assert printed == 'sending {"to": "ada@example.com"}\n'
    assert stats(tmp_path, "emails") == (0, 1, 0, 0)


@pytest.mark.timeout(120)
def test_the_readme_queue_example_runs_on_s3_once_the_bucket_exists(
    tmp_path: Path, moto_endpoint: str
) -> None:
    [example] = [b for b in blocks(README) if b.lang == "python" and b.module is None]
    bucket = new_bucket_name()
    url = f"s3://{bucket}/jobs?endpoint_url={moto_endpoint}"
    on_s3 = Block(example.lang, example.text.replace('"file://objq-data"', repr(url)), example.line)
    assert on_s3.text != example.text
    # Given no bucket: the example fails, saying so (the set-up list's first step)
    with pytest.raises(AssertionError, match="the bucket does not exist"):
        run_python(on_s3, tmp_path, "example.py")
    # When the bucket exists, the same example, nothing else changed, runs
    create_s3_bucket(moto_endpoint, bucket)
    assert run_python(on_s3, tmp_path, "example.py") == 'sending {"to": "ada@example.com"}\n'
    with Queue(url, broker="off") as q:
        counts = q.stats("emails")
    assert (counts.ready, counts.delayed, counts.in_flight, counts.dead) == (0, 1, 0, 0)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_readme_dramatiq_example_runs_its_message_in_a_dramatiq_worker(
    tmp_path: Path, children: Children
) -> None:
    app, commands = app_and_commands(README, "app.py")
    assert commands[-1].startswith("dramatiq "), commands
    (tmp_path / "app.py").write_text(app.text, encoding="utf-8")
    # When the reader sends, then starts `dramatiq app`
    run_commands(commands, tmp_path, children)
    # Then the worker runs the actor, and the queue is left empty
    wait_for(
        lambda: "Hello, Ada!" in worker_log(tmp_path),
        EXAMPLE_TIMEOUT_SECONDS,
        "the Dramatiq worker to greet Ada",
        progress=lambda: worker_log(tmp_path)[-2000:],
    )
    wait_for(
        lambda: stats(tmp_path, "default") == (0, 0, 0, 0),
        EXAMPLE_TIMEOUT_SECONDS,
        "the message to be acked",
        progress=lambda: stats(tmp_path, "default"),
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_readme_celery_example_gets_its_result_from_a_celery_worker(
    tmp_path: Path, children: Children
) -> None:
    app, commands = app_and_commands(README, "tasks.py")
    assert commands[0].startswith("celery "), commands
    (tmp_path / "tasks.py").write_text(app.text, encoding="utf-8")
    # When the reader starts `celery -A tasks worker`, then calls the task from another shell
    printed = run_commands(commands, tmp_path, children, before_foreground="celery")
    # Then the worker ran it, and the result came back through objq's result backend
    assert printed == "5\n", worker_log(tmp_path)[-2000:]


@pytest.mark.timeout(180)
def test_the_getting_started_examples_run_in_order_and_print_what_the_page_shows(
    tmp_path: Path,
) -> None:
    found = blocks(GETTING_STARTED)
    ran = 0
    for index, block in enumerate(found):
        if block.lang != "python":
            continue
        printed = run_python(block, tmp_path, f"step{index}.py")
        ran += 1
        after = found[index + 1] if index + 1 < len(found) else None
        if after is not None and after.lang == "text":
            assert_shows(after.text, printed, block.line)
    assert ran >= 3
    # Then one job of five is dead, with the error the worker gave it
    assert stats(tmp_path, "thumbnails") == (0, 0, 0, 1)
    with Queue((tmp_path / STORE).as_uri(), broker="off") as q:
        [dead] = q.dead_letters("thumbnails")
    assert dead.attempts == 3
    assert dead.error is not None and "image-3.png: not an image" in dead.error


@pytest.mark.parametrize(
    "page",
    [README, *sorted((ROOT / "docs").glob("*.md"))],
    ids=lambda page: page.relative_to(ROOT).as_posix(),
)
def test_every_python_block_of_the_docs_is_python(page: Path) -> None:
    """The examples no test runs (they need S3, a cluster or an app) still parse."""
    for block in blocks(page):
        if block.lang == "python":
            try:
                ast.parse(block.text)
            except SyntaxError as exc:
                pytest.fail(f"{page.name}, line {block.line + (exc.lineno or 0)}: {exc.msg}")
