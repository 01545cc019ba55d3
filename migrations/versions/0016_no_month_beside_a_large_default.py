"""PostgreSQL: no month of ``events`` is made by a writer's upkeep while the default partition
is large (contract §12).

Making a month under ``LOCK TABLE events IN ACCESS EXCLUSIVE MODE`` reads the whole of
``events_default``: PostgreSQL checks that none of its rows belongs to the new month, and
``mnestoma_events_partitions`` moves those that do. With millions of rows there (a clock
ahead or behind for a while, a bulk ``INSERT`` of history) every reader and writer of
``events`` waited seconds. The function is replaced (``CREATE OR REPLACE``: no lock on
``events``) by one that first looks at the default partition's size in the catalogue
(``pg_relation_size``, no row read): above 4 MiB it makes no month, and the rows there, and
the writes to the months not made meanwhile, wait for ``mnestoma split-history``, which
moves them into their months online and leaves an empty default partition. It now returns
the end of the partitions that follow on from the first of ``at``'s month without a gap,
that first itself when the month has none, so that the caller knows which month it left.

SQLite: nothing changes. The downgrade puts back 0015's function.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WHY_FUNCTION = (
    "-- Creates or replaces a function only.\n-- squawk-ignore require-statement-timeout\n"
)

_HEAD = "CREATE OR REPLACE FUNCTION mnestoma_events_partitions(at timestamptz, ahead integer)"

# The months not covered yet from at's (UTC) to ahead months after it, each made by
# mnestoma_events_month under an instant's exclusive lock on events, none while the default
# partition is larger than 4 MiB (rules.PARTITION_DEFAULT_MAX_MIB when this was written):
# those wait for split-history. The rows of a month made move into it (deleted from the
# default, inserted through events: the triggers keep event_turn_edges in step).
# Returns the end of the partitions that follow on from the first of at's month without a
# gap (that first itself when at's month has none).
PARTITIONS = (
    _HEAD
    + """
RETURNS timestamptz LANGUAGE plpgsql AS $fn$
DECLARE
    first_month timestamp := date_trunc('month', at AT TIME ZONE 'UTC');
    lo timestamptz;
    hi timestamptz;
    part text;
    moved jsonb;
    made_to timestamptz;
    next_end timestamptz;
BEGIN
    FOR i IN 0..ahead LOOP
        lo := (first_month + make_interval(months => i)) AT TIME ZONE 'UTC';
        hi := (first_month + make_interval(months => i + 1)) AT TIME ZONE 'UTC';
        CONTINUE WHEN EXISTS (
            SELECT 1 FROM mnestoma_events_bounds() b WHERE b.lower <= lo AND lo < b.upper
        );
        -- Under the lock below the default partition is read whole (none of its rows may
        -- belong to the month; those that do move): only while it is small. A larger one
        -- waits for split-history, which empties it online.
        CONTINUE WHEN coalesce(pg_relation_size(to_regclass('events_default')), 0)
            > 4194304;
        part := 'events_' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMM');
        BEGIN
            LOCK TABLE events IN ACCESS EXCLUSIVE MODE;
            CONTINUE WHEN EXISTS (
                SELECT 1 FROM mnestoma_events_bounds() b WHERE b.lower <= lo AND lo < b.upper
            );
            EXECUTE 'WITH gone AS (DELETE FROM events_default WHERE ts >= $1 AND ts < $2'
                ' RETURNING *) SELECT jsonb_agg(to_jsonb(gone)) FROM gone'
                INTO moved USING lo, hi;
            PERFORM mnestoma_events_month('events', part, lo, hi);
            IF moved IS NOT NULL THEN
                INSERT INTO events SELECT * FROM jsonb_populate_recordset(NULL::events, moved);
            END IF;
        EXCEPTION WHEN duplicate_table THEN
            NULL;  -- another session made it meanwhile
        END;
    END LOOP;
    -- The end of the partitions that follow on from the first of at's month without a gap
    -- (that first itself when at's month has none).
    made_to := first_month AT TIME ZONE 'UTC';
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

# 0015's, put back by the downgrade.
PARTITIONS_0015 = (
    _HEAD
    + """
RETURNS timestamptz LANGUAGE plpgsql AS $fn$
DECLARE
    first_month timestamp := date_trunc('month', at AT TIME ZONE 'UTC');
    lo timestamptz;
    hi timestamptz;
    part text;
    moved jsonb;
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
            EXECUTE 'WITH gone AS (DELETE FROM events_default WHERE ts >= $1 AND ts < $2'
                ' RETURNING *) SELECT jsonb_agg(to_jsonb(gone)) FROM gone'
                INTO moved USING lo, hi;
            PERFORM mnestoma_events_month('events', part, lo, hi);
            IF moved IS NOT NULL THEN
                INSERT INTO events SELECT * FROM jsonb_populate_recordset(NULL::events, moved);
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


def _postgresql() -> bool:
    return bool(op.get_context().dialect.name == "postgresql")


def upgrade() -> None:
    if _postgresql():
        op.execute(f"{WHY_FUNCTION}{PARTITIONS}")


def downgrade() -> None:
    if _postgresql():
        op.execute(f"{WHY_FUNCTION}{PARTITIONS_0015}")
