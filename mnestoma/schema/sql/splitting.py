"""The statements of ``mnestoma split-history`` (PostgreSQL, contract §12): the partitions
of ``events`` in the old layout and the default partition, the staging table
``events_split`` and its months, the triggers that mirror the old partition's writes into
it, the batches of the copy, and the swap of catalogue changes that puts the months in the
old partition's place (and, for the default partition, a new empty one).

A month of the new layout is made by ``mnestoma_events_month(parent, part, lo, hi)``, the
store's function (revision 0015), called by name. DDL takes no parameters: every name
written into a statement is checked here first (:func:`old_partition`, :func:`month_name`,
:func:`staged`), and every instant is a month's first, written from its year and month.
"""

from __future__ import annotations

import re
from typing import Final

from sqlalchemy import BigInteger, TextClause, bindparam, text

from mnestoma.schema.sql.partman import PARTMAN_CHILD_NAME

__all__ = [
    "COMMENT",
    "CREATE_DEFAULT",
    "DEFAULT_DDL",
    "DEFAULT_FACTS",
    "DEFAULT_MONTHS",
    "DEFAULT_NAME",
    "EVENTS_INDEXES",
    "HAS_MONTH_FUNCTION",
    "LEFTOVERS",
    "LEGACY_PARTITIONS",
    "MAKE_MONTH",
    "MIRROR_FUNCTION",
    "MIRROR_TRIGGER",
    "ROWS_ESTIMATE",
    "SPLIT_LOCK",
    "SPLIT_NAME",
    "STAGING",
    "STAGING_MONTHS",
    "STAGING_NAME",
    "STRAY_MONTHS",
    "Month",
    "attach_month",
    "batch_end",
    "comment",
    "copy_batch",
    "covered_months",
    "create_staging",
    "mirror_triggers",
    "month_name",
    "old_partition",
    "staged",
]

# The staging table, its default leaf, and the prefix of a month staged under a name that
# the old partition still holds (the old partition is the month itself).
STAGING_NAME = "events_split"
STAGING_DEFAULT = "events_split_default"
STAGING_STRAYS = "events_split_strays"
TEMP_PREFIX = "events_split_"
MIRROR_TRIGGER = "events_split_mirrored"
# The default partition of events: the rows of months no partition covers, split too.
DEFAULT_NAME = "events_default"
# What a table of the split that is left behind is named: the staging table and its months
# (``events_split``, ``events_split_YYYYMM`` and their leaves), the old partition detached by
# the swap (``<name>_dropped``, as retention names what it detaches: retention's pattern
# covers a month's, this one the default partition's).
SPLIT_NAME = rf"^events_split(_[a-z0-9_]+)?$|^{DEFAULT_NAME}_dropped$"

# A month of the new layout: its year (four digits, five from year 10000) and month.
Month = tuple[int, int]

_OLD = re.compile(r"^events_(to_)?[0-9]{4,5}(0[1-9]|1[0-2])$")
_STAGED = re.compile(r"^events_(split_)?[0-9]{4,5}(0[1-9]|1[0-2])$")
_OBJECT = re.compile(r"^[a-z0-9_]{1,63}$")


def old_partition(name: str) -> str:
    """``name``, checked to be a partition split-history rebuilds (one of the old layout,
    ``events_YYYYMM`` or ``events_to_YYYYMM``, or the default partition ``events_default``),
    so that it can be written into a statement as it is."""
    if not (_OLD.match(name) or name == DEFAULT_NAME):
        raise ValueError(f"not a partition of events: {name!r}")
    return name


def is_old_name(name: str) -> bool:
    """True for a name the package gives a partition of the old layout."""
    return bool(_OLD.match(name))


def staged(name: str) -> str:
    """``name``, checked to be a month of the staging table (its final name, or the
    temporary ``events_split_YYYYMM``)."""
    if not _STAGED.match(name):
        raise ValueError(f"not a month of the split: {name!r}")
    return name


def _object(name: str) -> str:
    """A table, index or constraint name read from the catalogue, checked to be plain."""
    if not _OBJECT.match(name):
        raise ValueError(f"not a name the split writes: {name!r}")
    return name


