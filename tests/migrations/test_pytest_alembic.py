"""pytest-alembic's built-in tests on the package's revisions, on SQLite and PostgreSQL.

Its plugin stays off (``-p no:pytest_alembic``: it fails at collection under pytest 9.2),
so its tests and its ``alembic_runner`` fixture are imported here, and the two fixtures it
asks for are this file's: ``alembic_config`` (the packaged scripts) and ``alembic_engine``
(a new database on each engine).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.config import Config
from bystander import fill_bystander, snapshot
from conftest import create_pg_database, drop_pg_database
from pytest_alembic.plugin.fixtures import alembic_runner
from pytest_alembic.runner import MigrationContext
from pytest_alembic.tests import (
    experimental,
    test_model_definitions_match_ddl,
    test_single_head_revision,
    test_up_down_consistency,
    test_upgrade,
)
from sqlalchemy import Engine

from mnestoma.engines import make_engine
from mnestoma.maintenance.migration import alembic_config as packaged_config
from mnestoma.maintenance.migration import head_revision

__all__ = [
    "alembic_runner",
    "test_model_definitions_match_ddl",
    "test_single_head_revision",
    "test_up_down_consistency",
    "test_upgrade",
]


@pytest.fixture
def alembic_config() -> Config:
    """The packaged scripts; env.py names the models' metadata itself."""
    return packaged_config()


@pytest.fixture
def alembic_engine(engine_name: str, tmp_path: Path) -> Iterator[Engine]:
    """A new, empty database on each engine, opened as the package opens a store."""
    if engine_name == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'alembic.sqlite'}")
        try:
            yield engine
        finally:
            engine.dispose()
        return
    url = create_pg_database("mnestoma_alembic")
    engine = make_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()
        drop_pg_database(url, later=True)


def _version_table_at_base(alembic_runner: MigrationContext) -> None:
    """Leave base with the package's version table in place, as any downgrade to base does.

    pytest-alembic compares the schema before each upgrade with the schema after its
    downgrade, through a MigrationContext of its own that knows only ``alembic_version``:
    the package's ``mnestoma_alembic_version``, missing before the first upgrade and kept
    (empty) after the downgrade to base, would read as a trace of revision 0001.
    """
    alembic_runner.migrate_up_to("0001")
    alembic_runner.migrate_down_to("base")


def test_downgrade_leaves_no_trace(alembic_runner: MigrationContext) -> None:
    """pytest-alembic's own (experimental) test, from a base that has the version table."""
    _version_table_at_base(alembic_runner)
    experimental.test_downgrade_leaves_no_trace(alembic_runner)


def test_pytest_alembics_runs_leave_the_store_the_environment_names_untouched(
    alembic_runner: MigrationContext, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runs hand env.py an Engine, and a wrapper of a connection: each migrates the
    database it wraps, never the store MNESTOMA_DATABASE_URL names (which a downgrade to
    0007 would strip of its outcome counts)."""
    monkeypatch.setenv("MNESTOMA_DATABASE_URL", store_url)
    before = fill_bystander(store_url)
    test_up_down_consistency(alembic_runner)
    test_downgrade_leaves_no_trace(alembic_runner)
    assert snapshot(store_url) == before
    assert alembic_runner.current == head_revision()  # up from base, each cycled down
