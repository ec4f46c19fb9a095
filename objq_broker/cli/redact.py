"""Keeping the worker's secrets out of what it stores.

``objq worker`` stores a failed command's stderr as the job's error, in the state and then in
the archive, where anyone who can read the bucket reads it. A command that prints its
environment, a traceback that shows a connection string or a tool that echoes its token
would hand the worker's credentials to all of them. A :class:`Redactor` replaces with ``***``:

- the values of the worker's own environment variables whose names look secret (they contain
  one of :data:`SECRET_NAME_WORDS`, in any case) and that are :data:`MIN_SECRET_CHARS` long or
  more (shorter ones, ``AUTH_ENABLED=1`` say, would blank out every ``1`` of the text);
- AWS access key ids (``AKIA...``, ``ASIA...``);
- assignments to secret-looking names: ``aws_secret_access_key = ...``, ``PASSWORD=...``,
  ``"api_key": "..."``, ``X-Api-Key: ...``;
- the value of an ``Authorization`` header, whatever its scheme, and ``Bearer`` tokens;
- the password of a URL: ``scheme://user:password@host`` becomes ``scheme://user:***@host``,
  and ``user:password@host`` without a scheme likewise;
- PEM private key blocks, whole, and the part of one that a cut left.

Then :meth:`Redactor.stored` keeps the end of what is left up to a length, saying in the text
that it was cut. Redaction is a best effort for secrets that are printed as they are; it does
not find one that was encoded, split or transformed.

>>> r = Redactor({"API_TOKEN": "s3cr3t-value", "HOME": "/root"})
>>> r.redact("token s3cr3t-value at postgres://app:hunter2@db/x, home /root")
'token *** at postgres://app:***@db/x, home /root'
"""

from __future__ import annotations

import re
from collections.abc import Mapping

#: What the name of a variable holding a secret contains (compared case-insensitively).
SECRET_NAME_WORDS = (
    "KEY",
    "SECRET",
    "TOKEN",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "SESSION",
    "AUTH",
    "PRIVATE",
)
#: Characters an environment value needs before it is looked for in the text.
MIN_SECRET_CHARS = 8
#: What a secret is replaced with.
MASK = "***"
#: Characters of a stored error, at most (the end is kept).
ERROR_MAX_CHARS = 4000

_WORDS = "|".join(word.lower() for word in SECRET_NAME_WORDS)
_NAME_CHAR = r"[A-Za-z0-9_.-]"
#: ``name = value`` or ``name: value``, the name and value quoted or not. Possessive, so a long
#: run of name characters costs linear time, never a backtracking search.
_ASSIGNMENT = re.compile(
    rf"(?<!{_NAME_CHAR})(?P<name>{_NAME_CHAR}++)"
    r"(?P<sep>[\"']?[ \t]*(?:=(?!=)|:)[ \t]*)"
    r"(?P<value>\"[^\"\n]*\"|'[^'\n]*'|[^\s\"',;&]++)"
)
_CAPITALISED = "|".join(word.capitalize() for word in SECRET_NAME_WORDS)
#: A name that ends in a secret word (``api_key``, ``X-Auth-Token``, ``apiKey``,
#: ``credentials``), but not ``KeyError`` or ``monkey``.
_SECRET_ENDING = re.compile(rf"(?:(?:^|[_.-])(?i:{_WORDS})|(?<=[a-z0-9])(?:{_CAPITALISED}))s?$")
#: The first and last line of a PEM private key (``RSA``, ``EC``, ``OPENSSH``, ``ENCRYPTED``...).
_PEM_MARKER = re.compile(r"-----(BEGIN|END) [A-Z0-9 ]*PRIVATE KEY-----")
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), MASK),
    # An Authorization header: whatever its scheme, all of its value.
    (
        re.compile(r"(?i)\b(authorization[\"']?[ \t]*[:=][ \t]*[\"']?)[^\r\n\"']+"),
        rf"\1{MASK}",
    ),
    (re.compile(r"\b(Bearer[ \t]+)[A-Za-z0-9._~+/=-]{8,}"), rf"\1{MASK}"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]*):[^/\s@]+@"), rf"\1:{MASK}@"),
    # The same without a scheme: ``user:password@host`` in a path or a host:port.
    (
        re.compile(r"((?:(?<=[\s/'\"(=,;<\[])|^)[^\s/?#@'\":]+):[^\s/?#@'\"]+@"),
        rf"\1:{MASK}@",
    ),
)


