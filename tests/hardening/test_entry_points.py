"""Bad values given to objq's entry points never reach the shared state.

The Python API checks its arguments (``tests/test_validation.py``); this proves the same for
what reaches it from outside: the ``objq`` command line, Dramatiq's broker and actor options,
and kombu/Celery message properties. Each input either is refused with an error that names the
argument (the command exits 2 with one ``objq: error:`` line), or is accepted; either way the
stored state still decodes, and a refusal commits nothing.

The command line runs as the real ``objq`` executable for the cases people type, and in
process (``main()``, the function the executable calls) where Hypothesis drives it widely.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import math
import os
import shlex
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import dramatiq
import kombu
import pytest
from celery import Celery
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import objq_broker.kombu  # noqa: F401  (registers the objq transport)
from objq_broker import ConfigurationError, Queue
from objq_broker.cli import main
from objq_broker.cli.values import FLAGS, MAX_DEMO_JOBS, MAX_THREADS, SETTINGS, TIME_RANGE
from objq_broker.dramatiq import ObjqBroker
from objq_broker.model.checks import MAX_ATTEMPTS, MAX_CLAIM, MAX_SECONDS, PRIORITY_RANGE
from objq_broker.model.durations import parse_duration, parse_time
from objq_broker.storage import open_store
from tests.cli.objq_cli import Result, one_line_error, parse_command, run_objq
from tests.support.state import assert_state_decodes
from tests.support.waiting import wait_for
from tests.test_validation import ODD_VALUES

_names = itertools.count()
_fast = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

#: What people type by mistake, or on purpose to see what happens, for a number or a duration.
ODD_TEXT = st.one_of(
    st.sampled_from(
        [
            "nan",
            "NaN",
            "inf",
            "-inf",
            "1e400",
            "1e300",
            "-1e300",
            "99999999999999999999",
            "-99999999999999999999",
            "2147483648",
            "-2147483649",
            "1000001",
            "0",
            "-0",
            "-1",
            "1",
            "1.5",
            "2.0",
            "True",
            "",
            " ",
            "0x10",
            "1_000",
            "10s",
            "15m",
            "2h",
            "7d",
            "36500d",
            "36501d",
            "-5s",
            "2999-01-01T00:00",
            "0001-01-01",
            "\udcff",  # a byte that is not UTF-8, as Python hands it over from argv
            "x\udcffy",
            "a/b",
            "a\x00b",
            "9" * 5000,
        ]
    ),
    st.text(st.characters(exclude_categories=()), max_size=8),  # surrogates included
    st.integers().map(str),
    st.floats().map(repr),
)


# --- the objq command ------------------------------------------------------------------------


def _cli_store(folder: Path) -> str:
    """A file store holding queue ``q`` and one job in it."""
    url = folder.as_uri()
    with Queue(url) as queue:
        queue.declare("q")
        queue.enqueue("q", b"held")
    return url


def _state_version(url: str) -> int:
    store = open_store(url)
    try:
        return assert_state_decodes(store).version
    finally:
        store.close()


def _run_in_process(argv: list[str]) -> Result:
    """``objq ARGV`` run in this process by ``main()``, as the executable runs it."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return Result(status, out.getvalue(), err.getvalue())


#: Command lines of the field report, run as the real executable; the fragments their one
#: error line must hold.
FIELD_COMMAND_LINES = [
    ("enqueue q x --delay nan", ["argument --delay", "'nan'"]),
    ("enqueue q x --delay 1e400", ["argument --delay", "'1e400'"]),
    ("config set q lease inf", ["argument VALUE: lease", "'inf'"]),
    ("config set q dead-ttl nan", ["argument VALUE: dead-ttl", "'nan'"]),
    ("declare q2 --lease nan", ["argument --lease", "'nan'"]),
    ("enqueue q x --priority 1.5", ["argument --priority", "whole number", "'1.5'"]),
    ("declare q2 --max-attempts 0", ["max_attempts", "int >= 1", "found 0"]),
    # A byte that is not UTF-8 reaches Python as a lone surrogate, which no JSON holds.
    ("enqueue q x --key \udcff", ["argument --key", "expected UTF-8 text", "'\\udcff'"]),
]

