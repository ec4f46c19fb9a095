"""How a queue finds its broker: the ``broker=`` mode and the ``broker_*`` options.

Modes:

* ``off``: no broker; this process commits directly by compare-and-set.
* ``auto`` (the default): the processes sharing a namespace elect one of themselves to commit
  for all. The first to find no reachable broker takes over (serving on ``broker_listen``); the
  others forward their operations to it.
* ``client``: forward to the elected broker, but never serve; with no reachable broker,
  commit directly.
* ``host:port``: always forward to the broker at this address (a dedicated ``objq broker``).

Every option can also come from the environment (``OBJQ_BROKER``, ``OBJQ_BROKER_LISTEN``, ...),
so workers started by Dramatiq or Celery switch modes without code changes. When neither names
a mode, the caller's default applies (``auto`` for a queue, ``client`` for a one-shot command,
which should not become the broker only to resign a moment later), and the settings say it was
not chosen: a queue on a store no other process can see then simply commits directly. This
module does not import pyzmq; the broker's own modules do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from objq_broker.errors import ConfigurationError
from objq_broker.model.checks import PositiveSeconds
from objq_broker.model.settings import option_names, read_settings

Mode = Literal["off", "auto", "client", "fixed"]
#: Seconds a broker may stay unreachable before a process of an ``auto`` namespace takes over.
DEFAULT_TAKEOVER_SECONDS = 5.0
#: Where an elected broker listens unless told: this host only, a port the system picks.
DEFAULT_LISTEN = "127.0.0.1:0"
#: The environment variable that names the mode when ``broker=`` does not.
MODE_ENV = "OBJQ_BROKER"


class BrokerOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The ``broker_*`` options of ``Queue``, each also from its environment variable."""

    #: Where this process serves when elected (host:port).
    broker_listen: Annotated[str, Meta(extra={"env": "OBJQ_BROKER_LISTEN"})] = DEFAULT_LISTEN
    #: The address written in the state for others to reach (None: the bound address).
    broker_advertise: Annotated[str | None, Meta(extra={"env": "OBJQ_BROKER_ADVERTISE"})] = None
    #: The shared secret that encrypts and authenticates the link. Never shown.
    broker_token: Annotated[
        str | None, Meta(extra={"env": "OBJQ_BROKER_TOKEN", "secret": True})
    ] = None
    #: How long the broker may be unreachable before a process takes over.
    broker_takeover_seconds: Annotated[
        PositiveSeconds, Meta(extra={"env": "OBJQ_BROKER_TAKEOVER_SECONDS"})
    ] = DEFAULT_TAKEOVER_SECONDS

    def __repr__(self) -> str:
        return (
            f"BrokerOptions(broker_listen={self.broker_listen!r}, "
            f"broker_advertise={self.broker_advertise!r}, "
            f"broker_takeover_seconds={self.broker_takeover_seconds!r})"
        )


#: Options of earlier versions: a token now encrypts and authenticates the link (CURVE).
_RETIRED = ("broker_tls_cert", "broker_tls_key", "broker_tls_ca")
#: The options this module takes out of ``Queue(**options)``.
BROKER_OPTIONS = option_names(BrokerOptions) | frozenset(_RETIRED)


@dataclass(frozen=True)
class BrokerSettings:
    mode: Mode = "off"
    #: Whether ``mode`` is the caller's default rather than asked for (argument or environment).
    implicit: bool = False
    #: The broker to use in ``fixed`` mode.
    address: str | None = None
    listen: str = DEFAULT_LISTEN
    #: The address written in the state for others to reach (default: the bound address).
    advertise: str | None = None
    #: The shared token: required beyond loopback; with it the link is encrypted and only
    #: processes holding it are let in (:mod:`objq_broker.broker.keys`). Never shown.
    token: str | None = field(default=None, repr=False)
    takeover_seconds: float = DEFAULT_TAKEOVER_SECONDS


def broker_settings(
    broker: str | None, options: dict[str, Any], *, default: Mode = "auto"
) -> BrokerSettings:
    """The settings of ``Queue(broker=..., broker_*=...)``; removes the ``broker_*`` keys from
    ``options``. ``default`` applies when neither ``broker`` nor ``OBJQ_BROKER`` names a mode.
    Raises :class:`ConfigurationError` naming what was expected."""
    given = {key: options.pop(key) for key in list(options) if key in BROKER_OPTIONS}
    retired = [key for key in _RETIRED if given.get(key) or os.environ.get(f"OBJQ_{key.upper()}")]
    if retired:
        raise ConfigurationError(
            f"broker: {', '.join(retired)} no longer exist; the link is secured by the shared "
            "token alone (broker_token= or $OBJQ_BROKER_TOKEN encrypts and authenticates it)"
        )
    chosen = {key: value for key, value in given.items() if value is not None}
    read = read_settings(BrokerOptions, chosen, where="broker", lax=True)
    spec = broker if broker is not None else os.environ.get(MODE_ENV) or None
    implicit = spec is None
    spec = spec or default
    if spec in ("off", "auto", "client"):
        mode: Mode = spec  # type: ignore[assignment]
        address = None
    elif _is_address(spec):
        mode, address = "fixed", spec
    else:
        raise ConfigurationError(
            f"broker: expected 'off', 'auto', 'client' or a host:port address, found {spec!r}"
        )
    for key in ("broker_listen", "broker_advertise"):
        value = getattr(read, key)
        if value is not None and not _is_address(value):
            raise ConfigurationError(f"{key}: expected host:port, found {value!r}")
    return BrokerSettings(
        mode=mode,
        implicit=implicit,
        address=address,
        listen=read.broker_listen,
        advertise=read.broker_advertise,
        token=read.broker_token,
        takeover_seconds=read.broker_takeover_seconds,
    )


def _is_address(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit()