def month_name(month: Month, prefix: str = "events_") -> str:
    """The name of ``month``'s partition (``events_YYYYMM``), or of its staged twin."""
    year, m = month
    return f"{prefix}{year:04d}{m:02d}"


def month_start(month: Month) -> str:
    """The first instant of ``month`` as PostgreSQL reads it (UTC; a year of five digits
    too, which Python's datetime cannot hold)."""
    year, m = month
    return f"{year:04d}-{m:02d}-01 00:00:00+00"


def next_month(month: Month) -> Month:
    year, m = month
    return (year + 1, 1) if m == 12 else (year, m + 1)


def months_between(first: Month, end: Month) -> list[Month]:
    """The months from ``first`` up to ``end`` (excluded)."""
    found: list[Month] = []
    month = first
    while month < end:
        found.append(month)
        month = next_month(month)
    return found


def _instant(month: Month) -> str:
    return f"'{month_start(month)}'::timestamptz"


# --- what there is -----------------------------------------------------------------------

# The store has the function that makes a month of the new layout (revision 0015).
HAS_MONTH_FUNCTION: Final[TextClause] = text(
    "SELECT to_regprocedure('mnestoma_events_month(regclass, text, timestamptz, timestamptz)')"
    " IS NOT NULL"
)

_UTC_MONTH = ", ".join(
    f"extract({part} FROM {{x}} AT TIME ZONE 'UTC')::int" for part in ("year", "month")
)
_FIRST_OF_MONTH = "date_trunc('month', {x} AT TIME ZONE 'UTC') = {x} AT TIME ZONE 'UTC'"

# A relation's rows as the planner estimates them, from the catalogue alone: the density of
# its last ANALYZE or VACUUM (``reltuples`` over ``relpages``) times the pages it has now
# (NULL when neither has counted any row of it yet).
_ESTIMATE = (
    "(CASE WHEN c.relpages > 0 AND c.reltuples >= 0 THEN c.reltuples / c.relpages"
    " * (pg_relation_size(c.oid) / current_setting('block_size')::int) END)::float8"
)

# Each partition of events in the old layout (a plain table, not the default partition,
# nor one of pg_partman's months: pg_partman goes on from its own), oldest first: its
# name, its lower bound's year and month (NULL: MINVALUE), its upper bound's, whether both
# bounds are firsts of months, its rows as estimated above, and whether it has pages. No
# row is read.
LEGACY_PARTITIONS: Final[TextClause] = text(
    "SELECT c.relname,"
    f" {_UTC_MONTH.format(x='nullif(b.lower, $$-infinity$$)')},"
    f" {_UTC_MONTH.format(x='b.upper')},"
    f" ({_FIRST_OF_MONTH.format(x='b.upper')})"
    f" AND (b.lower = '-infinity' OR {_FIRST_OF_MONTH.format(x='b.lower')}),"
    f" {_ESTIMATE}, pg_relation_size(c.oid) > 0"
    " FROM mnestoma_events_bounds() b JOIN pg_class c ON c.oid = b.part"
    " WHERE c.relkind = 'r' AND b.upper < 'infinity'"
    f" AND c.relname !~ '{PARTMAN_CHILD_NAME}'"  # pg_partman's months are its own
    " ORDER BY b.lower, b.upper"
)
# One partition's rows, estimated as above.
ROWS_ESTIMATE: Final[TextClause] = text(
    f"SELECT {_ESTIMATE} FROM pg_class c WHERE c.oid = to_regclass(:name)"
)
# The default partition of events (a plain table attached as its DEFAULT): its rows as
# estimated above, and whether it has pages (none: it holds no row); no row when events has
# none. No row is read.
DEFAULT_FACTS: Final[TextClause] = text(
    f"SELECT {_ESTIMATE}, pg_relation_size(c.oid) > 0"
    " FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid"
    f" WHERE c.oid = to_regclass('{DEFAULT_NAME}') AND c.relkind = 'r'"
    " AND i.inhparent = to_regclass('events')"
    " AND pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT'"
)
# The months (UTC) of the rows the default partition holds, oldest first: one scan of it,
# once, before its split begins.
DEFAULT_MONTHS: Final[TextClause] = text(
    f"SELECT DISTINCT {_UTC_MONTH.format(x='ts')} FROM {DEFAULT_NAME} ORDER BY 1, 2"
)


