"""PostgreSQL: whether pg_partman manages the months of ``events`` (contract §12), so that the
package neither duplicates nor fights it.

A DBA may hand the monthly upkeep of ``events`` to pg_partman (its ``create_parent``; the
operations guide, "Handing events to pg_partman"). The package then asks, per engine:

- **Does pg_partman make the months?** A row of its ``part_config`` names the events this
  connection sees (in whatever schema the extension is installed). Then the package's
  upkeep (:mod:`mnestoma.engines.partitions`) makes no month: pg_partman's ``premake``
  does, and a month made by both would stop pg_partman's maintenance (the second one
  overlaps the first). The answer is remembered per engine for
  :data:`~mnestoma.rules.PARTMAN_RECHECK_S` and asked again only when the package would
  make a month, so a store without the extension pays one catalogue read now and then.
- **Does pg_partman drop the old months?** Its row holds a ``retention``. Then
  ``prune_events`` drops no partition and deletes rows only, as on a store whose events are
  one table (:mod:`mnestoma.maintenance.retention`): asked afresh at each prune. Without
  one, the prune drops pg_partman's months too; they are plain tables (pg_partman 4.7
  cannot partition a month by kind), so it copies what it keeps of them, and of every
  partition before them, as of the partitions made before revision 0015
  (:func:`mnestoma.engines.partitions.drop_old_partitions`).

Without the extension, or with a role that may not read its ``part_config`` (logged once
per engine), the answer is no: the package's own upkeep is the default and needs nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from weakref import WeakKeyDictionary

from sqlalchemy import Connection, Engine

from mnestoma.core.errors import translate_errors
from mnestoma.core.rules import PARTMAN_RECHECK_S
from mnestoma.engines.backend import backend_of
from mnestoma.schema.sql.partman import PARTMAN_SCHEMA, part_config_of

__all__ = [
    "Partman",
    "forget_partman",
    "holds_retention",
    "knows_partman_months",
    "look",
    "makes_months",
]

logger = logging.getLogger("mnestoma.partitions")  # the partitions' logger: one concern


@dataclass(frozen=True, slots=True)
class Partman:
    """What pg_partman does for a store's events: makes its months (``months``: a
    ``part_config`` row names them), and drops the old ones (``retention``: one is set)."""

    months: bool = False
    retention: bool = False


_NONE = Partman()


@dataclass(slots=True)
class _Seen:
    """What was learned of one engine's store, when (monotonic), and whether the role's
    want of privileges on ``part_config`` was logged already."""

    partman: Partman = _NONE
    checked: float | None = None
    warned: bool = False


_seen: WeakKeyDictionary[Engine, _Seen] = WeakKeyDictionary()
_lock = threading.Lock()


def forget_partman(engine: Engine | None = None) -> None:
    """Forget what was learned (for one engine, or all): the next question asks again."""
    with _lock:
        if engine is None:
            _seen.clear()
        else:
            _seen.pop(engine, None)


def _of(engine: Engine) -> _Seen:
    """The engine's record (the caller holds ``_lock``)."""
    seen = _seen.get(engine)
    if seen is None:
        seen = _seen[engine] = _Seen()
    return seen


def look(conn: Connection) -> Partman:
    """Ask ``conn``'s database now, in its transaction (begun if none), what pg_partman does
    for its events; remembered for ``conn``'s engine. Two reads that fail nowhere: nothing
    when the extension is absent or ``part_config`` cannot be read by this role."""
    row = conn.execute(PARTMAN_SCHEMA).first()
    found, unreadable = _NONE, False
    if row is not None and row[1]:
        config = conn.execute(part_config_of(str(row[0]))).first()
        found = Partman(config is not None, config is not None and bool(config[0]))
    elif row is not None:
        unreadable = True
    with _lock:
        seen = _of(conn.engine)
        seen.partman, seen.checked = found, time.monotonic()
        warn, seen.warned = unreadable and not seen.warned, seen.warned or unreadable
    if warn:
        logger.warning(
            "pg_partman is installed in schema %s but this role may not read its part_config:"
            " taken as not managing events (grant USAGE on the schema and SELECT on"
            " part_config)",
            row[0] if row is not None else "?",
        )
    return found


def _known(engine: Engine) -> Partman | None:
    """What was learned of ``engine``'s store within :data:`PARTMAN_RECHECK_S`; None when
    it must be asked again. No statement."""
    with _lock:
        seen = _seen.get(engine)
        if seen is None or seen.checked is None:
            return None
        if time.monotonic() - seen.checked >= PARTMAN_RECHECK_S:
            return None
        return seen.partman


def knows_partman_months(engine: Engine) -> bool:
    """True when pg_partman is known (within :data:`PARTMAN_RECHECK_S`) to make the months of
    ``engine``'s events. No statement: for callers that must not run one."""
    known = _known(engine)
    return known is not None and known.months


def _asked(conn: Connection) -> Partman:
    """:func:`look` on an idle ``conn``, in a transaction of its own rolled back after."""
    with translate_errors():
        transaction = conn.begin()
        try:
            return look(conn)
        finally:
            transaction.rollback()


def makes_months(target: Engine | Connection) -> bool:
    """Does pg_partman make the months of ``target``'s events? What was learned within
    :data:`PARTMAN_RECHECK_S`, else asked: on ``target`` if it is an idle connection, on a
    connection of its own if it is an engine. A connection in a transaction is not asked
    (False unless known). MnestomaError: the database could not be asked."""
    engine = target if isinstance(target, Engine) else target.engine
    known = _known(engine)
    if known is not None:
        return known.months
    if isinstance(target, Connection):
        return False if target.in_transaction() else _asked(target).months
    with translate_errors(), target.connect() as conn:
        return _asked(conn).months


def holds_retention(conn: Connection) -> bool:
    """Does pg_partman drop the old months of ``conn``'s events (a retention set in its
    ``part_config``)? Asked now, in ``conn``'s transaction; False off PostgreSQL."""
    return backend_of(conn).partitioned and look(conn).retention
