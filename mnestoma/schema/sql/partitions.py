"""PostgreSQL's events partitioned by month (contract §12): what builds the layout beside
the models' tables (``create_all``, in the models' ``after_create`` of ``events``), the
statements that make the partitions of the coming months, and retention's.

The functions and triggers are those revisions 0011, 0013, 0015 and 0016 create, word for word,
and a new store's partitions are those the revisions leave on an empty one (a test compares
what ``create_all`` and the revisions build).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Final

from sqlalchemy import DDL, DateTime, Integer, TextClause, bindparam, event, text

from mnestoma.core.rules import (
    PARTITION_DEFAULT_MAX_MIB,
    PASSING_KINDS,
    EventKind,
    sql_list,
    sql_literal,
)
from mnestoma.core.types import UTCDateTime
from mnestoma.schema.models import Event
from mnestoma.schema.sql.partman import PARTMAN_CHILD_NAME, PARTMAN_NAME
from mnestoma.schema.sql.splitting import DEFAULT_DDL, DEFAULT_NAME, SPLIT_NAME

__all__ = [
    "AFTER_CREATE",
    "AFTER_DROP",
    "ENSURE_PARTITIONS",
    "HAS_PARTITIONS",
    "LAYOUT_NAMES",
    "PARTITION_BOUNDS",
    "PARTITION_NAME",
    "is_layout_name",
]

_PASSING = f"kind IN ({sql_list(PASSING_KINDS)})"
# The same, inside a string literal of PL/pgSQL.
_PASSING_QUOTED = sql_list(PASSING_KINDS).replace("'", "''")

SIDE_TABLE = """CREATE TABLE event_turn_edges (
    turn_id TEXT NOT NULL,
    mnest_id TEXT NOT NULL,
    ts TIMESTAMP WITH TIME ZONE NOT NULL,
    occurrence INTEGER DEFAULT 1 NOT NULL,
    CONSTRAINT pk_event_turn_edges PRIMARY KEY (turn_id, mnest_id, occurrence)
)"""
SIDE_INDEX = "CREATE INDEX ix_event_turn_edges_ts ON event_turn_edges (ts)"

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
TURN_EDGES_TRUNCATED = """CREATE OR REPLACE FUNCTION mnestoma_turn_edges_truncated() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    TRUNCATE event_turn_edges;
    RETURN NULL;
END
$fn$"""
BOUNDS = r"""CREATE OR REPLACE FUNCTION mnestoma_events_bounds()
RETURNS TABLE (part regclass, lower timestamptz, upper timestamptz)
LANGUAGE sql STABLE AS $fn$
    SELECT c.oid::regclass,
           CASE WHEN b.expr LIKE '%FROM (MINVALUE)%' THEN '-infinity'::timestamptz
                ELSE substring(b.expr FROM $r$FROM \('([^']*)'\)$r$)::timestamptz END,
           CASE WHEN b.expr LIKE '%TO (MAXVALUE)%' THEN 'infinity'::timestamptz
                ELSE substring(b.expr FROM $r$TO \('([^']*)'\)$r$)::timestamptz END
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS expr) b
    WHERE i.inhparent = 'events'::regclass AND b.expr <> 'DEFAULT'
$fn$"""
# Literals of PL/pgSQL's dynamic SQL, inside a string literal.
_CREATED_QUOTED = sql_literal(EventKind.CREATED).replace("'", "''")

# A month in the form revision 0015 gives it, under any range parent (events, or a staging
# table): ``part`` FOR VALUES FROM (lo) TO (hi), itself partitioned by list of kind, with
# two leaves, ``<part>_created`` (its CHECK of the month's bounds lets it be attached under
# another range parent without a scan) and ``<part>_rest`` (DEFAULT), each with its own
# primary key on id; the partitioned indexes of the parent cascade to both.
MONTH = f"""CREATE OR REPLACE FUNCTION mnestoma_events_month(
    parent regclass, part text, lo timestamptz, hi timestamptz
) RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE format(
        'CREATE TABLE %I PARTITION OF %s FOR VALUES FROM (%L) TO (%L) PARTITION BY LIST (kind)',
        part, parent, lo, hi);
    EXECUTE format(
        'CREATE TABLE %I PARTITION OF %I (CONSTRAINT %I PRIMARY KEY (id),'
        ' CONSTRAINT %I CHECK (ts >= %L AND ts < %L)) FOR VALUES IN ({_CREATED_QUOTED})',
        part || '_created', part, part || '_created_pkey', part || '_created_bound', lo, hi);
    EXECUTE format(
        'CREATE TABLE %I PARTITION OF %I (CONSTRAINT %I PRIMARY KEY (id)) DEFAULT',
        part || '_rest', part, part || '_rest_pkey');
