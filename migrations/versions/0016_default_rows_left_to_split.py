"""PostgreSQL: a month whose rows wait in the default partition by the thousand is no longer
made by a writer's upkeep under an exclusive lock on ``events`` (contract §12).

``mnestoma_events_partitions`` made a month by moving the rows ``events_default`` caught
for it (a clock ahead or behind, a raw ``INSERT``, a month whose lock stayed busy) while it
held ``LOCK TABLE events IN ACCESS EXCLUSIVE MODE``: every reader and writer of ``events``
waited for the move, seconds for millions of rows. It is replaced (``CREATE OR REPLACE``:
no lock on ``events``) by one that first counts those rows, reading 10,001 of them at
most, before any lock: a month with more than 10,000 is left to ``mnestoma split-history``,
which moves them online in batches; one with fewer is made as before (a move of
milliseconds). It now returns the end of the partitions that follow on from the first of
``at``'s month without a gap, that first itself when the month has none, so that the
caller knows which month it left.

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
# mnestoma_events_month under an instant's exclusive lock on events, but one for which the
# default partition holds more than 10,000 rows (rules.PARTITION_MOVE_MAX_ROWS when this was
# written): those wait for split-history. The rows of a month made move into it (deleted
# from the default, inserted through events: the triggers keep event_turn_edges in step).
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
    waiting bigint;
    made_to timestamptz;
    next_end timestamptz;
BEGIN
    FOR i IN 0..ahead LOOP
        lo := (first_month + make_interval(months => i)) AT TIME ZONE 'UTC';
        hi := (first_month + make_interval(months => i + 1)) AT TIME ZONE 'UTC';
        CONTINUE WHEN EXISTS (
            SELECT 1 FROM mnestoma_events_bounds() b WHERE b.lower <= lo AND lo < b.upper
        );
        -- Rows the default partition caught for the month move under the lock below only
        -- when they are few; more are left there for split-history, which moves them online.
        EXECUTE 'SELECT count(*) FROM (SELECT 1 FROM events_default WHERE ts >= $1 AND ts < $2'
            ' LIMIT 10001) w' INTO waiting USING lo, hi;
        CONTINUE WHEN waiting > 10000;
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
