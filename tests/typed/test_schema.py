"""Schema on its own: naming a type by ``module:Type``, and the types it refuses."""

from __future__ import annotations

import pytest

from objq_broker import ConfigurationError
from objq_broker.typed import PayloadInvalid, Schema
from tests.typed.schemas import Invoice, Order, Refund


def test_a_type_named_by_its_path() -> None:
    assert Schema.from_path("tests.typed.schemas:Order").type is Order
    refunds = Schema.from_path("tests.typed.schemas:Refund")
    assert refunds.type is Refund
    assert refunds.decode(b'{"order": "o-1", "cents": 5}') == {"order": "o-1", "cents": 5}
    assert repr(Schema.from_path("tests.typed.schemas:Invoice")) == "Schema(Invoice)"


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("tests.typed.schemas", "expected module:Type, found 'tests.typed.schemas'"),
        (":Order", "expected module:Type"),
        ("tests.typed.nowhere:Order", "expected an importable module 'tests.typed.nowhere'"),
        ("tests.typed.schemas:Nothing", "expected tests.typed.schemas to define Nothing"),
        ("tests.typed.schemas:Order.sku", "expected a class"),
        ("tests.typed.schemas:NotASchema", "found NotASchema, a class msgspec can neither"),
    ],
)
def test_a_path_that_names_no_schema_is_refused(path: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says.replace(".", r"\.")) as refused:
        Schema.from_path(path)
    # Not chained to a ModuleNotFoundError: that would mean an optional install is missing.
    assert refused.value.__cause__ is None


def test_pydantic_errors_are_one_line_each_with_their_paths() -> None:
    invoices = Schema(Invoice)
    with pytest.raises(PayloadInvalid) as refused:
        invoices.decode(b'{"number": 7, "cents": 0}')
    assert str(refused.value) == (
        """payload: expected Invoice, found b'{"number": 7, "cents": 0}': Input should be a """
        "valid string, got `int` - at `$.number`; Input should be greater than 0, got `int` - "
        "at `$.cents`"
    )
    assert invoices.encode(Invoice(number="F-7", cents=1)) == b'{"number":"F-7","cents":1}'


def test_a_long_payload_is_quoted_in_part() -> None:
    with pytest.raises(PayloadInvalid) as refused:
        Schema(Order).decode(b'{"sku": "' + b"x" * 500 + b'"}')
    assert len(str(refused.value)) < 200
