"""Alembic is the schema's only source of truth: one head, round trips, models == migrations."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from alembic.script import ScriptDirectory
from conftest import package_engine
from schema_kit import built_then_migrated, schema_diff
from sqlalchemy import exc as sa_exc
from sqlalchemy import inspect, text

import mnestoma
from mnestoma.engines import make_engine
from mnestoma.maintenance.migration import (
    alembic_config,
    current_revision,
    head_revision,
    offline_sql,
)
from mnestoma.schema.models import VIEW_NAME, Base

EXPECTED_TABLES = {
    "mnests",
    "events",
    "canonical_query_log",
    "ager_runs",
    "mnestoma_alembic_version",
}


def _diff(url: str) -> list:
    with package_engine(url) as engine, engine.connect() as conn:
        return schema_diff(conn)


def test_the_scripts_have_exactly_one_head() -> None:
    script = ScriptDirectory.from_config(alembic_config())
    assert script.get_heads() == [head_revision()]
    assert head_revision() == "0016"


def test_revisions_tell_the_story_in_order() -> None:
    script = ScriptDirectory.from_config(alembic_config())
    chain = [rev.revision for rev in script.walk_revisions()]
    assert chain == [
        "0016",
        "0015",
        "0014",
        "0013",
        "0012",
        "0011",
        "0010",
        "0009",
        "0008",
        "0007",
        "0006",
        "0005",
        "0004",
        "0003",
        "0002",
        "0001",
    ]


def test_upgrade_builds_tables_view_and_stamps_head(empty_db_url: str) -> None:
    mnestoma.upgrade(empty_db_url)
    with package_engine(empty_db_url) as engine:
        insp = inspect(engine)
        assert set(insp.get_table_names()) >= EXPECTED_TABLES
        assert VIEW_NAME in insp.get_view_names()
        assert current_revision(engine) == head_revision()


def test_upgrade_downgrade_to_base_and_upgrade_again(empty_db_url: str) -> None:
    mnestoma.upgrade(empty_db_url)
    mnestoma.downgrade(empty_db_url, "base")
    with package_engine(empty_db_url) as engine:
        tables = set(inspect(engine).get_table_names()) - {"mnestoma_alembic_version"}
        assert tables == set()
        assert current_revision(engine) is None
        mnestoma.upgrade(engine)
        assert current_revision(engine) == head_revision()
    assert _diff(empty_db_url) == []


def test_migrated_schema_equals_the_models(empty_db_url: str) -> None:
    mnestoma.upgrade(empty_db_url)
    assert _diff(empty_db_url) == []


def _schema_names(
    url: str, tables: tuple[str, ...] = ("mnests", "events", "canonical_query_log")
) -> dict:
    with package_engine(url) as engine:
        insp = inspect(engine)
        return {
            t: (
                sorted(c["name"] for c in insp.get_columns(t)),
                sorted(str(c["name"]) for c in insp.get_check_constraints(t)),
                sorted(str(i["name"]) for i in insp.get_indexes(t)),
            )
            for t in tables
        }


def test_downgrade_to_0001_and_back_keeps_every_constraint_name(empty_db_url: str) -> None:
    mnestoma.upgrade(empty_db_url)
    at_head = _schema_names(empty_db_url)
    mnestoma.downgrade(empty_db_url, "0001")
    at_0001 = _schema_names(empty_db_url)
    assert "ts_weight" not in at_0001["mnests"][0]
    added_later = {"ck_mnests_outcome_counts_nonneg", "ck_mnests_decayed_uses_nonneg"}  # 0008, 0010
    assert at_0001["mnests"][1] == sorted(set(at_head["mnests"][1]) - added_later)
    mnestoma.upgrade(empty_db_url)
    assert _schema_names(empty_db_url) == at_head


def test_create_all_from_models_equals_what_migrations_build(
    empty_db_url: str, engine_name: str
) -> None:
    """Tests may use create_all; it must build what the revisions build (names included),
    every table of the models."""
    every_table = tuple(Base.metadata.tables)
    built, migrated = built_then_migrated(empty_db_url, lambda u: _schema_names(u, every_table))
    assert built == migrated


def _check_texts(url: str, tables: tuple[str, ...]) -> dict[str, str]:
    """Every CHECK's rule by name, spaces and the outer parentheses aside."""
    with package_engine(url) as engine:
        insp = inspect(engine)
        texts = {}
        for t in tables:
            for c in insp.get_check_constraints(t):
                rule = " ".join(str(c["sqltext"]).split())
                while rule.startswith("(") and rule.endswith(")"):
                    rule = rule[1:-1].strip()
                texts[str(c["name"])] = rule
        return texts


