"""Nothing invalid may enter the state: every value is checked where it enters.

A value the state's own decoder refuses (a NaN lease, which JSON writes as ``null``; an ``int``
field holding 2.5) would make every process that shares the namespace refuse it. So every public
setter and enqueue option is driven here with wrong types and out-of-range values: each call
either raises :class:`ConfigurationError` naming the argument, or succeeds; either way the
stored state still decodes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from objq_broker import ConfigurationError, Queue
from objq_broker.builders import StagedBodies
from objq_broker.engine import STATE_KEY
from objq_broker.engine.snapshot import Snapshot
from objq_broker.model import ops as op_types
from objq_broker.model.checks import MAX_SECONDS
from objq_broker.model.encoding import decode_state
from objq_broker.model.records import QueueConfig
from objq_broker.model.settings import positive_seconds
from objq_broker.model.state import QueueState
from objq_broker.storage import MemoryStore

_names = itertools.count()

#: Values no setting accepts, or that only some accept: wrong types, non-finite and out-of-range
#: numbers, and a few valid ones so the "accepted" path is exercised too.
ODD_VALUES = st.one_of(
    st.sampled_from(
        [
            math.nan,
            math.inf,
            -math.inf,
            True,
            False,
            2.5,
            "3",
            "",
            b"3",
            None,
            -5,
            0,
            1,
            3,
            10**30,
            -(10**30),
            1e300,
            [1],
            {"a": 1},
        ]
    ),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.text(max_size=5),
)

SETTINGS = sorted(QueueConfig.__struct_fields__)
#: Settings whose default is None ("never").
UNSET_BY_DEFAULT = {"expires_seconds"}
#: Group settings (docs/groups.md): left out of the state until set.
GROUP_SETTINGS = {"group_concurrency", "fairness"}


def _stored_state_decodes(queue: Queue) -> None:
    queue.flush()
    blob = queue.store.read(STATE_KEY)
    if blob is not None:
        decode_state(blob.data, "state under test")  # raises StateCorrupt if refused
    Snapshot.read(queue.store)  # as another process reads it


def _attempt(call: Callable[[], Any]) -> bool:
    """Run ``call``; True if it was accepted, False if refused with ConfigurationError."""
    try:
        call()
    except ConfigurationError as exc:
        assert str(exc), "a refusal must say why"
        return False
    return True


@pytest.fixture
def queue() -> Any:
    with Queue(store=MemoryStore(f"validation-{next(_names)}")) as opened:
        opened.declare("q")
        opened.enqueue("q", b"held")
        yield opened


def _with_queue(test: Callable[[Queue], None]) -> None:
    with Queue(store=MemoryStore(f"validation-{next(_names)}")) as q:
        q.declare("q")
        q.enqueue("q", b"held")
        test(q)
        _stored_state_decodes(q)


_fast = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_fast
@given(name=st.sampled_from(SETTINGS), value=ODD_VALUES)
def test_declare_and_configure_never_store_an_invalid_setting(name: str, value: Any) -> None:
    def run(q: Queue) -> None:
        _attempt(lambda: q.declare(f"fresh-{next(_names)}", **{name: value}))
        _attempt(lambda: q.configure("q", **{name: value}))
        stored = getattr(q.config("q"), name)
        if name in GROUP_SETTINGS:  # unset (not stored), or a value of its own kind
            assert stored is msgspec.UNSET or (
                type(stored) is bool if name == "fairness" else type(stored) is int and stored >= 1
            ), stored
            return
        if stored is None:  # "never", the default of the settings that may be unset
            assert name in UNSET_BY_DEFAULT, name
            return
        assert isinstance(stored, int if name == "max_attempts" else float)
        assert math.isfinite(stored) and stored > 0

    _with_queue(run)


@_fast
@given(
    option=st.sampled_from(["priority", "delay", "max_attempts", "key"]),
    value=ODD_VALUES,
    many=st.booleans(),
)
def test_enqueue_options_never_store_an_invalid_job(option: str, value: Any, many: bool) -> None:
    def run(q: Queue) -> None:
        if many and option == "key":
            _attempt(lambda: q.enqueue_many("q", [b"a", b"b"], keys=[value, None]))
        elif many:
            _attempt(lambda: q.enqueue_many("q", [b"a", b"b"], **{option: value}))
        else:
            _attempt(lambda: q.enqueue("q", b"a", **{option: value}))

    _with_queue(run)


@_fast
@given(option=st.sampled_from(["n", "lease", "owner"]), value=ODD_VALUES)
def test_claim_options_never_store_an_invalid_lease(option: str, value: Any) -> None:
    def run(q: Queue) -> None:
        arguments: dict[str, Any] = {"n": 1, option: value}
        n = arguments.pop("n")
        if _attempt(lambda: q.claim("q", n, **arguments)):
            return
        # A refused claim leased nothing: the job is still there for a valid one.
        [delivery] = q.claim("q")
        q.ack(delivery)

    _with_queue(run)


@_fast
@given(
    call=st.sampled_from(["heartbeat", "nack-delay", "nack-error", "nack-retry"]),
    value=ODD_VALUES,
)
def test_settling_options_never_store_an_invalid_job(call: str, value: Any) -> None:
    def run(q: Queue) -> None:
        [delivery] = q.claim("q")
        if call == "heartbeat":
            _attempt(lambda: q.heartbeat([delivery], lease=value))
        elif call == "nack-delay":
            _attempt(lambda: q.nack(delivery, delay=value))
        elif call == "nack-error":
            _attempt(lambda: q.nack(delivery, error=value))
        else:
            _attempt(lambda: q.nack(delivery, retry=value))

    _with_queue(run)


@_fast
@given(
    option=st.sampled_from(["priority", "delay", "max_attempts", "write_id", "count"]),
    value=ODD_VALUES,
)
def test_staged_enqueue_options_never_store_an_invalid_job(option: str, value: Any) -> None:
    def run(q: Queue) -> None:
        q.store.put("staging/w1/one.json", b'[["a", false], ["b", false]]')
        count = value if option == "count" else 2
        staged = [StagedBodies("staging/w1/one.json", count)]
        arguments: dict[str, Any] = {"write_id": "w1"}
        if option != "count":
            arguments[option] = value
        _attempt(lambda: q.enqueue_staged("q", staged, **arguments))

    _with_queue(run)


@_fast
@given(
    call=st.sampled_from(["retry_dead", "purge_dead", "jobs-state", "jobs-limit", "queue"]),
    value=ODD_VALUES,
)
def test_operating_calls_refuse_bad_arguments(call: str, value: Any) -> None:
    def run(q: Queue) -> None:
        if call == "retry_dead":
            _attempt(lambda: q.retry_dead("q", value))
        elif call == "purge_dead":
            _attempt(lambda: q.purge_dead("q", value))
        elif call == "jobs-state":
            _attempt(lambda: q.jobs("q", state=value))
        elif call == "jobs-limit":
            _attempt(lambda: q.jobs("q", limit=value))
        else:
            _attempt(lambda: q.enqueue(value, b"x"))
            _attempt(lambda: q.declare(value))

    _with_queue(run)


# --- the defect that bricked a namespace, pinned ---------------------------------------------


def test_a_fractional_max_attempts_is_refused_and_nothing_is_committed(queue: Queue) -> None:
    version = Snapshot.read(queue.store).version
    with pytest.raises(ConfigurationError, match=r"max_attempts: expected int, found 2\.5"):
        queue.configure("q", max_attempts=2.5)
    with pytest.raises(ConfigurationError, match=r"max_attempts: expected int, found '3'"):
        queue.declare("other", max_attempts="3")
    with pytest.raises(
        ConfigurationError, match=r"lease_seconds: expected float > 0\.0, found nan"
    ):
        queue.declare("other", lease_seconds=math.nan)
    assert Snapshot.read(queue.store).version == version
    assert queue.queues() == ["q"]
    # Every other process still reads the namespace.
    with Queue(store=queue.store) as other:
        assert other.stats("q").ready == 1


def test_arguments_accepted_once_are_checked_again_in_another_type(queue: Queue) -> None:
    # Given enqueue and claim arguments accepted once (a producer's and a consumer's usual)
    queue.enqueue("q", b"x", priority=1, delay=1, max_attempts=2)
    assert [d.job.payload for d in queue.claim("q", lease=1)] == [b"held"]
    version = Snapshot.read(queue.store).version
    # When the same values come as bools, or in a container that cannot be remembered
    refused: dict[str, Callable[[], object]] = {
        r"enqueue to 'q': priority: expected int, found True": lambda: queue.enqueue(
            "q", b"x", priority=True
        ),
        r"enqueue to 'q': delay: expected seconds or a timedelta, found True": lambda: (
            queue.enqueue("q", b"x", delay=True)
        ),
        r"enqueue to 'q': max_attempts: expected int \| null, found True": lambda: queue.enqueue(
            "q", b"x", max_attempts=True
        ),
        r"claim from \['q'\]: lease: expected seconds or a timedelta, found True": lambda: (
            queue.claim("q", lease=True)
        ),
        r"claim from \['q'\]: n: expected int, found True": lambda: queue.claim("q", True),
        r"enqueue to \['q'\]: queue: expected str": lambda: queue.enqueue(["q"], b"x"),  # type: ignore[arg-type]
        r"claim from \[\['q'\]\]: queues: expected str, found \['q'\]": lambda: queue.claim(
            [["q"]]  # type: ignore[list-item]
        ),
    }
    # Then each is refused as the first time, saying where, and nothing is committed
    for message, call in refused.items():
        with pytest.raises(ConfigurationError, match=message):
            call()
    assert Snapshot.read(queue.store).version == version


def test_the_model_refuses_settings_built_in_code() -> None:
    # A QueueConfig made in code skips msgspec's constraints; the model checks it again.
    state = QueueState()
    with pytest.raises(ConfigurationError, match=r"max_attempts: expected int, found 2\.5"):
        state.declare("q", QueueConfig(max_attempts=2.5))  # type: ignore[arg-type]
    assert state.queue_names() == []
    assert not state.dirty


# --- operations from another process are checked by the same constraints --------------------


def test_operations_round_trip_on_the_wire_and_bad_ones_are_refused() -> None:
    decoder = msgspec.json.Decoder(op_types.ANY_OP)
    claim = op_types.Claim(["q"], ["t.0"], "host:1", 30.0)
    assert decoder.decode(msgspec.json.encode(claim)) == claim
    for bad in (
        b'{"type": "Claim", "queues": ["q"], "tokens": ["t"], "owner": "o", "lease_seconds": 1e400}',  # noqa: E501
        b'{"type": "Claim", "queues": ["a/b"], "tokens": ["t"], "owner": "o"}',
        b'{"type": "Configure", "queue": "q", "changes": {"max_attempts": "3"}}',
        b'{"type": "Declare", "queue": "q", "config": {"max_attempts": 2.5}}',
        b'{"type": "Enqueue", "items": [{"id": "j", "queue": "q", "body": "x", "priority": 1e3}]}',
    ):
        with pytest.raises(msgspec.ValidationError):
            decoder.decode(bad)
    # A change may be a flag (``fairness``), so a flag where a number belongs decodes, and is
    # refused when applied: alone, as any setting out of range is.
    flagged = decoder.decode(
        b'{"type": "Configure", "queue": "q", "changes": {"max_attempts": true}}'
    )
    state = QueueState()
    state.declare("q", None, 0.0)
    with pytest.raises(ConfigurationError, match="max_attempts"):
        flagged.apply(state, 0.0)
    assert state.config("q").max_attempts == QueueConfig().max_attempts


@pytest.mark.parametrize("value", [0, -1, math.inf, math.nan, 1e300, "4e9", True])
def test_a_setting_in_seconds_is_refused_unless_positive_and_within_a_century(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="at most about a century") as refused:
        positive_seconds(value, "takeover_seconds", where="objq broker")
    assert "takeover_seconds" in str(refused.value) and repr(value) in str(refused.value)
    assert positive_seconds(MAX_SECONDS, "takeover_seconds", where="objq broker") == MAX_SECONDS
