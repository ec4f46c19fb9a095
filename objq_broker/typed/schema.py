"""``Schema``: how the values of one type become payloads and back, validated both ways.

A payload is the value as JSON. msgspec encodes and validates ``msgspec.Struct`` classes,
dataclasses and ``TypedDict`` classes (and whatever else ``msgspec.json.Decoder`` accepts);
a pydantic 2 model goes through its own ``model_dump_json`` and ``model_validate_json``.
pydantic is never imported here: a model class exists only once its program imported
pydantic, so ``sys.modules`` tells whether a type can be one.

A value or payload that does not fit raises :class:`PayloadInvalid`, whose message says
where, what was expected, and what was found, with the path of the field at fault in
msgspec's form for either library (``Expected `int`, got `str` - at `$.qty```).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec
import msgspec.inspect

from objq_broker.errors import ConfigurationError, PayloadInvalid

T = TypeVar("T")

#: Bytes of a payload quoted in a :class:`PayloadInvalid` message.
QUOTED_PAYLOAD_BYTES = 60
#: The kinds of type a schema takes, as errors list them.
ACCEPTED_KINDS = "a msgspec.Struct, a dataclass, a TypedDict or a pydantic model"
#: pydantic error types whose input is not what the message is about (a missing field's is
#: the whole object; malformed JSON's is the payload itself).
_NO_FOUND_TYPES = frozenset({"missing", "json_invalid"})

__all__ = ["ACCEPTED_KINDS", "PayloadInvalid", "Schema"]


class Schema(Generic[T]):
    """Encodes values of ``type_`` as JSON payloads and decodes payloads back, validating both.

    >>> class Order(msgspec.Struct):
    ...     sku: str
    ...     qty: int
    >>> orders = Schema(Order)
    >>> orders.encode(Order("A", 2))
    b'{"sku":"A","qty":2}'
    >>> orders.decode(b'{"sku": "A", "qty": 2}')
    Order(sku='A', qty=2)
    >>> try:
    ...     orders.decode(b'{"sku":"A","qty":"2"}')
    ... except PayloadInvalid as exc:
    ...     print(exc)
    payload: expected Order, found b'{"sku":"A","qty":"2"}': Expected `int`, got `str` - at `$.qty`
    """

    def __init__(self, type_: type[T], /) -> None:
        self.type = type_
        self.name: str = getattr(type_, "__qualname__", None) or repr(type_)
        self._model = _pydantic_model(type_)
        self._decoder: msgspec.json.Decoder[T] | None = None
        if self._model is None:
            # msgspec takes any class, leaving it to a decode hook; a plain one has no fields
            # to validate, so it is refused here rather than at every claim.
            try:
                self._decoder = msgspec.json.Decoder(type_)
                plain = isinstance(msgspec.inspect.type_info(type_), msgspec.inspect.CustomType)
            except TypeError as exc:
                raise ConfigurationError(
                    f"schema: expected {ACCEPTED_KINDS}, found {self.name} ({exc})"
                ) from None
            if plain:
                raise ConfigurationError(
                    f"schema: expected {ACCEPTED_KINDS}, found {self.name}, a class msgspec "
                    "can neither encode nor validate"
                )
        self._encoder = msgspec.json.Encoder()

    def __repr__(self) -> str:
        return f"Schema({self.name})"

    @classmethod
    def from_path(cls, path: str) -> Schema[Any]:
        """The schema of the type that ``path`` names as ``module:Type`` (``module:Outer.Inner``
        for a nested class), importing the module."""
        module_name, sep, attribute = path.partition(":")
        if not (sep and module_name and attribute):
            raise ConfigurationError(f"schema: expected module:Type, found {path!r}")
        # The import's own error goes into the message, not the chain: a ConfigurationError
        # raised from ModuleNotFoundError means "an optional objq install is missing".
        try:
            found: object = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigurationError(
                f"schema {path!r}: expected an importable module {module_name!r}, found "
                f"{type(exc).__name__}: {exc}"
            ) from None
        for part in attribute.split("."):
            try:
                found = getattr(found, part)
            except AttributeError:
                raise ConfigurationError(
                    f"schema {path!r}: expected {module_name} to define {attribute}, found no "
                    f"{part!r}"
                ) from None
        if not isinstance(found, type):
            raise ConfigurationError(
                f"schema {path!r}: expected a class ({ACCEPTED_KINDS}), found "
                f"{type(found).__name__}"
            )
        return cls(found)

    def encode(self, value: T, *, where: str = "value") -> bytes:
        """``value`` as a payload. It is decoded again before it is returned, so what is
        enqueued is known to validate when it is claimed."""
        found = f"{where}: expected {self.name}, found {type(value).__name__}"
        if self._model is not None and not isinstance(value, self._model):
            raise PayloadInvalid(found)
        try:
            if self._model is not None:
                model: Any = value  # an instance of the model, checked above
                payload: bytes = model.model_dump_json().encode()
            else:
                payload = self._encoder.encode(value)
        except (TypeError, ValueError) as exc:  # a field holding what JSON cannot, say
            raise PayloadInvalid(f"{found}: {exc}") from exc
        self.decode(payload, where=where)
        return payload

    def decode(self, payload: bytes, *, where: str = "payload") -> T:
        """The value in ``payload``, or :class:`PayloadInvalid` saying why it does not fit."""
        try:
            if self._decoder is not None:
                return self._decoder.decode(payload)
            value: T = self._model.model_validate_json(payload)
            return value
        except msgspec.DecodeError as exc:  # ValidationError included
            detail = str(exc)
        except ValueError as exc:  # pydantic's ValidationError
            detail = _pydantic_detail(exc)
        quoted = bytes(payload[:QUOTED_PAYLOAD_BYTES])
        raise PayloadInvalid(f"{where}: expected {self.name}, found {quoted!r}: {detail}")


def _pydantic_model(type_: object) -> Any:
    """``type_`` if it is a pydantic model class, else None; a pydantic 1 model is refused."""
    pydantic = sys.modules.get("pydantic")
    base = getattr(pydantic, "BaseModel", None)
    if base is None or not isinstance(type_, type) or not issubclass(type_, base):
        return None
    if not hasattr(type_, "model_validate_json"):
        raise ConfigurationError(
            f"schema: expected a pydantic 2 model, found {type_.__qualname__} of pydantic "
            f"{getattr(pydantic, 'VERSION', '?')}"
        )
    return type_


def _pydantic_detail(exc: ValueError) -> str:
    """pydantic's errors on one line each, in msgspec's form: expected, found, and where."""
    errors: Callable[..., list[dict[str, Any]]] | None = getattr(exc, "errors", None)
    if errors is None:
        return str(exc)
    parts = []
    for error in errors(include_url=False):
        path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        found = "" if error["type"] in _NO_FOUND_TYPES else f", got `{_json_kind(error['input'])}`"
        parts.append(f"{error['msg']}{found} - at `{path}`")
    return "; ".join(parts) or str(exc)


def _json_kind(value: object) -> str:
    """What JSON calls the kind of ``value``, as msgspec's messages name it."""
    kinds: tuple[tuple[type | tuple[type, ...], str], ...] = (
        (bool, "bool"),
        (int, "int"),
        (float, "float"),
        (str, "str"),
        ((list, tuple), "array"),
        (dict, "object"),
    )
    if value is None:
        return "null"
    return next((name for kind, name in kinds if isinstance(value, kind)), type(value).__name__)
