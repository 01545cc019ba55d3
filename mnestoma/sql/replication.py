"""The statements of read replicas (PostgreSQL streaming replication, contract §12), built
once: the primary's WAL position after a commit, and what a standby says of itself."""

from __future__ import annotations

from typing import Final

from sqlalchemy import TextClause, text

__all__ = ["REPLICA_PROBE", "WAL_POSITION"]

# On the primary, after a commit: the WAL position every committed transaction lies behind
# (written, so that a standby streaming it can have replayed it), as text ('0/16B3748').
WAL_POSITION: Final[TextClause] = text("SELECT pg_current_wal_lsn()::text")

# On a server that may be a standby: whether it is one (in recovery), the WAL positions it
# has replayed and received, and its lag in seconds: 0 when it has replayed all it received
# (or receives nothing: just started, or its primary is away), else the time since the
# commit of the last transaction it replayed (NULL when it knows of none).
REPLICA_PROBE: Final[TextClause] = text(
    "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text,"
    " pg_last_wal_receive_lsn()::text,"
    " CASE WHEN pg_last_wal_receive_lsn() IS NULL"
    " OR pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn() THEN 0.0"
    " ELSE extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8"
    " END"
)