def holds_rows(name: str) -> TextClause:
    """Whether a partition holds a row (it reads one at most)."""
    return text(f"SELECT EXISTS (SELECT 1 FROM {old_partition(name)})")


def count_rows(name: str) -> TextClause:
    """How many rows a partition holds (a scan of it)."""
    return text(f"SELECT count(*) FROM {old_partition(name)}")


def oldest_month(name: str) -> TextClause:
    """The year and month of a partition's oldest event (UTC): one scan of it, once, before
    its split begins (``events.ts`` has no index)."""
    return text(f"SELECT {_UTC_MONTH.format(x='min(ts)')} FROM {old_partition(name)}")


def id_range(name: str) -> TextClause:
    """The lowest and highest id of a partition (both ends of its primary key)."""
    return text(f"SELECT min(id), max(id) FROM {old_partition(name)}")


# The definitions of events' own (partitioned) indexes, which the staging table copies so
# that its months' indexes are those ATTACH looks for (none is built by the swap).
EVENTS_INDEXES: Final[TextClause] = text(
    "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i"
    " WHERE i.indrelid = to_regclass('events') ORDER BY i.indexrelid"
)

# Whether the staging table exists, and its comment (what it stages, how far it is copied).
STAGING: Final[TextClause] = text(
    f"SELECT to_regclass('{STAGING_NAME}') IS NOT NULL,"
    f" obj_description(to_regclass('{STAGING_NAME}'), 'pg_class')"
)

# Whether a table holds one of these names (a month's final name is taken).
TAKEN: Final[TextClause] = text(
    "SELECT coalesce(bool_or(to_regclass(n) IS NOT NULL), false)"
    " FROM unnest(CAST(:names AS text[])) AS n"
)

# Whether a table is a partition of events now.
IS_ATTACHED: Final[TextClause] = text(
    "SELECT EXISTS (SELECT 1 FROM pg_inherits"
    " WHERE inhparent = to_regclass('events') AND inhrelid = to_regclass(:name))"
)

# The months of the staging table (not its default leaf), with their bounds.
_STAGED_BOUNDS = (
    " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
    " CROSS JOIN LATERAL (SELECT"
    r" substring(pg_get_expr(c.relpartbound, c.oid) FROM $r$FROM \('([^']*)'\)$r$)::timestamptz"
    " AS lower,"
    r" substring(pg_get_expr(c.relpartbound, c.oid) FROM $r$TO \('([^']*)'\)$r$)::timestamptz"
    " AS upper) b"
    f" WHERE i.inhparent = to_regclass('{STAGING_NAME}')"
    " AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'"
)
# The months of the staging table: each name and its bounds' years and months, oldest first.
STAGING_MONTHS: Final[TextClause] = text(
    "SELECT c.relname,"
    + _UTC_MONTH.format(x="b.lower")
    + ", "
    + _UTC_MONTH.format(x="b.upper")
    + _STAGED_BOUNDS
    + " ORDER BY b.lower"
)


def covered_months(old: str) -> TextClause:
    """The months of the staging table that a partition of events other than ``old``
    covers (a month of the default partition's rows made meanwhile, or retention's
    partition of everything before): their names."""
    return text(
        "SELECT c.relname"
        + _STAGED_BOUNDS
        + " AND EXISTS (SELECT 1 FROM mnestoma_events_bounds() e"
        f"  WHERE e.part <> to_regclass('{old_partition(old)}')"
        "  AND e.lower < b.upper AND b.lower < e.upper)"
        " ORDER BY b.lower"
    )


# The months of the rows the staging table's default leaf caught (rows dated in no month
# staged: a write into the far past while a catch-all is split, a write into a month of no
# partition while the default partition is), oldest first.
STRAY_MONTHS: Final[TextClause] = text(
    f"SELECT DISTINCT {_UTC_MONTH.format(x='ts')} FROM {STAGING_DEFAULT} ORDER BY 1, 2"
)

