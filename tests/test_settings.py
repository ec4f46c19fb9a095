"""Every setting is declared once, in its component's settings struct, and works every way the
component takes it: as a keyword (or option), in a URL's query, from the environment, and on
the command line where the command exposes it. The docs' option tables list exactly the
struct's fields, with its defaults; the constructors that still spell their keywords out agree
with the struct, and the keyword types of ``Queue`` and ``AsyncQueue`` name every setting."""

from __future__ import annotations

import inspect
import itertools
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from objq_broker import ConfigurationError, Queue
from objq_broker.broker.settings import BrokerOptions, broker_settings
from objq_broker.builders import default_owner
from objq_broker.core import QueueOptions
from objq_broker.dashboard.settings import DashboardSettings, token_from
from objq_broker.dramatiq.broker import DramatiqSettings, ObjqBroker
from objq_broker.engine import Engine
from objq_broker.engine.options import (
    ENGINE_OPTIONS,
    EngineOptions,
    EngineSettings,
    QueueSettings,
    resolve_store,
)
from objq_broker.kombu.settings import OWN_OPTIONS, TransportOptions, TransportSettings
from objq_broker.model.settings import defaults, env_names, option_names, text_names
from objq_broker.results.celery.settings import BackendSettings, backend_settings
from objq_broker.storage import url as storage_url
from objq_broker.storage.url import StoreOptions
from tests.cli.objq_cli import parse_command

ROOT = Path(__file__).resolve().parent.parent
_names = itertools.count()
_TOKEN = "a-token-of-at-least-16-characters"

#: For every setting of every struct: a valid value other than the default, and the same
#: value as text (None: text cannot give it). A setting added without one fails below.
SAMPLES: dict[type[msgspec.Struct], dict[str, tuple[Any, str | None]]] = {
    QueueSettings: {
        "key": ("other-state.json", None),
        "archive": (False, "off"),
        "archive_tail_bytes": (0, "0"),
        "max_batch_ops": (7, "7"),
        "max_batch_bytes": (4096, "4096"),
        "linger_seconds": (0.05, "50ms"),
        "commit_deadline_seconds": (120.0, "2m"),
        "max_staleness_seconds": (0.5, "0.5"),
        "idle_tick_seconds": (2.0, "2s"),
        "epoch": (3, None),
        "exclusive": (True, None),
        "seed": (42, "42"),
        "spill_at": (None, "none"),
        "run_jobs": (5, "5"),
        "gc_interval_seconds": (None, "none"),
        "gc_older_than_seconds": (7200.0, "2h"),
        "inline_state_bytes": (0, "0"),
        "max_state_bytes": (1 << 20, "1048576"),
        "clock": (lambda: 1.0, None),
        "owner": ("settings-test", None),
        "poll_seconds": (0.25, None),
        "max_poll_seconds": (2.0, None),
        "implicit_queues": (True, None),
    },
    BrokerOptions: {
        "broker_listen": ("127.0.0.1:7799", "127.0.0.1:7799"),
        "broker_advertise": ("10.0.0.5:7799", "10.0.0.5:7799"),
        "broker_token": (_TOKEN, _TOKEN),
        "broker_takeover_seconds": (2.5, "2.5s"),
    },
    TransportOptions: {
        "url": ("memory://settings-kombu", "memory://settings-kombu"),
        "visibility_timeout": (90.0, "1.5m"),
        "heartbeat_interval": (10.0, "10"),
        "polling_interval": (0.25, "250ms"),
        "max_staleness_seconds": (0.01, "10ms"),
        "store_options": ({"check_conditions": False}, None),
        "max_deliveries": (3, "3"),
        "batch_size": (7, "7.0"),
        "bindings_ttl": (2.0, "2"),
    },
    DramatiqSettings: {
        "lease_seconds": (12.0, "12s"),
        "heartbeat_seconds": (2.0, "2"),
        "dead_message_ttl": (60_000.0, "1m"),
        "max_deliveries": (3, "3"),
        "max_claim": (16, "16"),
    },
    DashboardSettings: {
        "token": (_TOKEN, _TOKEN),
        "refresh_seconds": (0.5, None),
        "page_size": (10, None),
        "session_seconds": (60.0, None),
        "allowed_hosts": (("localhost",), None),
    },
    BackendSettings: {
        "url": ("memory://settings-results", None),
        "prefix": ("elsewhere/", None),
        "store_options": ({"check_conditions": False}, None),
        "global_keyprefix": ("app-", None),
    },
}