#: More command lines to refuse, run in process.
REFUSED_COMMAND_LINES = [
    ("enqueue q x --delay 1e300", ["argument --delay", "at most 36500d", "'1e300'"]),
    ("enqueue q x --priority 99999999999999", ["--priority", "x<=2147483647"]),
    ("enqueue q x --max-attempts 0", ["argument --max-attempts", "0 is not", "1<=x"]),
    ("enqueue q x --max-attempts 2000000", ["--max-attempts", "x<=1000000"]),
    ("enqueue q x --batch 0", ["argument --batch", "x>=1"]),
    ("enqueue q x --key ''", ["key", "length >= 1", "''"]),
    ("enqueue 'a/b' x", ["queue", "'a/b'"]),
    ("enqueue q x\udcff", ["argument payload", "expected UTF-8 text"]),
    ("config set q lease_seconds 0", ["lease_seconds", "above zero", "'0'"]),
    ("config set q backoff-cap 1e12", ["backoff-cap", "at most 36500d", "'1e12'"]),
    ("config set q max-attempts 2.5", ["max-attempts", "whole number", "'2.5'"]),
    ("config set q max-attempts 0", ["max_attempts", "int >= 1", "found 0"]),
    ("declare q2 --expires 0", ["argument --expires", "above zero"]),
    ("enqueue-cmd q --timeout 0 -- true", ["argument --timeout", "above zero", "'0'"]),
    ("enqueue-cmd q --env NOEQUALS -- true", ["--env", "NAME=VALUE", "'NOEQUALS'"]),
    ("enqueue-cmd q --cwd /tmp/\udcff -- true", ["argument --cwd", "expected UTF-8 text"]),
    ("archive cat --since 99999999999999", ["argument --since", "1970-01-01", "9999-01-01"]),
    ("status --watch 1e300", ["argument --watch", "at most 36500d"]),
    ("worker --queue q --count 0", ["argument --count", "1<=x"]),
    ("worker --queue q --prefetch 200000", ["argument --prefetch", "200000 is not in the range"]),
    ("broker --takeover-seconds nan", ["argument --takeover-seconds", "'nan'"]),
    ("demo --jobs 10000000", ["argument --jobs", "x<=100000"]),
]


def test_field_command_lines_exit_2_naming_the_option_and_commit_nothing(
    tmp_path: Path,
) -> None:
    # Given a store with one queue and one job
    url = _cli_store(tmp_path / "store")
    version = _state_version(url)

    # When each bad command line runs as the real executable (refusals write nothing, so they
    # may run side by side)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(
            pool.map(lambda case: run_objq(*shlex.split(case[0]), url=url), FIELD_COMMAND_LINES)
        )

    # Then each exits 2 with one line naming what it refused, and nothing was committed:
    # `objq status` still reads the store and shows the one job
    for (line, fragments), result in zip(FIELD_COMMAND_LINES, results, strict=True):
        try:
            one_line_error(result, 2, "objq: error: ", *fragments)
        except AssertionError as exc:
            raise AssertionError(f"objq {line}: {exc}") from None
    assert _state_version(url) == version
    status = run_objq("status", "--json", url=url)
    assert status.code == 0, status.stderr
    assert [(q["queue"], q["ready"]) for q in status.json()["queues"]] == [("q", 1)]


@pytest.fixture(scope="module")
def refusing_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    """A store with one queue and one job, shared by commands that must all be refused;
    its state version."""
    url = _cli_store(tmp_path_factory.mktemp("refusing"))
    return url, _state_version(url)


@pytest.mark.parametrize(("line", "fragments"), REFUSED_COMMAND_LINES)
def test_refused_command_lines_exit_2_naming_the_option_and_commit_nothing(
    refusing_store: tuple[str, int], line: str, fragments: list[str]
) -> None:
    url, version = refusing_store
    one_line_error(_run_in_process(["--url", url, *shlex.split(line)]), 2, *fragments)
    assert _state_version(url) == version


def _names_option(line: str, option: str) -> bool:
    """Whether an error line names ``option`` (``max-attempts`` or ``max_attempts``)."""
    return option.replace("-", "_") in line.replace("-", "_")


#: Commands that commit, each with one option (``{v}`` is the value) and the name its refusal
#: must give. Values go after ``=`` or ``--`` so one starting with ``-`` stays a value.
COMMITTING = [
    (["enqueue", "q", "x", "--priority={v}"], "priority"),
    (["enqueue", "q", "x", "--delay={v}"], "delay"),
    (["enqueue", "q", "x", "--max-attempts={v}"], "max-attempts"),
    (["enqueue", "q", "x", "--key={v}"], "key"),
    (["enqueue", "q", "--", "{v}"], "payload"),
    (["enqueue", "--", "{v}", "x"], "queue"),
    (["enqueue-cmd", "q", "--timeout={v}", "--", "true"], "timeout"),
    (["enqueue-cmd", "q", "--env={v}", "--", "true"], "env"),
    (["enqueue-cmd", "q", "--cwd={v}", "--", "true"], "cwd"),
    *((["declare", "d", f"--{name}={{v}}"], name) for name in SETTINGS),
    *((["config", "set", "q", name, "--", "{v}"], name) for name in SETTINGS),
]


