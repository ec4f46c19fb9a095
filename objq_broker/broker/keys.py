"""Who may talk to a broker: the shared token, and the CURVE keys the link is secured with.

A broker with a token serves over libzmq's CURVE: every connection is encrypted and each end
proves it holds a key. Both keypairs are derived from the token with scrypt, so the token is the
only secret to hand out, and it never crosses the wire or enters the state: a client derives the
broker's public key (to encrypt to it) and the clients' keypair (which the broker admits, and
nothing else). A client with a wrong token derives another broker key, so the broker cannot
read its greeting and drops it; libzmq tells the client only through its socket's events, which
:mod:`~objq_broker.broker.client` turns into one clear :class:`~objq_broker.errors.AccessDenied`.

Without a token the link is plain, which :func:`require_token` allows on loopback only.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
from dataclasses import dataclass

from objq_broker.errors import ConfigurationError

#: The shortest token a broker beyond loopback takes: anyone who can read the bucket can test
#: guesses offline against the broker's public key, at scrypt's cost per guess, and 16
#: characters of ``secrets.token_urlsafe`` carry 96 bits.
MIN_TOKEN_CHARS = 16
#: How to make a good token, said when one is refused.
TOKEN_ADVICE = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'
#: scrypt's cost: about 30 ms once per process and token, and as much per guess for anyone
#: who captured a handshake and tries tokens offline.
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}


@dataclass(frozen=True)
class CurveKeys:
    """The Z85-encoded keys of a secured link (libzmq's text form of a 32-byte key)."""

    broker_public: bytes
    broker_secret: bytes
    client_public: bytes
    client_secret: bytes

    def __repr__(self) -> str:  # secrets stay out of logs and tracebacks
        return f"CurveKeys(broker_public={self.broker_public.decode()!r}, ...)"


@functools.lru_cache(maxsize=8)
def curve_keys(token: str) -> CurveKeys:
    """The keys every process holding ``token`` derives alike."""
    import zmq
    import zmq.utils.z85

    def keypair(role: bytes) -> tuple[bytes, bytes]:
        seed = hashlib.scrypt(
            token.encode(), salt=b"objq-broker/curve/" + role, dklen=32, **_SCRYPT
        )
        secret = zmq.utils.z85.encode(seed)
        return zmq.curve_public(secret), secret

    broker_public, broker_secret = keypair(b"broker")
    client_public, client_secret = keypair(b"client")
    return CurveKeys(broker_public, broker_secret, client_public, client_secret)


def is_loopback(address: str) -> bool:
    """Whether ``host:port`` listens on loopback only (no token needed there)."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_token(listen: str, token: str | None) -> None:
    """Refuse to serve beyond loopback without a shared token of
    :data:`MIN_TOKEN_CHARS` characters or more (blanks not counted)."""
    if is_loopback(listen):
        return
    if not token:
        raise ConfigurationError(
            f"broker_listen {listen!r} is beyond loopback: a shared token is needed "
            "(broker_token= or $OBJQ_BROKER_TOKEN), since anyone who can read the bucket can "
            "read the broker's address"
        )
    if len(token.strip()) < MIN_TOKEN_CHARS:
        raise ConfigurationError(
            f"broker_token: expected at least {MIN_TOKEN_CHARS} characters (not counting "
            f"blanks) for broker_listen {listen!r}, which is beyond loopback; found "
            f"{len(token.strip())}. Anyone who can read the bucket can test guesses offline; "
            f"make one with {TOKEN_ADVICE}"
        )
