"""Detached snapshots of rows: the objects every read and write returns.

Built in this one place. ``Mnest(**values)`` followed by ``make_transient_to_detached``
is the textbook spelling, but it fires an attribute event per column (30 µs a row, measured);
here the instance comes from the mapper's class manager with its columns loaded as committed
values and its identity key set, 2 µs a row. ``tests/rules/test_snapshots.py`` checks that the
result is indistinguishable from the textbook one, so an upgrade of SQLAlchemy that changed
the mechanism fails a test, not a user.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

from sqlalchemy import inspect
from sqlalchemy.orm import ClassManager

from mnestoma.core._sqla_compat import class_manager, detached, detached_all
from mnestoma.core.errors import StoreError
from mnestoma.schema.models import CanonicalQuery, Event, Mnest
from mnestoma.schema.sql.tables import EVENT_COLUMNS, MNEST_COLUMNS, QUERY_COLUMNS

__all__ = ["event", "mnest", "mnests", "query", "query_from"]

T = TypeVar("T")


# Each snapshot class's manager, which builds its instances: the mappers are configured when
# the models are imported (mnestoma.schema.models).
_MANAGERS: dict[type[Any], ClassManager[Any]] = {
    cls: class_manager(inspect(cls)) for cls in (Mnest, Event, CanonicalQuery)
}


def _build(cls: type[T], columns: Sequence[str], values: Sequence[Any]) -> T:
    """A detached ``cls`` with ``columns`` set to the first of ``values`` (a row may hold
    more, which are left out), without ``__init__`` or events; each table's first column is
    its ``id``."""
    if len(values) < len(columns):
        _too_short(cls, columns)(values)
    return detached(_MANAGERS[cls], cls, zip(columns, values, strict=False), values[0])


def _too_short(cls: type[Any], columns: Sequence[str]) -> Callable[[Sequence[Any]], NoReturn]:
    """What refuses a row with fewer values than ``cls`` has columns."""

    def refuse(values: Sequence[Any]) -> NoReturn:
        raise StoreError(
            f"a row of {len(values)} values for the {len(columns)} columns of {cls.__name__}"
        )

    return refuse


_REFUSE_MNEST = _too_short(Mnest, MNEST_COLUMNS)


def mnest(values: Sequence[Any]) -> Mnest:
    """A Mnest from the table's columns in order (a row of ``select(mnests)``)."""
    return _build(Mnest, MNEST_COLUMNS, values)


def mnests(rows: Iterable[Sequence[Any]]) -> list[Mnest]:
    """:func:`mnest` of each row, built in one loop (the rows a turn, a listing or a read
    of many edges returns)."""
    return detached_all(_MANAGERS[Mnest], Mnest, MNEST_COLUMNS, rows, _REFUSE_MNEST)


def event(values: Sequence[Any]) -> Event:
    """An Event from the table's columns in order."""
    return _build(Event, EVENT_COLUMNS, values)


def query(values: Sequence[Any]) -> CanonicalQuery:
    """A CanonicalQuery from the table's columns in order."""
    return _build(CanonicalQuery, QUERY_COLUMNS, values)


def query_from(values: Mapping[str, Any]) -> CanonicalQuery:
    """A CanonicalQuery from a mapping holding every column."""
    return _build(CanonicalQuery, QUERY_COLUMNS, [values[k] for k in QUERY_COLUMNS])
