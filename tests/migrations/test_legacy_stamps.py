"""A legacy store whose ``alembic_version`` also holds a service's own revision.

Before the package had its own version table, its revision lived in ``alembic_version``,
where a service sharing the database keeps its own. When both rows look like mnestoma
revisions (a service's first revision is often ``0001`` too), the store's row is told
apart by the schema, adopted into ``mnestoma_alembic_version``, and the service's row stays
where it is.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, create_engine, inspect, text

import mnestoma
from mnestoma.cli import cli
from mnestoma.maintenance.migration import LEGACY_VERSION_TABLE, VERSION_TABLE

TS = "2026-01-01 00:00:00+00:00"


def _engine(url: str) -> Engine:
    return create_engine(url.replace("postgresql://", "postgresql+psycopg://"))


def _legacy_store(url: str, revision: str) -> None:
    """A store at ``revision`` with a row and its event, stamped in ``alembic_version`` as
    releases before ``mnestoma_alembic_version`` did."""
    mnestoma.upgrade(url, revision)
    columns = "id, src_executor, src_version, dst_executor, dst_version, weight, uses, "
    columns += "ts_first, ts_last, decay_lambda, state"
    values = f"'mn_legacyrow00001', 'a', '1', 'b', '1', 0.5, 2, '{TS}', '{TS}', 0.018, 'active'"
    if revision != "0001":
        columns += ", ts_weight"
        values += f", '{TS}'"
    engine = _engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO mnests ({columns}) VALUES ({values})"))
        conn.execute(
            text("INSERT INTO events (mnest_id, kind, ts) VALUES (:id, 'created', :ts)"),
            {"id": "mn_legacyrow00001", "ts": TS},
        )
        conn.execute(text(f"DROP TABLE {VERSION_TABLE}"))
        conn.execute(
            text(f"CREATE TABLE {LEGACY_VERSION_TABLE} (version_num VARCHAR(32) PRIMARY KEY)")
        )
        conn.execute(text(f"INSERT INTO {LEGACY_VERSION_TABLE} VALUES (:r)"), {"r": revision})
    engine.dispose()


def _add_service_stamp(url: str, revision: str) -> None:
    """The service's own table and its revision, in the same ``alembic_version``."""
    engine = _engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE orders (id INTEGER PRIMARY KEY)"))
        conn.execute(text("INSERT INTO orders VALUES (7)"))
        conn.execute(text(f"INSERT INTO {LEGACY_VERSION_TABLE} VALUES (:r)"), {"r": revision})
    engine.dispose()


def _versions(url: str) -> dict[str, list[str]]:
    engine = _engine(url)
    out: dict[str, list[str]] = {}
    with engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
        for table in (LEGACY_VERSION_TABLE, VERSION_TABLE):
            if table in tables:
                rows = conn.execute(text(f"SELECT version_num FROM {table}")).scalars()
                out[table] = sorted(rows)
    engine.dispose()
    return out


def _rows(url: str) -> dict[str, list[tuple]]:
    engine = _engine(url)
    with engine.connect() as conn:
        rows = {
            "mnests": conn.execute(text("SELECT id, uses, weight FROM mnests")).all(),
            "events": conn.execute(text("SELECT mnest_id, kind FROM events")).all(),
            "orders": conn.execute(text("SELECT id FROM orders")).all(),
        }
    engine.dispose()
    return {k: [tuple(r) for r in v] for k, v in rows.items()}


# (the store's legacy revision, the service's revision): both are mnestoma revision ids.
STAMPS = [("0002", "0001"), ("0001", "0003"), ("0005", "0002")]
# Every revision ever stamped in alembic_version, each beside another revision id.
EVERY_LEGACY_STAMP = [
    ("0001", "0002"),
    ("0002", "0001"),
    ("0003", "0006"),
    ("0004", "0001"),
    ("0005", "0002"),
    ("0006", "0003"),
]


def _legacy_beside_service(url: str, store_rev: str, service_rev: str) -> None:
    """A store stamped in the legacy table at ``store_rev`` beside a service's own stamp."""
    _legacy_store(url, store_rev)
    _add_service_stamp(url, service_rev)


@pytest.mark.parametrize(("store_rev", "service_rev"), STAMPS, ids=lambda r: r)
def test_a_legacy_stamp_beside_a_services_own_revision_is_adopted_and_the_service_row_kept(
    empty_db_url: str, store_rev: str, service_rev: str
) -> None:
    _legacy_beside_service(empty_db_url, store_rev, service_rev)
    before = _rows(empty_db_url)
    mnestoma.upgrade(empty_db_url)
    assert _versions(empty_db_url) == {
        LEGACY_VERSION_TABLE: [service_rev],
        VERSION_TABLE: [mnestoma.head_revision()],
    }
    assert _rows(empty_db_url) == before
    with mnestoma.Mnestoma(empty_db_url) as store:
        assert store.get("mn_legacyrow00001") is not None
        assert [e.kind for e in store.events(mnest_id="mn_legacyrow00001")] == ["created"]


@pytest.mark.parametrize(("store_rev", "service_rev"), EVERY_LEGACY_STAMP, ids=lambda r: r)
def test_status_reads_the_legacy_stamp_beside_a_services_own_revision(
    empty_db_url: str, store_rev: str, service_rev: str
) -> None:
    _legacy_beside_service(empty_db_url, store_rev, service_rev)
    assert mnestoma.current_revision(empty_db_url) == store_rev
    result = CliRunner().invoke(cli, ["status", "--json", "--database-url", empty_db_url])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["revision"] == store_rev
    # reading adopts nothing
    assert _versions(empty_db_url) == {LEGACY_VERSION_TABLE: sorted([store_rev, service_rev])}
