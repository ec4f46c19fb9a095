"""The payload types of the typed-queue tests, one of each kind a schema takes. ``objq enqueue
--schema tests.typed.schemas:Order`` imports this module too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import msgspec
import pydantic


class Order(msgspec.Struct):
    sku: str
    qty: int


class Line(msgspec.Struct):
    sku: str
    qty: int


class Basket(msgspec.Struct):
    customer: str
    lines: list[Line]


@dataclass
class Shipment:
    order: str
    weight_grams: int
    express: bool = False


class Refund(TypedDict):
    order: str
    cents: int


class Invoice(pydantic.BaseModel):
    number: str
    cents: pydantic.PositiveInt


class NotASchema:
    """A plain class: neither msgspec nor pydantic can encode it."""

    def __init__(self, note: str) -> None:
        self.note = note