def _build_queue(way: str, name: str, value: Any, text: str | None) -> dict[str, Any]:
    url = f"memory://settings-{next(_names)}"
    if way == "url":
        url += f"?{name}={text}"
        options: dict[str, Any] = {}
    else:
        options = {name: value}
    own = {k: options.pop(k) for k in list(options) if k not in ENGINE_OPTIONS}
    with Queue(url, broker="off", **own, **options) as queue:
        found = {k: getattr(queue, k) for k in own}
        committer = queue.committer
        found |= {k: getattr(committer, k) for k in ENGINE_OPTIONS if hasattr(committer, k)}
    _, engine_options = resolve_store(url, None, dict(options), "Queue")
    return {**engine_options, **{k: v for k, v in found.items() if k == name}}


def _build_broker(way: str, name: str, value: Any, text: str | None) -> dict[str, Any]:
    read = broker_settings("off", {name: value} if way == "keyword" else {})
    return {"broker_" + k: v for k, v in vars(read).items()}


def _build_transport(way: str, name: str, value: Any, text: str | None) -> dict[str, Any]:
    options = {name: value if way == "keyword" else text}
    hostname = None if name == "url" else "memory://settings-kombu"
    read = TransportSettings.from_connection(hostname, options)
    found = {**vars(read), **read.queue_options}
    if name == "store_options":
        found[name] = {k: read.queue_options[k] for k in value}
    return found


def _build_dramatiq(way: str, name: str, value: Any, text: str | None) -> dict[str, Any]:
    keywords: dict[str, Any] = {}
    if way != "environment":
        keywords[name] = value if way == "keyword" else text
    broker = ObjqBroker(url=f"memory://settings-{next(_names)}", broker="off", **keywords)
    try:
        return dict(vars(broker))
    finally:
        broker.close()


def _build_dashboard(way: str, name: str, value: Any, text: str | None) -> dict[str, Any]:
    if way == "environment":
        return {"token": token_from(None)}
    return msgspec.structs.asdict(DashboardSettings(**{name: value}))


def _build_backend(way: str, name: str, value: Any, text: str | None) -> dict[str, Any]:
    url = None if name == "url" else "memory://settings-results"
    return msgspec.structs.asdict(backend_settings(url, {name: value}))


#: How each component is built from one setting given one way, and what it then holds.
BUILDERS: dict[type[msgspec.Struct], Callable[[str, str, Any, str | None], dict[str, Any]]] = {
    QueueSettings: _build_queue,
    BrokerOptions: _build_broker,
    TransportOptions: _build_transport,
    DramatiqSettings: _build_dramatiq,
    DashboardSettings: _build_dashboard,
    BackendSettings: _build_backend,
}
#: The ways a component takes a setting besides a keyword: text in an option dict (kombu's
#: transport options and the Dramatiq broker's keywords read text as the environment's), a
#: URL's query (the engine's settings).
TEXT_WAY = {QueueSettings: "url", TransportOptions: "text", DramatiqSettings: "text"}
#: Command-line options that give a setting: (struct, setting) -> (argv, parsed attribute).
CLI = {
    (BrokerOptions, "broker_takeover_seconds"): (
        ["broker", "--takeover-seconds"],
        "takeover_seconds",
    ),
    (BrokerOptions, "broker_listen"): (["broker", "--listen"], "listen"),
    (BrokerOptions, "broker_advertise"): (["broker", "--advertise"], "advertise"),
    (DashboardSettings, "token"): (["dashboard", "--token"], "token"),
}


def _cases() -> Iterator[Any]:
    for struct, samples in SAMPLES.items():
        envs = env_names(struct)
        for name, (_, text) in samples.items():
            yield pytest.param(struct, name, "keyword", id=f"{struct.__name__}-{name}-keyword")
            way = TEXT_WAY.get(struct)
            if way and text is not None and name in text_names(struct):
                yield pytest.param(struct, name, way, id=f"{struct.__name__}-{name}-{way}")
            if name in envs:
                yield pytest.param(struct, name, "environment", id=f"{struct.__name__}-{name}-env")
            if (struct, name) in CLI:
                yield pytest.param(struct, name, "cli", id=f"{struct.__name__}-{name}-cli")


