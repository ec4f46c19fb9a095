"""A Celery task whose messages name their group (``docs/groups.md``) by the task, not by
each call.

Celery hands a task's own attributes to ``apply_async`` only from a fixed list (queue,
priority, expires, ...), so a group that belongs to the task (every message of a mailbox
task in its user's group, say) needs the task class to add it. ``GroupedTask`` adds the
``MessageGroupId`` property that the transport reads, as a call's
``apply_async(..., MessageGroupId=...)`` does; a call that gives one keeps its own::

    from objq_broker.kombu.tasks import GroupedTask

    @app.task(base=GroupedTask, message_group=lambda args, kwargs: kwargs["tenant"])
    def render(*, tenant, page): ...

    app = Celery(..., task_cls=GroupedTask)  # or: every task of the app may name one

A retry (``self.retry()``) and a canvas signature go through ``apply_async`` too, so their
messages keep the group. The group is worked out in the caller, so a function that fails or
returns something other than a name raises there, and nothing is sent.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery import Task

from objq_broker.errors import ConfigurationError
from objq_broker.kombu.channel import GROUP_PROPERTY

#: What ``message_group`` may be: a group name, a function of a call's (args, kwargs) that
#: returns one (or None: no group), or None (the task's messages name no group).
MessageGroup = str | Callable[[Sequence[Any], Mapping[str, Any]], str | None] | None


class GroupedTask(Task):  # type: ignore[misc]  # (celery is not annotated)
    """A task whose messages are sent in the group ``message_group`` names."""

    message_group: MessageGroup = None

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *rest: Any,
        **options: Any,
    ) -> Any:
        if GROUP_PROPERTY not in options:
            # Read as stored: Celery makes the decorator's options class attributes, so a
            # function given there would come back bound to the task.
            rule = inspect.getattr_static(self, "message_group")
            group = group_of(self.name, rule, args or (), kwargs or {})
            if group is not None:
                options[GROUP_PROPERTY] = group
        return super().apply_async(args, kwargs, *rest, **options)


def group_of(
    task: str, rule: MessageGroup, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> str | None:
    """The group task ``task``'s ``rule`` gives a call with ``args`` and ``kwargs``."""
    group = rule(args, kwargs) if callable(rule) else rule
    if group is not None and (not isinstance(group, str) or not group):
        raise ConfigurationError(
            f"task {task!r}: its message_group must give a group name (a non-empty string) "
            f"or None, found {group!r}"
        )
    return group