@_fast
@given(command=st.sampled_from(COMMITTING), value=ODD_TEXT)
def test_committing_commands_refuse_bad_values_and_never_store_one(
    tmp_path_factory: pytest.TempPathFactory, command: tuple[list[str], str], value: str
) -> None:
    template, option = command
    url = _cli_store(tmp_path_factory.mktemp("cli"))
    version = _state_version(url)

    result = _run_in_process(["--url", url, *(word.replace("{v}", value) for word in template)])
    status, err = result.code, result.stderr

    assert status in (0, 2), err
    if status == 2:
        [line] = err.strip().splitlines()
        assert line.startswith("objq: error: "), line
        assert _names_option(line, option), (option, line)
        assert _state_version(url) == version, "a refused command committed"
    else:
        assert err == "", err
        _state_version(url)  # decodes


def _whole_in(low: int, high: int | None = None) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and low <= v and (high is None or v <= high)


def _duration_in(above_zero: bool = False) -> Callable[[Any], bool]:
    def check(text: Any) -> bool:
        seconds = parse_duration(text) if isinstance(text, str) else float(text)
        return (seconds > 0 if above_zero else seconds >= 0) and seconds <= MAX_SECONDS

    return check


def _time_in(text: Any) -> bool:
    low, high = TIME_RANGE
    return low.timestamp() <= parse_time(text, time.time()) <= high.timestamp()


#: Options of every command, read-only and long-running ones included: parsing alone refuses
#: what the command or the store would refuse later. (command line, option, accepted values)
PARSED = [
    (["enqueue", "q", "x", "--batch={v}"], "batch", _whole_in(1)),
    (["enqueue", "q", "x", "--priority={v}"], "priority", _whole_in(*PRIORITY_RANGE)),
    (["enqueue", "q", "x", "--max-attempts={v}"], "max-attempts", _whole_in(1, MAX_ATTEMPTS)),
    (["enqueue", "q", "x", "--delay={v}"], "delay", _duration_in()),
    (["enqueue-cmd", "q", "--timeout={v}", "--", "true"], "timeout", _duration_in(True)),
    (["jobs", "list", "q", "--limit={v}"], "limit", _whole_in(1)),
    (["status", "--watch={v}"], "watch", _duration_in()),
    (["archive", "list", "--since={v}"], "since", _time_in),
    (["archive", "cat", "--until={v}"], "until", _time_in),
    (["gc", "--older-than={v}"], "older-than", _duration_in()),
    (["results", "purge", "--older-than={v}"], "older-than", _duration_in()),
    (["worker", "--queue=q", "--count={v}"], "count", _whole_in(1, MAX_THREADS)),
    (["worker", "--queue=q", "--prefetch={v}"], "prefetch", _whole_in(0, MAX_CLAIM - MAX_THREADS)),
    (["worker", "--queue=q", "--timeout={v}"], "timeout", _duration_in(above_zero=True)),
    (["worker", "--queue=q", "--stop-grace={v}"], "stop-grace", _duration_in()),
    (["broker", "--takeover-seconds={v}"], "takeover-seconds", _duration_in(above_zero=True)),
    (["demo", "--jobs={v}"], "jobs", _whole_in(1, MAX_DEMO_JOBS)),
    (["demo", "--workers={v}"], "workers", _whole_in(1, MAX_THREADS)),
    *(
        (["declare", "d", f"--{name}={{v}}"], name, _duration_in(above_zero=True))
        for name in SETTINGS
        if name not in ("max-attempts", "group-concurrency", "fairness")
    ),
    (["declare", "d", "--group-concurrency={v}"], "group-concurrency", _whole_in(1, MAX_CLAIM)),
    (["declare", "d", "--fairness={v}"], "fairness", lambda v: str(v).lower() in FLAGS),
]


