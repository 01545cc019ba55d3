"""The ager: decay, demote, merge, prune and count archive candidates in one transaction."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict
from datetime import datetime
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.sql import Executable

from .executor import Executor
from .rules import AgerReport, archive_cutoff
from .sql.ager import ager_statements, cache_size_pragma
from .sql.tables import AGER_RUNS

__all__ = ["AGER_CACHE_KIB", "run_ager"]

_INSERT_AGER_RUN = AGER_RUNS.insert()

# SQLite's page cache during a run, at least (KiB): the demotions rewrite index entries all
# over the edge-key and (state, src) indexes, and the default 2 MB cache would read and
# write a page back for most of them. Bounded: the run's memory does not grow with the rows.
AGER_CACHE_KIB = 64 * 1024


def _run(conn: Connection, stmt: Executable, params: Any = None) -> Any:
    """Execute on ``conn`` through the package's executor (driver errors translated)."""
    return Executor(conn).execute(stmt, params)


def run_ager(conn: Connection, now: datetime) -> AgerReport:
    """Run the ager at ``now`` on ``conn``, whose transaction (holding the write lock) the
    caller owns; set-based SQL, so memory does not grow with the number of rows."""
    started = time.perf_counter()
    p = {"now": now, "cutoff": archive_cutoff(now)}
    if conn.dialect.name == "postgresql":
        report = _run_postgresql(conn, p)
    else:
        with _page_cache(conn, AGER_CACHE_KIB):
            report = _run_sqlite(conn, p)
    # One row per run, in the run's transaction: it exists exactly when the run commits.
    run = {"ts": now, "duration_s": time.perf_counter() - started, **asdict(report)}
    _run(conn, _INSERT_AGER_RUN, run)
    return report


def _run_postgresql(conn: Connection, p: dict[str, Any]) -> AgerReport:
    s = ager_statements("postgresql")
    # One lock order with writers: they wait for the ager instead of deadlocking.
    _run(conn, s["lock"])
    merged = _run(conn, s["merge"], p).rowcount
    pruned = _run(conn, s["prune"], p).rowcount
    decayed = _run(conn, s["decay"], p).rowcount
    demoted = _run(conn, s["demote"], p).rowcount
    archive = _run(conn, s["archive_count"], p).scalar_one()
    return _report(merged, pruned, demoted, decayed, archive)


def _run_sqlite(conn: Connection, p: dict[str, Any]) -> AgerReport:
    s = ager_statements("sqlite")
    _run(conn, s["pairs_create"])
    try:
        merged = 0
        if _run(conn, s["pairs"], p).rowcount:
            _run(conn, s["merge_events"], p)
            _run(conn, s["merge_update"], p)
            merged = _run(conn, s["merge_delete"], p).rowcount
        _run(conn, s["moves_events"], p)
        pruned = _run(conn, s["prune"], p).rowcount
        demoted = _run(conn, s["demote"], p).rowcount
        decayed = _run(conn, s["decay"], p).rowcount
        archive = _run(conn, s["archive_count"], p).scalar_one()
    except BaseException:
        _cleanup(conn, s["pairs_drop"])
        raise
    _run(conn, s["pairs_drop"])
    return _report(merged, pruned, demoted, decayed, archive)


def _report(merged: int, pruned: int, demoted: int, decayed: int, archive: Any) -> AgerReport:
    return AgerReport(
        decayed=decayed,
        to_decaying=demoted + merged,
        merged=merged,
        protos_pruned=pruned,
        archive_candidates=int(archive),
    )


def _cleanup(conn: Connection, stmt: Executable) -> None:
    """Undo the run's temporary state after a failure; a second failure here would only
    hide the first, which is the one the caller needs to see."""
    with suppress(Exception):
        conn.execute(stmt)


@contextmanager
def _page_cache(conn: Connection, at_least_kib: int) -> Iterator[None]:
    """SQLite's page cache at ``at_least_kib`` or more for the block, set back afterwards,
    also on error (``PRAGMA cache_size`` belongs to the connection, not the transaction)."""
    s = ager_statements("sqlite")
    before = int(_run(conn, s["cache_size"]).scalar_one())
    # negative: KiB; positive: pages
    kib = -before if before < 0 else before * int(_run(conn, s["page_size"]).scalar_one()) // 1024
    if kib >= at_least_kib:
        yield
        return
    _run(conn, cache_size_pragma(-at_least_kib))
    try:
        yield
    except BaseException:
        _cleanup(conn, cache_size_pragma(before))
        raise
    _run(conn, cache_size_pragma(before))
