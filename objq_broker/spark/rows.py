"""How the Spark writer turns DataFrame rows into job payloads, and its option parsing.

Three ways, chosen by the writer's options:

* ``payload_column`` (default ``payload``): the column's bytes (or UTF-8 text) are the payload.
* ``dramatiq_actor`` or ``actor_column``: a Dramatiq message for that actor, so a Dramatiq
  worker on objq runs it.
* ``celery_task`` or ``task_column``: a Celery task message (protocol 2, kombu's envelope).

For messages, positional arguments come from ``args_columns`` (a comma-separated list of
columns, in order) or ``args_column`` (one array column); keyword arguments from
``kwargs_columns`` (named columns) or ``kwargs_column`` (a map or struct column).
``priority_column`` and ``delay_column`` (seconds) set a job's priority and delay per row,
``group_column`` its group (``docs/groups.md``; null: none).

Each column is checked where it enters: its Spark type when the write is planned (on the
driver, before any task runs), and its values, batch by batch, against the constraints the
state holds jobs to (:mod:`objq_broker.model.checks`): a value out of range fails the task, so
the write is aborted and nothing is enqueued.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from objq_broker.errors import ConfigurationError
from objq_broker.model.checks import Identifier, Priority, SignedSeconds, checked
from objq_broker.model.messages import celery_message, dramatiq_message

DEFAULT_PAYLOAD_COLUMN = "payload"
#: The writer's options, listed in errors about unknown ones.
WRITER_OPTIONS = (
    "url",
    "queue",
    "payload_column",
    "dramatiq_actor",
    "actor_column",
    "celery_task",
    "task_column",
    "args_columns",
    "args_column",
    "kwargs_columns",
    "kwargs_column",
    "priority",
    "priority_column",
    "delay_seconds",
    "delay_column",
    "group_column",
    "max_attempts",
    "rows_per_object",
)

Row = tuple[bytes, int | None, float | None, str | None]  # payload, priority, delay, group

_INTEGERS: tuple[type[DataType], ...] = (ByteType, ShortType, IntegerType, LongType)
#: The Spark types the column an option names may have, and how an error says them.
_COLUMN_TYPES: dict[str, tuple[tuple[type[DataType], ...], str]] = {
    "payload_column": ((StringType, BinaryType), "string or binary"),
    "actor_column": ((StringType,), "string"),
    "task_column": ((StringType,), "string"),
    "args_column": ((ArrayType,), "an array"),
    "kwargs_column": ((MapType, StructType), "a map with string keys, or a struct"),
    "priority_column": (_INTEGERS, "tinyint, smallint, int or bigint"),
    "delay_column": (
        (*_INTEGERS, FloatType, DoubleType),
        "seconds as tinyint, smallint, int, bigint, float or double",
    ),
    "group_column": ((StringType,), "string"),
}


class _RowValues(msgspec.Struct, frozen=True):
    """A batch's per-row job settings (null: the writer's option), held to the state's
    constraints."""

    priority: list[Priority | None] = msgspec.field(default_factory=list)
    delay: list[SignedSeconds | None] = msgspec.field(default_factory=list)
    group: list[Identifier | None] = msgspec.field(default_factory=list)


def required(options: Mapping[str, str], name: str, where: str) -> str:
    value = options.get(name)
    if not value:
        raise ConfigurationError(f"{where}: option {name!r} is required, found none")
    return str(value)


def option_int(
    options: Mapping[str, str], name: str, default: int | None, where: str
) -> int | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(
            f"{where}: option {name!r} must be an integer, found {raw!r}"
        ) from None


def check_known(
    options: Mapping[str, str], accepted: Sequence[str] = WRITER_OPTIONS, where: str = "objq writer"
) -> None:
    """Refuse an option not in ``accepted`` (the writer's, unless told), listing those it
    has. Spark passes ``path`` along with every source's options."""
    known = {name.lower() for name in accepted}
    unknown = sorted(k for k in options if k.lower() not in known and k.lower() != "path")
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown option(s) {unknown}; accepted: {list(accepted)}"
        )


def _columns(raw: str | None) -> tuple[str, ...]:
    return tuple(c.strip() for c in raw.split(",") if c.strip()) if raw else ()


