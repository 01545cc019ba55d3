"""PostgreSQL's events partitioned by month (contract §12): what builds the layout beside
the models' tables (``create_all``, in the models' ``after_create`` of ``events``), and the
statements that make the partitions of the coming months.

The functions and triggers are those revisions 0011 and 0013 create, word for word (a test
compares what ``create_all`` and the revisions build).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Final

from sqlalchemy import DDL, DateTime, Integer, TextClause, bindparam, event, text

from mnestoma.core.rules import PASSING_KINDS, EventKind, sql_list, sql_literal
from mnestoma.core.types import UTCDateTime
from mnestoma.schema.models import Event
from mnestoma.schema.sql.splitting import SPLIT_NAME

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
_PARTITIONS_HEAD = (
    "CREATE OR REPLACE FUNCTION mnestoma_events_partitions(at timestamptz, ahead integer)"
)
PARTITIONS = (
    _PARTITIONS_HEAD
    + f"""
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
                    ' WHERE turn_id IS NOT NULL AND kind IN ({_PASSING_QUOTED})'
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

# The partitions of a new store, as revision 0011 leaves an empty one: every ts before the
# bound (the first of the month after next week's) in events_to_YYYYMM, the default
# partition, and the months from the bound on.
LAYOUT = """DO $do$
DECLARE
    bound timestamptz := (date_trunc('month', (now() + interval '7 days') AT TIME ZONE 'UTC')
                          + interval '1 month') AT TIME ZONE 'UTC';
    part text := 'events_to_' || to_char(bound AT TIME ZONE 'UTC', 'YYYYMM');
BEGIN
    EXECUTE format(
        'CREATE TABLE %I PARTITION OF events (CONSTRAINT %I PRIMARY KEY (id))'
        ' FOR VALUES FROM (MINVALUE) TO (%L)', part, part || '_pkey', bound);
    CREATE TABLE events_default PARTITION OF events
        (CONSTRAINT events_default_pkey PRIMARY KEY (id)) DEFAULT;
    PERFORM mnestoma_events_partitions(bound, 3);
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
    PARTITIONS,
    *TRIGGERS,
    LAYOUT,
)
# After DROP TABLE events (its partitions and triggers went with it).
AFTER_DROP: Final[tuple[str, ...]] = (
    "DROP TABLE IF EXISTS event_turn_edges",
    "DROP FUNCTION IF EXISTS mnestoma_events_partitions(timestamptz, integer)",
    "DROP FUNCTION IF EXISTS mnestoma_events_bounds()",
    "DROP FUNCTION IF EXISTS mnestoma_turn_edge_added()",
    "DROP FUNCTION IF EXISTS mnestoma_turn_edge_removed()",
    "DROP FUNCTION IF EXISTS mnestoma_turn_edges_truncated()",
)

# The names of the layout that are not the models' own tables: the side table, and the
# partitions of events (events_YYYYMM, events_to_YYYYMM, events_default).
SIDE_TABLE_NAME = "event_turn_edges"
# A month is named by its year (four digits, five from year 10000 on: the month of the
# store's last instants ends there) and its month.
PARTITION_NAME = r"^events_(to_)?[0-9]{4,5}(0[1-9]|1[0-2])$|^events_default$"
LAYOUT_NAMES = (SIDE_TABLE_NAME,)
# The tables a prune builds or detaches for an instant (left behind only if it stopped).
RETENTION_NAME = r"^events_keep_[0-9]{6,7}$|^events_(to_)?[0-9]{6,7}_dropped$"
_LAYOUT = re.compile(f"{PARTITION_NAME}|{RETENTION_NAME}|{SPLIT_NAME}")


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

_NAME = re.compile(PARTITION_NAME)


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


DEFAULT_PARTITION = "events_default"
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
