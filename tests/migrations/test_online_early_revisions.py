"""Revisions 0003–0006 on a live PostgreSQL store: each CHECK is added ``NOT VALID`` and
validated in a transaction of its own, each index built and dropped ``CONCURRENTLY``, so the
writers of the release before go on; the schema after each revision is the one a single
transaction builds (a connection handed over, and the ``db sql`` script run with psql), and a
revision stopped halfway (an invalid index left by a failed build) is completed by the next.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import create_pg_database, drop_pg_database
from sqlalchemy import Connection, Engine, event, text
from sqlalchemy.engine import URL
from test_live_upgrade import Writers

import mnestoma
from mnestoma.engines import make_engine
from mnestoma.maintenance.migration import current_revision, offline_sql

EARLY = ("0003", "0004", "0005", "0006")
TIMEOUT = 0.5  # seconds a statement waits for a lock in these tests


@pytest.fixture
def databases() -> Iterator[list[URL]]:
    """Three brand-new empty PostgreSQL databases."""
    urls = [create_pg_database("mnestoma_early") for _ in range(3)]
    try:
        yield urls
    finally:
        for url in urls:
            drop_pg_database(url, later=True)


def _libpq(url: URL) -> str:
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def schema_dump(url: URL) -> str:
    """``pg_dump --schema-only`` of the database, its per-run restrict key left out."""
    done = subprocess.run(
        ["pg_dump", "--schema-only", "--no-owner", _libpq(url)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return "\n".join(
        line for line in done.stdout.splitlines() if not re.match(r"\\(un)?restrict ", line)
    )


def _psql(url: URL, sql: str) -> None:
    done = subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", _libpq(url)],
        input=sql, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def seed_at_0002(engine: Engine, mnests: int, events_each: int) -> None:
    """Rows and events as a release at revision 0002 writes them."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO mnests (id, src_executor, src_version, dst_executor, dst_version,"
                " weight, uses, ts_first, ts_last, ts_weight, state) SELECT"
                " 'mn_early' || lpad(g::text, 10, '0'), 'src' || (g % 97), '1', 'dst' || g,"
                " '1', 0.3, 1, now(), now(), now(), CASE WHEN g % 3 = 0 THEN 'decaying'"
                " ELSE 'active' END FROM generate_series(1, :n) g"
            ),
            {"n": mnests},
        )
        conn.execute(
            text(
                "INSERT INTO events (mnest_id, kind, ts, turn_id, weight_before, weight_after,"
                " state_before, state_after) SELECT 'mn_early' || lpad((g % :n + 1)::text,"
                " 10, '0'), 'reinforced', now(), CASE WHEN g % 2 = 0 THEN 't' || g END,"
                " 0.3, 0.3, 'active', 'active' FROM generate_series(1, :e) g"
            ),
            {"n": mnests, "e": mnests * events_each},
        )


def test_each_early_revision_online_builds_the_schema_one_transaction_and_the_script_build(
    databases: list[URL],
) -> None:
    """After each of 0003–0006: the online upgrade (a transaction a revision, CONCURRENTLY,
    NOT VALID then VALIDATE), the upgrade in a connection handed over (one transaction:
    the statements these revisions always ran) and the ``db sql`` script run with psql
    dump the same schema."""
    online, handed, script = databases
    engines = [make_engine(u) for u in (online, handed)]
    try:
        for engine in engines:
            mnestoma.upgrade(engine, "0002")
        _psql(script, offline_sql("postgresql://", "base:0002"))
        for engine in engines:
            seed_at_0002(engine, 50, 4)
        before = "0002"
        for rev in EARLY:
            mnestoma.upgrade(engines[0], rev)
            with engines[1].connect() as conn:
                mnestoma.upgrade(conn, rev)
                conn.commit()
            _psql(script, offline_sql("postgresql://", f"{before}:{rev}"))
            before = rev
            dumped = schema_dump(online)
            assert dumped == schema_dump(handed), f"online and handed differ after {rev}"
            assert dumped == schema_dump(script), f"online and the script differ after {rev}"
        assert "NOT VALID" not in dumped
    finally:
        for engine in engines:
            engine.dispose()