END
$fn$"""

_PARTITIONS_HEAD = (
    "CREATE OR REPLACE FUNCTION mnestoma_events_partitions(at timestamptz, ahead integer)"
)
# The months from ``at``'s (UTC) to ``ahead`` months after it that no partition covers
# yet, each made by mnestoma_events_month under an instant's exclusive lock on events; the
# rows of such a month that the default partition caught move into it (deleted there and
# inserted through events: the triggers keep event_turn_edges in step); none while the
# default partition is larger than PARTITION_DEFAULT_MAX_MIB (its size in the catalogue):
# making a month reads it whole under that lock, so its rows wait for split-history, which
# moves them online (revision 0016).
# Returns the end of the partitions that follow on from the first of at's month without a
# gap (that first itself when at's month has none).
PARTITIONS = (
    _PARTITIONS_HEAD
    + f"""
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
            > {PARTITION_DEFAULT_MAX_MIB * 1024 * 1024};
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

_ROW_TRIGGERS = tuple(
    f"CREATE TRIGGER {name} AFTER {op} ON events FOR EACH ROW"
    f" WHEN ({row}.turn_id IS NOT NULL AND {row}.{_PASSING}) EXECUTE FUNCTION {fn}()"
    for name, op, row, fn in (
        ("events_turn_edge_added", "INSERT", "NEW", "mnestoma_turn_edge_added"),
        ("events_turn_edge_removed", "DELETE", "OLD", "mnestoma_turn_edge_removed"),
    )
)
TRIGGERS = (
    *_ROW_TRIGGERS,
    "CREATE TRIGGER events_truncated AFTER TRUNCATE ON events FOR EACH STATEMENT"
    " EXECUTE FUNCTION mnestoma_turn_edges_truncated()",
)

# The partitions of a new store, as the revisions leave an empty one: no partition of the
# past (0011's catch-all, empty there, is dropped by 0015), the default partition, and
# months in 0015's form from the current one (0015) and from 0011's bound (the first of the
# month after next week's) on, three ahead of each.
LAYOUT = f"""DO $do$
DECLARE
    bound timestamptz := (date_trunc('month', (now() + interval '7 days') AT TIME ZONE 'UTC')
                          + interval '1 month') AT TIME ZONE 'UTC';
BEGIN
    {DEFAULT_DDL};
    PERFORM mnestoma_events_partitions(bound, 3);
    PERFORM mnestoma_events_partitions(now(), 3);
END
$do$"""

# After CREATE TABLE events (PostgreSQL), in this order.
AFTER_CREATE: Final[tuple[str, ...]] = (
    SIDE_TABLE,
    SIDE_INDEX,
    TURN_EDGE_ADDED,
    TURN_EDGE_REMOVED,
    TURN_EDGES_TRUNCATED,
    BOUNDS,
    MONTH,
    PARTITIONS,
    *TRIGGERS,
    LAYOUT,
)
# After DROP TABLE events (its partitions and triggers went with it).
AFTER_DROP: Final[tuple[str, ...]] = (
    "DROP TABLE IF EXISTS event_turn_edges",
    "DROP FUNCTION IF EXISTS mnestoma_events_partitions(timestamptz, integer)",
    "DROP FUNCTION IF EXISTS mnestoma_events_month(regclass, text, timestamptz, timestamptz)",
    "DROP FUNCTION IF EXISTS mnestoma_events_bounds()",
    "DROP FUNCTION IF EXISTS mnestoma_turn_edge_added()",
    "DROP FUNCTION IF EXISTS mnestoma_turn_edge_removed()",
    "DROP FUNCTION IF EXISTS mnestoma_turn_edges_truncated()",
)

