"""Secrets hidden wherever the package shows text: URLs, error messages, tracebacks.

At the bottom of the package (it imports none of it), so that every layer, the errors first,
can hide a secret before anything shows it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

__all__ = [
    "MIN_BARE_SECRET_CHARS",
    "REDACTED",
    "carries_secret",
    "is_secret_key",
    "redact_text",
    "redact_url",
    "scrub_exception",
    "secrets_of",
    "split_url_secrets",
]

# Query keys that carry a secret: libpq's password and sslpassword (the passphrase of the
# sslkey file), and anything named like a password, secret or token.
_SECRET_WORDS = ("password", "passwd", "passphrase", "pwd", "secret", "token", "credential")
REDACTED = "***"
_USERINFO = re.compile(r"(://[^:/@\s]*):[^@\s]*@")
# A key named like a secret and its ``=`` (``%3D`` in a connection string written inside a
# URL); where the value after it ends is read by _value_end.
_SPACE = r"[ \t\n\r\f\v]"  # libpq's isspace(): ASCII only
_ENCODED_SPACE = rf"(?:{_SPACE}|\+|%20|%0[9A-D])"  # as a URL writes one
_SECRET_KEY = re.compile(
    r"(?i)\b([\w.-]*(?:" + "|".join(_SECRET_WORDS) + r")[\w.-]*)"
    rf"({_SPACE}*={_SPACE}*|{_ENCODED_SPACE}*%3D{_ENCODED_SPACE}*)"
)
# libpq's connection string: a value runs to the next space, a backslash escaping the
# character after it, or it is a single-quoted string with backslash escapes.
_PLAIN_VALUE = re.compile(r"(?:\\.?|[^ \t\n\r\f\v\\])*", re.DOTALL)
_QUOTED_VALUE = {q: re.compile(rf"{q}(?:\\.?|[^{q}\\])*(?:{q}|\Z)", re.DOTALL) for q in ("'", '"')}
# A URL's query value (``?password=``) runs to the next ``&`` (a literal one is ``%26``).
_QUERY_VALUE = re.compile(r"(?:\\.?|[^ \t\n\r\f\v\\&])*", re.DOTALL)
# A connection string percent-encoded inside a URL: its quotes and escapes are encoded
# too, so its secret is taken to run to the end of that query value, or of the text.
_ENCODED_VALUE = re.compile(r"[^&]*", re.DOTALL)
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)


# A secret shorter than this is hidden only after its key (``password=...``): hiding it
# wherever it appears would garble every message that happens to contain its letters.
MIN_BARE_SECRET_CHARS = 4
# The psycopg drivers read the URL's database as libpq's ``dbname``.
_DBNAME_DRIVERS = frozenset({"psycopg", "psycopg2", "psycopg_async"})


def is_secret_key(key: str) -> bool:
    """True for a URL query key whose value is a secret (``password``, ``sslpassword``...)."""
    low = key.lower()
    return any(word in low for word in _SECRET_WORDS)


def carries_secret(value: str) -> bool:
    """True for a value with a secret written inside it: a libpq connection string with
    ``password=...`` (libpq reads one from ``dbname``), a URL with ``user:password@``."""
    return redact_text(value) != value


def split_url_secrets(url: URL, *, connection_strings: bool = True) -> tuple[URL, dict[str, Any]]:
    """The URL without its secrets, and those secrets (for ``connect_args``, which override
    what the URL says).

    A secret query key is dropped from the URL. With ``connection_strings`` (a server's URL,
    PostgreSQL's; not a file's), a query value or a database name holding a connection
    string with a password stays in the URL with the password hidden (a copy of the URL
    reaches no other database), its real value in the secrets.
    """
    secrets: dict[str, Any] = {k: v for k, v in url.query.items() if is_secret_key(k)}
    shown = url.difference_update_query(list(secrets)) if secrets else url
    if not connection_strings:  # a file name (SQLite's) is not a connection string
        return shown, secrets
    hidden = {k: v for k, v in shown.query.items() if _value_carries_secret(v)}
    if hidden:
        secrets.update(hidden)
        shown = shown.update_query_dict({k: _redact_query_value(v) for k, v in hidden.items()})
    database = url.database
    if database and url.get_driver_name() in _DBNAME_DRIVERS and carries_secret(database):
        secrets.setdefault("dbname", database)
        shown = shown.set(database=redact_text(database))
    return shown, secrets


def _value_carries_secret(value: str | tuple[str, ...]) -> bool:
    values = (value,) if isinstance(value, str) else value
    return any(carries_secret(v) for v in values)


def secrets_of(url: URL, connect_args: dict[str, Any] | None = None) -> list[str]:
    """Every secret value a connection made from ``url`` and ``connect_args`` knows: the
    password, the values of secret keys, and the secrets inside connection strings (as
    written, and as libpq reads them: unquoted, unescaped)."""
    found = [url.password] if url.password else []
    values: list[tuple[str, Any]] = [*url.query.items(), *(connect_args or {}).items()]
    if url.database:
        values.append(("dbname", url.database))
    for key, value in values:
        for text in (value,) if isinstance(value, str) else value or ():
            if not isinstance(text, str):
                continue
            if is_secret_key(key):
                found.append(text)
            else:
                for start, ends in _secret_values(text):
                    found.extend(r for end in ends for r in _readings(text[start:end]))
    return [str(s) for s in found if str(s)]


def _readings(value: str) -> list[str]:
    """A secret value as written and as libpq reads it (without its quotes, unescaped)."""
    inner = value
    if value[:1] in _QUOTED_VALUE and len(value) > 1:
        inner = value[1:-1] if value.endswith(value[0]) else value[1:]
    forms = (value, _ESCAPED.sub(r"\1", value), inner, _ESCAPED.sub(r"\1", inner))
    return list(dict.fromkeys(forms))


def scrub_exception(err: BaseException, secrets: Iterable[str] = ()) -> None:
    """Hide, in place, every secret in the messages of ``err`` and of what it chains (its
    cause, its context, the driver error SQLAlchemy wraps): whoever shows or logs the whole
    traceback (``mnestoma --debug``, a service's logger) sees none. ``secrets`` are values
    known to be secret, hidden even where no key names them."""
    known = {s for s in secrets if len(s) >= MIN_BARE_SECRET_CHARS}
    seen: set[int] = set()
    stack: list[BaseException | None] = [err]
    while stack:
        exc = stack.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        args = tuple(redact_text(a, known) if isinstance(a, str) else a for a in exc.args)
        if args != exc.args:
            exc.args = args
        notes = getattr(exc, "__notes__", None)
        if isinstance(notes, list):
            notes[:] = [redact_text(n, known) if isinstance(n, str) else n for n in notes]
        orig = getattr(exc, "orig", None)
        stack.extend(
            (exc.__cause__, exc.__context__, orig if isinstance(orig, BaseException) else None)
        )


def redact_url(url: str | URL) -> str:
    """The URL as text with every secret it can carry hidden: the password of
    ``user:password@``, the value of every secret query key (``?password=``,
    ``sslpassword``, any key named like a password, secret or token), and a password
    written inside a connection string held by a query value or the database name."""
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except (ArgumentError, ValueError):
        return redact_text(str(url))
    if not isinstance(parsed, URL):
        return redact_text(str(url))
    query = {
        k: REDACTED if is_secret_key(k) else _redact_query_value(v) for k, v in parsed.query.items()
    }
    database = redact_text(parsed.database) if parsed.database else parsed.database
    shown = parsed.set(query=query, database=database).render_as_string(hide_password=True)
    return redact_text(shown.replace("%2A%2A%2A", REDACTED))


def _redact_query_value(value: str | tuple[str, ...]) -> str | tuple[str, ...]:
    """A non-secret query value, with any secret written inside it hidden (libpq reads a
    whole connection string from ``dbname``)."""
    if isinstance(value, tuple):
        return tuple(redact_text(v) for v in value)
    return redact_text(value)


def redact_text(text: str, known: Iterable[str] = ()) -> str:
    """Hide secrets inside free text (an error message): ``user:password@`` in URLs, the
    value of ``password=...``, ``sslpassword=...`` (and any key named like a secret) in
    query strings and libpq connection strings, however it is quoted or escaped, and each
    ``known`` secret wherever it appears. All are found in the text as given, then hidden
    together: hiding one first could cut another in two."""
    spans = [(m.end(1) + 1, m.end() - 1) for m in _USERINFO.finditer(text)]
    spans += _secret_spans(text)
    for secret in known:
        at = text.find(secret) if secret else -1
        while at >= 0:
            spans.append((at, at + len(secret)))
            at = text.find(secret, at + 1)
    shown: list[str] = []
    pos = 0
    for start, end in _merged(spans):
        shown += (text[pos:start], REDACTED)
        pos = end
    shown.append(text[pos:])
    return "".join(shown)


def _merged(spans: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """The non-empty ``spans`` in order, those that overlap or touch joined into one."""
    current: tuple[int, int] | None = None
    for start, end in sorted(span for span in spans if span[1] > span[0]):
        if current is not None and start <= current[1]:
            current = (current[0], max(current[1], end))
            continue
        if current is not None:
            yield current
        current = (start, end)
    if current is not None:
        yield current


def _secret_spans(text: str) -> Iterator[tuple[int, int]]:
    """Where each value of a key named like a secret starts and ends in ``text``: the
    longest of the ways it can be read, so that none leaves a part of it shown."""
    for start, ends in _secret_values(text):
        yield start, max(ends)


def _secret_values(text: str) -> Iterator[tuple[int, list[int]]]:
    """Where each value of a key named like a secret starts, and where each way of reading
    it ends: unquoted, or a quoted string with backslash escapes (libpq's single quotes, a
    message's double quotes)."""
    pos = 0
    while (found := _SECRET_KEY.search(text, pos)) is not None:
        start = found.end()
        ends = [_match_end(_reading_of(text, found), text, start)]
        quoted = _QUOTED_VALUE.get(text[start : start + 1])
        if quoted is not None:
            ends.append(_match_end(quoted, text, start))
        ends = [end for end in ends if end > start]
        if ends:
            yield start, ends
        pos = max([start, *ends])


def _reading_of(text: str, key: re.Match[str]) -> re.Pattern[str]:
    """How the unquoted value after ``key`` is read: percent-encoded, a URL query's, or
    libpq's."""
    if "%3D" in key.group(2).upper():
        return _ENCODED_VALUE
    if key.group(2) == "=" and text[key.start() - 1 : key.start()] in ("?", "&"):
        return _QUERY_VALUE
    return _PLAIN_VALUE


def _match_end(pattern: re.Pattern[str], text: str, start: int) -> int:
    found = pattern.match(text, start)
    return found.end() if found is not None else start
