"""How instants are written: ISO-8601 UTC for machines, a short UTC form for tables, and
"how long ago" for people. Every module that shows a time uses these."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import overload

__all__ = ["ago", "iso_utc", "short_utc"]

SHORT_FORMAT = "%Y-%m-%d %H:%M:%SZ"


@overload
def iso_utc(value: datetime) -> str: ...
@overload
def iso_utc(value: None) -> None: ...
@overload
def iso_utc(value: datetime | None) -> str | None: ...
def iso_utc(value: datetime | None) -> str | None:
    """ISO-8601 in UTC with a ``Z`` (JSON, GraphML, titles), or None."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def short_utc(value: datetime | None, missing: str = "-") -> str:
    """``2026-03-02 09:00:00Z`` (tables and sentences); ``missing`` for None."""
    return missing if value is None else value.astimezone(UTC).strftime(SHORT_FORMAT)


def ago(then: datetime | None, now: datetime) -> str:
    """How long before ``now`` an instant was, in the largest whole unit that fits."""
    if then is None:
        return "never"
    seconds = (now - then).total_seconds()
    if seconds < 0:
        return "after the status's now"
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''} ago"
    return "now" if seconds < 1 else f"{int(seconds)} s ago"