# The names of the layout that are not the models' own tables: the side table, and the
# partitions of events at every level (events_YYYYMM and its leaves events_YYYYMM_created
# and events_YYYYMM_rest; events_to_YYYYMM and its default leaf events_to_YYYYMM_default;
# events_default).
SIDE_TABLE_NAME = "event_turn_edges"
# A month is named by its year (four digits, five from year 10000 on: the month of the
# store's last instants ends there) and its month.
_MONTH = "[0-9]{4,5}(0[1-9]|1[0-2])"
PARTITION_NAME = (
    f"^events_(to_)?{_MONTH}$|^events_{_MONTH}_(created|rest)$|^events_to_{_MONTH}_default$"
    "|^events_default$"
)
LAYOUT_NAMES = (SIDE_TABLE_NAME,)
# The tables a prune builds or detaches for an instant (left behind only if it stopped).
DROPPED_NAME = r"^events_(to_)?[0-9]{6,7}_dropped$"
RETENTION_NAME = rf"^events_keep_[0-9]{{6,7}}$|{DROPPED_NAME}"
# pg_partman's months and template, and split-history's tables, are the store's too.
_LAYOUT = re.compile(f"{PARTITION_NAME}|{RETENTION_NAME}|{PARTMAN_NAME}|{SPLIT_NAME}")


def is_layout_name(name: str) -> bool:
    """True for a table the store builds beside the models' on PostgreSQL: the side table,
    a partition of events, or a table of retention's or of split-history's."""
    return name in LAYOUT_NAMES or bool(_LAYOUT.match(name))


# Is events partitioned here (the function revision 0011 creates is there)?
HAS_PARTITIONS: Final[TextClause] = text(
    "SELECT to_regprocedure('mnestoma_events_partitions(timestamptz, integer)') IS NOT NULL"
)
# Make the partitions of :at's month and :ahead months after it; the end of the partitions
# that follow on from :at's month, :cap at most (an instant Python holds, where the last
# month the store holds ends in year 10000), and whether the transaction has changed
# anything so far (made a partition; evaluated after, the subquery being kept apart).
ENSURE_PARTITIONS: Final[TextClause] = text(
    "SELECT made, txid_current_if_assigned() IS NOT NULL FROM"
    " (SELECT least(mnestoma_events_partitions(:at, :ahead), :cap) AS made OFFSET 0) ensured"
).bindparams(
    bindparam("at", type_=UTCDateTime()),
    bindparam("ahead"),
    bindparam("cap", type_=DateTime(timezone=True)),  # INSTANTS_END: not a stored instant
)
# Each partition but the default whose range ends by :before, with that end, oldest first.
PARTITION_BOUNDS: Final[TextClause] = text(
    "SELECT part::text, upper FROM mnestoma_events_bounds() WHERE upper <= :before ORDER BY lower"
).bindparams(bindparam("before", type_=UTCDateTime()))


# --- retention: dropping whole months ---------------------------------------------------------

_NAME = re.compile(f"{PARTITION_NAME}|{PARTMAN_CHILD_NAME}")  # pg_partman's months too


def partition(name: str) -> str:
    """``name``, checked to be one of the partitions of events (so that it can be written
    into a statement as it is)."""
    if not _NAME.match(name):
        raise ValueError(f"not a partition of events: {name!r}")
    return name


_KEPT = (
    f"kind = {sql_literal(EventKind.CREATED)}"
    " AND EXISTS (SELECT 1 FROM mnests m WHERE m.id = {table}.mnest_id)"
)


def lock_old(name: str) -> TextClause:
    """Hold off writes into a partition about to be dropped (reads go on)."""
    return text(f"LOCK TABLE {partition(name)} IN SHARE MODE")


# What the copy of the kept rows reads besides the partitions: events (its columns, for the
# new table) and mnests (which rows are still stored). Writers go on.
LOCK_READ: Final[tuple[TextClause, ...]] = (
    text("LOCK TABLE events IN ACCESS SHARE MODE"),
    text("LOCK TABLE mnests IN ACCESS SHARE MODE"),
)


def count_rows(name: str, *, before_end: bool = False) -> TextClause:
    """How many rows a partition holds (with ``before_end``: those before ``:end``)."""
    where = " WHERE ts < :end" if before_end else ""
    return text(f"SELECT count(*) FROM {partition(name)}{where}").bindparams(
        *([bindparam("end", type_=UTCDateTime())] if before_end else [])
    )


def create_keep(keep: str) -> TextClause:
    """The table that will hold what retention keeps of the dropped months."""
    return text(
        f"CREATE TABLE {keep} (LIKE events INCLUDING DEFAULTS INCLUDING CONSTRAINTS,"
        f" CONSTRAINT {keep}_pkey PRIMARY KEY (id))"
    )