@settings(max_examples=150, deadline=None)
@given(option=st.sampled_from(PARSED), value=ODD_TEXT)
def test_every_option_is_checked_as_it_is_parsed(
    option: tuple[list[str], str, Callable[[Any], bool]], value: str
) -> None:
    template, name, accepted = option
    argv = [word.replace("{v}", value) for word in template]
    try:
        params = parse_command(argv)
    except click.BadParameter as exc:
        assert isinstance(exc.param, click.Option), exc
        assert f"--{name}" in exc.param.opts, (name, exc.format_message())
        return
    except click.NoSuchOption:
        # click reads a value that starts with "-" given to an option whose value is optional
        # (--watch [EVERY]) as options of its own; refused all the same, with exit status 2.
        assert name == "watch" and value.startswith("-"), (name, value)
        return
    parsed = params[name.replace("-", "_")]
    assert accepted(parsed), f"--{name}={value!r} was accepted as {parsed!r}"


# --- Dramatiq --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dramatiq_broker() -> Iterator[ObjqBroker]:
    broker = ObjqBroker(url=f"memory://entry-points-dramatiq-{next(_names)}")
    yield broker
    broker.close()


def _totals(broker: ObjqBroker) -> tuple[int, ...]:
    broker.client.flush()
    snap = assert_state_decodes(broker.client.store)
    return tuple(
        stats.ready + stats.delayed + stats.in_flight + stats.dead
        for stats in (snap.stats(name) for name in snap.queue_names())
    )


def _actor(broker: ObjqBroker, **options: Any) -> dramatiq.Actor[[], None]:
    def job() -> None:
        pass

    name = f"job_{next(_names)}"
    return dramatiq.actor(actor_name=name, queue_name="q", broker=broker, **options)(job)


@_fast
@given(option=st.sampled_from(["delay", "broker_priority"]), value=ODD_VALUES)
def test_dramatiq_send_options_are_checked_before_anything_is_stored(
    dramatiq_broker: ObjqBroker, option: str, value: Any
) -> None:
    send = _actor(dramatiq_broker)
    before = _totals(dramatiq_broker)
    try:
        send.send_with_options(**{option: value})
    except ConfigurationError as exc:
        assert option in str(exc), exc
        assert _totals(dramatiq_broker) == before, "a refused message was stored"
        return
    assert sum(_totals(dramatiq_broker)) == sum(before) + 1


@_fast
@given(
    option=st.sampled_from(
        ["broker_priority", "priority", "max_retries", "min_backoff", "time_limit"]
    ),
    value=ODD_VALUES,
)
def test_dramatiq_actor_options_are_checked_when_the_actor_is_declared(
    dramatiq_broker: ObjqBroker, option: str, value: Any
) -> None:
    # broker_priority reaches the state: refused at declaration if no message could carry it.
    # The others are Dramatiq's own (its worker reads them); they never reach the state.
    try:
        actor = _actor(dramatiq_broker, **{option: value})
    except ConfigurationError as exc:
        assert option == "broker_priority" and option in str(exc), exc
        return
    before = sum(_totals(dramatiq_broker))
    actor.send()
    assert sum(_totals(dramatiq_broker)) == before + 1


@_fast
@given(
    option=st.sampled_from(["max_retries", "min_backoff", "eta", "retries", "pipe_target"]),
    value=ODD_VALUES,
)
def test_dramatiq_message_options_travel_in_the_payload_only(
    dramatiq_broker: ObjqBroker, option: str, value: Any
) -> None:
    actor = _actor(dramatiq_broker)
    before = _totals(dramatiq_broker)
    try:
        actor.send_with_options(**{option: value})
    except TypeError:  # Dramatiq's JSON encoder: bytes are not JSON (with any broker)
        assert isinstance(value, bytes)
        assert _totals(dramatiq_broker) == before
        return
    assert sum(_totals(dramatiq_broker)) == sum(before) + 1


@_fast
@given(
    option=st.sampled_from(
        ["lease_seconds", "heartbeat_seconds", "dead_message_ttl", "max_deliveries", "max_claim"]
    ),
    value=ODD_VALUES,
)
# A lease so short that a third of it is no number of seconds: refused as the lease.
@example(option="lease_seconds", value=5e-324)
def test_dramatiq_broker_settings_are_checked_when_it_is_built(option: str, value: Any) -> None:
    url = f"memory://entry-points-settings-{next(_names)}"
    try:
        broker = ObjqBroker(url=url, **{option: value})
    except ConfigurationError as exc:
        assert option in str(exc), exc
        return
    try:
        _actor(broker).send()  # declares the queues with these settings
        assert sum(_totals(broker)) == 1
    finally:
        broker.close()


