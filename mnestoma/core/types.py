"""Column types that behave the same on SQLite and PostgreSQL."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import JSON, DateTime
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.sqlite import DATETIME as SQLITE_DATETIME
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from mnestoma.core.errors import InvalidInput
from mnestoma.core.rules import MAX_JSON_DEPTH

__all__ = [
    "EARLIEST_CLOCK",
    "EARLIEST_INSTANT",
    "INSTANTS_END",
    "JSONDocument",
    "UTCDateTime",
    "ensure_aware_utc",
    "ensure_instant",
    "ensure_json",
    "ensure_unicode_text",
    "parse_sqlite_timestamp",
    "sqlite_timestamp_text",
]


# The instants the store holds: from the first of year 1000, since SQLite keeps them as text
# that sorts and reads back only with four-digit years, to the end of 9999-12-30, a day short
# of Python's last, so that no session zone turns one into year 10000 on PostgreSQL's way back.
EARLIEST_INSTANT = datetime(1000, 1, 1, tzinfo=UTC)
INSTANTS_END = datetime(9999, 12, 31, tzinfo=UTC)  # the first instant past them
# A clock's now is a year later at least: the ager and status look back from it (90 and 30
# days), and what they compare with must be an instant the store holds too.
EARLIEST_CLOCK = datetime(1001, 1, 1, tzinfo=UTC)
_LAST_DAY = (INSTANTS_END - timedelta(days=1)).date().isoformat()  # for messages


def ensure_aware_utc(value: Any, what: str = "datetime") -> datetime:
    """Return ``value`` in UTC, refusing naive datetimes and non-datetimes."""
    if not isinstance(value, datetime):
        raise InvalidInput(f"{what} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is UTC:
        return value
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise InvalidInput(f"{what} must be timezone-aware (got a naive datetime)")
    try:
        return value.astimezone(UTC)
    except OverflowError:  # year 1 east of UTC, or 9999-12-31 west of it
        raise InvalidInput(
            f"{what} {value.isoformat()} is outside the years 1 to 9999 in UTC"
        ) from None


def ensure_instant(
    value: Any, what: str = "datetime", *, earliest: datetime = EARLIEST_INSTANT
) -> datetime:
    """:func:`ensure_aware_utc`, refusing too an instant the store cannot hold (from
    :data:`EARLIEST_INSTANT`, or ``earliest``, up to :data:`INSTANTS_END`)."""
    aware = ensure_aware_utc(value, what)
    if earliest <= aware < INSTANTS_END:
        return aware
    raise InvalidInput(
        f"{what} is {aware.isoformat()}: the store holds instants from "
        f"{earliest.date().isoformat()} to {_LAST_DAY} (UTC)"
    )


def sqlite_timestamp_text(value: datetime) -> str:
    """What a timestamp is on SQLite: naive UTC text with microseconds (sorts as it should),
    ``YYYY-MM-DD HH:MM:SS.ffffff``. An instant the store holds has a four-digit year, so its
    ISO form in UTC is that text followed by ``+00:00`` (read a tenth of the time strftime's
    format takes)."""
    return ensure_instant(value).isoformat(" ", "microseconds")[:26]


def ensure_unicode_text(value: str, what: str) -> None:
    """Refuse lone surrogates: no database (nor UTF-8) can hold them."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{what} is not valid Unicode text (a lone surrogate?)") from None


_fromisoformat = datetime.fromisoformat