class Noted:
    """Every statement an engine sent, as text on one line, its comments left out."""

    def __init__(self, engine: Engine) -> None:
        self.statements: list[str] = []

        @event.listens_for(engine, "before_cursor_execute")
        def note(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
            lines = [x for x in statement.splitlines() if not x.lstrip().startswith("--")]
            self.statements.append(" ".join(" ".join(lines).split()))


def test_the_early_revisions_take_no_lock_that_holds_writers_for_a_scan_or_a_build(
    pg_empty_db_url: str,
) -> None:
    """What made 0003–0006 hold writers for the length of the table: a CHECK added (or
    validated) under ACCESS EXCLUSIVE, an index built or dropped without CONCURRENTLY."""
    engine = make_engine(pg_empty_db_url)
    try:
        mnestoma.upgrade(engine, "0002")
        noted = Noted(engine)
        mnestoma.upgrade(engine, "0006")
    finally:
        engine.dispose()
    ddl = [s for s in noted.statements if re.match(r"(ALTER|CREATE|DROP) (TABLE|INDEX)", s)]
    checks = [s for s in ddl if "ADD CONSTRAINT" in s and "CHECK" in s]
    assert len(checks) == 2 and all(s.endswith("NOT VALID") for s in checks), checks
    assert sum("VALIDATE CONSTRAINT" in s for s in ddl) == 2
    for s in ddl:
        if re.match(r"(CREATE|DROP) INDEX", s) and "ager_runs" not in s:
            assert "CONCURRENTLY" in s, s


class OldWriters(Writers):
    """Threads writing as a release at 0002 did (a reinforcement and its event, one
    transaction each) until stopped; the longest write and any error are kept."""

    def __init__(self, engine: Engine, count: int, mnests: int) -> None:
        self.engine = engine
        self.mnests = mnests
        self._next = [i * 7919 for i in range(count)]  # each thread's own run of rows
        super().__init__(self._write_next, count, settle=0.0)

    def _write_next(self, i: int) -> None:
        self.write_row(self._next[i])
        self._next[i] += 1

    def write_row(self, n: int) -> None:
        mid = f"mn_early{n % self.mnests + 1:010d}"
        with self.engine.begin() as conn:
            now = datetime.now(UTC)
            conn.execute(
                text("UPDATE mnests SET uses = uses + 1, ts_last = :now WHERE id = :id"),
                {"id": mid, "now": now},
            )
            conn.execute(
                text(
                    "INSERT INTO events (mnest_id, kind, ts, turn_id, weight_before,"
                    " weight_after, state_before, state_after) VALUES (:id, 'reinforced',"
                    " :now, :turn, 0.3, 0.3, 'active', 'active')"
                ),
                {"id": mid, "now": now, "turn": f"w{time.monotonic_ns()}"},
            )


# The statements of 0003 and 0005 that read all of ``events``: the CHECK's scan (its
# validation; before, its addition), the turn index's build.
LONG_ON_EVENTS = re.compile(
    r"(VALIDATE|ADD) CONSTRAINT ck_events_recorder_known"
    r"|CREATE INDEX (CONCURRENTLY )?(IF NOT EXISTS )?ix_events_turn_id"
)


def test_writers_of_0002_go_on_while_a_large_store_goes_from_0002_to_0006(
    pg_empty_db_url: str,
) -> None:
    """While 0003 validates its CHECK over 400,000 events and 0005 builds its index of
    them, the writers of the release at 0002 keep writing: writes complete during each of
    those statements, none fails, and none waits for more than about a lock timeout."""
    engine = make_engine(pg_empty_db_url, pool_size=8)
    try:
        mnestoma.upgrade(engine, "0002")
        seed_at_0002(engine, 20_000, 20)
        with engine.begin() as conn:
            conn.execute(text("ANALYZE mnests, events"))
        during: dict[str, int] = {}
        with OldWriters(engine, 3, 20_000) as writers:

            @event.listens_for(engine, "before_cursor_execute")
            def started(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
                if LONG_ON_EVENTS.search(statement) and "NOT VALID" not in statement:
                    conn.info["writes_before"] = writers.writes

            @event.listens_for(engine, "after_cursor_execute")
            def ended(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
                if "writes_before" in conn.info:
                    during[statement] = writers.writes - conn.info.pop("writes_before")

            time.sleep(0.2)
            mnestoma.upgrade(engine, "0006", lock_timeout=TIMEOUT)
            time.sleep(0.2)
        assert current_revision(engine) == "0006"
        assert writers.errors == []
        assert len(during) == 2 and all(n >= 3 for n in during.values()), during
        assert writers.longest < TIMEOUT + 0.75, writers.longest
    finally:
        engine.dispose()


def _index_state(engine: Engine, name: str) -> tuple[bool, bool] | None:
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT indisvalid, indpred IS NOT NULL FROM pg_index"
                " WHERE indexrelid = to_regclass(:n)"
            ),
            {"n": name},
        ).first()
    return None if row is None else (bool(row[0]), bool(row[1]))


# A concurrent build that fails (here, a unique index over duplicates) leaves its index
# behind, INVALID, under the name the revision builds.
HALF_BUILT = {
    "0005": "CREATE UNIQUE INDEX CONCURRENTLY ix_events_turn_id_partial ON events (kind)",
    "0006": "CREATE UNIQUE INDEX CONCURRENTLY ix_mnests_active_src ON mnests (state)",
}
BUILT = {"0005": "ix_events_turn_id", "0006": "ix_mnests_active_src"}


@pytest.mark.parametrize("rev", sorted(HALF_BUILT))
def test_a_revision_whose_concurrent_build_failed_halfway_drops_the_invalid_index_and_completes(
    databases: list[URL], rev: str
) -> None:
    stopped, clean = databases[0], databases[1]
    engines = [make_engine(u) for u in (stopped, clean)]
    try:
        before = "0004" if rev == "0005" else "0005"
        for engine in engines:
            mnestoma.upgrade(engine, before)
        seed = make_engine(stopped, isolation_level="AUTOCOMMIT")
        try:
            with seed.connect() as conn:
                conn.execute(
                    text(
                        "INSERT INTO mnests (id, src_executor, src_version, dst_executor,"
                        " dst_version, weight, uses, ts_first, ts_last, ts_weight, state)"
                        " SELECT 'mn_half' || lpad(g::text, 10, '0'), 's' || g, '1', 'd', '1',"
                        " 0.3, 1, now(), now(), now(), 'active' FROM generate_series(1, 3) g"
                    )
                )
                conn.execute(
                    text(
                        "INSERT INTO events (mnest_id, kind, ts) SELECT 'mn_half' ||"
                        " lpad(g::text, 10, '0'), 'created', now() FROM generate_series(1, 3) g"
                    )
                )
                with pytest.raises(Exception, match="could not create unique index"):
                    conn.execute(text(HALF_BUILT[rev]))
                conn.execute(text("DELETE FROM events"))
                conn.execute(text("DELETE FROM mnests"))
        finally:
            seed.dispose()
        left = "ix_events_turn_id_partial" if rev == "0005" else BUILT[rev]
        assert _index_state(engines[0], left) == (False, False)  # INVALID, not partial
        for engine in engines:
            mnestoma.upgrade(engine, rev)
        assert current_revision(engines[0]) == rev
        assert _index_state(engines[0], BUILT[rev]) == (True, True)
        assert _index_state(engines[0], "ix_events_turn_id_partial") is None
        assert schema_dump(stopped) == schema_dump(clean)
    finally:
        for engine in engines:
            engine.dispose()


class Stopped(Exception):
    """The upgrade was interrupted here (as a kill or a dropped connection would)."""


@pytest.mark.parametrize(
    ("rev", "pattern"),
    [
        ("0003", r"VALIDATE CONSTRAINT ck_events_recorder_known"),
        ("0003", r"UPDATE mnestoma_alembic_version"),
        ("0004", r"UPDATE mnests SET decay_lambda"),
        ("0004", r"VALIDATE CONSTRAINT"),
        ("0005", r"DROP INDEX CONCURRENTLY IF EXISTS ix_events_turn_id$"),
        ("0005", r"ALTER INDEX"),
        ("0005", r"UPDATE mnestoma_alembic_version"),
        ("0006", r"DROP INDEX CONCURRENTLY IF EXISTS ix_mnests_state_src"),
        ("0006", r"UPDATE mnestoma_alembic_version"),
    ],
)
def test_an_early_revision_stopped_after_its_first_step_is_completed_by_the_next_upgrade(
    databases: list[URL], rev: str, pattern: str
) -> None:
    stopped, clean = databases[0], databases[1]
    engines = [make_engine(u) for u in (stopped, clean)]
    try:
        before = f"{int(rev) - 1:04d}"
        for engine in engines:
            mnestoma.upgrade(engine, before)
        fired: list[str] = []

        @event.listens_for(engines[0], "before_cursor_execute")
        def stop(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
            if not fired and re.search(pattern, statement.strip()):
                fired.append(statement)
                raise Stopped(statement)

        with pytest.raises(Stopped):
            mnestoma.upgrade(engines[0], rev)
        assert current_revision(engines[0]) == before
        for engine in engines:
            mnestoma.upgrade(engine, rev)
        assert current_revision(engines[0]) == rev
        assert schema_dump(stopped) == schema_dump(clean)
    finally:
        for engine in engines:
            engine.dispose()