def test_every_check_the_models_write_is_the_one_migrations_build(empty_db_url: str) -> None:
    """A rule that derives a CHECK from the rules (the states, the recorders) cannot change
    without a revision: the models' CHECK texts and the revisions' are the same."""
    every_table = tuple(Base.metadata.tables)
    with package_engine(empty_db_url) as engine:
        Base.metadata.create_all(engine)
    built = _check_texts(empty_db_url, every_table)
    with package_engine(empty_db_url) as engine:
        Base.metadata.drop_all(engine)
    mnestoma.upgrade(empty_db_url)
    migrated = _check_texts(empty_db_url, every_table)
    assert built and set(built) == set(migrated)
    assert {n: t for n, t in built.items() if migrated[n] != t} == {}, migrated


def _ager_runs_checks(engine) -> list[str]:
    return sorted(str(c["name"]) for c in inspect(engine).get_check_constraints("ager_runs"))


def test_0009_gives_the_ager_runs_check_the_models_name_and_0008_gets_the_old_one_back(
    empty_db_url: str,
) -> None:
    """0003 named the CHECK twice over; 0009 renames it, keeping the rule and every row."""
    with package_engine(empty_db_url) as engine:
        mnestoma.upgrade(engine, "0008")
        assert _ager_runs_checks(engine) == ["ck_ager_runs_ck_ager_runs_duration_nonneg"]
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO ager_runs (ts, duration_s, decayed, to_decaying, merged,"
                    " protos_pruned, archive_candidates) VALUES (:ts, 1.5, 1, 2, 3, 4, 5)"
                ),
                {"ts": datetime(2026, 1, 1, tzinfo=UTC).isoformat(" ")},
            )
        mnestoma.upgrade(engine)
        assert _ager_runs_checks(engine) == ["ck_ager_runs_duration_nonneg"]
        models = {c.name for c in Base.metadata.tables["ager_runs"].constraints}
        assert "ck_ager_runs_duration_nonneg" in models
        with engine.begin() as conn:
            row = conn.execute(text("SELECT duration_s, archive_candidates FROM ager_runs")).one()
            assert tuple(row) == (1.5, 5)
            with pytest.raises(sa_exc.IntegrityError), conn.begin_nested():  # the rule stays
                conn.execute(
                    text(
                        "INSERT INTO ager_runs (ts, duration_s, decayed, to_decaying,"
                        " merged, protos_pruned, archive_candidates)"
                        " VALUES (:ts, -1, 0, 0, 0, 0, 0)"
                    ),
                    {"ts": datetime(2026, 1, 2, tzinfo=UTC).isoformat(" ")},
                )
        mnestoma.downgrade(engine, "0008")
        assert _ager_runs_checks(engine) == ["ck_ager_runs_ck_ager_runs_duration_nonneg"]
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM ager_runs")).scalar_one() == 1