# Tables of the split that the swap detached from events and that are not dropped yet
# (named ``<name>_dropped``, they carry the mirror trigger; an old partition retention
# detached meanwhile is retention's to drop).
LEFTOVERS: Final[TextClause] = text(
    "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
    f" WHERE t.tgname = '{MIRROR_TRIGGER}' AND c.relname LIKE '%\\_dropped'"
    " AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)"
    " ORDER BY c.relname"
)
# Whether a table still carries the mirror trigger (the function is then kept).
MIRRORS_LEFT: Final[TextClause] = text(
    f"SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = '{MIRROR_TRIGGER}')"
)


def month_objects(name: str) -> TextClause:
    """The tables, indexes and CHECK constraints of a staged month and of its leaves, as
    (kind, table, name) rows, for the renames of the swap."""
    relation = f"to_regclass('{staged(name)}')"
    return text(
        "SELECT 'index', c.relname, ic.relname"
        f" FROM pg_partition_tree({relation}) t JOIN pg_class c ON c.oid = t.relid"
        " JOIN pg_index i ON i.indrelid = t.relid JOIN pg_class ic ON ic.oid = i.indexrelid"
        " UNION ALL SELECT 'check', c.relname, con.conname"
        f" FROM pg_partition_tree({relation}) t JOIN pg_class c ON c.oid = t.relid"
        " JOIN pg_constraint con ON con.conrelid = t.relid AND con.contype = 'c'"
        " UNION ALL SELECT 'table', c.relname, c.relname"
        f" FROM pg_partition_tree({relation}) t JOIN pg_class c ON c.oid = t.relid"
    )


def staged_holds_rows(name: str) -> TextClause:
    """Whether a month of the staging table holds a row (it reads one at most)."""
    return text(f"SELECT EXISTS (SELECT 1 FROM {staged(name)})")


def drop_staged(name: str) -> TextClause:
    """A month of the staging table dropped, its leaves with it."""
    return text(f"DROP TABLE {staged(name)}")


def table_indexes(name: str) -> TextClause:
    """The names of the indexes of one plain table (the old partition, detached)."""
    return text(
        "SELECT ic.relname FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid"
        f" WHERE i.indrelid = to_regclass('{_object(name)}')"
    )


# --- the start: the staging table, its months, the triggers ---------------------------------

# One split at a time: its steps that change what the split is take this lock first (each
# in its own transaction).
SPLIT_LOCK: Final[TextClause] = text("SELECT pg_advisory_xact_lock(hashtext('mnestoma split'))")
LOCAL_LOCK_TIMEOUT: Final[TextClause] = text("SELECT set_config('lock_timeout', :t, true)")


def lock_old(name: str, mode: str) -> TextClause:
    """Hold the old partition in ``mode`` (SHARE: its writers wait; SHARE ROW EXCLUSIVE: the
    same, and one holder at a time)."""
    if mode not in ("SHARE", "SHARE ROW EXCLUSIVE"):
        raise ValueError(f"not a lock the split takes: {mode!r}")
    return text(f"LOCK TABLE {old_partition(name)} IN {mode} MODE")


def create_staging(old: str) -> TextClause:
    """The staging table: the old partition's columns in its order (so that a row of it is a
    row of the staging table as it is), defaults and CHECKs, partitioned by range of ts."""
    return text(
        f"CREATE TABLE {STAGING_NAME} (LIKE {old_partition(old)}"
        " INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (ts)"
    )


_INDEX_HEAD = re.compile(r"^CREATE (UNIQUE )?INDEX \S+ ON ONLY \S+ ")


def staging_index(definition: str) -> TextClause:
    """One of events' indexes (``pg_get_indexdef``), made on the staging table: its months
    get the same, named as PostgreSQL names them under events."""
    if not _INDEX_HEAD.match(definition):
        raise ValueError(f"not an index of events: {definition!r}")
    return text(_INDEX_HEAD.sub(rf"CREATE \1INDEX ON {STAGING_NAME} ", definition, count=1))


# The staging table's default leaf: the rows of a write dated before its first month.
CREATE_STAGING_DEFAULT: Final[TextClause] = text(
    f"CREATE TABLE {STAGING_DEFAULT} PARTITION OF {STAGING_NAME}"
    f" (CONSTRAINT {STAGING_DEFAULT}_pkey PRIMARY KEY (id)) DEFAULT"
)

