"""The ager's merge costs the same whatever the plan: linear on a PostgreSQL database without
statistics."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from conftest import mnest_row
from sqlalchemy import insert, text

import mnestoma
from mnestoma import Mnestoma
from mnestoma.schema.models import Mnest

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _plan_work(node: dict) -> int:
    """Rows a plan node and its children produced or threw away, times their loops: the work
    an EXPLAIN ANALYZE plan did, independent of the machine's speed."""
    rows = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
    rows += node.get("Rows Removed by Join Filter", 0) + node.get(
        "Rows Removed by Index Recheck", 0
    )
    own = int(rows * node.get("Actual Loops", 1))
    return own + sum(_plan_work(child) for child in node.get("Plans", []))


@pytest.mark.parametrize("hub_side", ["src", "dst"])
def test_the_merge_of_a_hub_is_linear_on_a_database_without_statistics(
    pg_empty_db_url: str, hub_side: str
) -> None:
    """One executor with 2,000 active rows below 0.20 (as their source, or as their
    destination), each with a decaying twin, loaded after the last ANALYZE: a plan that
    reached one side through the (state, src) or the dst_executor index read every twin of
    the hub for each row (quadratic, millions of rows); the merge statement does a bounded
    amount of work per row, and merges every pair."""
    from mnestoma.schema.sql import ager as stm

    hub = 2_000

    def ends(i: int) -> dict[str, str]:
        if hub_side == "src":
            return {"src_executor": "hub", "dst_executor": f"d{i}"}
        return {"src_executor": f"s{i}", "dst_executor": "hub"}

    mnestoma.upgrade(pg_empty_db_url)
    with Mnestoma(pg_empty_db_url) as store:
        with store.engine.begin() as conn:
            # no ANALYZE behind the test's back: on mnests, and on every table that holds
            # events (their partitions: a partitioned table keeps no storage parameters)
            tables = conn.execute(
                text(
                    "SELECT relid::regclass::text"
                    " FROM unnest(ARRAY['mnests', 'events']::regclass[]) t,"
                    " pg_partition_tree(t) WHERE isleaf"
                )
            ).scalars()
            for table in tables:
                conn.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = false)"))
            conn.execute(text("SELECT pg_stat_reset()"))
            conn.execute(
                insert(Mnest.__table__),
                [
                    mnest_row(T0, **ends(i), weight=0.1, state=state)
                    for i in range(hub)
                    for state in ("active", "decaying")
                ],
            )
        with store.engine.connect() as conn:
            # the rows came after the last ANALYZE (upgrade's, on empty tables): no column
            # statistics, as after a bulk load or a copy
            column_stats = "SELECT count(*) FROM pg_stats WHERE tablename = 'mnests'"
            assert conn.execute(text(column_stats)).scalar_one() == 0
            changes = stm.postgresql_ager_statements().changes
            [merge] = [c.statement for c in changes if c.name == "merge"]
            params = {"now": T0 + timedelta(days=1), "cutoff": T0 - timedelta(days=89)}
            compiled = merge.compile(dialect=conn.dialect)
            plan = conn.exec_driver_sql(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + compiled.string,
                {**compiled.params, **params},
            ).scalar_one()
            work = _plan_work(plan[0]["Plan"])
            left = conn.execute(text("SELECT state, count(*) FROM mnests GROUP BY state")).all()
            merged = conn.execute(text("SELECT count(*) FROM events WHERE kind = 'merged'"))
            merged_events = merged.scalar_one()
            conn.rollback()
    assert dict(left) == {"decaying": hub}  # the statement did merge every pair
    assert merged_events == 2 * hub
    assert work < 20 * 2 * hub, work  # quadratic: ~hub² = 4,000,000