def _seed_0001(url: str) -> None:
    """Rows as the seed system writes them at revision 0001 (no ts_weight)."""
    engine = make_engine(url)
    rows = [
        ("mn_seedactive00001", "search", "1", "read", "2", 0.7, 4, "active"),
        ("mn_seedproto000001", "read", "2", "pdf.to_text", None, 0.3, 1, "proto"),
        ("mn_seeddecaying001", "search", "1", "read", "1", 0.1, 9, "decaying"),
    ]
    first = datetime(2026, 1, 1, tzinfo=UTC)
    last = datetime(2026, 2, 1, 8, 30, tzinfo=UTC)
    if engine.dialect.name == "sqlite":
        first_v: object = first.replace(tzinfo=None).isoformat(" ", "microseconds")
        last_v: object = last.replace(tzinfo=None).isoformat(" ", "microseconds")
    else:
        first_v, last_v = first, last
    with engine.begin() as conn:
        for r in rows:
            conn.execute(
                text(
                    "INSERT INTO mnests (id, src_executor, src_version, dst_executor, dst_version,"
                    " weight, uses, ts_first, ts_last, decay_lambda, state)"
                    " VALUES (:id, :s, :sv, :d, :dv, :w, :u, :f, :l, 0.018, :st)"
                ),
                dict(
                    id=r[0],
                    s=r[1],
                    sv=r[2],
                    d=r[3],
                    dv=r[4],
                    w=r[5],
                    u=r[6],
                    st=r[7],
                    f=first_v,
                    l=last_v,
                ),
            )
        conn.execute(
            text(
                "INSERT INTO events (mnest_id, kind, ts, turn_id, weight_after, state_after)"
                " VALUES ('mn_seedactive00001', 'created', :f, 't-1', 0.3, 'active')"
            ),
            {"f": first_v},
        )
        conn.execute(
            text(
                "INSERT INTO canonical_query_log (ts, raw_query, canonical_query, canonical_hash)"
                " VALUES (:f, 'Find PDFs', 'find pdf', :h)"
            ),
            {"f": first_v, "h": "0" * 64},
        )
    engine.dispose()


def test_a_0001_store_with_rows_upgrades_to_head_keeping_every_row(empty_db_url: str) -> None:
    mnestoma.upgrade(empty_db_url, "0001")
    _seed_0001(empty_db_url)
    mnestoma.upgrade(empty_db_url)
    m = mnestoma.Mnestoma(empty_db_url)
    try:
        rows = {r.id: r for r in m.edges()}
        assert set(rows) == {"mn_seedactive00001", "mn_seedproto000001", "mn_seeddecaying001"}
        active = rows["mn_seedactive00001"]
        assert (active.weight, active.uses, active.state) == (0.7, 4, "active")
        # ts_weight is backfilled from ts_last: the weight refers to the last passing.
        assert active.ts_weight == active.ts_last == datetime(2026, 2, 1, 8, 30, tzinfo=UTC)
        assert rows["mn_seedproto000001"].dst_version is None
        assert [e.turn_id for e in m.events()] == ["t-1"]
        assert [q.canonical_query for q in m.recent_queries()] == ["find pdf"]
    finally:
        m.close()
    assert _diff(empty_db_url) == []


def test_downgrade_to_0001_keeps_rows_and_re_anchors_weights_at_ts_last(
    store_url: str, clock
) -> None:
    m = mnestoma.Mnestoma(store_url, clock=clock)
    try:
        m.record_passing("search", "1", "read", "2")
        clock.advance(days=10)
        m.apply_ager()  # weight now refers to ts_weight = ts_last + 10 days
        row = m.edges()[0]
    finally:
        m.close()
    mnestoma.downgrade(store_url, "0001")
    with package_engine(store_url) as engine:
        with engine.connect() as conn:
            weight, uses = conn.execute(text("SELECT weight, uses FROM mnests")).one()
        assert uses == 1
        # 0001 decays from ts_last: the stored weight is the weight at ts_last again.
        assert row.weight == pytest.approx(0.30 * math.exp(-0.018 * 10))
        assert weight == pytest.approx(0.30)
    mnestoma.upgrade(store_url)


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_offline_sql_script_is_produced_for_each_dialect(dialect: str) -> None:
    url = "sqlite://" if dialect == "sqlite" else "postgresql+psycopg://"
    sql = offline_sql(url)
    assert "CREATE TABLE mnests" in sql
    assert "CREATE UNIQUE INDEX ux_mnests_proto_key" in sql
    assert "CREATE VIEW v_mnestoma" in sql
    assert "UPDATE mnestoma_alembic_version SET version_num='0002'" in sql
    if dialect == "postgresql":
        assert "JSONB" in sql and "TIMESTAMP WITH TIME ZONE" in sql