# A month of the new layout under the staging table (the store's function).
MAKE_MONTH: Final[TextClause] = text(
    f"SELECT mnestoma_events_month(to_regclass('{STAGING_NAME}'), :part,"
    " CAST(:lo AS timestamptz), CAST(:hi AS timestamptz))"
)


def rest_bound(name: str, month: Month) -> TextClause:
    """A CHECK of the month's bounds on its ``_rest`` leaf, so that the attach to events
    reads none of its rows (the ``_created`` leaf has its own); dropped once attached."""
    leaf = f"{staged(name)}_rest"
    lo, hi = _instant(month), _instant(next_month(month))
    return text(f"ALTER TABLE {leaf} ADD CONSTRAINT {leaf}_bound CHECK (ts >= {lo} AND ts < {hi})")


def drop_rest_bound(name: str) -> TextClause:
    leaf = f"{staged(name)}_rest"
    return text(f"ALTER TABLE {leaf} DROP CONSTRAINT {leaf}_bound")


# The function of the triggers that mirror the old partition's writes into the staging
# table, in the writer's transaction: an insert inserts the row, a delete deletes it, an
# update does both, a TRUNCATE empties the staging table.
MIRROR_FUNCTION: Final[TextClause] = text(
    """CREATE OR REPLACE FUNCTION mnestoma_split_mirrored() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE events_split;
        RETURN NULL;
    END IF;
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        DELETE FROM events_split WHERE id = OLD.id AND ts = OLD.ts AND kind = OLD.kind;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO events_split SELECT (NEW).*;
    END IF;
    RETURN NULL;
END
$fn$"""
)
DROP_MIRROR_FUNCTION: Final[TextClause] = text("DROP FUNCTION IF EXISTS mnestoma_split_mirrored()")


def mirror_triggers(old: str) -> tuple[TextClause, ...]:
    """The triggers on the old partition: each row written, deleted or changed, and a
    TRUNCATE, mirrored into the staging table."""
    name = old_partition(old)
    return (
        text(
            f"CREATE TRIGGER {MIRROR_TRIGGER} AFTER INSERT OR UPDATE OR DELETE ON {name}"
            " FOR EACH ROW EXECUTE FUNCTION mnestoma_split_mirrored()"
        ),
        text(
            f"CREATE TRIGGER {MIRROR_TRIGGER}_truncated AFTER TRUNCATE ON {name}"
            " FOR EACH STATEMENT EXECUTE FUNCTION mnestoma_split_mirrored()"
        ),
    )


# What the staging table stages, and how far the copy went, in its comment: durable, and
# written in the transaction of each batch. The ids of the old partition's rows up to
# ``watermark`` that were there when the triggers were made are copied by the batches;
# every write since is mirrored.
COMMENT = re.compile(
    r"^mnestoma split-history of (?P<old>\S+): ids from (?P<first>-?\d+) to"
    r" (?P<watermark>-?\d+), copied to (?P<copied>-?\d+)$"
)


def comment(old: str, first: int, watermark: int, copied: int) -> TextClause:
    note = (
        f"mnestoma split-history of {old_partition(old)}: ids from {int(first)} to"
        f" {int(watermark)}, copied to {int(copied)}"
    )
    return text(f"COMMENT ON TABLE {STAGING_NAME} IS '{note}'")


# --- the batches ----------------------------------------------------------------------------

# The copy's batches (and the comment they write) one at a time, whoever runs them.
LOCK_STAGING: Final[TextClause] = text(f"LOCK TABLE {STAGING_NAME} IN SHARE UPDATE EXCLUSIVE MODE")


def batch_end(old: str) -> TextClause:
    """The highest of the next ``:n`` ids after ``:after`` (up to ``:watermark``) that the
    old partition holds, and how many there are (fewer than ``:n``: the last batch)."""
    return text(
        "SELECT max(id), count(*) FROM (SELECT id FROM"
        f" {old_partition(old)} WHERE id > :after AND id <= :watermark ORDER BY id LIMIT :n) s"
    ).bindparams(
        bindparam("after", type_=BigInteger()),
        bindparam("watermark", type_=BigInteger()),
        bindparam("n", type_=BigInteger()),
    )


