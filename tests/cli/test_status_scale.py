"""A status that does not read every event (contract §12): from ``STATUS_ESTIMATE_FROM``
events, estimates shown as "about N" (PostgreSQL: the catalogue's; SQLite: a sample of the
ids); ``--exact`` counts and says it scans; below it, exact counts as before."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text

from mnestoma import Mnestoma, Passing
from mnestoma.cli import cli
from mnestoma.core.rules import Recorder
from mnestoma.maintenance import status as status_module
from mnestoma.maintenance.status import collect_status, render_status


def _fill(url: str) -> None:
    """40 passings (30 by calls, 10 by the tracer, 8 of them with an outcome) and a query."""
    with Mnestoma(url) as store:
        for i in range(30):
            store.record_passing(f"a{i % 4}", "1", f"b{i % 5}", "1", turn_id=f"t{i}")
        for i in range(10):
            outcome = "ok" if i < 6 else ("error" if i < 8 else None)
            store.record_turn(
                f"u{i}",
                [Passing(f"c{i % 2}", "1", "d", "1", outcome=outcome)],
                recorder=Recorder.TRACER,
            )
        store.log_canonical_query("q", "q")


def _analyse(url: str, *tables: str) -> None:
    """PostgreSQL: gather the statistics of ``tables`` (the events' and the queries' by
    default), from which the catalogue's estimates are read."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        for table in tables or ("events", "canonical_query_log"):
            conn.execute(text(f"ANALYZE {table}"))
    engine.dispose()


def _estimating_sqlite_store(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, fill: Callable[[str], None]
) -> str:
    """The URL of a SQLite store that ``fill`` wrote, whose status estimates from one event."""
    url = f"sqlite:///{tmp_path}/store.sqlite"
    fill(url)
    monkeypatch.setattr(status_module, "STATUS_ESTIMATE_FROM", 1)
    return url


def _status_json(url: str) -> str:
    """What ``mnestoma status --json`` prints for the store at ``url``."""
    return CliRunner().invoke(cli, ["status", "--json", "--database-url", url]).output


def _counts(st: Any) -> tuple[Any, ...]:
    by = st.passings_by_recorder or {}
    return (
        st.events,
        st.events_by_kind,
        st.passings,
        st.passings_with_turn,
        st.query_log,
        {name: (f.passings, f.ok, f.error) for name, f in by.items()},
    )


def test_a_store_below_the_bound_is_counted_exactly_on_both_engines(store_url: str) -> None:
    _fill(store_url)
    if store_url.startswith("postgresql"):
        _analyse(store_url)
    st = collect_status(store_url)
    assert not st.estimated and st.events == 40  # each a passing: created or reinforced
    assert st.passings == 40 and st.events_kept_from is not None
    assert "about" not in render_status(st)


