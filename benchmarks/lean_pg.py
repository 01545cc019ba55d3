"""The lean loop: what a user without the package writes on PostgreSQL, on two plain tables.

Not the package's schema: two tables of its own, created by the benchmark in its throwaway
database (:func:`create_tables`): ``lean_edges`` (one row an edge, a unique key on
``(src, dst)``) and ``lean_events`` (one row a passing, no index). A passing is one
transaction on one ``psycopg`` connection, as plainly as it can be written:
``SELECT ... FOR UPDATE`` of the edge, "now" read once the row is locked, the decay and the
reinforcement computed in Python with the numbers of :mod:`benchmarks.baseline`, then
``UPDATE`` of the edge, ``INSERT`` of its event and ``COMMIT``, one statement at a time. The
first passing of an edge inserts it (``INSERT ... ON CONFLICT DO NOTHING``); a writer that
loses that race locks the row the winner made and reinforces it.

There is no per-edge decay speed (every edge decays at the package's default), no version,
state, tags, turn or recorder: the least a hand-written recorder of passings keeps. While the
writers workload times its lock holds (``holds`` set), the locking select has the server
mark the instant the row is granted (:mod:`benchmarks.lock_hold`).
"""

from __future__ import annotations

from typing import Any

from .baseline import DEFAULT_DECAY_LAMBDA, INITIAL_WEIGHT, reinforce
from .baseline_pg import PsycopgLoop, psycopg_conninfo
from .lock_hold import marked_select

__all__ = ["EDGES_TABLE", "LeanLoop", "counts", "create_tables", "edge_key"]

EDGES_TABLE = "lean_edges"
_TABLES = (
    "CREATE TABLE lean_edges (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " src text NOT NULL, dst text NOT NULL, weight double precision NOT NULL,"
    " uses integer NOT NULL, ts_last timestamptz NOT NULL, UNIQUE (src, dst))",
    "CREATE TABLE lean_events (edge_id bigint NOT NULL, ts timestamptz NOT NULL,"
    " weight_before double precision, weight_after double precision NOT NULL)",
)
_COLUMNS = "id, weight, ts_last"
_SELECT = f"SELECT {_COLUMNS} FROM lean_edges WHERE src = %s AND dst = %s FOR UPDATE"
_SELECT_MARKED = marked_select(_SELECT, _COLUMNS)
_UPDATE = (
    "UPDATE lean_edges SET weight = %s, uses = uses + 1, ts_last = greatest(ts_last, %s)"
    " WHERE id = %s"
)
_EVENT = (
    "INSERT INTO lean_events (edge_id, ts, weight_before, weight_after) VALUES (%s, %s, %s, %s)"
)
_CREATE = (
    "INSERT INTO lean_edges (src, dst, weight, uses, ts_last) VALUES (%s, %s, %s, 1, %s)"
    " ON CONFLICT DO NOTHING RETURNING id"
)
_STRONGEST = "SELECT dst, weight FROM lean_edges WHERE src = %s ORDER BY weight DESC LIMIT %s"


def edge_key(
    src_executor: str, src_version: str, dst_executor: str, dst_version: str
) -> tuple[str, str]:
    """The lean table's (src, dst) of an edge given as the package's four-part key."""
    return f"{src_executor}@{src_version}", f"{dst_executor}@{dst_version}"


def create_tables(url: str) -> None:
    """Create the lean loop's two tables in the database at ``url``."""
    import psycopg

    with psycopg.connect(psycopg_conninfo(url), autocommit=True) as con:
        for sql in _TABLES:
            con.execute(sql)


def counts(url: str, edge: tuple[str, str, str, str]) -> tuple[int, int]:
    """The edge's ``uses`` and the number of reinforcement events (the lost-update check)."""
    import psycopg

    with psycopg.connect(psycopg_conninfo(url), autocommit=True) as con:
        row = con.execute(
            "SELECT uses FROM lean_edges WHERE src = %s AND dst = %s", edge_key(*edge)
        )
        (uses,) = row.fetchone() or (0,)
        reinforced = con.execute(
            "SELECT count(*) FROM lean_events WHERE weight_before IS NOT NULL"
        ).fetchone()
    return int(uses), int(reinforced[0] if reinforced else 0)


class LeanLoop(PsycopgLoop[int]):
    """``record_passing`` on the lean tables, on one psycopg connection."""

    def record_passing(
        self, src_executor: str, src_version: str, dst_executor: str, dst_version: str
    ) -> int:
        """Create (weight 0.30) or reinforce (+0.15 on the decayed weight) one edge; its id."""
        return self._in_transaction(edge_key(src_executor, src_version, dst_executor, dst_version))

    def _record(self, con: Any, key: tuple[str, str], holds: Any) -> int:
        select = _SELECT if holds is None else _SELECT_MARKED
        while True:
            row = con.execute(select, key).fetchone()
            if holds is not None and row is not None:
                holds.taken()
            now = self._clock()  # read once the row lock is held
            if row is not None:
                edge_id, weight, ts_last = row[:3]
                seconds = (now - ts_last).total_seconds()
                before, after = reinforce(weight, DEFAULT_DECAY_LAMBDA, seconds)
                con.execute(_UPDATE, (after, now, edge_id))
                con.execute(_EVENT, (edge_id, now, before, after))
                return int(edge_id)
            created = con.execute(_CREATE, (*key, INITIAL_WEIGHT, now)).fetchone()
            if created is not None:
                con.execute(_EVENT, (created[0], now, None, INITIAL_WEIGHT))
                return int(created[0])
            # another writer created it first: lock that row and reinforce it

    def suggest_next(self, src_executor: str, k: int = 5) -> list[tuple[Any, ...]]:
        """The k heaviest edges out of a ``src`` (opens the connection before a race)."""
        with self._con.transaction():
            return self._con.execute(_STRONGEST, (src_executor, k)).fetchall()
