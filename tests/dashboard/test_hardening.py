"""The dashboard's answers to the unexpected: a 500 carries the security headers every other
answer carries, and a form field given twice is refused rather than one of them picked."""

from __future__ import annotations

from objq_broker import Queue
from objq_broker.storage import MemoryStore
from objq_broker.storage.base import Blob
from tests.dashboard.browsing import TOKEN, get, post, serving

#: What every answer must carry.
SECURITY = {
    "content-security-policy": "default-src 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "cache-control": "no-store",
}


class BrokenReads(MemoryStore):
    """A real memory store whose reads of the state fail with an error objq does not know
    (a bug, or an SDK error no adapter translates), once ``broken`` is set."""

    broken = False

    def read(self, key: str) -> Blob | None:
        if self.broken and key.endswith("state.json"):
            raise RuntimeError("the unexpected")
        return super().read(key)


def test_a_server_error_carries_the_security_headers() -> None:
    store = BrokenReads("dashboard-500")
    with Queue(store=store, broker="off") as queue:
        queue.enqueue("q", b"x")
    store.broken = True
    with serving(store) as base:
        answer = get(base)
    assert answer.status == 500
    assert answer.body == "Internal Server Error"
    for name, value in SECURITY.items():
        assert value in answer.headers[name], (name, answer.headers)


def test_a_form_field_given_twice_is_refused() -> None:
    store = MemoryStore("dashboard-duplicates")
    with serving(store, token=TOKEN) as base:
        origin = {"Origin": base.rstrip("/")}
        # Given the right token and a wrong one: neither is picked
        twice: list[dict[str, str | list[str]]] = [
            {"token": [TOKEN, "not-the-token"]},
            {"token": TOKEN, "next": ["/", "/x"]},
        ]
        for fields in twice:
            answer = post(base + "login", fields, origin)
            assert answer.status == 400, answer
            name = next(key for key, value in fields.items() if isinstance(value, list))
            assert f"expected at most one &#39;{name}&#39; field, found 2" in answer.body
            assert "set-cookie" not in answer.headers
        # And one of each logs in
        answer = post(base + "login", {"token": TOKEN}, origin)
        assert answer.status in (200, 303)