@pytest.fixture
def quiet_logs() -> Iterator[None]:
    """No logging: a test report carrying a logged lone surrogate cannot be sent from a
    pytest-xdist worker to its controller, which then loses the worker."""
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.usefixtures("quiet_logs")
def test_a_dramatiq_failure_whose_text_is_not_utf8_is_recorded_not_retried_for_ever() -> None:
    # Given an actor whose exception carries a lone surrogate (a file name of undecodable bytes)
    broker = ObjqBroker(url=f"memory://entry-points-surrogate-{next(_names)}")
    name = os.fsdecode(b"/data/\xff.csv")  # as os.listdir() gives it: '/data/\udcff.csv'

    def open_it() -> None:
        raise ValueError(f"cannot parse {name}")

    actor = dramatiq.actor(actor_name="open_it", queue_name="files", broker=broker, max_retries=0)(
        open_it
    )
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=1)
    worker.start()
    try:
        # When it runs and fails
        actor.send()
        broker.join("files", timeout=5_000)
    finally:
        worker.stop()
        broker.close()

    # Then its dead letter keeps the failure, escaped, and the state decodes
    with Queue(store=broker.client.store) as reader:
        [dead] = reader.dead_letters("files")
        assert dead.error is not None and "\\udcff" in dead.error
        assert_state_decodes(reader.store)


# --- kombu and Celery ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kombu_connection() -> Iterator[kombu.Connection]:
    with kombu.Connection(f"objq+memory://entry-points-kombu-{next(_names)}") as connection:
        yield connection


def _kombu_queue(connection: kombu.Connection) -> Queue:
    queue: Queue = connection.transport.open_queue()
    return queue


def _published(connection: kombu.Connection, **properties: Any) -> list[int]:
    """Publish one message to a fresh queue with ``properties``; the objq priorities of the
    jobs it made (none if kombu refused it)."""
    name = f"k{next(_names)}"
    target = kombu.Queue(name, kombu.Exchange(name), name)
    with connection.Producer() as producer:
        producer.publish(
            {"n": 1}, exchange=target.exchange, routing_key=name, declare=[target], **properties
        )
    client = _kombu_queue(connection)
    client.flush()
    assert_state_decodes(client.store)
    return [job.priority for _, job in client.jobs(name)]


def _kombu_priority(value: Any) -> int:
    """What kombu's virtual transports make of a priority: clamped into 0-9, 0 if not a
    number; +-infinity clamped like any other number."""
    if isinstance(value, float) and math.isinf(value):
        return 9 if value > 0 else 0
    try:
        return max(min(int(value or 0), 9), 0)
    except (TypeError, ValueError):
        return 0


@_fast
@given(value=st.one_of(ODD_VALUES, st.sampled_from([math.inf, -math.inf, 300, -3, "high"])))
def test_kombu_priority_is_clamped_as_on_kombus_other_transports(
    kombu_connection: kombu.Connection, value: Any
) -> None:
    try:
        priorities = _published(kombu_connection, priority=value)
    except TypeError:  # kombu's JSON encoder refuses some types (with any transport)
        assert not isinstance(value, int | float | str | None)
        return
    assert priorities == [-_kombu_priority(value)]


ETAS = st.one_of(
    st.sampled_from(
        ["9999-12-31T23:59:59", "0001-01-01T00:00:00", "garbage", "", "2026-13-45", "NaN"]
    ),
    st.datetimes().map(lambda moment: moment.isoformat()),
    ODD_VALUES,
)


@_fast
@given(
    properties=st.one_of(
        st.fixed_dictionaries({"expiration": ODD_VALUES}),
        st.fixed_dictionaries({"delivery_mode": ODD_VALUES}),
        st.fixed_dictionaries({"headers": st.fixed_dictionaries({"eta": ETAS})}),
        st.fixed_dictionaries({"headers": st.fixed_dictionaries({"expires": ETAS})}),
        st.fixed_dictionaries({"headers": st.dictionaries(st.text(max_size=3), ODD_VALUES)}),
    )
)
def test_kombu_message_properties_never_reach_the_state(
    kombu_connection: kombu.Connection, properties: dict[str, Any]
) -> None:
    # kombu itself refuses some (an expiration it cannot multiply, an unknown delivery mode,
    # bytes it cannot encode) before the transport sees them; whatever it sends is one job.
    try:
        priorities = _published(kombu_connection, **properties)
    except (ValueError, TypeError, KeyError, OverflowError):
        return
    assert priorities == [0]


