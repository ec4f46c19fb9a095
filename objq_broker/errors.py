"""The one exception tree of objq.

Every error objq raises derives from :class:`ObjqError`. Storage adapters translate their SDK's
errors into the storage branch in exactly one place each; the queue model raises the queue branch.
Messages say what was expected, what was found, and where (backend, bucket or directory, key,
queue, job id).
"""

from __future__ import annotations

import re

#: Query parameters whose values are never shown (a URL may carry a credential in one).
_SECRET_PARAMETER = re.compile(
    r"(?i)([?&][^=&\s'\"]*(?:secret|token|password|key)[^=&\s'\"]*)=[^&\s'\"]*"
)
#: ``user:password@`` after a scheme, anywhere in a text (an endpoint in a query string too).
_USERINFO = re.compile(r"(://)[^/?#@\s'\"]*@")
#: ``user:password@host`` without a scheme (``file://user:pw@/x`` read as a path, a host and
#: port in an SDK's message): a word with a ':' and then an '@' before any space, '/' or quote.
_BARE_USERINFO = re.compile(r"(?:(?<=[\s/'\"(=,;<\[])|^)[^\s/?#@'\":]+:[^\s/?#@'\"]*@")


def redacted(text: str) -> str:
    """``text`` (a URL, or a message that may hold URLs) fit to print or log: no
    ``user:password@`` (after a scheme or not), and the values of query parameters that look
    like credentials (``...secret...``, ``token``, ``password``, ``key``) replaced by ``***``.
    The one place such text is cleaned: every objq error's message passes through it."""
    # Without a scheme the userinfo is masked, not dropped: a path or host shown without it
    # would read as another one.
    text = _BARE_USERINFO.sub("***@", _USERINFO.sub(r"\1", text))
    return _SECRET_PARAMETER.sub(r"\1=***", text)


class ObjqError(Exception):
    """Root of every error raised by objq. Its message is :func:`redacted`: an error may
    quote a URL or an SDK's message, and errors end up in logs, terminals and job records."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redacted(arg) if isinstance(arg, str) else arg for arg in args))


class ConfigurationError(ObjqError, ValueError):
    """A URL, option or setting is invalid; the message lists what is accepted."""


def missing_extra(needs: str, package: str, extra: str, found: object) -> ConfigurationError:
    """The error for ``needs`` (a URL scheme, a command) whose optional install is missing: a
    setup to fix on this host, not a bug; ``found`` is what the import said."""
    return ConfigurationError(
        f"{needs} needs {package}, which could not be imported ({found}); "
        f"install it with: pip install 'objq-broker[{extra}]'"
    )


#: A job's recorded error is cut to this: the archive keeps a line per job, not a traceback.
MAX_JOB_ERROR_CHARS = 2000


def job_error(exc: BaseException | None) -> str | None:
    """What a job's record keeps of the exception its run raised: ``Type: message``, cut."""
    if exc is None:
        return None
    return storable_text(f"{type(exc).__name__}: {exc}"[:MAX_JOB_ERROR_CHARS])


def storable_text(text: str) -> str:
    """``text`` as UTF-8 can hold it: lone surrogates (an exception about a file name read
    from undecodable bytes carries them) become backslash escapes. A state that cannot be
    encoded would fail every operation of its commit."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


# --- storage ---------------------------------------------------------------------------------


class StorageError(ObjqError):
    """An object-storage operation failed."""


class PreconditionFailed(StorageError):
    """A conditional write lost: the object changed, or exists when it was to be created."""


class ObjectNotFound(StorageError, LookupError):
    """The object does not exist."""


class BucketNotFound(StorageError, LookupError):
    """The bucket (or root directory) does not exist."""


class AccessDenied(StorageError, PermissionError):
    """The storage refused the credentials for this operation."""


class StorageUnavailable(StorageError, ConnectionError):
    """The storage could not be reached or failed transiently; the operation may be retried."""


class InvalidKey(StorageError, ValueError):
    """An object key is malformed or would escape the store's root."""


class UnsafeStore(ConfigurationError):
    """The store took a write whose condition did not hold: compare-and-set is not safe on it."""


# --- state -----------------------------------------------------------------------------------


class StateCorrupt(ObjqError):
    """A state object could not be decoded or has an unknown format; it is never overwritten."""


class WriterFenced(ObjqError):
    """Another writer with a newer epoch took over this namespace; this one must stop."""


# --- the elected broker ----------------------------------------------------------------------


class BrokerTaken(ObjqError):
    """Another process became the namespace's broker first; this one stays a client."""


class BrokerUnreachable(StorageUnavailable):
    """The namespace's broker did not answer (gone, paused, or not a broker of this
    namespace); the client looks for another, or takes over, or commits directly."""


class RequestRefused(ConfigurationError):
    """The broker could not take a request as sent (an operation's value out of bounds, a
    malformed body); nothing of it was applied."""


class RequestTooLarge(ConfigurationError):
    """An operation is larger than a broker takes in one request; nothing of it was sent."""


# --- queue -----------------------------------------------------------------------------------


class QueueError(ObjqError):
    """A queue operation was refused."""


class StateFull(QueueError):
    """The operation would make the namespace's state larger than its readers accept
    (``max_state_bytes``); it alone was refused, and the rest of its batch committed."""


class QueueNotFound(QueueError, LookupError):
    """The queue has not been declared."""


class JobNotFound(QueueError, LookupError):
    """No job with this id exists in the place it was looked for."""


class LeaseLost(QueueError):
    """The delivery's lease expired or was replaced: this holder may no longer ack or nack it."""


class QueueClosed(ObjqError):
    """The queue (or its engine) was closed; no more operations are accepted."""


class PayloadInvalid(ObjqError, ValueError):
    """A value or payload does not validate against the type of its queue
    (:mod:`objq_broker.typed`)."""