def copy_kept(keep: str, name: str, *, before_end: bool = False) -> TextClause:
    """Copy the ``created`` events of the mnests still stored from a partition."""
    src = partition(name)
    where = _KEPT.format(table=src) + (" AND ts < :end" if before_end else "")
    return text(f"INSERT INTO {keep} SELECT * FROM {src} WHERE {where}").bindparams(
        *([bindparam("end", type_=UTCDateTime())] if before_end else [])
    )


def instant(at: datetime) -> str:
    """An aware instant as a PostgreSQL literal (DDL takes no parameters)."""
    if at.tzinfo is None:
        raise ValueError("an aware instant is needed")
    return f"'{at.astimezone(UTC).isoformat()}'::timestamptz"


def finish_keep(keep: str, end: datetime) -> tuple[TextClause, ...]:
    """Its bound as a CHECK (so that the attach reads no row) and the indexes of events."""
    return (
        text(f"ALTER TABLE {keep} ADD CONSTRAINT {keep}_bound CHECK (ts < {instant(end)})"),
        text(f"CREATE INDEX {keep}_mnest_id_idx ON {keep} (mnest_id)"),
        text(f"CREATE INDEX {keep}_turn_id_idx ON {keep} (turn_id) WHERE turn_id IS NOT NULL"),
        text(f"ANALYZE {keep}"),
    )


DEFAULT_PARTITION = DEFAULT_NAME
# The lock timeout of the transaction (set back after a step that took its locks under a
# short one), and a lock timeout for the rest of the transaction.
CURRENT_LOCK_TIMEOUT: Final[TextClause] = text("SELECT current_setting('lock_timeout')")
LOCAL_LOCK_TIMEOUT: Final[TextClause] = text("SELECT set_config('lock_timeout', :t, true)")


def count_table(name: str) -> TextClause:
    """How many rows a table of retention's holds."""
    return text(f"SELECT count(*) FROM {name}")


LOCK_EVENTS: Final[TextClause] = text("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")


def detach(name: str) -> TextClause:
    return text(f"ALTER TABLE events DETACH PARTITION {partition(name)}")


def rename(old: str, new: str) -> TextClause:
    return text(f"ALTER TABLE {old} RENAME TO {new}")


DELETE_DEFAULT_BEFORE_END: Final[TextClause] = text(
    "DELETE FROM events_default WHERE ts < :end"
).bindparams(bindparam("end", type_=UTCDateTime()))


def attach_keep(final: str, end: datetime) -> TextClause:
    """``final`` becomes the partition of every ts before ``end``."""
    return text(
        f"ALTER TABLE events ATTACH PARTITION {partition(final)}"
        f" FOR VALUES FROM (MINVALUE) TO ({instant(end)})"
    )


def drop_bound(final: str, keep: str) -> TextClause:
    return text(f"ALTER TABLE {partition(final)} DROP CONSTRAINT {keep}_bound")


def turn_edges_of(final: str) -> TextClause:
    """The rows of event_turn_edges of the passings a partition holds (kept ones)."""
    return text(
        "INSERT INTO event_turn_edges (turn_id, mnest_id, ts, occurrence)"
        f" SELECT turn_id, mnest_id, ts, occurrence FROM {partition(final)}"
        f" WHERE turn_id IS NOT NULL AND {_PASSING} ON CONFLICT DO NOTHING"
    )


def detached(name: str) -> str:
    """``name``, checked to be a partition retention detached (or the table it builds)."""
    base = name.removesuffix("_dropped")
    if not (_NAME.match(base) or re.match(r"^events_keep_[0-9]{6,7}$", base)):
        raise ValueError(f"not a table of retention's: {name!r}")
    return name


def drop_table(name: str) -> TextClause:
    return text(f"DROP TABLE IF EXISTS {name}")


# --- retention: months in 0015's form, dropped without reading them -----------------------

# The forms of a partition of events (WHOLE_PARTITIONS).
MONTH_FORM = "month"
KEPT_FORM = "kept"
LEGACY_FORM = "legacy"

