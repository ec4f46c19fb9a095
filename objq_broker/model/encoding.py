"""The state's bytes: encoding it, and decoding it with every field checked, refusing a
corrupt or unknown document with a message that says what was found where (it is never
overwritten); the last check before a write that the bytes will decode again; and the archive
objects' JSON lines."""

from __future__ import annotations

import re

import msgspec

from objq_broker.errors import StateCorrupt
from objq_broker.model.checks import UNDECODABLE
from objq_broker.model.records import READABLE_FORMATS, ArchiveRecord, StateDoc

_encoder = msgspec.json.Encoder()
_state_decoder = msgspec.json.Decoder(StateDoc)
_format_probe = msgspec.json.Decoder(dict[str, object])


def encode_state(doc: StateDoc) -> bytes:
    return _encoder.encode(doc)


#: Largest state object decoded unless told otherwise (``max_state_bytes``). The head of a
#: namespace with runs stays far smaller (``docs/runs.md``); a state past this was most
#: likely made to exhaust the memory of every process that reads it.
DEFAULT_MAX_STATE_BYTES = 64 * 1024 * 1024


def decode_state(data: bytes, where: str, max_bytes: int = DEFAULT_MAX_STATE_BYTES) -> StateDoc:
    """Decode a stored state, or raise :class:`StateCorrupt` saying what was found where."""
    if len(data) > max_bytes:
        raise StateCorrupt(
            f"{where}: expected a state of at most {max_bytes} bytes, found {len(data)} bytes; "
            "if it is genuine (a namespace without runs holding hundreds of thousands of "
            "jobs), raise the limit with the max_state_bytes option"
        )
    try:
        doc = _state_decoder.decode(data)
    except UNDECODABLE as exc:
        raise StateCorrupt(_corrupt_message(where, _describe_format(data), str(exc))) from exc
    if doc.format not in READABLE_FORMATS:
        raise StateCorrupt(_corrupt_message(where, f"format {doc.format!r}", "unknown format"))
    needed = doc.needed_format()
    if doc.format < needed:
        what = "an archive tail" if doc.archive_tail is not None else "runs"
        found = f"format {doc.format} with {what}"
        raise StateCorrupt(_corrupt_message(where, found, f"{what} need format {needed}"))
    return doc


def check_encoded(data: bytes, where: str, *, only: bytes | None = None) -> None:
    """Refuse to let a state be written that its own decoder would refuse.

    Every value is checked where it enters (``model.checks``), so this is the last line of
    defence, and it must not cost a decode per commit. What slips past type checks is a
    non-finite float: JSON has no way to write one, so msgspec writes ``null``, and the
    decoder then refuses the field. So the encoded bytes are searched for a field written as
    ``null`` that may not be (:func:`refused_null`); only then is the state decoded, and
    refused if that fails.

    ``only``: the part of ``data`` that may hold such a field, when the rest was searched as
    it was made (a state's jobs and archive tail, kept encoded between commits, which most
    commits keep as they were: ``QueueState.encode``)."""
    name = refused_null(data if only is None else only)
    if name is None:
        return
    try:
        decode_state(data, where, max_bytes=len(data))
    except StateCorrupt as exc:
        raise StateCorrupt(
            f"{where}: refusing to write a state that could not be read back "
            f"(field {name!r} written as null): {exc}"
        ) from exc


def refused_null(data: bytes, start: int = 0, end: int | None = None) -> str | None:
    """The first field of ``data[start:end]`` written as ``null`` that may not be, if any.

    A substring search in C from one ``":null`` to the next (a state holds a few, one per
    queue that never expires), with only the key before each looked at here: a regular
    expression over the whole state cost milliseconds per commit. A quote not escaped by a
    backslash cannot lie inside a string, so payloads never match."""
    stop = len(data) if end is None else end
    while (hit := data.find(b'":null', start, stop)) >= 0:
        start = hit + len(b'":null')
        opening = data.rfind(b'"', 0, hit)  # a key holds no quote: this one opens it
        name = data[opening + 1 : hit]
        if name in _NULLABLE_NAMES:
            continue  # (most hits: a queue's expires_seconds)
        if opening < 0 or (opening > 0 and data[opening - 1] == _BACKSLASH):
            continue  # not a real key: its quote is escaped, inside a string
        if _FIELD_NAME.fullmatch(name):
            return name.decode()
    return None


def _nullable_fields() -> frozenset[str]:
    """The names of the state's fields (at any depth) that may be ``null``."""
    names: set[str] = set()
    seen: set[type] = set()
    pending: list[msgspec.inspect.Type] = list(msgspec.inspect.multi_type_info([StateDoc]))
    while pending:
        kind = pending.pop()
        if isinstance(kind, msgspec.inspect.StructType):
            if kind.cls in seen:
                continue
            seen.add(kind.cls)
            for field in kind.fields:
                if _allows_none(field.type):
                    names.add(field.encode_name)
                pending.append(field.type)
        elif isinstance(kind, msgspec.inspect.UnionType):
            pending.extend(kind.types)
        elif isinstance(kind, msgspec.inspect.ListType | msgspec.inspect.SetType):
            pending.append(kind.item_type)
        elif isinstance(kind, msgspec.inspect.DictType):
            pending.append(kind.value_type)
        elif isinstance(kind, msgspec.inspect.TupleType):
            pending.extend(kind.item_types)
    return frozenset(names)


def _allows_none(kind: msgspec.inspect.Type) -> bool:
    if isinstance(kind, msgspec.inspect.NoneType):
        return True
    return isinstance(kind, msgspec.inspect.UnionType) and any(
        isinstance(t, msgspec.inspect.NoneType) for t in kind.types
    )


#: What a field's name looks like (a payload's bytes may look like anything).
_FIELD_NAME = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")
_BACKSLASH = ord("\\")
_NULLABLE_FIELDS = _nullable_fields()
_NULLABLE_NAMES = frozenset(name.encode() for name in _NULLABLE_FIELDS)


def _corrupt_message(where: str, found: str, detail: str) -> str:
    return (
        f"{where}: expected an objq state of format {', '.join(map(str, READABLE_FORMATS))}, "
        f"found {found} ({detail}); "
        "it will not be overwritten: restore it from a backup or move it aside"
    )


def _describe_format(data: bytes) -> str:
    try:
        probe = _format_probe.decode(data)
    except UNDECODABLE:
        return f"{len(data)} bytes that are not a JSON object (starting {data[:40]!r})"
    fmt = probe.get("format")
    if fmt not in READABLE_FORMATS:
        return f"format {fmt!r}"
    return "a document of the right format with invalid fields"


def encode_archive(records: list[ArchiveRecord]) -> bytes:
    return _encoder.encode_lines(records)


def decode_archive(data: bytes, where: str) -> list[ArchiveRecord]:
    decoder = msgspec.json.Decoder(ArchiveRecord)
    records = []
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(decoder.decode(line))
        except UNDECODABLE as exc:
            raise StateCorrupt(f"{where}, line {number}: not an archive record ({exc})") from exc
    return records