def copy_batch(old: str) -> TextClause:
    """The old partition's rows whose ids lie in ``[:first, :last]`` into the staging table,
    but those already there (mirrored, or a batch run before a kill); each row copied is
    locked ``FOR SHARE`` until the batch commits (a delete or update of it waits, then is
    mirrored; inserts are not held up)."""
    return text(
        f"INSERT INTO {STAGING_NAME} SELECT * FROM {old_partition(old)}"
        " WHERE id BETWEEN :first AND :last FOR SHARE ON CONFLICT DO NOTHING"
    ).bindparams(bindparam("first", type_=BigInteger()), bindparam("last", type_=BigInteger()))


# --- the swap ---------------------------------------------------------------------------------

LOCK_EVENTS: Final[TextClause] = text("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
STRAYS_LEFT: Final[TextClause] = text(f"SELECT EXISTS (SELECT 1 FROM {STAGING_DEFAULT})")
DETACH_STAGING_DEFAULT: Final[tuple[TextClause, ...]] = (
    text(f"ALTER TABLE {STAGING_NAME} DETACH PARTITION {STAGING_DEFAULT}"),
    text(f"ALTER TABLE {STAGING_DEFAULT} RENAME TO {STAGING_STRAYS}"),
    text(f"ALTER INDEX {STAGING_DEFAULT}_pkey RENAME TO {STAGING_STRAYS}_pkey"),
    CREATE_STAGING_DEFAULT,
)
MOVE_STRAYS: Final[tuple[TextClause, ...]] = (
    text(f"INSERT INTO {STAGING_NAME} SELECT * FROM {STAGING_STRAYS}"),
    text(f"DROP TABLE {STAGING_STRAYS}"),
)


def detach_old(old: str) -> TextClause:
    return text(f"ALTER TABLE events DETACH PARTITION {old_partition(old)}")


def rename_table(old: str, new: str) -> TextClause:
    return text(f"ALTER TABLE {_object(old)} RENAME TO {_object(new)}")


def rename_index(old: str, new: str) -> TextClause:
    return text(f"ALTER INDEX {_object(old)} RENAME TO {_object(new)}")


def rename_check(table: str, old: str, new: str) -> TextClause:
    return text(f"ALTER TABLE {_object(table)} RENAME CONSTRAINT {_object(old)} TO {_object(new)}")


def detach_staged(name: str) -> TextClause:
    return text(f"ALTER TABLE {STAGING_NAME} DETACH PARTITION {staged(name)}")


def attach_month(name: str, month: Month) -> TextClause:
    """A month (its CHECKs spare the scan of its leaves) attached to events."""
    lo, hi = _instant(month), _instant(next_month(month))
    return text(
        f"ALTER TABLE events ATTACH PARTITION {staged(name)} FOR VALUES FROM ({lo}) TO ({hi})"
    )


DROP_STAGING: Final[TextClause] = text(f"DROP TABLE IF EXISTS {STAGING_NAME}")

# A new empty default partition of events, in place of the one a swap detached: the
# statement that builds a new store's (LAYOUT in mnestoma.schema.sql.partitions); events'
# partitioned indexes give it theirs, named as on a new store.
DEFAULT_DDL: Final[str] = (
    f"CREATE TABLE {DEFAULT_NAME} PARTITION OF events"
    f"\n        (CONSTRAINT {DEFAULT_NAME}_pkey PRIMARY KEY (id)) DEFAULT"
)
CREATE_DEFAULT: Final[TextClause] = text(DEFAULT_DDL)


def dropped_name(old: str) -> str:
    """What the old partition is named once the swap detached it (retention's suffix)."""
    return f"{old_partition(old)}_dropped"


def drop_leftover(name: str) -> TextClause:
    """Drop an old partition the swap detached: its space goes back to the system."""
    if not name.endswith("_dropped"):
        raise ValueError(f"not a table the split detached: {name!r}")
    old_partition(name.removesuffix("_dropped"))
    return text(f"DROP TABLE IF EXISTS {name}")
