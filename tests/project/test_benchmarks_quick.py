"""The benchmark suite's quick mode keeps working, and its baseline keeps agreeing.

No timing is asserted here: these tests only check that ``python -m benchmarks --quick``
completes and that the package and the hand-written ``sqlite3`` baseline leave the same rows,
weights, events and paths after the same work.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import asdict, replace
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import REPO

ROOT = REPO
if str(ROOT) not in sys.path:  # ``benchmarks`` lives at the top of the checkout
    sys.path.insert(0, str(ROOT))

from conftest import PG_ADMIN_URL, require_postgresql  # noqa: E402

from benchmarks import run as bench  # noqa: E402
from benchmarks import workloads as w  # noqa: E402
from benchmarks.baseline import Baseline  # noqa: E402
from benchmarks.data import NOW, FixedClock, SqliteFiles  # noqa: E402


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory: pytest.TempPathFactory) -> bench.Report:
    """One quick run of every workload on SQLite (package and baseline)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench, "_sync", _no_sync)
        return bench.run(quick=True, workdir=str(tmp_path_factory.mktemp("bench")))


def _no_sync() -> None:
    """Stands in for the flush to disk before each timed ager run: no timing is asserted here,
    and on a busy machine each flush takes a good part of a second."""


@pytest.fixture
def files(tmp_path: Path) -> SqliteFiles:
    """Migrated SQLite files in a temporary folder."""
    return SqliteFiles(tmp_path)


def test_quick_mode_runs_every_workload(quick_report: bench.Report) -> None:
    assert list(dict.fromkeys(r.workload for r in quick_report.results)) == list(bench.WORKLOADS)
    assert [(c["shape"], c["rows"]) for c in quick_report.curve] == [
        (shape, n) for shape in bench.AGER_SHAPES for n in bench.QUICK.ager_sizes
    ]
    for r in quick_report.results:
        if r.workload == "ager_batches":  # the package against itself: default / one batch
            default, one_batch = r.details["seconds"].values()
            assert r.values["package"] and default and one_batch, r
        else:
            assert r.values["package"] and r.values["baseline"], r


def test_package_and_baseline_agree_after_the_same_work(quick_report: bench.Report) -> None:
    disagreements = [f"{c.name}: {c.detail}" for c in quick_report.checks if not c.ok]
    assert disagreements == []
    names = " ".join(c.name for c in quick_report.checks)
    for what in (
        "record_passing",
        "record_turn rows",
        "record_turn into a big",
        "apply_ager",
        "walk",
        "suggest",
    ):
        assert what in names


def test_walk_returns_the_same_number_of_paths_on_both(quick_report: bench.Report) -> None:
    (walk,) = [r for r in quick_report.results if r.workload == "walk"]
    counts = walk.details["paths_per_walk"]
    assert counts["package"] == counts["baseline"]
    # Out-degree 10, depth 3: about 10 + 100 + 1,000 simple paths per walk.
    assert all(1_000 <= n <= 1_110 for n in counts["package"])


def test_concurrent_writers_lose_no_update(quick_report: bench.Report) -> None:
    (writers,) = [r for r in quick_report.results if r.workload == "writers"]
    for impl, outcome in writers.details["outcome"].items():
        assert outcome["failed"] == 0, impl
        assert outcome["lost"] == 0, impl
        for one in outcome["rounds"]:
            assert one["uses"] == 1 + one["calls"], impl


def test_the_writers_rate_is_the_median_of_interleaved_rounds(tmp_path: Path) -> None:
    report = bench.run(quick=True, only=["writers"], rounds=3, workdir=str(tmp_path))
    (writers,) = [r for r in report.results if r.workload == "writers"]
    for impl, outcome in writers.details["outcome"].items():
        rates = sorted(one["calls_per_s"] for one in outcome["rounds"])
        assert len(rates) == 3, impl
        assert writers.values[impl] == outcome["calls_per_s"] == rates[1], impl
    names = [c.name for c in report.checks if c.name.startswith("writers")]
    assert sum("round 3" in n for n in names) == 2  # the package and the baseline


