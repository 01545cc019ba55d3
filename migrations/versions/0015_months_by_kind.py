"""PostgreSQL: each month of ``events`` partitioned by kind, so that retention drops a month
without reading a row of it (contract §12); a new store has no partition of the past.

The new form of a month ``events_YYYYMM`` (FOR VALUES FROM its first instant, UTC, TO the
next month's) is itself ``PARTITION BY LIST (kind)``, with two leaves, each with its own
primary key on ``id``: ``events_YYYYMM_created`` (FOR VALUES IN ('created'), with a CHECK
``events_YYYYMM_created_bound`` of the month's bounds, so that it can be attached under
another range parent without a scan) and ``events_YYYYMM_rest`` (DEFAULT). The partitioned
indexes of ``events`` cascade to both. ``mnestoma_events_month(parent, part, lo, hi)`` makes
such a month under any range parent; ``mnestoma_events_partitions`` is replaced (``CREATE OR
REPLACE``: no lock on ``events``) so that every month made from now on has this form.

Steps, each its own transaction and each safe to run again over what a stopped run left:
the two functions; each plain partition 0011 (or upkeep, or retention) made that holds no
row, one at a time: under ``LOCK TABLE events`` (``lock_timeout = 50ms``, tried again up to
200 times; writers queue behind it that long at most), found still plain and empty,
detached, dropped and, a month, made again in the new form (catalogue changes only); an
empty partition of everything before (``events_to_YYYYMM``, the table as it was on a store
that had no event) is dropped and not made again, so that a new store has none. Last, the
months from the current one, three ahead, made in the new form (the same short lock,
tried again). No row is copied: a partition that holds rows stays as it is and keeps
working (a month written to, the history a store had before 0011); ``mnestoma
split-history`` rebuilds those into the new form.

SQLite: nothing changes.

The downgrade puts back 0013's ``mnestoma_events_partitions`` (plain months), makes each
partition in the new form a plain table again (its rows copied) and, where no partition
holds everything before, makes one as 0011 does (its bound the first of the month after
next week's, or the first month that holds rows if earlier; the empty months before it
dropped), then drops ``mnestoma_events_month``. It is not live-safe: it copies rows under
an exclusive lock on ``events`` held to its end, and a process of this release still
running (a split of history, say) calls the function it drops; stop writers first.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LOCK_TIMEOUT = "50ms"
TRIES = 200
# Months made from the current one on (rules.EVENT_PARTITIONS_AHEAD when this was written).
AHEAD = 3

MONTH = """CREATE OR REPLACE FUNCTION mnestoma_events_month(
    parent regclass, part text, lo timestamptz, hi timestamptz
) RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE format(
        'CREATE TABLE %I PARTITION OF %s FOR VALUES FROM (%L) TO (%L) PARTITION BY LIST (kind)',
        part, parent, lo, hi);
    EXECUTE format(
        'CREATE TABLE %I PARTITION OF %I (CONSTRAINT %I PRIMARY KEY (id),'
        ' CONSTRAINT %I CHECK (ts >= %L AND ts < %L)) FOR VALUES IN (''created'')',
        part || '_created', part, part || '_created_pkey', part || '_created_bound', lo, hi);
    EXECUTE format(
        'CREATE TABLE %I PARTITION OF %I (CONSTRAINT %I PRIMARY KEY (id)) DEFAULT',
        part || '_rest', part, part || '_rest_pkey');
END
$fn$"""

# The months not covered yet from at's (UTC) to ahead months after it, each made by
# mnestoma_events_month under an instant's exclusive lock on events; the rows the default
# partition caught for such a month move into it (deleted there, inserted through events:
# the triggers keep event_turn_edges in step). Returns the end of the partitions that
# follow on from at's month without a gap, as 0011's did.
PARTITIONS = """CREATE OR REPLACE FUNCTION mnestoma_events_partitions(at timestamptz, ahead integer)
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


