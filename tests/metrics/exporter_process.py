"""A real ``objq exporter`` child process on a store, and scraping it over HTTP."""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tests.cli.objq_cli import environment, objq_command
from tests.support.processes import Children
from tests.support.servers import free_port
from tests.support.waiting import wait_for

#: Seconds an exporter may take to start answering (a Python start and one bind).
START_TIMEOUT_SECONDS = 15.0
#: Seconds one scrape may take.
SCRAPE_TIMEOUT_SECONDS = 10.0


@dataclass
class Exporter:
    """One running ``objq exporter``: its process, where it serves, and its output."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text()

    def scrape(self) -> dict[str, Metric]:
        """One scrape of ``/metrics``, parsed: each family by name (a counter's without
        ``_total``, as the parser names families)."""
        with urllib.request.urlopen(self.url, timeout=SCRAPE_TIMEOUT_SECONDS) as response:
            assert response.status == 200
            text = response.read().decode()
        return {family.name: family for family in text_string_to_metric_families(text)}

    def answers(self) -> dict[str, Metric] | None:
        """A scrape once the exporter answers; None while it does not listen yet. Fails at
        once if the process has exited."""
        if self.process.poll() is not None:
            raise AssertionError(
                f"objq exporter exited with {self.process.returncode}: {self.output()}"
            )
        try:
            return self.scrape()
        except urllib.error.URLError:
            return None


def start_exporter(children: Children, store_url: str, log: Path, *options: str) -> Exporter:
    """Start ``objq exporter OPTIONS`` on a free port for ``store_url`` (given as
    ``$OBJQ_URL``, the fallback of ``--url``) and wait until it answers a scrape."""
    port = free_port()
    process = children.start(
        [*objq_command(), "exporter", "--listen", f"127.0.0.1:{port}", *options],
        env=environment(store_url),
        log=log,
    )
    exporter = Exporter(process, f"http://127.0.0.1:{port}/metrics", log)
    wait_for(
        exporter.answers, START_TIMEOUT_SECONDS, "objq exporter to answer", progress=exporter.output
    )
    return exporter


def value(families: dict[str, Metric], name: str, **labels: str) -> float:
    """The value of the one sample of family ``name`` with these labels."""
    found = [s.value for s in families[name].samples if s.labels == labels]
    assert len(found) == 1, (name, labels, families[name].samples)
    return found[0]