def test_a_large_postgresql_store_reads_its_counts_from_the_catalogue_and_says_about(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(pg_store_url)
    exact = collect_status(pg_store_url, exact=True)
    monkeypatch.setattr(status_module, "STATUS_ESTIMATE_FROM", 1)
    not_analysed = collect_status(pg_store_url)
    assert not not_analysed.estimated  # no statistics yet: counted
    _analyse(pg_store_url)
    st = collect_status(pg_store_url)
    assert st.estimated and not exact.estimated
    # a table this small is sampled whole: the estimates are the counts
    assert _counts(st) == _counts(exact)
    assert st.last_passing == exact.last_passing
    assert st.oldest_event == exact.oldest_event and st.events_kept_from is None
    shown = render_status(st)
    assert f"events     about {exact.events} " in shown
    assert "passings   about 40" in shown and "`mnestoma status --exact` reads" in shown
    assert "about" not in render_status(exact)
    assert "exact: every row read" in render_status(exact)
    result = CliRunner().invoke(cli, ["status", "--exact", "--database-url", pg_store_url])
    assert result.exit_code == 0, result.output
    assert "events     40 " in result.output and "--exact scans" in result.output
    assert '"estimated": true' in _status_json(pg_store_url)


def test_the_estimate_of_a_partitioned_table_sums_its_partitions(pg_store_url: str) -> None:
    engine = create_engine(pg_store_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("DROP TABLE IF EXISTS status_parts"))
        conn.execute(text("CREATE TABLE status_parts (n int) PARTITION BY RANGE (n)"))
        for name, bounds in (("status_low", "(0) TO (100)"), ("status_high", "(100) TO (1000)")):
            conn.execute(
                text(f"CREATE TABLE {name} PARTITION OF status_parts FOR VALUES FROM {bounds}")
            )
        conn.execute(text("INSERT INTO status_parts SELECT g FROM generate_series(1, 250) g"))
        try:
            # one partition analysed (its estimate), the other not yet (counted)
            conn.execute(text("ANALYZE status_low"))
            assert status_module._estimated_rows(conn, "status_parts") == 250
            conn.execute(text("ANALYZE status_high"))
            assert status_module._estimated_rows(conn, "status_parts") == 250
        finally:
            conn.execute(text("DROP TABLE status_parts"))
    engine.dispose()


def test_a_large_sqlite_store_samples_its_events_and_says_about(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/store.sqlite"
    _fill(url)
    exact = collect_status(url, exact=True)
    monkeypatch.setattr(status_module, "STATUS_ESTIMATE_FROM", 1)
    monkeypatch.setattr(status_module, "STATUS_SAMPLED_IDS", 4000)
    st = collect_status(url)
    assert st.estimated and not exact.estimated
    # 4000 ids drawn among 40: each event found about 100 times
    assert abs(st.events - 40) <= 8 and abs(st.passings - 40) <= 8
    assert set(st.automatic) == {"tracer"} and st.last_passing == exact.last_passing
    assert f"events     about {st.events} " in render_status(st)
    result = CliRunner().invoke(cli, ["status", "--exact", "--database-url", url])
    assert "events     40 " in result.output and "--exact scans" in result.output


def test_a_postgresql_store_of_many_edges_reads_its_states_from_the_catalogue(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(pg_store_url)
    with Mnestoma(pg_store_url) as store:
        # two rows: ANALYZE keeps as a common value one it saw more than once
        store.record_proto("a0", "1", "wished")
        store.record_proto("a1", "1", "wished")
    exact = collect_status(pg_store_url, exact=True)
    monkeypatch.setattr(status_module, "STATUS_ESTIMATE_FROM", 1)
    assert not collect_status(pg_store_url).mnests_estimated  # no statistics yet: counted
    _analyse(pg_store_url, "mnests")
    st = collect_status(pg_store_url)
    assert st.mnests_estimated and not exact.mnests_estimated
    # a table this small is sampled whole: the estimates are the counts
    assert st.mnests_by_state == exact.mnests_by_state and st.mnests_by_state["proto"] == 2
    shown = render_status(st)
    assert f"mnests     about {exact.mnests} (active about " in shown
    assert "`mnestoma status --exact` reads every row" in shown
    assert f"mnests     {exact.mnests} (active " in render_status(exact)
    assert '"mnests_estimated": true' in _status_json(pg_store_url)


def test_a_sqlite_store_always_counts_its_edges(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = collect_status(_estimating_sqlite_store(tmp_path, monkeypatch, _fill))
    assert st.estimated and not st.mnests_estimated
    assert "mnests     about" not in render_status(st)


def _chains(url: str) -> None:
    """Three chains: (a, b, c), (b, c, d) and (x, b, c)."""
    with Mnestoma(url) as store:
        store.record_turn("t1", [("a", "1", "b", "1"), ("b", "1", "c", "1"), ("c", "1", "d", "1")])
        store.record_turn("t2", [("x", "1", "b", "1"), ("b", "1", "c", "1")])


def test_a_large_postgresql_store_reads_its_chains_from_the_catalogue(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _chains(pg_store_url)
    monkeypatch.setattr(status_module, "STATUS_ESTIMATE_FROM", 1)
    counted = collect_status(pg_store_url)
    assert (counted.chains, counted.chains_estimated) == (3, False)  # no statistics yet
    _analyse(pg_store_url, "mnest_chains")
    st = collect_status(pg_store_url)
    exact = collect_status(pg_store_url, exact=True)
    # a table this small is sampled whole: the estimate is the count
    assert (st.chains, st.chains_estimated) == (3, True)
    assert (exact.chains, exact.chains_estimated) == (3, False)
    shown = render_status(st)
    assert "chains     about 3 (" in shown and "`mnestoma status --exact` reads" in shown
    assert "chains     3 (" in render_status(exact)
    assert '"chains_estimated": true' in _status_json(pg_store_url)


def test_a_sqlite_store_always_counts_its_chains(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = collect_status(_estimating_sqlite_store(tmp_path, monkeypatch, _chains))
    assert (st.chains, st.chains_estimated) == (3, False)
    assert "chains     3 (" in render_status(st)
