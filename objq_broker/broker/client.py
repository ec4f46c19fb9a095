"""One client's connection to a broker: sessions out, outcomes back, commit notices streamed.

:class:`BrokerLink` is transport only. Deciding which broker to talk to, and what to do when it
is gone, is :mod:`objq_broker.broker.elected`'s job. Every failure of the link itself becomes
one of three errors: :class:`~objq_broker.errors.BrokerUnreachable` (gone, paused, not a broker
of this namespace: look for another), :class:`~objq_broker.errors.WriterFenced` (it was
replaced: look for its successor) and :class:`~objq_broker.errors.AccessDenied` (wrong token or
TLS setting: no other broker will do better).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from objq_broker.broker import wire
from objq_broker.broker.server import (
    APPLY_METHOD,
    CLAIM_METHOD,
    GRPC_OPTIONS,
    HELLO_METHOD,
    TOKEN_METADATA,
    WATCH_METHOD,
)
from objq_broker.errors import AccessDenied, BrokerUnreachable, ConfigurationError, WriterFenced
from objq_broker.model.ops import Outcomes, Session

log = logging.getLogger("objq_broker.broker")

#: How long a hello may take before the broker counts as unreachable.
HELLO_TIMEOUT_SECONDS = 2.0


class BrokerLink:
    """A channel to the broker at ``address``.

    ``token``: the shared token, if the broker requires one. ``tls_ca``: a PEM file of the
    certificate authority to trust (or True for the system's): the channel uses TLS then.
    """

    def __init__(
        self, address: str, *, token: str | None = None, tls_ca: str | bool | None = None
    ) -> None:
        self.address = address
        self._metadata = ((TOKEN_METADATA, token),) if token else ()
        if tls_ca:
            self._channel = grpc.secure_channel(address, _credentials(tls_ca), GRPC_OPTIONS)
        else:
            self._channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        self._apply: Any = self._channel.unary_unary(APPLY_METHOD)
        self._hello: Any = self._channel.unary_unary(HELLO_METHOD)
        self._watch: Any = self._channel.unary_stream(WATCH_METHOD)
        self._claim: Any = self._channel.unary_unary(CLAIM_METHOD)
        self._streams: list[Any] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"BrokerLink({self.address!r})"

    def apply(self, session: Session, timeout: float) -> Outcomes:
        """Send ``session``; its outcomes once the broker has committed it."""
        try:
            response = self._apply(
                wire.encode_request(session), timeout=timeout, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            raise self._error(exc, timeout) from None
        return wire.decode_response(response, session.ops)

    def claim(self, session: Session, wait_seconds: float, timeout: float) -> Outcomes | None:
        """Send ``session`` (one claim) to wait at the broker up to ``wait_seconds`` for jobs;
        its outcome once it took some, was refused, or the wait is over. None from a broker
        too old to take waiting claims (nothing was applied)."""
        request = wire.encode_claim(session, wait_seconds)
        try:
            response = self._claim(request, timeout=timeout, metadata=self._metadata)
        except ValueError as exc:  # the channel was closed meanwhile: this link is done
            raise BrokerUnreachable(f"broker {self.address}: {exc}") from None
        except grpc.RpcError as exc:
            if getattr(exc, "code", lambda: None)() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise self._error(exc, timeout) from None
        return wire.decode_response(response, session.ops)

    def hello(self, timeout: float = HELLO_TIMEOUT_SECONDS) -> wire.Hello:
        """Who answers at this address."""
        try:
            return wire.decode_hello(self._hello(b"", timeout=timeout, metadata=self._metadata))
        except grpc.RpcError as exc:
            raise self._error(exc, timeout) from None

    def watch(self, notice: Callable[[], None]) -> None:
        """Call ``notice`` after each of the broker's commits until the stream ends (the
        broker stopped, or :meth:`close`); raises what ended it otherwise."""
        try:
            stream = self._watch(b"", metadata=self._metadata)
        except ValueError:  # the channel was closed meanwhile: nothing more to watch
            return
        with self._lock:
            self._streams.append(stream)
        try:
            for _ in stream:
                notice()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise self._error(exc, None) from None
        finally:
            with self._lock:
                self._streams.remove(stream)

    def close(self) -> None:
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            stream.cancel()
        self._channel.close()

    def _error(self, exc: grpc.RpcError, timeout: float | None) -> Exception:
        # A failed call's error is also its grpc.Call, which says why.
        code: Any = getattr(exc, "code", lambda: None)()
        detail: Any = getattr(exc, "details", lambda: str(exc))()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return AccessDenied(f"broker {self.address}: {detail}")
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            return WriterFenced(f"broker {self.address}: {detail}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return BrokerUnreachable(
                f"broker {self.address}: no answer within {timeout:g} s; "
                "the operations may or may not have been applied"
            )
        if code == grpc.StatusCode.UNAVAILABLE and "handshake" in str(detail).lower():
            return AccessDenied(
                f"broker {self.address}: TLS handshake failed ({detail}); check that the "
                "broker and its clients agree on TLS and the certificate authority"
            )
        return BrokerUnreachable(f"broker {self.address} unreachable or failed: {detail}")


def _credentials(tls_ca: str | bool) -> grpc.ChannelCredentials:
    if tls_ca is True:
        return grpc.ssl_channel_credentials()
    try:
        root = Path(str(tls_ca)).read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"objq broker: cannot read TLS CA file: {exc}") from exc
    return grpc.ssl_channel_credentials(root_certificates=root)