@pytest.mark.parametrize(("struct", "name", "way"), list(_cases()))
def test_every_setting_works_every_way_its_component_takes_it(
    struct: type[msgspec.Struct], name: str, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    value, text = SAMPLES[struct][name]
    for variable in env_names(struct).values():
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("OBJQ_BROKER", raising=False)
    assert value != defaults(struct)[name], "a sample must differ from the default"
    if way == "cli":
        argv, attribute = CLI[(struct, name)]
        assert parse_command([*argv, str(text)])[attribute] == value
        return
    if way == "environment":
        assert text is not None
        monkeypatch.setenv(env_names(struct)[name], text)
    held = BUILDERS[struct](way, name, value, text)[name]
    if callable(value):
        assert held is value
    elif isinstance(value, float):
        assert held == pytest.approx(value)
    else:
        assert held == value


def test_every_setting_has_a_sample_and_every_struct_a_builder() -> None:
    for struct, samples in SAMPLES.items():
        assert set(samples) == option_names(struct), struct.__name__
        assert struct in BUILDERS


def test_engine_options_are_the_struct_fields_and_run_jobs_is_one() -> None:
    assert option_names(EngineSettings) == ENGINE_OPTIONS
    assert "run_jobs" in ENGINE_OPTIONS
    with Queue("memory://settings-run-jobs", broker="off", run_jobs=5) as queue:
        assert queue.committer.run_jobs == 5  # type: ignore[attr-defined]
    with Queue("memory://settings-run-jobs-url?run_jobs=5", broker="off") as queue:
        assert queue.committer.run_jobs == 5  # type: ignore[attr-defined]


def test_the_engine_constructor_takes_exactly_the_struct_fields_with_its_defaults() -> None:
    parameters = inspect.signature(Engine).parameters
    keywords = {
        name: p.default
        for name, p in parameters.items()
        if p.kind is p.KEYWORD_ONLY and name != "bodies"  # a broker's shared cache, not a setting
    }
    assert set(keywords) == option_names(EngineSettings)
    assert keywords == defaults(EngineSettings)


def test_queue_and_dramatiq_constructors_agree_with_their_structs() -> None:
    assert set(EngineOptions.__optional_keys__) == option_names(EngineSettings)
    assert set(StoreOptions.__optional_keys__) == set().union(*storage_url._OPTIONS.values())
    keywords = option_names(QueueSettings) | option_names(BrokerOptions) | {"broker"}
    assert set(QueueOptions.__optional_keys__) == keywords | set(StoreOptions.__optional_keys__)
    own = option_names(QueueSettings) - option_names(EngineSettings)
    with Queue("memory://settings-defaults", broker="off") as queue:
        held = {name: getattr(queue, name) for name in own}
    # owner None: the host and pid
    expected = defaults(QueueSettings) | {"owner": default_owner()}
    assert held == {name: expected[name] for name in own}
    broker = inspect.signature(ObjqBroker).parameters
    for name, default in defaults(DramatiqSettings).items():
        # None: read from the environment, or computed from another (lease / 3)
        assert broker[name].default in (default, None), name


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"run_jobs": 0}, "run_jobs: expected a positive whole number"),
        ({"linger_seconds": float("nan")}, "linger_seconds: expected a number of seconds"),
        ({"archive": "yes"}, "archive: expected true or false"),
    ],
)
def test_a_refused_keyword_names_the_setting_and_what_it_must_be(
    given: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigurationError, match=expected):
        Queue("memory://settings-refused", broker="off", **given)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("memory://x?run_jobs=0", "run_jobs: expected a positive whole number, found 0"),
        ("memory://x?run_jobs=many", "run_jobs: expected a whole number, found 'many'"),
        ("memory://x?linger_seconds=soon", "linger_seconds: expected a number of seconds"),
        ("memory://x?archive=perhaps", "archive: expected true/false"),
        ("memory://x?colour=red", "unknown option 'colour'"),
        # which state object, and who writes it: the same for every tool that opens the URL
        ("memory://x?key=other.json", "unknown option 'key'"),
        ("memory://x?exclusive=true", "unknown option 'exclusive'"),
    ],
)
def test_a_refused_url_setting_names_it(url: str, expected: str) -> None:
    with pytest.raises(ConfigurationError, match=expected):
        Queue(url, broker="off")


