"""What a type checker sees: mypy, strict, on a user's module, reveals the user's own classes
as the values of typed deliveries and refuses a value or a delivery of another type."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

USER_CODE = """
    from __future__ import annotations

    from dataclasses import dataclass
    from typing import TypedDict

    import msgspec
    import pydantic

    from objq_broker import AsyncQueue, Queue
    from objq_broker.typed import AsyncTypedQueue, TypedQueue


    class Order(msgspec.Struct):
        sku: str
        qty: int


    @dataclass
    class Shipment:
        order: str


    class Refund(TypedDict):
        cents: int


    class Invoice(pydantic.BaseModel):
        number: str


    def produce_and_consume(queue: Queue) -> None:
        orders = TypedQueue("orders", Order, queue=queue)
        shipments = TypedQueue("shipments", Shipment, queue=queue)
        reveal_type(orders.claim()[0].value)
        reveal_type(shipments.claim()[0].value)
        reveal_type(TypedQueue("refunds", Refund, queue=queue).claim()[0].value)
        reveal_type(TypedQueue("invoices", Invoice, queue=queue).claim()[0].value)
        orders.enqueue(Shipment("o-1"))
        orders.ack(shipments.claim()[0])


    async def consume(queue: AsyncQueue) -> None:
        orders = AsyncTypedQueue("orders", Order, queue=queue)
        reveal_type((await orders.claim())[0].value)
"""


def test_mypy_reveals_the_users_classes(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy comes with the lint dependency group")
    from mypy import api

    user = tmp_path / "user_code.py"
    user.write_text(textwrap.dedent(USER_CODE))
    # Errors of the modules it imports are not the user's: reported only for the user's file,
    # as for an installed objq_broker (here the source tree is on the path).
    out, err, status = api.run(
        [
            "--strict",
            "--config-file=",
            "--follow-imports=silent",
            f"--cache-dir={tmp_path / 'cache'}",
            str(user),
        ]
    )
    lines = [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith(str(user))]
    # mypy versions spell a TypedDict differently: TypedDict('m.T', {...}) or TypedDict(m.T, {...})
    refund = next((line for line in lines if "TypedDict(" in line), "")
    assert "user_code.Refund" in refund, out + err
    assert lines == [
        'note: Revealed type is "user_code.Order"',
        'note: Revealed type is "user_code.Shipment"',
        refund,
        'note: Revealed type is "user_code.Invoice"',
        'error: Argument 1 to "enqueue" of "TypedQueue" has incompatible type "Shipment"; '
        'expected "Order"  [arg-type]',
        'error: Argument 1 to "ack" of "TypedQueue" has incompatible type '
        '"TypedDelivery[Shipment]"; expected "TypedDelivery[Order]"  [arg-type]',
        'note: Revealed type is "user_code.Order"',
    ], out + err
    assert status == 1  # the two errors above, and nothing else
    assert "Found 2 errors in 1 file" in out
