"""The two-host Dramatiq example of docs/deploy.md, run on two test hosts (network namespaces,
tests/support/hosts.py) with the page's own app, environment files and command.

Only what a test must change is changed: the store is a folder both hosts see (instead of
S3), each host's advertised address is its test address, and the workers are smaller (two
processes or pool children per host, which still share the page's fixed port). The rest, port
and token included, is the page's.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from objq_broker.engine.snapshot import Snapshot
from objq_broker.storage import open_store
from tests.docs.test_examples import ROOT, Block, blocks, reader_env
from tests.support.hosts import Host, make_hosts
from tests.support.processes import Children
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

DEPLOY = ROOT / "docs" / "deploy.md"
DRAMATIQ = "### Two hosts with Dramatiq"
CELERY = "### Two hosts with Celery, and a prefork fleet"
SENT = 20
TIMEOUT_SECONDS = 60.0


@pytest.fixture
def hosts() -> Iterator[list[Host]]:
    yield from make_hosts(["a", "b"])


def section_blocks(title: str) -> list[Block]:
    text = DEPLOY.read_text(encoding="utf-8")
    start = text.index(title)
    line = text.count("\n", 0, start) + 1
    # The section ends at the next heading of its level or above.
    ends = [text.find(mark, start + len(title)) for mark in ("\n## ", "\n### ")]
    end = min((at for at in ends if at >= 0), default=len(text))
    last = text.count("\n", 0, end) + 1
    return [block for block in blocks(DEPLOY) if line < block.line < last]


def environment(block: Block) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in block.text.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs if not key.startswith("#")}


def host_env(folder: Path, url: str, host: Host, file: Block) -> dict[str, str]:
    """A reader's environment on ``host`` from one of the page's environment files, with the
    test's store and the host's test address."""
    env = reader_env(folder) | environment(file)
    port = env["OBJQ_BROKER_ADVERTISE"].rsplit(":", 1)[1]
    return env | {"OBJQ_URL": url, "OBJQ_BROKER_ADVERTISE": f"{host.address}:{port}"}


def broker_address(url: str) -> str | None:
    record = Snapshot.read(open_store(url)).broker
    return None if record is None else record.address


def clients(url: str) -> int:
    return Snapshot.read(open_store(url)).broker_clients()


def greeted(folder: Path) -> int:
    return sum(path.read_text(errors="replace").count("Hello, ") for path in folder.glob("*.log"))


def start_on_both_hosts(  # noqa: PLR0917 (the page's parts and the test's)
    children: Children,
    folder: Path,
    url: str,
    hosts: list[Host],
    files: list[Block],
    command: str,
) -> tuple[Host, dict[str, str], str]:
    """Start the page's worker ``command`` on host a with the first environment file, wait
    until it serves as the broker at the address and port the page gives it, then start it
    on host b with the second: host b, its environment, and where the broker serves."""
    a, b = hosts
    env_a, env_b = host_env(folder, url, a, files[0]), host_env(folder, url, b, files[1])
    port = env_a["OBJQ_BROKER_LISTEN"].rsplit(":", 1)[1]
    children.start(
        a.command(["sh", "-c", command]), env=env_a, cwd=folder, log=folder / "a.log", group=True
    )
    wait_for(
        lambda: broker_address(url) == f"{a.address}:{port}",
        TIMEOUT_SECONDS,
        "host a's worker to serve at its advertised address",
        progress=lambda: broker_address(url),
    )
    children.start(
        b.command(["sh", "-c", command]), env=env_b, cwd=folder, log=folder / "b.log", group=True
    )
    return b, env_b, f"{a.address}:{port}"


def test_the_two_host_dramatiq_example_shares_one_broker_across_the_hosts(
    tmp_path: Path, hosts: list[Host], children: Children
) -> None:
    found = section_blocks(DRAMATIQ)
    [app] = [block for block in found if block.module == "app.py"]
    files = [block for block in found if block.lang == "sh" and "OBJQ_BROKER_TOKEN=" in block.text]
    [command] = [b.text.split("#")[0].strip() for b in found if "dramatiq app" in b.text]
    assert len(files) == 2, "one environment file per host"
    (tmp_path / "app.py").write_text(app.text, encoding="utf-8")
    url = (tmp_path / "store").as_uri()
    small = re.sub(r"--processes \d+ --threads \d+", "--processes 2 --threads 2", command)

    # Given the worker of host a, elected: it serves on the page's port, at its address;
    # when host b's worker starts and a producer on host b sends messages
    b, env_b, served_at = start_on_both_hosts(children, tmp_path, url, hosts, files, small)
    send = f"import app\nfor n in range({SENT}):\n    app.greet.send(f'reader {{n}}')\n"
    subprocess.run(
        b.command([sys.executable, "-c", send]),
        env=env_b,
        cwd=tmp_path,
        check=True,
        timeout=TIMEOUT_SECONDS,
        capture_output=True,
    )
    # Then every message runs, and host b's processes go through host a's broker
    wait_for(
        lambda: greeted(tmp_path) >= SENT,
        TIMEOUT_SECONDS,
        "every message to run",
        progress=lambda: greeted(tmp_path),
    )
    assert broker_address(url) == served_at
    assert clients(url) >= 2, "host b's worker and producer did not commit through the broker"
    b_log = (tmp_path / "b.log").read_text(errors="replace")
    assert "commits directly" not in b_log, b_log[-2000:]


def test_the_two_host_celery_example_serves_a_prefork_fleet_from_one_broker(
    tmp_path: Path, hosts: list[Host], children: Children
) -> None:
    files = [
        b for b in section_blocks(DRAMATIQ) if b.lang == "sh" and "OBJQ_BROKER_TOKEN=" in b.text
    ]
    found = section_blocks(CELERY)
    [app] = [block for block in found if block.module == "tasks.py"]
    [command] = [b.text.split("#")[0].strip() for b in found if "celery -A" in b.text]
    url = (tmp_path / "store").as_uri()
    # The page's store is S3: the test's is a folder both hosts see.
    (tmp_path / "tasks.py").write_text(
        app.text.replace("objq+s3://my-bucket/jobs", f"objq+{url}"), encoding="utf-8"
    )
    small = re.sub(r"--concurrency \d+", "--concurrency 2", command)
    # Given a prefork worker on host a, elected; when a prefork worker on host b starts and a
    # producer on host b calls tasks
    b, env_b, served_at = start_on_both_hosts(children, tmp_path, url, hosts, files, small)
    call = (
        "import tasks\n"
        f"results = [tasks.add.delay(n, n) for n in range({SENT})]\n"
        f"print(sum(r.get(timeout={TIMEOUT_SECONDS:g}) for r in results))\n"
    )
    done = subprocess.run(
        b.command([sys.executable, "-c", call]),
        env=env_b,
        cwd=tmp_path,
        check=True,
        timeout=TIMEOUT_SECONDS * 2,
        capture_output=True,
        text=True,
    )
    # Then every result comes back, and host b's processes went through host a's broker
    assert done.stdout.strip() == str(sum(2 * n for n in range(SENT)))
    assert broker_address(url) == served_at
    assert clients(url) >= 2, "host b's worker and producer did not commit through the broker"
    b_log = (tmp_path / "b.log").read_text(errors="replace")
    assert "commits directly" not in b_log, b_log[-2000:]
