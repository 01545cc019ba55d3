"""Two upgrades of one database started together: the migration lock serialises them, and
each reports what it applied itself. The one that waited found the database at head once it
held the lock, and says so ("already at revision ..."), not the revisions the other applied.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import NullPool, create_engine, text
from sqlalchemy.engine import make_url

import mnestoma
from mnestoma.core.redaction import redact_url
from mnestoma.engines.locking import MIGRATION_LOCK_KEY, waiting_file

HEAD = mnestoma.head_revision()
START = "0002"
WAIT_S = 90.0

# The programmatic door, in a process of its own: its report on one line.
API_CODE = (
    "import sys, mnestoma\n"
    "r = mnestoma.upgrade(sys.argv[1])\n"
    "print(r.before, r.after, ','.join(r.applied) or '-')\n"
)


def _start(door: str, url: str) -> subprocess.Popen[str]:
    if door == "cli":
        args = [sys.executable, "-m", "mnestoma", "db", "upgrade", "--database-url", url]
    else:
        args = [sys.executable, "-c", API_CODE, url]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _flock_holders(path: str) -> set[str]:
    """The processes holding a ``flock`` on ``path`` (Linux's /proc/locks)."""
    inode = os.stat(path).st_ino
    holders = set()
    with open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()
            if "FLOCK" in fields and fields[-3].rsplit(":", 1)[-1] == str(inode):
                holders.add(fields[-4])
    return holders


@contextmanager
def _migration_lock_held(url: str, procs: list[subprocess.Popen[str]]) -> Iterator[None]:
    """Hold the lock a migration takes until every process of ``procs`` waits for it."""
    pids = {str(p.pid) for p in procs}
    if make_url(url).get_backend_name() == "sqlite":
        if not os.path.exists("/proc/locks"):
            pytest.skip("needs /proc/locks to see the waiting writers")
        holder = sqlite3.connect(make_url(url).database or "", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        lock_file = waiting_file(make_url(url))
        assert lock_file is not None
        yield
        # each waiting write holds a shared flock on the writers' file while it waits
        _wait_for(
            lambda: os.path.exists(lock_file) and pids <= _flock_holders(lock_file),
            "both upgrades to wait for the write lock",
        )
        holder.rollback()
        holder.close()
        return
    engine = create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as holder:
            holder.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            yield
            # a waiting migrator asks for the lock and rolls back, again and again: its
            # session's last statement is one of the two, its state_change moves on
            asking = text(
                "SELECT pid, state_change FROM pg_stat_activity WHERE datname = :db "
                "AND pid <> pg_backend_pid() "
                "AND (query = 'ROLLBACK' OR query LIKE '%pg_try_advisory_lock%')"
            )
            seen: dict[int, object] = {}
            polling: set[int] = set()

            def both_polling() -> bool:
                for pid, changed in holder.execute(asking, {"db": make_url(url).database}):
                    if pid in seen and seen[pid] != changed:
                        polling.add(pid)
                    seen[pid] = changed
                return len(polling) >= 2

            _wait_for(both_polling, "both upgrades to wait for the migration lock")
            holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
    finally:
        engine.dispose()


@pytest.mark.parametrize("door", ["cli", "api"])
def test_two_upgrades_at_once_each_report_what_they_applied(empty_db_url: str, door: str) -> None:
    mnestoma.upgrade(empty_db_url, START)
    procs: list[subprocess.Popen[str]] = []
    try:
        with _migration_lock_held(empty_db_url, procs):
            procs += [_start(door, empty_db_url), _start(door, empty_db_url)]
        outs = [p.communicate(timeout=WAIT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert mnestoma.current_revision(empty_db_url) == HEAD
    lines = sorted(out.strip() for out, _err in outs)
    if door == "cli":
        where = redact_url(mnestoma.resolve_database_url(empty_db_url))
        assert lines == [
            f"{where}: already at revision {HEAD} (head)",
            f"{where}: upgraded from {START} to {HEAD} (head)",
        ], outs
        # the revisions named on stderr are those of the one that applied them
        named = sorted(err.count("Running upgrade") for _out, err in outs)
        assert named == [0, int(HEAD) - int(START)], outs
    else:
        applied = ",".join(f"{n:04d}" for n in range(int(START) + 1, int(HEAD) + 1))
        assert lines == sorted([f"{HEAD} {HEAD} -", f"{START} {HEAD} {applied}"]), outs


def test_an_upgrade_reports_the_revisions_it_applied_oldest_first(empty_db_url: str) -> None:
    first = mnestoma.upgrade(empty_db_url, START)
    assert (first.before, first.after, first.applied) == (None, START, ("0001", START))
    rest = mnestoma.upgrade(empty_db_url)
    assert (rest.before, rest.after) == (START, HEAD) and rest.moved
    assert rest.applied == tuple(f"{n:04d}" for n in range(int(START) + 1, int(HEAD) + 1))
    again = mnestoma.upgrade(empty_db_url)
    assert (again.before, again.after, again.applied, again.moved) == (HEAD, HEAD, (), False)
    down = mnestoma.downgrade(empty_db_url, "0001")
    assert (down.before, down.after) == (HEAD, "0001")
    assert down.applied == tuple(f"{n:04d}" for n in range(int(HEAD), 1, -1))


def test_an_upgrade_on_a_callers_connection_reports_what_it_applied(
    empty_db_url: str, tmp_path: Path
) -> None:
    engine = mnestoma.make_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            report = mnestoma.upgrade(conn, START)
        assert (report.before, report.after, report.applied) == (None, START, ("0001", START))
    finally:
        engine.dispose()