def _retried(body: str) -> str:
    """PL/pgSQL running ``body`` under ``lock_timeout = LOCK_TIMEOUT``, tried again (after a
    short pause) up to ``TRIES`` times while its lock is busy, the lock timeout as it was
    after (revision 0011's pattern): writers queue behind it that long at most."""
    return f"""        tries := 0;
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


# The plain partitions of events (but the default) that hold no row, oldest first.
_EMPTY_PLAIN = """SELECT c.relname::text AS part, b.lower, b.upper
        FROM mnestoma_events_bounds() b JOIN pg_class c ON c.oid = b.part
        WHERE c.relkind = 'r'{only}
        ORDER BY b.lower"""

# Under the lock: the partition still a plain one of events and still empty, detached,
# dropped and, a month, made again in the new form (an empty partition of everything
# before is not made again).
_CONVERTED = """                LOCK TABLE events IN ACCESS EXCLUSIVE MODE;
                IF EXISTS (
                    SELECT 1 FROM mnestoma_events_bounds() b JOIN pg_class c ON c.oid = b.part
                    WHERE c.relname = r.part AND c.relkind = 'r'
                ) THEN
                    EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM %I)', r.part) INTO empty;
                    IF empty THEN
                        EXECUTE format('ALTER TABLE events DETACH PARTITION %I', r.part);
                        EXECUTE format('DROP TABLE %I', r.part);
                        IF r.lower > '-infinity' THEN
                            PERFORM mnestoma_events_month('events', r.part, r.lower, r.upper);
                        END IF;
                    END IF;
                END IF;"""


def convert(only: str | None = None) -> str:
    """The DO block that converts the empty plain partitions (with ``only``: that one), each
    under its own short lock, tried again. A partition that holds a row is passed over
    before any lock is asked for."""
    where = "" if only is None else f" AND c.relname = '{_checked(only)}'"
    return f"""DO $do$
DECLARE
    r record;
    empty boolean;
    tries integer;
    waited text := current_setting('lock_timeout');
BEGIN
    FOR r IN {_EMPTY_PLAIN.format(only=where)}
    LOOP
        EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM %I)', r.part) INTO empty;
        CONTINUE WHEN NOT empty;
{_retried(_CONVERTED)}
    END LOOP;
END
$do$"""


_NAME = re.compile(r"^events_(to_)?[0-9]{6,7}$")


def _checked(name: str) -> str:
    """A partition's name as 0011 and upkeep make them (written into a statement as is)."""
    if not _NAME.match(name):
        raise ValueError(f"not a partition of events: {name!r}")
    return name


# The plain partitions of events (but the default), oldest first: the candidates of the
# online run, one transaction each.
PLAIN = text(
    "SELECT c.relname::text FROM mnestoma_events_bounds() b JOIN pg_class c ON c.oid = b.part"
    " WHERE c.relkind = 'r' ORDER BY b.lower"
)

MAKE_MONTHS = f"""DO $do$
DECLARE
    tries integer;
    waited text := current_setting('lock_timeout');
BEGIN
{_retried(f"                PERFORM mnestoma_events_partitions(now(), {AHEAD});")}
END
$do$"""

# What squawk would object to, and why it does not apply.
WHY_FUNCTION = (
    "-- Creates or replaces a function only.\n-- squawk-ignore require-statement-timeout\n"
)
WHY_DO = (
    "-- Catalogue changes on empty tables only (the one read: whether a partition holds a\n"
    "-- row), each lock on events waited for 50 ms at most and tried again: no\n"
    "-- statement_timeout needed.\n"
    "-- squawk-ignore require-statement-timeout\n"
)


def _postgresql() -> bool:
    return bool(op.get_context().dialect.name == "postgresql")


def _own_transactions() -> bool:
    """True when each revision commits on its own (a handed connection's transaction is
    the caller's: everything runs in it)."""
    return bool(op.get_context().opts.get("transaction_per_migration"))


def upgrade() -> None:
    if not _postgresql():
        return
    op.execute(f"{WHY_FUNCTION}{MONTH}")
    op.execute(f"{WHY_FUNCTION}{PARTITIONS}")
    context = op.get_context()
    if not _own_transactions():
        op.execute(f"{WHY_DO}{convert()}")
        op.execute(f"{WHY_DO}{MAKE_MONTHS}")
        return
    if context.as_sql:  # the offline script: every partition in one statement
        with context.autocommit_block():
            op.execute(f"{WHY_DO}{convert()}")
    else:
        with context.autocommit_block():
            names = [str(n) for n in op.get_bind().execute(PLAIN).scalars()]
            for name in names:
                op.execute(f"{WHY_DO}{convert(name)}")
    with context.autocommit_block():
        op.execute(f"{WHY_DO}{MAKE_MONTHS}")


