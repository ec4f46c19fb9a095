"""A real ``celery worker`` (prefork) for the outcomes app (``tests.spark.celery_outcomes_app``),
on an objq store: the environment and the command line the true-outcomes tests start it with."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.spark.celery_outcomes_app"


def outcomes_env(url: str, **extra: str) -> dict[str, str]:
    """This process's environment, with the app's broker on ``url`` and this checkout first on
    the path (the worker and the senders import the app from it)."""
    return dict(
        os.environ,
        CELERY_BROKER_URL=f"objq+{url}",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        **extra,
    )


def outcomes_worker(*options: str) -> list[str]:
    """The worker's command line: prefork, quiet, no cluster chatter; ``options`` added."""
    return [
        sys.executable, "-m", "celery", "-A", APP, "worker", "--pool", "prefork", *options,
        "--loglevel", "ERROR", "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
