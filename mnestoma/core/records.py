"""Rows as JSON-ready records: every column keyed by its name, times as ISO-8601 UTC.

The one record shape of a mnest, shared by the command line's listings and the graph's
JSON, so that a consumer reads the same keys from both.
"""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from mnestoma.core.timefmt import iso_utc

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["fields_record", "jsonable", "mnest_record", "row_record"]


class _Row(Protocol):
    def as_dict(self) -> dict[str, Any]: ...


class _Edge(_Row, Protocol):
    def effective_weight(self, at: datetime) -> float: ...


def jsonable(value: Any) -> Any:
    """A column value as JSON holds it: a datetime as ISO-8601 UTC, anything else as is."""
    return iso_utc(value) if isinstance(value, datetime) else value


def fields_record(obj: DataclassInstance, *, json: bool = False) -> dict[str, Any]:
    """A dataclass's fields by name, in their order; with ``json``, JSON-ready (times as
    ISO-8601 UTC). What the small result types' ``as_dict`` return."""
    values = {f.name: getattr(obj, f.name) for f in fields(obj)}
    return {k: jsonable(v) for k, v in values.items()} if json else values


def row_record(row: _Row) -> dict[str, Any]:
    """Every column of a row (a mnest, an event, a logged query), JSON-ready."""
    return {k: jsonable(v) for k, v in row.as_dict().items()}


def mnest_record(m: _Edge, at: datetime, effective: float | None = None) -> dict[str, Any]:
    """Every column of a mnest, JSON-ready, plus ``effective_weight`` at ``at`` (or the
    ``effective`` weight already computed at that instant)."""
    out = row_record(m)
    out["effective_weight"] = effective if effective is not None else m.effective_weight(at)
    return out