def _mask_private_keys(text: str) -> str:
    """``text`` with each PEM private key block masked whole, in one pass. A cut may have left
    half a block: an END without its BEGIN masks from the start of the text (or the previous
    block), a BEGIN without its END masks to the end."""
    kept: list[str] = []
    done = 0  # text[:done] is in kept
    opened: int | None = None
    for marker in _PEM_MARKER.finditer(text):
        if marker[1] == "BEGIN":
            if opened is None:
                opened = marker.start()
            continue
        kept += [text[done : opened if opened is not None else done], f"[private key {MASK}]"]
        done, opened = marker.end(), None
    if opened is not None:
        kept += [text[done:opened], f"[private key {MASK}]"]
        done = len(text)
    return "".join([*kept, text[done:]])


def _assignment(match: re.Match[str]) -> str:
    """``name=value`` with the value masked when the name looks secret. With ``=`` any name
    that holds a secret word counts (masking too much is the safe mistake); with ``:`` only
    one that ends in one, so that ``KeyError: 'x'`` in a traceback keeps its ``'x'``."""
    name, sep, value = match["name"], match["sep"], match["value"]
    secret = secret_name(name) if "=" in sep else _SECRET_ENDING.search(name) is not None
    if not secret or value == MASK:
        return match[0]
    quote = value[0] if value[0] in "\"'" else ""
    return f"{name}{sep}{quote}{MASK}{quote}"


def secret_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a secret."""
    upper = name.upper()
    return any(word in upper for word in SECRET_NAME_WORDS)


def keep_tail(text: str, limit: int, *, what: str = "text", total: str | None = None) -> str:
    """``text``, or its last ``limit`` characters after a note saying it was cut."""
    if len(text) <= limit and total is None:
        return text
    kept = text[-limit:]
    of = f" of {total}" if total is not None else f" of {len(text):,}"
    return f"[{what} cut to its last {len(kept):,} characters{of}] {kept}"


class Redactor:
    """Replaces the secrets of ``environ`` (the worker's environment, read when this is built)
    and secret-looking patterns in a text with ``***``; see the module docstring.

    >>> Redactor({}).redact("key AKIAIOSFODNN7EXAMPLE, Authorization: Bearer abc.def.ghi")
    'key ***, Authorization: ***'
    """

    def __init__(self, environ: Mapping[str, str]) -> None:
        values = {
            value.strip()
            for name, value in environ.items()
            if secret_name(name) and len(value.strip()) >= MIN_SECRET_CHARS
        }
        # Longest first: a secret that contains another is replaced whole.
        self._values = sorted(values, key=len, reverse=True)
        self._pattern = (
            re.compile("|".join(re.escape(value) for value in self._values))
            if self._values
            else None
        )

    def __repr__(self) -> str:
        return f"Redactor({len(self._values)} secret values)"

    def redact(self, text: str) -> str:
        """``text`` with every secret it shows replaced."""
        if self._pattern is not None:
            text = self._pattern.sub(MASK, text)
        text = _mask_private_keys(text)
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return _ASSIGNMENT.sub(_assignment, text)

    def stored(self, text: str, limit: int = ERROR_MAX_CHARS) -> str:
        """``text`` redacted and cut to its last ``limit`` characters: what may be stored."""
        return keep_tail(self.redact(text), limit, what="error")
