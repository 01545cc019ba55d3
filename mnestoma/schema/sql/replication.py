"""The statements of read replicas (PostgreSQL streaming replication, contract §12), built
once: the primary's WAL position after a commit, what a standby says of itself, and which
cluster and database a server is."""

from __future__ import annotations

from typing import Final

from sqlalchemy import TextClause, text

__all__ = [
    "IDENTITY",
    "REPLICA_POSITION",
    "REPLICA_PROBE",
    "REPLICA_STATUS",
    "SERVER_POSITION",
    "WAL_POSITION",
]

# On the primary: the WAL position every committed transaction lies behind (written, so
# that a standby streaming it can have replayed it), as text ('0/16B3748'). Read after a
# commit (read-your-writes) and, every so often, before a replica's replayed position (its
# lag is measured against it).
WAL_POSITION: Final[TextClause] = text("SELECT pg_current_wal_lsn()::text")

# The WAL position a server's replicas are measured against (the status): a primary's
# current position, a standby's replayed one (the status of a standby, given replicas).
SERVER_POSITION: Final[TextClause] = text(
    "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()"
    " ELSE pg_current_wal_lsn() END)::text"
)

# On a server that may be a standby, before a read goes to it: whether it is one (in
# recovery), and the WAL position it has replayed.
REPLICA_POSITION: Final[TextClause] = text(
    "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text"
)

# Which cluster and database a server is: its system identifier (a primary's and every
# standby's made from it are the same) and the connection's database.
IDENTITY: Final[TextClause] = text(
    "SELECT system_identifier::text, current_database() FROM pg_control_system()"
)

# On a server that may be a standby, what it says of itself: whether it is one (in
# recovery), the WAL positions it has replayed and received, and its own measure of its
# lag in seconds: 0 when it has replayed all it received (or receives nothing: just started,
# or cut off from its primary), else the time since the commit of the last transaction it
# replayed (NULL when it knows of none). It knows nothing of what its primary wrote since:
# the routing and the status measure a replica's lag against the primary's WAL_POSITION.
REPLICA_PROBE: Final[TextClause] = text(
    "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text,"
    " pg_last_wal_receive_lsn()::text,"
    " CASE WHEN pg_last_wal_receive_lsn() IS NULL"
    " OR pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn() THEN 0.0"
    " ELSE extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8"
    " END"
)

# On a standby, for the status: whether it is one, the WAL position it has replayed, the
# seconds since the commit of the last transaction it replayed (NULL when it knows of none),
# and whether a WAL receiver streams to it from a primary (a row of pg_stat_wal_receiver,
# whose status only roles with pg_read_all_stats see: NULL for the others).
REPLICA_STATUS: Final[TextClause] = text(
    "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text,"
    " extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8,"
    " EXISTS (SELECT 1 FROM pg_stat_wal_receiver"
    " WHERE status IS NULL OR status = 'streaming')"
)