# Each partition of events but the default whose range ends by :before, oldest first, with
# its range (its lower bound NULL for MINVALUE) and its form: 'month' (0015's: partitioned
# by list of kind, with exactly the leaves <name>_created and <name>_rest), 'kept' (the
# partition of everything before, partitioned by range, with its default leaf
# <name>_default), else 'legacy' (a plain table: anything 0011 made, what retention kept
# before 0015, a month of pg_partman's; or a month whose leaves do not carry its name, as
# one renamed to pg_partman's name). The catalogue only.
WHOLE_PARTITIONS: Final[TextClause] = text(
    "SELECT c.relname::text, CASE WHEN b.lower > '-infinity' THEN b.lower END, b.upper,"
    " CASE WHEN c.relkind <> 'p' THEN 'legacy'"
    "  WHEN b.lower = '-infinity' AND EXISTS ("
    "   SELECT 1 FROM pg_inherits i JOIN pg_class l ON l.oid = i.inhrelid"
    "   WHERE i.inhparent = c.oid AND l.relname = c.relname || '_default'"
    "   AND pg_get_expr(l.relpartbound, l.oid) = 'DEFAULT') THEN 'kept'"
    "  WHEN b.lower > '-infinity' AND ("
    "   SELECT array_agg(l.relname::text || ':' || l.relkind::text ORDER BY l.relname)"
    "   FROM pg_inherits i JOIN pg_class l ON l.oid = i.inhrelid WHERE i.inhparent = c.oid)"
    "   = ARRAY[c.relname || '_created:r', c.relname || '_rest:r'] THEN 'month'"
    "  ELSE 'legacy' END"
    " FROM mnestoma_events_bounds() b JOIN pg_class c ON c.oid = b.part"
    " WHERE b.upper <= :before ORDER BY b.lower"
).bindparams(bindparam("before", type_=UTCDateTime()))

# The rows of some tables by the catalogue, never read: reltuples where the table was
# analysed or vacuumed, else the statistics' count of its live rows.
ESTIMATED_ROWS: Final[TextClause] = text(
    "SELECT coalesce(sum(CASE WHEN c.reltuples >= 0 THEN c.reltuples"
    " ELSE pg_stat_get_live_tuples(c.oid) END), 0)::float8"
    " FROM pg_class c WHERE c.oid = ANY(CAST(:tables AS regclass[]))"
)


def detach_from(parent: str, name: str) -> TextClause:
    """``name`` detached from ``parent`` (a catalogue change)."""
    return text(f"ALTER TABLE {partition(parent)} DETACH PARTITION {partition(name)}")


def create_kept(final: str) -> tuple[TextClause, ...]:
    """The partition of everything before an instant, in 0015's form: partitioned by range
    of ts (the columns and CHECKs of events), with its default leaf."""
    default = partition(f"{partition(final)}_default")
    return (
        text(
            f"CREATE TABLE {final} (LIKE events INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
            " PARTITION BY RANGE (ts)"
        ),
        text(
            f"CREATE TABLE {default} PARTITION OF {final}"
            f" (CONSTRAINT {default}_pkey PRIMARY KEY (id)) DEFAULT"
        ),
    )


def attach_range(parent: str, name: str, lower: datetime | None, upper: datetime) -> TextClause:
    """``name`` attached to ``parent`` for the ts from ``lower`` (None: MINVALUE) to
    ``upper``; a CHECK of ``name`` that implies the range spares the scan."""
    low = "MINVALUE" if lower is None else instant(lower)
    return text(
        f"ALTER TABLE {partition(parent)} ATTACH PARTITION {partition(name)}"
        f" FOR VALUES FROM ({low}) TO ({instant(upper)})"
    )


def move_default_kept(final: str) -> TextClause:
    """The default partition's rows before ``:end`` deleted, the ``created`` events of the
    mnests still stored among them moved into ``final`` (detached meanwhile); how many went."""
    return text(
        "WITH gone AS (DELETE FROM events_default WHERE ts < :end RETURNING *),"
        f" kept AS (INSERT INTO {partition(final)} SELECT * FROM gone"
        f" WHERE {_KEPT.format(table='gone')} RETURNING 1)"
        " SELECT (SELECT count(*) FROM gone) - (SELECT count(*) FROM kept)"
    ).bindparams(bindparam("end", type_=UTCDateTime()))


# The ids of the rows retention does not keep, gathered before they are deleted: a table of
# the session's own schema, named through it (no table of another schema is ever touched).
_NOT_KEPT = "mnestoma_not_kept"
NOT_KEPT_TABLE = f"pg_temp.{_NOT_KEPT}"


def _not_kept(kept: str) -> str:
    """The rows of ``kept`` retention does not keep: all but the ``created`` events of the
    mnests still stored. One ``NOT EXISTS``, so that the planner may join it as an
    anti-join: half the time of a ``NOT (kind = ... AND EXISTS ...)``, whose subquery runs
    once a row."""
    return (
        f"{partition(kept)} k WHERE NOT EXISTS (SELECT 1 FROM mnests m"
        f" WHERE m.id = k.mnest_id AND k.kind = {sql_literal(EventKind.CREATED)})"
    )


