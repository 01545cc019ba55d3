"""A hand-written reference for the PostgreSQL writers workload, on plain ``psycopg``.

What a careful user writes without the package, with the package's protocol, so that the
two measure the same thing: one transaction per call, the row locked with
``SELECT … FOR UPDATE`` before "now" is read (contract §4), then the reinforcement and its
event in one statement, then ``COMMIT``. Same schema (``mnestoma.upgrade``), same rules and
numbers as :mod:`benchmarks.baseline`. It only records passings to active edges: the
writers workload needs nothing else.

While the writers workload times its lock holds (``holds`` set), the locking select also
has the server mark the instant the row is granted, and the mark is read once ``COMMIT``
returns (:mod:`benchmarks.lock_hold`).
"""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from .baseline import DEFAULT_DECAY_LAMBDA, INITIAL_WEIGHT, Clock, reinforce
from .lock_hold import marked_select

T = TypeVar("T")

__all__ = ["PgBaseline", "PsycopgLoop", "psycopg_conninfo"]

_SEL_COLUMNS = "id, weight, decay_lambda, ts_weight"
_SEL_ACTIVE = (
    f"SELECT {_SEL_COLUMNS} FROM mnests WHERE src_executor = %s"
    " AND src_version = %s AND dst_executor = %s AND dst_version = %s AND state = 'active'"
    " FOR UPDATE"
)
_SEL_ACTIVE_MARKED = marked_select(_SEL_ACTIVE, _SEL_COLUMNS)
_REINFORCE = (
    "WITH r AS (UPDATE mnests SET weight = %(after)s, uses = uses + 1,"
    " ts_last = greatest(ts_last, %(now)s), ts_weight = greatest(ts_weight, %(now)s)"
    " WHERE id = %(id)s RETURNING id)"
    " INSERT INTO events (mnest_id, kind, ts, weight_before, weight_after, state_before,"
    " state_after) SELECT id, 'reinforced', %(now)s, %(before)s, %(after)s, 'active', 'active'"
    " FROM r"
)
_CREATE = (
    "INSERT INTO mnests (id, src_executor, src_version, dst_executor, dst_version, weight,"
    " uses, ts_first, ts_last, ts_weight, decay_lambda, state)"
    " VALUES (%(id)s, %(s)s, %(sv)s, %(d)s, %(dv)s, %(w)s, 1, %(now)s, %(now)s, %(now)s,"
    " %(lam)s, 'active') ON CONFLICT DO NOTHING RETURNING id"
)
_CREATED_EVENT = (
    "INSERT INTO events (mnest_id, kind, ts, weight_after, state_after)"
    " VALUES (%s, 'created', %s, %s, 'active')"
)
_SUGGEST = (
    "SELECT id, weight * exp(-decay_lambda * greatest(0, extract(epoch FROM %(now)s - ts_weight)"
    " / 86400)) AS eff FROM mnests WHERE state = 'active' AND src_executor = %(src)s"
    " ORDER BY eff DESC, uses DESC, id LIMIT %(k)s"
)


def _utc_now() -> datetime:
    return datetime.now(UTC)


def psycopg_conninfo(url: str) -> str:
    """A SQLAlchemy URL (``postgresql+psycopg://...``) as a libpq connection string."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(False)


class PsycopgLoop(Generic[T]):
    """A hand-written recorder on one psycopg connection: each call one transaction, and
    while the writers workload times the lock holds (``holds`` set), the instant its
    ``COMMIT`` returns marked. Subclasses write the passing (``_record``)."""

    def __init__(self, url: str, *, clock: Clock | None = None) -> None:
        import psycopg

        self._con = psycopg.connect(psycopg_conninfo(url))
        self._clock: Clock = clock or _utc_now
        # Set by the writers workload (benchmarks.lock_hold): marks each hold of the row lock.
        self.holds: Any = None

    def _record(self, con: Any, key: Any, holds: Any) -> T:
        raise NotImplementedError

    def _in_transaction(self, key: Any) -> T:
        """``_record(key)`` in a transaction of its own, its hold marked when timed."""
        con = self._con
        holds = self.holds
        try:
            with con.transaction():
                result = self._record(con, key, holds)
        except BaseException:
            if holds is not None:
                holds.released()
            raise
        if holds is not None:
            at = time.time()
            holds.released()
            holds.committed(con.pgconn, at)
        return result

    def close(self) -> None:
        """Close the connection."""
        self._con.close()


class PgBaseline(PsycopgLoop[str]):
    """``record_passing`` on active edges, on one psycopg connection."""

    def record_passing(
        self, src_executor: str, src_version: str, dst_executor: str, dst_version: str
    ) -> str:
        """Create (weight 0.30) or reinforce (+0.15 on the decayed weight) one active edge."""
        return self._in_transaction((src_executor, src_version, dst_executor, dst_version))

    def _record(self, con: Any, key: tuple[str, str, str, str], holds: Any) -> str:
        select = _SEL_ACTIVE if holds is None else _SEL_ACTIVE_MARKED
        while True:
            row = con.execute(select, key).fetchone()
            if holds is not None and row is not None:
                holds.taken()
            now = self._clock()  # read once the row lock is held
            if row is not None:
                mid, weight, lam, ts_weight = row[:4]
                before, after = reinforce(weight, lam, (now - ts_weight).total_seconds())
                params = {"id": mid, "now": now, "before": before, "after": after}
                con.execute(_REINFORCE, params)
                return str(mid)
            mid = "mn_" + secrets.token_urlsafe(12)
            values = dict(zip(("s", "sv", "d", "dv"), key, strict=True))
            values |= {"id": mid, "w": INITIAL_WEIGHT, "now": now, "lam": DEFAULT_DECAY_LAMBDA}
            if con.execute(_CREATE, values).fetchone() is not None:
                con.execute(_CREATED_EVENT, (mid, now, INITIAL_WEIGHT))
                return mid
            # another writer created it first: lock that row and reinforce it

    def suggest_next(self, src_executor: str, k: int = 5) -> list[tuple[Any, ...]]:
        """The k strongest active edges out of a source (used to open the connection)."""
        with self._con.transaction():
            params = {"src": src_executor, "k": k, "now": self._clock()}
            return self._con.execute(_SUGGEST, params).fetchall()