def test_a_setting_in_both_the_url_and_a_keyword_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="both in the URL and as keywords"):
        Queue("memory://settings-twice?run_jobs=5", broker="off", run_jobs=6)


def test_a_refused_environment_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OBJQ_BROKER_TAKEOVER_SECONDS", "0")
    with pytest.raises(ConfigurationError, match=r"\$OBJQ_BROKER_TAKEOVER_SECONDS"):
        broker_settings("off", {})


def test_a_token_is_never_shown_in_a_refusal() -> None:
    with pytest.raises(ConfigurationError) as refused:
        broker_settings("off", {"broker_token": 1234567890123456789})
    assert "1234567890123456789" not in str(refused.value)


# --- the docs' tables --------------------------------------------------------------------------

#: (file, text just before the table, struct): each table lists exactly its struct's settings.
TABLES = [
    ("docs/queue.md", "Queue settings, as keywords of `Queue(...)`", QueueSettings),
    ("docs/broker.md", "Options (keywords of `Queue`/`AsyncQueue`", BrokerOptions),
    ("docs/celery.md", "## Transport options", TransportOptions),
    ("docs/celery.md", "`result_backend_transport_options` accepts:", BackendSettings),
    ("docs/dramatiq.md", "## The broker's settings", DramatiqSettings),
    ("docs/dashboard.md", "`DashboardSettings` takes:", DashboardSettings),
]
#: What a table writes for "no default" (the setting is None, or computed from another).
_NO_VALUE = re.compile(r"^(none|\u2013|-|the bound address|\w+ / 3)$")
_UNITS = {"kib": 1024, "mib": 1024 * 1024}


def _table(path: str, after: str) -> tuple[list[str], list[list[str]]]:
    text = (ROOT / path).read_text()
    lines = text[text.index(after) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    header, _, *body = rows
    return [cell.lower() for cell in header], body


def _shows(cell: str, default: Any) -> bool:
    """Whether a table's default cell says ``default``."""
    shown = cell.replace("`", "").strip().lower()
    if default is None or default == "":
        return bool(_NO_VALUE.match(shown))
    if isinstance(default, bool):
        return shown in (("true", "on") if default else ("false", "off"))
    if callable(default):
        return shown == f"{default.__module__}.{default.__name__}"
    if isinstance(default, int | float):
        number, _, unit = shown.partition(" ")
        return float(number.replace(",", "")) * _UNITS.get(unit, 1) == default
    if isinstance(default, dict):
        return shown == "{}" and default == {}
    return shown == str(default).lower()


@pytest.mark.parametrize(("path", "after", "struct"), TABLES, ids=[t[2].__name__ for t in TABLES])
def test_each_docs_table_lists_its_structs_settings_with_their_defaults(
    path: str, after: str, struct: type[msgspec.Struct]
) -> None:
    header, body = _table(path, after)
    listed = {row[0].strip("`"): row for row in body if row[0].startswith("`")}
    assert set(listed) == option_names(struct), f"{path}: the table and {struct.__name__} differ"
    default_column = header.index("default")
    for name, default in defaults(struct).items():
        cell = listed[name][default_column]
        assert _shows(cell, default), f"{path}: {name}: the table says {cell!r}, not {default!r}"
    if "environment" in header:
        column = header.index("environment")
        shown = {
            name: m[0] if (m := re.search(r"OBJQ_\w+", row[column])) else None
            for name, row in listed.items()
        }
        assert {k: v for k, v in shown.items() if v} == env_names(struct), path


def test_the_kombu_table_lists_every_engine_option_the_transport_passes_on() -> None:
    _, body = _table("docs/celery.md", "## Transport options")
    [row] = [row for row in body if row[0] == "engine options"]
    listed = set(re.findall(r"`(\w+)`", row[2])) - {"Queue"}
    assert listed == ENGINE_OPTIONS - {"clock", "seed"} - OWN_OPTIONS


def test_the_storage_url_table_lists_each_schemes_options() -> None:
    _, body = _table("docs/storage.md", "## Storage URLs")
    for row in body:
        scheme = row[0].strip("`").split("://")[0]
        listed = set(re.findall(r"`([a-z_]+)=?`", row[2]))
        # check_conditions is every scheme's, said once below the table
        assert listed == set(storage_url._OPTIONS[scheme]) - {"check_conditions"}, scheme