def parse_sqlite_timestamp(value: str | datetime) -> datetime:
    """A timestamp as SQLite returns it (naive UTC text) as an aware UTC datetime."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    try:
        # Naive text, the format this package writes: 5× cheaper than .replace(tzinfo=).
        return _fromisoformat(value + "+00:00")
    except ValueError:
        pass  # text that carries its own zone ("Z", "+02:00"), written by another tool
    parsed = _fromisoformat(value)
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


class _NaiveUTCText(SQLITE_DATETIME):
    """SQLite's column of instants: naive UTC text in :func:`sqlite_timestamp_text`'s format
    (:class:`UTCDateTime` fuses its own processing with this text's)."""


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in and out; naive values are refused.

    SQLite keeps no zone, so values are stored as naive UTC text in one format (which also
    makes text comparison chronological); PostgreSQL keeps ``timestamptz`` and psycopg
    returns it in the session zone, so results are converted back to UTC.
    """

    # SQLite's own column type is the text one below (SQLAlchemy's per-dialect variant):
    # the dialect that stores instants as text is the one that gets its processors.
    impl = DateTime(timezone=True).with_variant(_NaiveUTCText(), "sqlite")  # type: ignore[no-untyped-call]
    cache_ok = True

    def _as_text(self, dialect: Dialect) -> bool:
        """True when ``dialect`` stores these instants as naive UTC text."""
        return isinstance(self.impl_instance.dialect_impl(dialect), _NaiveUTCText)

    def process_bind_param(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        aware = ensure_instant(value)
        if self._as_text(dialect):
            return aware.replace(tzinfo=None)
        return aware

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        stored: datetime = datetime.fromisoformat(value) if isinstance(value, str) else value
        if stored.tzinfo is None:
            return stored.replace(tzinfo=UTC)
        return stored.astimezone(UTC)

    # On SQLite the two steps (ours, then the dialect's text formatting and regex parsing)
    # are fused into one: the same text format, a third of the cost on the hot paths.

    def bind_processor(self, dialect: Dialect) -> Any:
        if not self._as_text(dialect):
            return super().bind_processor(dialect)

        def process(value: Any) -> str | None:
            return None if value is None else sqlite_timestamp_text(value)

        return process

    def result_processor(self, dialect: Dialect, coltype: Any) -> Any:
        if not self._as_text(dialect):
            return super().result_processor(dialect, coltype)

        def process(value: Any) -> datetime | None:
            return None if value is None else parse_sqlite_timestamp(value)

        return process


def ensure_json(value: Any, what: str) -> Any:
    """Check that ``value`` is plain JSON that every reader of the store can take back.

    dict (string keys) / list / tuple / str / int / finite float / bool / None, containers
    nested at most :data:`~mnestoma.rules.MAX_JSON_DEPTH` levels, no NUL nor lone surrogate
    in any string. The walk is iterative, so a structure nested 10,000 deep (or a cycle) is
    an :class:`InvalidInput`, never a ``RecursionError``.
    """
    if value is None:
        return None
    stack: list[tuple[Any, int]] = [(value, 1)]  # (item, nesting level if it is a container)
    while stack:
        item, level = stack.pop()
        if isinstance(item, str):
            _check_json_text(item, what)
        elif item is None or isinstance(item, int):  # bool is an int
            continue
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidInput(f"{what} must not contain NaN or infinity")
        elif isinstance(item, dict | list | tuple):
            if level > MAX_JSON_DEPTH:
                raise InvalidInput(
                    f"{what} is nested more than {MAX_JSON_DEPTH} levels deep (or refers to itself)"
                )
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise InvalidInput(f"{what} keys must be strings, got {type(key).__name__}")
                    _check_json_text(key, what)
                    stack.append((child, level + 1))
            else:
                stack.extend((child, level + 1) for child in item)
        else:
            raise InvalidInput(
                f"{what} must be JSON-serialisable: "
                f"Object of type {type(item).__name__} is not JSON serializable"
            )
    return value


def _check_json_text(value: str, what: str) -> None:
    # PostgreSQL's JSONB cannot hold U+0000 nor lone surrogates: refused on both engines
    if "\x00" in value:
        raise InvalidInput(f"{what} must not contain the NUL character")
    ensure_unicode_text(value, what)


class JSONDocument(TypeDecorator[Any]):
    """JSON on SQLite, JSONB on PostgreSQL; a Python ``None`` is stored as SQL NULL."""

    impl = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")
    cache_ok = True
