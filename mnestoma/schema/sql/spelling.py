"""How one engine spells the statements that differ between SQLite and PostgreSQL.

Each engine's home (:mod:`mnestoma.engines.sqlite`, :mod:`mnestoma.engines.postgresql`)
fills a :class:`Spelling` and registers it under its dialect's name; the builders of
``schema/sql`` read it by that name (:func:`spelling_of`, one dict lookup) and never compare
the name themselves. Expressions that only differ in their words are SQLAlchemy's per-dialect
compilation instead (:mod:`mnestoma.core.sqlrules`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table

__all__ = ["Spelling", "register_spelling", "spelling_of"]


@dataclass(frozen=True, slots=True)
class Spelling:
    """What an engine's statements do their own way."""

    # The dialect's INSERT, the one with ON CONFLICT (``sqlalchemy.dialects.<name>.insert``).
    insert: Callable[[Table], Any]
    # A row found again by SQLite's rowid (one b-tree lookup, not two), else by its id.
    rowid: bool
    # The functions that make a character of a code and find a text in another.
    char: str
    instr: str
    # The collation that compares text byte by byte, as SQLite does; None: the default does.
    bytewise: str | None
    # A float product that underflows raises (PostgreSQL): products of weights are guarded.
    underflow_raises: bool
    # A recursive CTE takes no ORDER BY or LIMIT in its recursive term (PostgreSQL): the walk
    # ranks each depth and extends the best ``:limit`` paths of it.
    ranks_each_depth: bool
    # Rows another transaction holds are skipped (``FOR UPDATE SKIP LOCKED``, by ``ctid``)
    # when the ager deletes faded chains; else the ager holds the one write lock.
    skips_locked_rows: bool
    # The ager's statements, batched or not (``SQLiteAgerStatements`` or
    # ``PostgreSQLAgerStatements`` of :mod:`mnestoma.schema.sql.ager`, which reads this module).
    ager_statements: Callable[[bool], Any]


_SPELLINGS: dict[str, Spelling] = {}


def register_spelling(dialect: str, spelling: Spelling) -> None:
    """Have :func:`spelling_of` answer ``spelling`` for ``dialect`` (done by its engine's home)."""
    _SPELLINGS[dialect] = spelling


def spelling_of(dialect: str) -> Spelling:
    """The spelling of ``dialect``'s statements.

    Raises:
        KeyError: no engine's home registered one under that name.
    """
    return _SPELLINGS[dialect]


def dialect_insert(dialect: str) -> Any:
    """The INSERT construct of ``dialect`` (see :attr:`Spelling.insert`)."""
    return _SPELLINGS[dialect].insert
