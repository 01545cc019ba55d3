"""The decayed count of passings: ``mnests.decayed_uses`` (contract §12, "Orders for a
planner"), what ``rank(order_by="decayed_uses")`` and ``suggest_next(order_by=...)`` read,
and the view ``v_mnestoma`` showing it.

A passing adds 1 to the count, which decays with the row's ``decay_lambda`` from its
``ts_last`` and is never clamped (``mnestoma.rules.decayed_count``). The rows already there
get it from their own columns, not from their events (retention may have pruned those, and
an ager's merge leaves the absorbed row's on its id): their ``uses`` passings spread evenly
from ``ts_first`` to ``ts_last`` (``mnestoma.rules.spread_count``), exact for a row of one
use and for rows passed at a steady pace.

Safe on a live database. PostgreSQL (11 and later) adds a column with a constant default
without rewriting the table (its lock held for an instant); the CHECK is added ``NOT VALID``
and validated in a transaction of its own (a lock that lets writers on). The rows are filled
in batches of ``BATCH`` ids, each its own short transaction, so that a writer waits for one
batch at most; a passing recorded meanwhile by an older release (which does not know the
column) is counted by the batch that comes after it, since the count is computed from
``uses``. A stopped run is completed by the next: every statement runs again over what the
stopped one left (the fill computes the same values again). The ``mnestoma db sql`` script
fills every row in one statement, in a transaction of its own.

SQLite adds the column in place (``ALTER TABLE ... ADD COLUMN``, its CHECK written with the
column), fills it in the same transaction (the whole upgrade is one, as every SQLite upgrade
is), and creates the view again.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-10
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHECK = "ck_mnests_decayed_uses_nonneg"
RULE = "decayed_uses >= 0"
BATCH = 500  # rows a fill transaction updates (PostgreSQL, online): a writer waits ~30 ms at most

_COLUMNS_0008 = (
    "id, src_executor, src_version, dst_executor, dst_version, weight, uses, ts_first, "
    "ts_last, ts_weight, decay_lambda, state, tags, desired_sig, ok_count, error_count"
)
_LIVE = "WHERE state IN ('active', 'proto')"
VIEW_0008 = f"CREATE VIEW v_mnestoma AS SELECT {_COLUMNS_0008} FROM mnests {_LIVE}"
VIEW_0010 = f"VIEW v_mnestoma AS SELECT {_COLUMNS_0008}, decayed_uses FROM mnests {_LIVE}"


def _fill(dialect: str) -> str:
    """``SET decayed_uses = ...``: rules.spread_count as of this revision, in SQL."""
    if dialect == "postgresql":
        days = "CAST(EXTRACT(EPOCH FROM (ts_last - ts_first)) AS DOUBLE PRECISION) / 86400.0"
        least, greatest = "LEAST", "GREATEST"
    else:
        days = "(julianday(ts_last) - julianday(ts_first))"
        least, greatest = "min", "max"
    gap = f"{least}(decay_lambda * {days} / {greatest}(uses - 1, 1), 200.0)"
    return (
        f"SET decayed_uses = CASE WHEN uses <= 1 OR {gap} <= 1e-9 THEN uses"
        f" ELSE (1.0 - exp(-{least}({gap} * uses, 200.0))) / (1.0 - exp(-{gap})) END"
    )


def _postgresql() -> bool:
    return bool(op.get_context().dialect.name == "postgresql")


# PostgreSQL, each statement with what squawk (the migration linter CI runs) would object
# to and why it does not apply here, in the comment squawk honours. The first transaction
# commits before the fill and the validation run in their own, so every statement is written
# to run again over what a stopped run committed.
PG_UPGRADE = (
    "-- A constant default rewrites nothing and holds the lock for an instant, so no\n"
    "-- statement_timeout is needed.\n"
    "-- squawk-ignore require-statement-timeout\n"
    "ALTER TABLE mnests ADD COLUMN IF NOT EXISTS decayed_uses FLOAT DEFAULT 1.0 NOT NULL",
    "-- A stopped run's CHECK, if any, added again by the next statement in this transaction:\n"
    "-- no other transaction sees the table without it.\n"
    f"-- squawk-ignore ban-drop-constraint\nALTER TABLE mnests DROP CONSTRAINT IF EXISTS {CHECK}",
    f"ALTER TABLE mnests ADD CONSTRAINT {CHECK} CHECK ({RULE}) NOT VALID",
    f"CREATE OR REPLACE {VIEW_0010}",
)
PG_VALIDATE = (
    "-- Idempotent: run again, it validates again.\n"
    f"-- squawk-ignore prefer-robust-stmts\nALTER TABLE mnests VALIDATE CONSTRAINT {CHECK}"
)


def _fill_postgresql(per_revision: bool) -> None:
    """Fill the rows there, in batches of ids (online, each its own transaction), or in one
    statement (the offline script; a connection the caller handed over)."""
    fill = f"UPDATE mnests {_fill('postgresql')}"
    context = op.get_context()
    if context.as_sql or not per_revision:
        if per_revision:
            with context.autocommit_block():
                op.execute(fill)
        else:
            op.execute(fill)
        return
    batch = text(
        f"{fill} WHERE id IN (SELECT id FROM mnests WHERE id > :after ORDER BY id LIMIT {BATCH})"
        " RETURNING id"
    )
    with context.autocommit_block():
        conn = op.get_bind()
        after = ""
        while True:
            ids = conn.execute(batch, {"after": after}).scalars().all()
            if not ids:
                return
            after = max(ids)


def _exp_on_sqlite() -> None:
    """A SQLite built without its math functions lacks exp(): the connection gets one (the
    package's own engines already have it; a connection handed over may not)."""
    if op.get_context().as_sql:
        return
    # the DB-API connection: sqlite3's own, or SQLAlchemy's adapter of aiosqlite's (whose
    # methods wait for the driver's coroutines; the driver's own would return them unawaited)
    raw = op.get_bind().connection.dbapi_connection
    cursor = raw.cursor()
    try:
        cursor.execute("SELECT exp(0.0)")
        cursor.fetchall()
    except Exception:  # sqlite3.OperationalError: no such function
        raw.create_function("exp", 1, _exp, deterministic=True)
    finally:
        cursor.close()


def _exp(x: float | None) -> float | None:
    if x is None:
        return None
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def upgrade() -> None:
    if _postgresql():
        for statement in PG_UPGRADE:
            op.execute(statement)
        per_revision = bool(op.get_context().opts.get("transaction_per_migration"))
        _fill_postgresql(per_revision)
        if per_revision:
            with op.get_context().autocommit_block():
                op.execute(PG_VALIDATE)
        else:  # in a connection the caller handed over: its transaction decides
            op.execute(PG_VALIDATE)
        return
    _exp_on_sqlite()
    op.execute("DROP VIEW IF EXISTS v_mnestoma")
    op.execute(
        "ALTER TABLE mnests ADD COLUMN decayed_uses FLOAT DEFAULT 1.0 NOT NULL"
        f" CONSTRAINT {CHECK} CHECK ({RULE})"
    )
    op.execute(f"UPDATE mnests {_fill('sqlite')}")
    op.execute(f"CREATE {VIEW_0010}")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS v_mnestoma")
    if _postgresql():
        op.execute(f"ALTER TABLE mnests DROP CONSTRAINT {CHECK}")
    op.drop_column("mnests", "decayed_uses")
    op.execute(VIEW_0008)
