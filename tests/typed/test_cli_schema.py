"""``objq enqueue --schema module:Type``: every payload is checked against the type before
anything is committed. The real ``objq`` executable runs from the repository's root, which is
where it finds ``tests.typed.schemas``."""

from __future__ import annotations

from pathlib import Path

import pytest

from objq_broker import Queue
from objq_broker.typed import TypedQueue
from tests.cli.objq_cli import Result, run_objq
from tests.typed.schemas import Invoice, Order

ROOT = Path(__file__).resolve().parents[2]
ORDER = "tests.typed.schemas:Order"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return (tmp_path / "store").as_uri()


def objq(url: str, *args: str) -> Result:
    return run_objq(*args, url=url, cwd=ROOT)


def lines(tmp_path: Path, *documents: str) -> Path:
    path = tmp_path / "orders.jsonl"
    path.write_text("".join(f"{document}\n" for document in documents))
    return path


def test_valid_lines_are_enqueued(tmp_path: Path, url: str) -> None:
    path = lines(tmp_path, '{"sku": "A-1", "qty": 1}', "", '{"sku": "B-2", "qty": 2}')
    done = objq(url, "enqueue", "orders", "--jsonl", str(path), "--schema", ORDER, "--json")
    assert (done.code, done.stderr) == (0, "")
    assert done.json()["enqueued"] == 2
    with TypedQueue("orders", Order, url=url) as orders:
        got = orders.claim(5, timeout=5)
        assert [d.value for d in got] == [Order("A-1", 1), Order("B-2", 2)]


@pytest.mark.parametrize("source", ["--jsonl", "--file"])
def test_a_bad_line_refuses_the_file_and_commits_nothing(
    tmp_path: Path, url: str, source: str
) -> None:
    # Given a declared queue and a file whose third line is no Order
    with Queue(url, broker="off") as queue:
        queue.declare("orders")
    path = lines(
        tmp_path,
        '{"sku": "A-1", "qty": 1}',
        '{"sku": "B-2", "qty": 2}',
        '{"sku": "C-3", "qty": "five"}',
        '{"sku": "D-4", "qty": 4}',
    )
    # When it is enqueued one line per commit
    done = objq(url, "enqueue", "orders", source, str(path), "--schema", ORDER, "--batch", "1")
    # Then the command refuses it as a usage error, naming the line and what is wrong
    assert done.code == 2
    assert done.stderr == (
        f"objq: error: {path}, line 3: expected Order, found "
        """b'{"sku": "C-3", "qty": "five"}': Expected `int`, got `str` - at `$.qty`\n"""
    )
    # And not even the lines before it were committed
    with Queue(url, broker="off") as queue:
        assert queue.jobs("orders") == []


def test_one_payload_is_checked_too(url: str) -> None:
    invoice = "tests.typed.schemas:Invoice"
    refused = objq(url, "enqueue", "invoices", '{"number": "F-1", "cents": 0}', "--schema", invoice)
    assert refused.code == 2
    assert refused.stderr.endswith("Input should be greater than 0, got `int` - at `$.cents`\n")
    assert refused.stderr.startswith("objq: error: PAYLOAD: expected Invoice, found ")
    done = objq(url, "enqueue", "invoices", '{"number": "F-1", "cents": 5}', "--schema", invoice)
    assert done.code == 0, done.stderr
    with TypedQueue("invoices", Invoice, url=url) as invoices:
        [delivery] = invoices.claim()
        assert delivery.value == Invoice(number="F-1", cents=5)


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ("tests.typed.schemas", "expected module:Type"),
        ("tests.typed.nowhere:Order", "expected an importable module 'tests.typed.nowhere'"),
        ("tests.typed.schemas:Nothing", "expected tests.typed.schemas to define Nothing"),
        ("tests.typed.schemas:NotASchema", "expected a msgspec.Struct, a dataclass"),
    ],
)
def test_a_schema_that_names_no_type_is_a_usage_error(url: str, schema: str, says: str) -> None:
    done = objq(url, "enqueue", "orders", '{"sku": "A-1", "qty": 1}', "--schema", schema)
    assert done.code == 2
    assert done.stderr.startswith("objq: error: schema")
    assert says in done.stderr
    assert not Path(url.removeprefix("file://")).exists()  # nothing was even created