def test_an_unknown_revision_is_invalid_input(empty_db_url: str) -> None:
    with pytest.raises(mnestoma.InvalidInput):
        mnestoma.upgrade(empty_db_url, "9999")
    assert current_revision(empty_db_url) is None


def test_upgrade_runs_inside_a_callers_connection(empty_db_url: str) -> None:
    with package_engine(empty_db_url) as engine:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))  # the caller's transaction is open
            mnestoma.upgrade(conn)
            conn.rollback()  # the caller decides: nothing was built
        assert current_revision(engine) is None
        with engine.connect() as conn:
            mnestoma.upgrade(conn)
            conn.commit()
        assert current_revision(engine) == head_revision()


def _mnests_indexes(engine) -> dict[str, str]:
    """Each index of mnests and the text the database keeps of it."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            rows = conn.execute(
                text(
                    "SELECT name, sql FROM sqlite_master"
                    " WHERE type = 'index' AND tbl_name = 'mnests'"
                )
            )
        else:
            rows = conn.execute(
                text("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'mnests'")
            )
        return {name: sql or "" for name, sql in rows}


def _fillfactor(engine) -> str | None:
    with engine.connect() as conn:
        options = conn.execute(
            text("SELECT reloptions FROM pg_class WHERE relname = 'mnests'")
        ).scalar_one()
    found = [o for o in options or [] if o.startswith("fillfactor=")]
    return found[0] if found else None


def test_0006_indexes_only_active_rows_by_source_and_0005_gets_the_full_index_back(
    empty_db_url: str,
) -> None:
    with package_engine(empty_db_url) as engine:
        mnestoma.upgrade(engine)
        indexes = _mnests_indexes(engine)
        assert "ix_mnests_state_src" not in indexes
        definition = indexes["ix_mnests_active_src"].replace("(", "").replace(")", "")
        assert "src_executor, src_version" in definition
        assert "WHERE state" in definition and "'active'" in definition
        mnestoma.downgrade(engine, "0005")
        indexes = _mnests_indexes(engine)
        assert "ix_mnests_active_src" not in indexes
        assert "WHERE" not in indexes["ix_mnests_state_src"]


def test_0006_leaves_room_on_postgresql_pages_and_0005_resets_it(pg_empty_db_url: str) -> None:
    with package_engine(pg_empty_db_url) as engine:
        mnestoma.upgrade(engine)
        assert _fillfactor(engine) == "fillfactor=70"
        mnestoma.downgrade(engine, "0005")
        assert _fillfactor(engine) is None


def _in_place_share(engine) -> float:
    """Bulk-load 2,000 rows back to back, then rewrite each one's weight in one statement
    (as the ager's decay does): the share of updates that stayed on their page."""
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE mnests CASCADE"))
        conn.execute(
            text(
                "INSERT INTO mnests (id, src_executor, src_version, dst_executor,"
                " dst_version, weight, uses, ts_first, ts_last, ts_weight, state)"
                " SELECT 'mn_fill' || lpad(g::text, 10, '0'), 'src', '1', 'dst' || g, '1',"
                " 0.5, 1, now(), now(), now(), 'active' FROM generate_series(1, 2000) g"
            )
        )
    with engine.begin() as conn:
        updated = conn.execute(text("UPDATE mnests SET weight = weight / 2")).rowcount
        in_place = conn.execute(
            text("SELECT pg_stat_get_xact_tuples_hot_updated('mnests'::regclass)")
        ).scalar_one()
    assert updated == 2000
    return float(in_place) / updated


def test_postgresql_rewrites_rows_of_bulk_loaded_pages_in_place(pg_empty_db_url: str) -> None:
    """Pages filled to 70 % leave room for the new version of 30/70 of their rows within
    one transaction: such an update (no indexed column changes) stays on its page and
    writes no index entry. Full pages (revision 0005) leave room for almost none."""
    with package_engine(pg_empty_db_url) as engine:
        mnestoma.upgrade(engine, "0005")
        full_pages = _in_place_share(engine)
        mnestoma.upgrade(engine)
        with_room = _in_place_share(engine)
    assert full_pages < 0.05
    assert 0.38 < with_room < 0.5