# 0013's partition maker, as 0014 has it: plain months.
PARTITIONS_0013 = (
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
                    'INSERT INTO event_turn_edges (turn_id, mnest_id, ts, occurrence)'
                    ' SELECT turn_id, mnest_id, ts, occurrence FROM %I'
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

# The layout as 0014 has it, under an exclusive lock on events held to the end: each
# partition in 0015's form (a month, or what retention kept of the months it dropped) a
# plain table again (rows copied: not live-safe); and where no partition holds everything
# before, one made as 0011 makes it, its bound the first of the month after next week's or
# the first month that holds rows if earlier (the empty months before it dropped, the rows
# the default partition holds before it moved into it).
LAYOUT_0014 = """DO $do$
DECLARE
    r record;
    bound timestamptz := (date_trunc('month', (now() + interval '7 days') AT TIME ZONE 'UTC')
                          + interval '1 month') AT TIME ZONE 'UTC';
    held boolean;
    low text;
    part text;
BEGIN
    LOCK TABLE events IN ACCESS EXCLUSIVE MODE;
    FOR r IN
        SELECT c.relname::text AS part, b.lower, b.upper
        FROM mnestoma_events_bounds() b JOIN pg_class c ON c.oid = b.part
        WHERE c.relkind = 'p' ORDER BY b.lower
    LOOP
        low := CASE WHEN r.lower = '-infinity' THEN 'MINVALUE' ELSE quote_literal(r.lower) END;
        EXECUTE format('ALTER TABLE events DETACH PARTITION %I', r.part);
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I)', r.part) INTO held;
        IF held THEN
            EXECUTE format('ALTER TABLE %I RENAME TO %I', r.part, r.part || '_downgraded');
            EXECUTE format(
                'CREATE TABLE %I (LIKE events INCLUDING DEFAULTS INCLUDING CONSTRAINTS,'
                ' CONSTRAINT %I PRIMARY KEY (id))', r.part, r.part || '_pkey');
            EXECUTE format('INSERT INTO %I SELECT * FROM %I', r.part, r.part || '_downgraded');
            EXECUTE format('DROP TABLE %I', r.part || '_downgraded');
            EXECUTE format(
                'ALTER TABLE events ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%L)',
                r.part, low, r.upper);
        ELSE
            EXECUTE format('DROP TABLE %I', r.part);
            EXECUTE format(
                'CREATE TABLE %I PARTITION OF events (CONSTRAINT %I PRIMARY KEY (id))'
                ' FOR VALUES FROM (%s) TO (%L)', r.part, r.part || '_pkey', low, r.upper);
        END IF;
    END LOOP;
    IF EXISTS (SELECT 1 FROM mnestoma_events_bounds() b WHERE b.lower = '-infinity') THEN
        RETURN;
    END IF;
    FOR r IN
        SELECT c.relname::text AS part, b.lower
        FROM mnestoma_events_bounds() b JOIN pg_class c ON c.oid = b.part
        WHERE b.lower < bound ORDER BY b.lower
    LOOP
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I)', r.part) INTO held;
        IF held THEN
            bound := r.lower;
            EXIT;
        END IF;
    END LOOP;
    FOR r IN
        SELECT c.relname::text AS part
        FROM mnestoma_events_bounds() b JOIN pg_class c ON c.oid = b.part
        WHERE b.upper <= bound
    LOOP
        EXECUTE format('ALTER TABLE events DETACH PARTITION %I', r.part);
        EXECUTE format('DROP TABLE %I', r.part);
    END LOOP;
    part := 'events_to_' || to_char(bound AT TIME ZONE 'UTC', 'YYYYMM');
    EXECUTE format(
        'CREATE TABLE %I (LIKE events INCLUDING DEFAULTS INCLUDING CONSTRAINTS,'
        ' CONSTRAINT %I PRIMARY KEY (id))', part, part || '_pkey');
    EXECUTE format(
        'WITH moved AS (DELETE FROM events_default WHERE ts < %L RETURNING *)'
        ' INSERT INTO %I SELECT * FROM moved', bound, part);
    EXECUTE format(
        'ALTER TABLE events ATTACH PARTITION %I FOR VALUES FROM (MINVALUE) TO (%L)', part, bound);
    EXECUTE format(
        'INSERT INTO event_turn_edges (turn_id, mnest_id, ts, occurrence)'
        ' SELECT turn_id, mnest_id, ts, occurrence FROM %I'
        ' WHERE turn_id IS NOT NULL AND kind IN (''created'', ''reinforced'')'
        ' ON CONFLICT DO NOTHING', part);
END
$do$"""

PG_DOWNGRADE = (
    PARTITIONS_0013,
    LAYOUT_0014,
    "DROP FUNCTION IF EXISTS mnestoma_events_month(regclass, text, timestamptz, timestamptz)",
)


def downgrade() -> None:
    if not _postgresql():
        return
    for statement in PG_DOWNGRADE:
        op.execute(statement)
