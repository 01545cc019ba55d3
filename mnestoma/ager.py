"""The ager: decay, demote, merge, prune and count archive candidates in one transaction."""

from __future__ import annotations

import time
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.sql import Executable

from .errors import translate_errors
from .models import AgerRun
from .rules import ARCHIVE_AFTER_DAYS, AgerReport
from .sql.ager import ager_statements

__all__ = ["run_ager"]

_INSERT_AGER_RUN = AgerRun.__table__.insert()


def _run(conn: Connection, stmt: Executable, params: Any = None) -> Any:
    """Execute on ``conn``, translating driver errors into the package's."""
    with translate_errors():
        return conn.execute(stmt, params) if params is not None else conn.execute(stmt)


def run_ager(conn: Connection, now: datetime) -> AgerReport:
    """Run the ager at ``now`` on ``conn``, whose transaction (holding the write lock) the
    caller owns; set-based SQL, so memory does not grow with the number of rows."""
    started = time.perf_counter()
    dialect = conn.dialect.name
    s = ager_statements(dialect)
    p = {"now": now, "cutoff": now - timedelta(days=ARCHIVE_AFTER_DAYS)}
    if dialect == "postgresql":
        # One lock order with writers: they wait for the ager instead of deadlocking.
        _run(conn, s["lock"])
    _run(conn, s["prune_events"], p)
    pruned = _run(conn, s["prune"], p).rowcount
    _run(conn, s["merge_events_absorbed"], p)
    _run(conn, s["merge_events_target"], p)
    _run(conn, s["merge_update"], p)
    merged = _run(conn, s["merge_delete"], p).rowcount
    _run(conn, s["demote_events"], p)
    demoted = _run(conn, s["demote"], p).rowcount
    decayed_rows = _run(conn, s["decay"], p).rowcount
    archive = _run(conn, s["archive_count"], p).scalar_one()
    report = AgerReport(
        decayed=decayed_rows,
        to_decaying=demoted + merged,
        merged=merged,
        protos_pruned=pruned,
        archive_candidates=int(archive),
    )
    # One row per run, in the run's transaction: it exists exactly when the run commits.
    run = {"ts": now, "duration_s": time.perf_counter() - started, **asdict(report)}
    _run(conn, _INSERT_AGER_RUN, run)
    return report