def collect_not_kept(kept: str) -> TextClause:
    """The ids of the rows of the partition of everything before that retention does not
    keep into a temporary table. A ``CREATE TABLE AS`` may read in parallel, which a
    ``DELETE`` never does: the anti-join of every kept row against ``mnests`` is the longest
    read of a prune."""
    return text(
        f"CREATE TEMPORARY TABLE {_NOT_KEPT} ON COMMIT DROP AS SELECT k.id FROM {_not_kept(kept)}"
    )


def delete_collected(kept: str) -> TextClause:
    """The rows whose ids :func:`collect_not_kept` gathered deleted from ``kept`` (each
    leaf's primary key finds them; ids are unique across the partitions)."""
    return text(f"DELETE FROM {partition(kept)} k USING {NOT_KEPT_TABLE} g WHERE k.id = g.id")


def delete_not_kept(kept: str) -> TextClause:
    """The same rows deleted in one statement, read by one process: for a role that may
    not make a temporary table (no ``TEMPORARY`` privilege on the database)."""
    return text(f"DELETE FROM {_not_kept(kept)}")


DROP_NOT_KEPT: Final[TextClause] = text(f"DROP TABLE IF EXISTS {NOT_KEPT_TABLE}")


# The months a prune detached that a stopped prune left behind (not attached anywhere).
LEFTOVERS: Final[TextClause] = text(
    "SELECT c.relname::text FROM pg_class c"
    " WHERE c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'events'::regclass)"
    " AND c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relname ~ :pattern"
    " ORDER BY c.relname"
).bindparams(pattern=DROPPED_NAME)


# One batch of the rows of event_turn_edges before :end, in (ts, turn_id, mnest_id,
# occurrence) order after the last one seen (:ts, :turn, :mnest, :occ): those whose passing
# is gone (dropped with its partition) are deleted; the event is looked up by its ts too, so
# that only its partition is searched. Returns how many were deleted, how many were looked
# at, and the last one.
PRUNE_TURN_EDGES_BATCH: Final[TextClause] = text(
    "WITH batch AS ("
    " SELECT s.ctid AS row, s.ts, s.turn_id, s.mnest_id, s.occurrence FROM event_turn_edges s"
    " WHERE s.ts < :end"
    " AND (s.ts, s.turn_id, s.mnest_id, s.occurrence) > (:ts, :turn, :mnest, :occ)"
    " ORDER BY s.ts, s.turn_id, s.mnest_id, s.occurrence LIMIT :n),"
    " gone AS (DELETE FROM event_turn_edges t USING batch b WHERE t.ctid = b.row"
    "  AND NOT EXISTS (SELECT 1 FROM events e WHERE e.ts = b.ts AND e.turn_id = b.turn_id"
    "  AND e.mnest_id = b.mnest_id AND e.occurrence = b.occurrence"
    f"  AND e.{_PASSING}) RETURNING 1),"
    " last AS (SELECT ts, turn_id, mnest_id, occurrence FROM batch"
    "  ORDER BY ts DESC, turn_id DESC, mnest_id DESC, occurrence DESC LIMIT 1)"
    " SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM batch),"
    " last.ts, last.turn_id, last.mnest_id, last.occurrence"
    " FROM (SELECT 1) one LEFT JOIN last ON true"
).bindparams(
    bindparam("end", type_=UTCDateTime()),
    bindparam("ts", type_=UTCDateTime()),
    bindparam("turn"),
    bindparam("mnest"),
    bindparam("occ", type_=Integer()),
    bindparam("n"),
)


# --- create_all: the layout built beside the models' events ----------------------------------


def _partitioned_layout(event_name: str, statements: tuple[str, ...]) -> None:
    """DDL listeners on ``events`` running ``statements`` on PostgreSQL only (SQLAlchemy's
    ``execute_if``): what revision 0011 builds beside the table (partitions,
    event_turn_edges, its triggers and functions). A DDL's text is %-formatted: its own
    percent signs are doubled."""
    for statement in statements:
        ddl = DDL(statement.replace("%", "%%"))  # type: ignore[no-untyped-call]
        ddl = ddl.execute_if(dialect="postgresql")
        event.listen(Event.__table__, event_name, ddl)


_partitioned_layout("after_create", AFTER_CREATE)
_partitioned_layout("after_drop", AFTER_DROP)
