"""A Celery task that names its messages' group itself (``objq_broker.kombu.tasks``): by a
name or by a function of each call's arguments, through every way a task is sent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

import objq_broker.kombu  # noqa: F401  (registers the objq+... URLs)
from objq_broker import ConfigurationError, Queue
from objq_broker.kombu.tasks import GroupedTask


@pytest.fixture
def url(tmp_path: Path) -> str:
    return (tmp_path / "broker").as_uri()


@pytest.fixture
def app(url: str) -> Iterator[Celery]:
    app = Celery("grouped", broker=f"objq+{url}", task_cls=GroupedTask)
    yield app
    # app.close() leaves the connections the tasks were sent on open in kombu's process-wide
    # pool, and with them the broker this process was elected to be: closed here
    app.pool.force_close_all()
    app.close()


def _task(app: Celery, name: str, **options: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> None:
        return None

    # (Registered by call, not as a decorator: Celery's decorator is not annotated.)
    return app.task(name=name, shared=False, **options)(run)


def _groups(url: str) -> list[str | None]:
    with Queue(url) as queue:
        return [job.group for _, job in queue.jobs("celery")]


def test_every_way_of_sending_a_task_names_the_group_its_task_gives(app: Celery, url: str) -> None:
    render = _task(app, "render", message_group=lambda args, kwargs: kwargs["tenant"])
    mail = _task(app, "mail", message_group="mailbox")
    plain = _task(app, "plain")
    render.apply_async(kwargs={"tenant": "t1"})
    render.delay(tenant="t2")
    render.s(tenant="t3").apply_async()
    render.apply_async(kwargs={"tenant": "t4"}, MessageGroupId="given")  # the call's own wins
    mail.delay(1)
    plain.delay()
    assert _groups(url) == ["t1", "t2", "t3", "given", "mailbox", None]


def test_a_group_function_that_fails_or_gives_no_name_sends_nothing(app: Celery, url: str) -> None:
    numbered = _task(app, "numbered", message_group=lambda args, kwargs: args[0])
    with pytest.raises(ConfigurationError, match=r"task 'numbered'.*found 5"):
        numbered.delay(5)
    with pytest.raises(ConfigurationError, match="found ''"):
        numbered.delay("")
    with pytest.raises(IndexError):
        numbered.delay()
    numbered.delay("fine")
    assert _groups(url) == ["fine"]
