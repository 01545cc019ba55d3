"""pg_partman (contract §12): the statements that ask whether the extension manages the
months of ``events`` (its ``part_config`` row for the table, in whatever schema the extension
is installed), and the names of the tables it makes beside the store's.

Both statements are catalogue and configuration reads that fail on no database: where the
extension is absent the first returns no row, and the second is only run on a schema the
role may read (the first says so).
"""

from __future__ import annotations

import functools
import re
from typing import Final

from sqlalchemy import TextClause, text

__all__ = [
    "PARTMAN_CHILD_NAME",
    "PARTMAN_NAME",
    "PARTMAN_SCHEMA",
    "is_partman_name",
    "part_config_of",
]

# The schema pg_partman is installed in, and whether this role may read its part_config
# (USAGE on the schema, SELECT on the table; asked by oid, so that a schema the role may not
# use is no error). No row: the extension is not installed in this database.
PARTMAN_SCHEMA: Final[TextClause] = text(
    "SELECT n.nspname, has_schema_privilege(n.oid, 'USAGE') AND has_table_privilege(c.oid,"
    " 'SELECT') FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
    " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = 'part_config'"
    " WHERE e.extname = 'pg_partman'"
)

# Whether a retention is set (pg_partman drops the old months), from the row of the events
# this connection sees ('schema.events', as create_parent stores it); no row: pg_partman
# does not manage events (or is undoing its partitioning).
_PART_CONFIG = (
    "SELECT p.retention IS NOT NULL FROM {schema}.part_config p"
    " WHERE p.parent_table = (SELECT n.nspname || '.' || c.relname FROM pg_class c"
    " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass('events'))"
    " AND NOT p.undo_in_progress"
)


def _quoted(name: str) -> str:
    """``name`` as a PostgreSQL identifier, double-quoted."""
    return '"' + name.replace('"', '""') + '"'


@functools.cache
def part_config_of(schema: str) -> TextClause:
    """The read of events' row in ``schema``'s ``part_config`` (one statement object per
    schema, so that the statement caches keep it)."""
    return text(_PART_CONFIG.format(schema=_quoted(schema)))


# The months pg_partman makes under events, named by its monthly datetime_string YYYY_MM
# after the prefix _p (events_p2027_05; five digits of year from 10000 on), whether
# attached or left detached by its retention: plain tables, which retention drops by its
# copying path, as the partitions made before 0015; the template table that gives them their
# primary key (its own default name template_<schema>_events, or events_template beside
# events, as the operations guide creates it).
PARTMAN_CHILD_NAME = r"^events_p[0-9]{4,5}_(0[1-9]|1[0-2])$"
PARTMAN_NAME = rf"{PARTMAN_CHILD_NAME}|^events_template$|^template_[a-z0-9_]+_events$"
_PARTMAN = re.compile(PARTMAN_NAME)


def is_partman_name(name: str) -> bool:
    """True for a table pg_partman makes for the store's events: a month or its template."""
    return bool(_PARTMAN.match(name))