def test_every_target_gets_a_verdict_line(quick_report: bench.Report) -> None:
    text = bench.format_report(quick_report, with_pg=False)
    assert "| target" in text
    for target in (
        "PostgreSQL 8 writers ≥ 1.3 × the psycopg reference",
        "PostgreSQL 8 writers ≥ 1.0 × the lean psycopg loop",
        "PostgreSQL lock hold ≤ 0.7 × the hand-written loop's (server-side)",
    ):
        assert target in text, target
    # 16, and the ager's default run against its one-batch run for each shape (SQLite)
    assert len(quick_report.verdicts) == 16 + len(bench.AGER_SHAPES)


def test_baseline_follows_the_contract_numbers(files: SqliteFiles) -> None:
    path = str(files.clone("empty"))
    clock = FixedClock(NOW)
    base = Baseline(path, clock=clock)
    first = base.record_passing("a", "1", "b", "1")
    second = base.record_passing("a", "1", "b", "1")
    proto = base.record_passing("a", "1", "c", dst_exists=False)
    base.close()
    assert (first[5], first[6]) == (0.30, 1)
    assert (second[5], second[6]) == (pytest.approx(0.45), 2)
    assert (proto[4], proto[11]) == (None, "proto")
    assert second[9] == "2026-06-01 12:00:00.000000"  # naive UTC text, as the package stores


def test_baseline_and_package_age_a_store_alike(files: SqliteFiles) -> None:
    clock = FixedClock(NOW)
    outcome = {}
    for impl in ("package", "baseline"):
        where = str(files.clone("empty"))
        clock.now = NOW
        store = w.open_store(impl, where, clock)
        store.record_passing("a", "1", "b", "1")
        store.record_passing("a", "1", "c", dst_exists=False)
        store.record_turn("t1", [("a", "1", "b", "1"), ("b", "1", "c", "1")])
        store.record_turn("t1", [("a", "1", "b", "1")])  # a retried turn counts once
        clock.now = NOW + timedelta(days=60)
        report = store.apply_ager()
        store.close()
        fields = report if isinstance(report, dict) else w._report_dict(report)
        outcome[impl] = (fields, w.edge_snapshot(impl, where), w.summary(impl, where))
    assert outcome["package"] == outcome["baseline"]
    assert outcome["package"][0]["to_decaying"] == 2  # 0.45 and 0.30, decayed 60 days