@_fast
@given(value=ODD_VALUES)
@example(value=5e-324)  # positive, yet zero once made seconds
@example(value=0.5)
def test_kombu_queue_expiry_is_checked_when_the_queue_is_declared(
    kombu_connection: kombu.Connection, value: Any
) -> None:
    name = f"x{next(_names)}"
    target = kombu.Queue(name, queue_arguments={"x-expires": value})
    try:
        target(kombu_connection.default_channel).declare()
    except ConfigurationError as exc:
        assert "x-expires" in str(exc), exc
        return
    client = _kombu_queue(kombu_connection)
    client.flush()
    snap = assert_state_decodes(client.store)
    if name in snap.queue_names():  # (one that expires within milliseconds may be gone)
        expires = snap.config(name).expires_seconds
        assert expires is None or 0 < expires <= MAX_SECONDS


@_fast
@given(
    option=st.sampled_from(
        [
            "visibility_timeout",
            "polling_interval",
            "heartbeat_interval",
            "max_deliveries",
            "batch_size",
            "bindings_ttl",
        ]
    ),
    value=ODD_VALUES,
)
@example(option="visibility_timeout", value=5e-324)  # (as for the Dramatiq broker)
def test_kombu_transport_options_are_checked_when_connecting(option: str, value: Any) -> None:
    url = f"objq+memory://entry-points-options-{next(_names)}"
    with kombu.Connection(url, transport_options={option: value}) as connection:
        try:
            connection.connect()
        except ConfigurationError as exc:
            assert option in str(exc), exc
            return
        with connection.SimpleQueue("checked") as simple:
            simple.put({"n": 1})
            simple.get(timeout=5).ack()
        client = _kombu_queue(connection)
        client.flush()
        assert_state_decodes(client.store)


@_fast
@given(
    option=st.sampled_from(["priority", "countdown", "eta", "expires"]),
    value=st.one_of(ODD_VALUES, ETAS),
)
def test_celery_send_options_never_reach_the_state(option: str, value: Any) -> None:
    app = Celery(broker=f"objq+memory://entry-points-celery-{next(_names)}")
    try:
        try:
            app.send_task("entry.points", kwargs={"n": 1}, **{option: value})
            sent = 1
        except (ValueError, TypeError, OverflowError, AttributeError):
            sent = 0  # refused by Celery itself (a countdown or ETA it cannot compute)
        with app.connection_for_write() as connection:
            client = _kombu_queue(connection)
            client.flush()
            snap = assert_state_decodes(client.store)
            jobs = snap.jobs("celery") if "celery" in snap.queue_names() else []
            assert len(jobs) == sent
            assert all(-9 <= job.priority <= 0 for _, job in jobs)
    finally:
        # app.close() leaves the connection send_task used open in kombu's process-wide pool
        # (and with it the transport's threads): closed here
        app.pool.force_close_all()
        app.close()


def test_the_celery_worker_dead_letters_a_malformed_eta_and_holds_a_far_one() -> None:
    # Given a Celery task sent with a malformed ETA header, and one due in year 9999
    from celery.contrib.testing.worker import start_worker

    app = Celery("entry", broker=f"objq+memory://entry-points-eta-{next(_names)}")
    app.conf.update(worker_hijack_root_logger=False, broker_connection_retry_on_startup=False)
    ran = threading.Event()

    app.task(name="entry.eta")(ran.set)

    with app.connection_for_write() as connection, connection.Producer() as producer:
        for eta in ("garbage", "9999-12-31T23:59:59+00:00"):
            producer.publish(
                [[], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}],
                routing_key="celery",
                declare=[kombu.Queue("celery")],
                headers={"task": "entry.eta", "id": f"eta-{eta[:4]}", "eta": eta},
                serializer="json",
            )

    # When a real worker takes them
    worker = start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10)
    with worker, app.connection_for_write() as connection:
        client = _kombu_queue(connection)

        # Then the malformed one is dead-lettered, and the far one is held, leased, not run
        def settled() -> bool:
            stats = client.stats("celery")
            return (stats.dead, stats.in_flight) == (1, 1)

        wait_for(
            settled,
            20,
            "a dead letter and a held ETA task",
            progress=lambda: client.stats("celery"),
        )
        assert not ran.is_set()

    # and the state decodes, with the far one back in the queue once the worker left
    with app.connection_for_write() as connection:
        client = _kombu_queue(connection)
        client.flush()
        after = assert_state_decodes(client.store).stats("celery")
        assert (after.dead, after.ready + after.in_flight + after.delayed) == (1, 1)
    app.close()
