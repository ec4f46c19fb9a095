"""kombu's own integration test classes, subclassed for objq as kombu does for its transports
(``t/integration/test_redis.py``). See ``conftest.py`` for the fixtures and what is left out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.kombu_suite.kombu_upstream import load_common

#: kombu's ``t/integration/common.py``, loaded at run time: its classes have no static type, so
#: each subclass below subclasses ``Any`` (mypy's ``misc`` error, ignored on those lines).
common: Any = load_common()


class TestObjqBasicFunctionality(common.BasicFunctionality):  # type: ignore[misc]
    pass


class TestObjqExchangeTypes(common.BaseExchangeTypes):  # type: ignore[misc]
    pass


class TestObjqMessage(common.BaseMessage):  # type: ignore[misc]
    pass


class TestObjqPriority(common.BasePriority):  # type: ignore[misc]
    # kombu priority 0-9, higher first, as with AMQP (kombu's Redis transport is the reverse).
    PRIORITY_ORDER = "asc"


class TestObjqTimeToLive(common.BaseTimeToLive):  # type: ignore[misc]
    # Each test sleeps 3 s by design; the expiry check does not depend on the backend, so
    # these run on a local directory only (the time budget of the suite).
    @pytest.fixture
    def objq_store_url(self, tmp_path: Path) -> str:
        return (tmp_path / "objq").as_uri()


if hasattr(common, "BaseEventLoop"):  # in kombu 5.7, not in 5.5

    class TestObjqEventLoop(common.BaseEventLoop):  # type: ignore[misc]
        pass


def test_every_generic_class_is_run_or_listed(left_out_classes: dict[str, str]) -> None:
    # A class added to kombu's common.py must be subclassed above or listed with a reason.
    generic = {name for name in vars(common) if name.startswith("Base") or name.endswith("ality")}
    generic = {name for name in generic if isinstance(getattr(common, name), type)}
    run = {base.__name__ for cls in list(globals().values()) if isinstance(cls, type)
           for base in cls.__mro__[1:] if base.__module__ == common.__name__}  # fmt: skip
    # (an older kombu may lack a listed class: only the classes it has must be accounted for)
    assert generic - run == set(left_out_classes) & generic, (generic, run)