def test_the_package_ager_in_batches_or_in_one_transaction_ends_alike(
    files: SqliteFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ager_once`` times the facade's batched run, or with ``one_transaction`` the run in
    a unit of work (``ager_curve --one-transaction``): the same report and end state."""
    import mnestoma
    from benchmarks.data import ager_rows, load_sqlite

    outcome = []
    for one_transaction in (False, True):
        where = str(files.clone("empty"))
        load_sqlite(where, ager_rows(3_000))
        if one_transaction:  # the facade's batched run is not the one timed
            monkeypatch.setattr(mnestoma.Mnestoma, "apply_ager", None)
        got = w.ager_once("package", where, one_transaction=one_transaction)
        outcome.append((got["report"], w.ager_summary("package", where)))
    assert outcome[0] == outcome[1]
    assert outcome[0][0]["to_decaying"] > 0 and outcome[0][0]["merged"] > 0


def test_command_line_quick_subset_exits_zero(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "record_passing,walk",
         "--workdir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "record_passing" in proc.stdout and "walk" in proc.stdout
    assert "consistency checks: " in proc.stdout


def test_unknown_workload_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        bench.run(quick=True, only=["nope"])


@pytest.mark.postgresql
def test_quick_mode_on_postgresql(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_postgresql()  # skips on a machine without a server; fails in CI
    monkeypatch.setattr(bench, "_sync", _no_sync)
    # one store size of each shape (four batches of the ager's first size): agreement with the
    # baseline does not depend on the size, the growth curve is the SQLite run's to show
    smallest = bench.QUICK.ager_sizes[:1]
    monkeypatch.setattr(bench, "QUICK", replace(bench.QUICK, ager_sizes=smallest))
    report = bench.run(
        quick=True,
        postgresql=PG_ADMIN_URL,
        only=["record_passing", "record_turn", "apply_ager", "walk", "writers"],
        workdir=str(tmp_path),
    )
    assert [f"{c.name}: {c.detail}" for c in report.checks if not c.ok] == []
    assert any("package-pg" in c.name for c in report.checks)
    # the ager on PostgreSQL leaves the same rows and events as the sqlite3 baseline, on
    # both data shapes
    for shape in ("mixed store", "mostly-demoting store"):
        assert any(
            c.name.startswith(f"apply_ager {shape}") and "package-pg" in c.name
            for c in report.checks
        ), shape
    (writers,) = [r for r in report.results if r.workload == "writers"]
    for impl in ("package-pg", "baseline-pg", "lean-pg"):
        outcome = writers.details["outcome"][impl]
        assert outcome["lost"] == 0, impl
        assert outcome["failed"] == 0, impl
        # the server marked the grant and the commit of every call of every side, no hold
        # is negative, and the commit mark comes before COMMIT returns to the client
        for one in outcome["rounds"]:
            assert one["server_holds"] == one["return_holds"] == one["calls"], impl
            assert one["server_hold_us"]["p10"] > 0, impl
            assert one["server_hold_us"]["median"] < one["return_hold_us"]["median"], impl
    assert outcome["unmarked_locks"] == 0  # the lean loop marks the lock it takes
    assert "package PostgreSQL / baseline psycopg" in writers.note
    assert "package PostgreSQL / lean psycopg loop" in writers.note
    assert "server-side hold package PostgreSQL / lean psycopg loop" in writers.note
    rates = [v for v in report.verdicts if v.target.startswith("PostgreSQL 8 writers")]
    assert [v.measured.split(";")[1].split(":")[0].strip() for v in rates] == [
        "baseline psycopg",
        "lean psycopg loop",
    ]
    (hold,) = [v for v in report.verdicts if v.target.startswith("PostgreSQL lock hold")]
    assert "lean loop" in hold.measured and "package / reference" in hold.measured


@pytest.mark.postgresql
def test_psycopg_reference_follows_the_contract_numbers(tmp_path: Path) -> None:
    require_postgresql()
    from benchmarks.baseline_pg import PgBaseline
    from benchmarks.data import PostgresServer

    server = PostgresServer(PG_ADMIN_URL)
    try:
        url = server.url(server.clone("empty"))
        clock = FixedClock(NOW)
        ref = PgBaseline(url, clock=clock)
        first = ref.record_passing("a", "1", "b", "1")
        assert ref.record_passing("a", "1", "b", "1") == first
        clock.now = NOW + timedelta(days=10)
        ref.record_passing("a", "1", "b", "1")
        ref.close()
        (row,) = w.edge_snapshot("baseline-pg", url)
        events = w.summary("baseline-pg", url)["events"]
    finally:
        server.close()
    # 0.30, +0.15 → 0.45; ten days at 0.018/day, then +0.15
    assert row[4:6] == ("active", 3)
    assert row[6] == pytest.approx(0.45 * math.exp(-0.018 * 10) + 0.15)
    assert events == {"created": 1, "reinforced": 2}


@pytest.mark.postgresql
def test_lean_loop_follows_the_contract_numbers() -> None:
    require_postgresql()
    from benchmarks import lean_pg
    from benchmarks.data import PostgresServer

    server = PostgresServer(PG_ADMIN_URL)
    try:
        url = server.url(server.clone("empty"))
        lean_pg.create_tables(url)
        clock = FixedClock(NOW)
        loop = lean_pg.LeanLoop(url, clock=clock)
        first = loop.record_passing("a", "1", "b", "1")
        assert loop.record_passing("a", "1", "b", "1") == first
        clock.now = NOW + timedelta(days=10)
        loop.record_passing("a", "1", "b", "1")
        loop.close()
        uses, reinforced = lean_pg.counts(url, ("a", "1", "b", "1"))
        import psycopg

        from benchmarks.baseline_pg import psycopg_conninfo

        with psycopg.connect(psycopg_conninfo(url)) as con:
            weight, ts_last = con.execute("SELECT weight, ts_last FROM lean_edges").fetchone()
            afters = [r[0] for r in con.execute("SELECT weight_after FROM lean_events ORDER BY ts")]
    finally:
        server.close()
    assert (uses, reinforced) == (3, 2)
    # 0.30, +0.15 → 0.45; ten days at 0.018/day, then +0.15
    assert weight == pytest.approx(0.45 * math.exp(-0.018 * 10) + 0.15)
    assert afters == [0.30, pytest.approx(0.45), pytest.approx(weight)]
    assert ts_last == NOW + timedelta(days=10)


@pytest.mark.postgresql
def test_the_server_side_hold_starts_when_the_row_is_granted() -> None:
    """A call that waits for another transaction's row lock: its server-side hold leaves the
    wait out, whether its lock comes from a marked SELECT ... FOR UPDATE (the lean loop) or
    from its UPDATE (the trigger)."""
    require_postgresql()
    import threading
    import time

    import psycopg

    from benchmarks import lean_pg
    from benchmarks.baseline_pg import psycopg_conninfo
    from benchmarks.data import PostgresServer
    from benchmarks.lock_hold import HoldTimes, install_lock_marks

    server = PostgresServer(PG_ADMIN_URL)
    wait = 0.4
    try:
        url = server.url(server.clone("empty"))
        conninfo = psycopg_conninfo(url)
        lean_pg.create_tables(url)
        install_lock_marks(conninfo, lean_pg.EDGES_TABLE)
        loop = lean_pg.LeanLoop(url)
        loop.record_passing("a", "1", "b", "1")
        times = HoldTimes()
        loop.holds = times
        update = psycopg.connect(conninfo)

        def by_update() -> None:
            with update.transaction():
                update.execute("UPDATE lean_edges SET uses = uses + 1")
            times.committed(update.pgconn, time.time())

        for call in (lambda: loop.record_passing("a", "1", "b", "1"), by_update):
            holder = psycopg.connect(conninfo)
            holder.execute("SELECT 1 FROM lean_edges FOR UPDATE")
            released = threading.Timer(wait, holder.commit)
            started = time.perf_counter()
            released.start()
            call()
            took = time.perf_counter() - started
            released.join()
            holder.close()
            assert took >= wait
        loop.close()
        update.close()
    finally:
        server.close()
    assert len(times.server_holds) == 2
    assert all(0 < h < wait / 2 for h in times.server_holds), times.server_holds
    assert len(times.holds) == 1  # the client-side figure: the lean loop's select only


@pytest.mark.postgresql
def test_the_server_side_hold_ends_at_the_commit_on_the_server() -> None:
    """The server-side hold counts the work done under the lock up to ``COMMIT`` (a sleep on
    the server before it), not the client's time after ``COMMIT`` returned (a sleep on the
    client before it reads the marks); the return figure counts both. A transaction that
    commits with its statement in one pipeline, as the package sends it, is marked too."""
    require_postgresql()
    import time

    import psycopg

    from benchmarks import lean_pg
    from benchmarks.baseline_pg import psycopg_conninfo
    from benchmarks.data import PostgresServer
    from benchmarks.lock_hold import HoldTimes, install_lock_marks

    server = PostgresServer(PG_ADMIN_URL)
    under_lock, after_commit = 0.3, 0.5
    times = HoldTimes()
    try:
        url = server.url(server.clone("empty"))
        conninfo = psycopg_conninfo(url)
        lean_pg.create_tables(url)
        install_lock_marks(conninfo, lean_pg.EDGES_TABLE)
        lean_pg.LeanLoop(url).record_passing("a", "1", "b", "1")
        with psycopg.connect(conninfo) as con:
            with con.transaction():
                con.execute("UPDATE lean_edges SET uses = uses + 1")
                con.execute("SELECT pg_sleep(%s)", (under_lock,))
            time.sleep(after_commit)
            times.committed(con.pgconn, time.time())
            con.autocommit = True
            with con.pipeline():
                con.execute("BEGIN")
                con.execute(
                    "WITH r AS (UPDATE lean_edges SET uses = uses + 1 RETURNING id)"
                    " INSERT INTO lean_events (edge_id, ts, weight_after)"
                    " SELECT id, now(), 0.3 FROM r"
                )
                con.execute("COMMIT")
            times.committed(con.pgconn, time.time())
    finally:
        server.close()
    assert len(times.server_holds) == len(times.return_holds) == 2
    slept, pipelined = times.server_holds
    assert under_lock <= slept < under_lock + after_commit / 2
    assert times.return_holds[0] >= under_lock + after_commit
    assert 0 < pipelined < under_lock


def test_quick_report_is_written_as_json_with_every_workload(
    quick_report: bench.Report,
) -> None:
    written = json.loads(json.dumps(bench._json_ready(asdict(quick_report)), default=str))
    assert [r["workload"] for r in written["results"]] == [r.workload for r in quick_report.results]
    assert all(isinstance(k, str) for r in written["results"] for k in r["details"])