@dataclass(frozen=True)
class RowPlan:
    """Which columns make a row's payload, priority, delay and group."""

    kind: str  # "payload", "dramatiq" or "celery"
    message_queue: str
    payload_column: str | None = None
    name: str | None = None
    name_column: str | None = None
    args_column: str | None = None
    args_columns: tuple[str, ...] = ()
    kwargs_column: str | None = None
    kwargs_columns: tuple[str, ...] = ()
    priority_column: str | None = None
    delay_column: str | None = None
    group_column: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str], schema: StructType, queue: str) -> RowPlan:
        """The plan the options describe, its columns checked against the DataFrame's."""
        where = "objq writer"
        check_known(options)
        dramatiq = options.get("dramatiq_actor"), options.get("actor_column")
        celery = options.get("celery_task"), options.get("task_column")
        if any(dramatiq) and any(celery):
            raise ConfigurationError(
                f"{where}: got both Dramatiq ({dramatiq}) and Celery ({celery}) options; "
                "expected one framework"
            )
        pair = dramatiq if any(dramatiq) else celery
        if all(pair):
            raise ConfigurationError(
                f"{where}: got a fixed name {pair[0]!r} and a name column {pair[1]!r}; expected one"
            )
        for single, several in (
            ("args_column", "args_columns"),
            ("kwargs_column", "kwargs_columns"),
        ):
            if options.get(single) and options.get(several):
                raise ConfigurationError(
                    f"{where}: got both {single!r} and {several!r}; expected one"
                )
        kind = "dramatiq" if any(dramatiq) else "celery" if any(celery) else "payload"
        plan = cls(
            kind=kind,
            message_queue=queue,
            payload_column=options.get("payload_column", DEFAULT_PAYLOAD_COLUMN)
            if kind == "payload"
            else None,
            name=pair[0] or None,
            name_column=pair[1] or None,
            args_column=options.get("args_column") or None,
            args_columns=_columns(options.get("args_columns")),
            kwargs_column=options.get("kwargs_column") or None,
            kwargs_columns=_columns(options.get("kwargs_columns")),
            priority_column=options.get("priority_column") or None,
            delay_column=options.get("delay_column") or None,
            group_column=options.get("group_column") or None,
        )
        columns = list(schema.fieldNames())
        missing = [c for c in plan.used_columns() if c not in columns]
        if missing:
            raise ConfigurationError(
                f"{where}: column(s) {missing} not in the DataFrame; its columns: {columns}"
            )
        for option, column in plan.typed_columns().items():
            _check_type(option, column, schema[column].dataType)
        return plan

    def typed_columns(self) -> dict[str, str]:
        """The columns whose Spark type is fixed, by the option that names them."""
        names = {
            "payload_column": self.payload_column,
            "actor_column" if self.kind == "dramatiq" else "task_column": self.name_column,
            "args_column": self.args_column,
            "kwargs_column": self.kwargs_column,
            "priority_column": self.priority_column,
            "delay_column": self.delay_column,
            "group_column": self.group_column,
        }
        return {option: column for option, column in names.items() if column}

    def used_columns(self) -> list[str]:
        single = [
            self.payload_column,
            self.name_column,
            self.args_column,
            self.kwargs_column,
            self.priority_column,
            self.delay_column,
            self.group_column,
        ]
        return [c for c in single if c] + list(self.args_columns) + list(self.kwargs_columns)

    def rows(self, batch: pa.RecordBatch) -> Iterator[Row]:
        """(payload, priority, delay, group) of each row of ``batch``; a priority or delay of
        None leaves the writer's option, a group of None is none."""
        count = batch.num_rows
        priorities = self._settings(batch, "priority", self.priority_column, count)
        delays = self._settings(batch, "delay", self.delay_column, count)
        groups = self._settings(batch, "group", self.group_column, count)
        for index, payload in enumerate(self._payloads(batch, count)):
            yield payload, priorities[index], delays[index], groups[index]

    def _settings(
        self, batch: pa.RecordBatch, field: str, name: str | None, count: int
    ) -> list[Any]:
        """The values of column ``name``, checked as the job setting ``field``."""
        if name is None:
            return [None] * count
        values = checked(
            {field: self._column(batch, name, count)}, _RowValues, f"objq writer: column {name!r}"
        )
        return list(getattr(values, field))

    @staticmethod
    def _column(batch: pa.RecordBatch, name: str | None, count: int) -> list[Any]:
        if name is None:
            return [None] * count
        return list(batch.column(batch.schema.get_field_index(name)).to_pylist())

    def _payloads(self, batch: pa.RecordBatch, count: int) -> Iterator[bytes]:
        if self.kind == "payload":
            for value in self._column(batch, self.payload_column, count):
                if value is None:
                    raise ConfigurationError(
                        f"objq writer: column {self.payload_column!r}: expected a payload, "
                        "found null"
                    )
                yield value.encode() if isinstance(value, str) else bytes(value)
            return
        names = self._column(batch, self.name_column, count)
        args = self._args(batch, count)
        kwargs = self._kwargs(batch, count)
        build = dramatiq_message if self.kind == "dramatiq" else celery_message
        for index in range(count):
            name = self.name or names[index]
            if not name:
                raise ConfigurationError(
                    f"objq writer: column {self.name_column!r}: expected a task name, "
                    f"found {name!r}"
                )
            yield build(self.message_queue, str(name), args[index], kwargs[index])

    def _args(self, batch: pa.RecordBatch, count: int) -> list[list[Any]]:
        if self.args_column:
            return [list(v or []) for v in self._column(batch, self.args_column, count)]
        columns = [self._column(batch, c, count) for c in self.args_columns]
        return [[column[i] for column in columns] for i in range(count)]

    def _kwargs(self, batch: pa.RecordBatch, count: int) -> list[dict[str, Any]]:
        if self.kwargs_column:
            return [_mapping(v) for v in self._column(batch, self.kwargs_column, count)]
        columns = {c: self._column(batch, c, count) for c in self.kwargs_columns}
        return [{c: values[i] for c, values in columns.items()} for i in range(count)]


def _check_type(option: str, column: str, found: DataType) -> None:
    accepted, words = _COLUMN_TYPES[option]
    fits = isinstance(found, accepted)
    if isinstance(found, MapType):
        fits = fits and isinstance(found.keyType, StringType)
    if not fits:
        raise ConfigurationError(
            f"objq writer: option {option!r} names column {column!r}; expected {words}, "
            f"found {found.simpleString()}"
        )


def _mapping(value: object) -> dict[str, Any]:
    """A map column arrives from Arrow as a list of (key, value) pairs, a struct as a dict."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, list):
        return {str(k): v for k, v in value}
    raise ConfigurationError(f"objq writer: expected a map or struct of kwargs, found {value!r}")
