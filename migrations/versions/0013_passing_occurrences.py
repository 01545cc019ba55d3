"""Every passing counts: ``events.occurrence``, and exactly once per (turn, edge, occurrence)
(contract §13). The k-th time an edge occurs in a turn is its own passing; the database
refuses the same (turn, edge, occurrence) twice, so that retries stay safe. Every event
already there is occurrence 1 (the column's default), so a retry of an old turn's edge is
still a no-op and a second occurrence of it now counts.

SQLite: the column added in place (a constant default rewrites nothing), and
``ux_events_turn_edge`` made again over ``(turn_id, mnest_id, occurrence)``, in the one
transaction every SQLite upgrade is.

PostgreSQL, safe on a live database. First transaction: the column added to ``events`` (its
partitions with it) and to ``event_turn_edges`` (PostgreSQL 11 and later add a column with
a constant default in the catalogue only; the lock is held for an instant, under
``lock_timeout = 50ms``, tried again up to 200 times), and the trigger functions replaced so
that they copy and match the occurrence (and the function that makes a month's partition,
which copies the side rows of the rows it moves). Then the unique index over ``(turn_id,
mnest_id, occurrence)`` built ``CONCURRENTLY`` (an invalid one a failed build left is
dropped and built again), and last the primary key of ``event_turn_edges`` swapped to it
(``USING INDEX``: catalogue changes only, under the same short lock timeout, tried again).
Until the swap the old key still refuses a second occurrence: writers of the previous
release, which write none, go on throughout. Each step is safe to run again. In a
connection the caller handed over (one transaction), a plain index build.

The downgrade keeps every event; those of a second or later occurrence lose their
``turn_id`` (the older rule has room for one passing per turn and edge), and their rows of
``event_turn_edges`` go. It takes exclusive locks: it is not live-safe.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-14
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PASSING = "kind IN ('created', 'reinforced')"
_TURN_EDGE_WHERE = f"turn_id IS NOT NULL AND {_PASSING}"
LOCK_TIMEOUT = "50ms"
TRIES = 200
SIDE_UNIQUE = "ux_event_turn_edges_occurrence"
SIDE_KEY = "pk_event_turn_edges"

# SQLite
SQLITE_UPGRADE = (
    "ALTER TABLE events ADD COLUMN occurrence INTEGER DEFAULT 1 NOT NULL",
    "DROP INDEX IF EXISTS ux_events_turn_edge",
    "CREATE UNIQUE INDEX ux_events_turn_edge ON events (turn_id, mnest_id, occurrence)"
    f" WHERE {_TURN_EDGE_WHERE}",
)
# Events of a second or later occurrence keep their history, not their turn.
DETACH_LATER_OCCURRENCES = (
    f"UPDATE events SET turn_id = NULL WHERE occurrence > 1 AND {_TURN_EDGE_WHERE}"
)
SQLITE_DOWNGRADE = (
    DETACH_LATER_OCCURRENCES,
    "DROP INDEX IF EXISTS ux_events_turn_edge",
    "CREATE UNIQUE INDEX ux_events_turn_edge ON events (turn_id, mnest_id)"
    f" WHERE {_TURN_EDGE_WHERE}",
)


def _retried(body: str) -> str:
    """PL/pgSQL running ``body`` under ``lock_timeout = LOCK_TIMEOUT``, tried again (after a
    short pause) up to ``TRIES`` times while its lock is busy, the lock timeout as it was
    after (revision 0011's pattern): writers queue behind it that long at most."""
    return f"""    tries := 0;
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '{LOCK_TIMEOUT}', true);
{body}
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            tries := tries + 1;
            IF tries >= {TRIES} THEN RAISE; END IF;
            PERFORM pg_sleep(least(0.005 * tries, 0.2));
        END;
    END LOOP;
    PERFORM set_config('lock_timeout', waited, true);"""


def _do(body: str) -> str:
    return f"""DO $do$
DECLARE
    tries integer;
    waited text := current_setting('lock_timeout');
BEGIN
{_retried(body)}
END
$do$"""


WHY_DO = (
    "-- Catalogue changes only (a constant default rewrites nothing), each lock waited for\n"
    "-- 50 ms at most and tried again: no statement_timeout needed.\n"
    "-- squawk-ignore require-statement-timeout\n"
)

ADD_COLUMNS = WHY_DO + _do(
    "            ALTER TABLE events\n"
    "                ADD COLUMN IF NOT EXISTS occurrence INTEGER DEFAULT 1 NOT NULL;\n"
    "            ALTER TABLE event_turn_edges\n"
    "                ADD COLUMN IF NOT EXISTS occurrence INTEGER DEFAULT 1 NOT NULL;"
)

TURN_EDGE_ADDED = """CREATE OR REPLACE FUNCTION mnestoma_turn_edge_added() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO event_turn_edges (turn_id, mnest_id, ts, occurrence)
    VALUES (NEW.turn_id, NEW.mnest_id, NEW.ts, NEW.occurrence);
    RETURN NULL;
END
$fn$"""
TURN_EDGE_REMOVED = """CREATE OR REPLACE FUNCTION mnestoma_turn_edge_removed() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM event_turn_edges
    WHERE turn_id = OLD.turn_id AND mnest_id = OLD.mnest_id AND occurrence = OLD.occurrence;
    RETURN NULL;
END
$fn$"""

# 0011's, its move of the default partition's rows copying their occurrence.
_PARTITIONS = (
    "CREATE OR REPLACE FUNCTION mnestoma_events_partitions(at timestamptz, ahead integer)"
    + """
RETURNS timestamptz LANGUAGE plpgsql AS $fn$
DECLARE
    first_month timestamp := date_trunc('month', at AT TIME ZONE 'UTC');
    lo timestamptz;
    hi timestamptz;
    part text;
    made_to timestamptz;
    next_end timestamptz;
BEGIN
    FOR i IN 0..ahead LOOP
        lo := (first_month + make_interval(months => i)) AT TIME ZONE 'UTC';
        hi := (first_month + make_interval(months => i + 1)) AT TIME ZONE 'UTC';
        CONTINUE WHEN EXISTS (
            SELECT 1 FROM mnestoma_events_bounds() b WHERE b.lower <= lo AND lo < b.upper
        );
        part := 'events_' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMM');
        BEGIN
            LOCK TABLE events IN ACCESS EXCLUSIVE MODE;
            CONTINUE WHEN EXISTS (
                SELECT 1 FROM mnestoma_events_bounds() b WHERE b.lower <= lo AND lo < b.upper
            );
            IF EXISTS (SELECT 1 FROM events_default WHERE ts >= lo AND ts < hi) THEN
                EXECUTE format(
                    'CREATE TABLE %I (LIKE events INCLUDING DEFAULTS INCLUDING CONSTRAINTS,'
                    ' CONSTRAINT %I PRIMARY KEY (id))', part, part || '_pkey');
                EXECUTE format(
                    'WITH moved AS (DELETE FROM events_default WHERE ts >= %L AND ts < %L'
                    ' RETURNING *) INSERT INTO %I SELECT * FROM moved', lo, hi, part);
                EXECUTE format(
                    'ALTER TABLE events ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                    part, lo, hi);
                EXECUTE format(
                    'INSERT INTO event_turn_edges (turn_id, mnest_id, ts{occurrence})'
                    ' SELECT turn_id, mnest_id, ts{occurrence} FROM %I'
                    ' WHERE turn_id IS NOT NULL AND kind IN (''created'', ''reinforced'')'
                    ' ON CONFLICT DO NOTHING', part);
            ELSE
                EXECUTE format(
                    'CREATE TABLE %I PARTITION OF events (CONSTRAINT %I PRIMARY KEY (id))'
                    ' FOR VALUES FROM (%L) TO (%L)', part, part || '_pkey', lo, hi);
            END IF;
        EXCEPTION WHEN duplicate_table THEN
            NULL;  -- another session made it meanwhile
        END;
    END LOOP;
    -- The end of the partitions that follow on from at's month without a gap.
    made_to := (first_month + make_interval(months => ahead + 1)) AT TIME ZONE 'UTC';
    LOOP
        SELECT b.upper INTO next_end FROM mnestoma_events_bounds() b
        WHERE b.lower <= made_to AND made_to < b.upper;
        EXIT WHEN next_end IS NULL OR next_end = 'infinity';
        made_to := next_end;
    END LOOP;
    RETURN made_to;
END
$fn$"""
)
PARTITIONS = _PARTITIONS.replace("{occurrence}", ", occurrence")

# Functions replaced: no table is locked.
WHY_FUNCTION = "-- Replaces a function only.\n-- squawk-ignore require-statement-timeout\n"
PG_FIRST = (
    ADD_COLUMNS,
    *(f"{WHY_FUNCTION}{fn}" for fn in (TURN_EDGE_ADDED, TURN_EDGE_REMOVED, PARTITIONS)),
)

_INDEX_ON = f"{SIDE_UNIQUE} ON event_turn_edges (turn_id, mnest_id, occurrence)"
BUILD = f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {_INDEX_ON}"
BUILD_IN_TRANSACTION = (
    "-- A connection handed over migrates in its own transaction: no CONCURRENTLY there.\n"
    "-- squawk-ignore require-concurrent-index-creation, require-statement-timeout\n"
    f"CREATE UNIQUE INDEX IF NOT EXISTS {_INDEX_ON}"
)
DROP_INVALID = (
    "-- CONCURRENTLY: writers go on while it runs; lock_timeout bounds its waits.\n"
    f"-- squawk-ignore require-statement-timeout\nDROP INDEX CONCURRENTLY IF EXISTS {SIDE_UNIQUE}"
)
INVALID = text(
    "SELECT NOT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(:name)"
).bindparams(name=SIDE_UNIQUE)

# The key over three columns, once: the old key (and its index) dropped, the new index
# taken as the key (renamed to it). Catalogue changes only.
_KEY_HAS_OCCURRENCE = (
    "(SELECT i.indnatts FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
    f" WHERE c.relname = '{SIDE_KEY}') = 3"
)
SWAP_KEY = WHY_DO + _do(
    f"            IF NOT {_KEY_HAS_OCCURRENCE} THEN\n"
    f"                ALTER TABLE event_turn_edges DROP CONSTRAINT {SIDE_KEY};\n"
    f"                ALTER TABLE event_turn_edges ADD CONSTRAINT {SIDE_KEY}\n"
    f"                    PRIMARY KEY USING INDEX {SIDE_UNIQUE};\n"
    "            END IF;"
)


def _postgresql() -> bool:
    return bool(op.get_context().dialect.name == "postgresql")


def _own_transactions() -> bool:
    """True when each revision commits on its own (a handed connection's transaction is
    the caller's: everything runs in it)."""
    return bool(op.get_context().opts.get("transaction_per_migration"))


def _build_index() -> None:
    """The unique index over (turn_id, mnest_id, occurrence), CONCURRENTLY; an invalid one
    left by a build that failed is dropped first."""
    context = op.get_context()
    with context.autocommit_block():
        if not context.as_sql and op.get_bind().execute(INVALID).scalar():
            op.execute(DROP_INVALID)
        op.execute(BUILD)


def upgrade() -> None:
    if not _postgresql():
        for statement in SQLITE_UPGRADE:
            op.execute(statement)
        return
    for statement in PG_FIRST:
        op.execute(statement)
    if not _own_transactions():
        op.execute(BUILD_IN_TRANSACTION)
        op.execute(SWAP_KEY)
        return
    _build_index()
    with op.get_context().autocommit_block():
        op.execute(SWAP_KEY)


# 0011's trigger functions and partition maker, as they were.
_OLD_ADDED = """CREATE OR REPLACE FUNCTION mnestoma_turn_edge_added() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO event_turn_edges (turn_id, mnest_id, ts) VALUES (NEW.turn_id, NEW.mnest_id, NEW.ts);
    RETURN NULL;
END
$fn$"""
_OLD_REMOVED = """CREATE OR REPLACE FUNCTION mnestoma_turn_edge_removed() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM event_turn_edges WHERE turn_id = OLD.turn_id AND mnest_id = OLD.mnest_id;
    RETURN NULL;
END
$fn$"""
PG_DOWNGRADE = (
    "LOCK TABLE events IN ACCESS EXCLUSIVE MODE",
    "DELETE FROM event_turn_edges WHERE occurrence > 1",
    DETACH_LATER_OCCURRENCES,
    _OLD_ADDED,
    _OLD_REMOVED,
    _PARTITIONS.replace("{occurrence}", ""),
    "CREATE UNIQUE INDEX ux_event_turn_edges_pair ON event_turn_edges (turn_id, mnest_id)",
    f"ALTER TABLE event_turn_edges DROP CONSTRAINT {SIDE_KEY}",
    f"ALTER TABLE event_turn_edges ADD CONSTRAINT {SIDE_KEY}"
    " PRIMARY KEY USING INDEX ux_event_turn_edges_pair",
    "ALTER TABLE event_turn_edges DROP COLUMN occurrence",
    "ALTER TABLE events DROP COLUMN occurrence",
)


def downgrade() -> None:
    if _postgresql():
        for statement in PG_DOWNGRADE:
            op.execute(statement)
        return
    for statement in SQLITE_DOWNGRADE:
        op.execute(statement)
    op.drop_column("events", "occurrence")
