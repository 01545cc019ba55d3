"""What ``migrations/env.py`` migrates: what it was handed, or what ``alembic`` names.

A caller hands an Engine, a Connection or a wrapper whose ``connect()`` yields one; that
database is migrated, and anything else is refused before anything runs. The environment's
store (MNESTOMA_DATABASE_URL) is never a stand-in for what was handed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from alembic import command
from bystander import fill_bystander, snapshot
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import create_async_engine

import mnestoma
from mnestoma.engines import make_engine
from mnestoma.maintenance.migration import HANDED, alembic_config, current_revision


@dataclass
class Wrapper:
    """A caller's own wrapper: ``connect()`` yields the connection it holds, left open (as
    pytest-alembic's ``WrappingConnection`` does)."""

    connection: Connection

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        yield self.connection


@pytest.fixture
def bystander(store_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A store at head with outcome counts, named by MNESTOMA_DATABASE_URL."""
    monkeypatch.setenv("MNESTOMA_DATABASE_URL", store_url)
    return store_url


@pytest.mark.parametrize(
    ("caller_commits", "revision"),
    [(True, mnestoma.head_revision()), (False, None)],
    ids=["migrated when the caller commits", "the caller's to roll back"],
)
def test_a_wrapper_whose_connect_yields_a_connection_is_migrated_in_the_callers_transaction(
    empty_db_url: str, bystander: str, caller_commits: bool, revision: str | None
) -> None:
    before = fill_bystander(bystander)
    engine = make_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            if not caller_commits:
                conn.begin()  # the caller's own transaction, which it then rolls back
            command.upgrade(alembic_config(Wrapper(conn)), "head")
            if caller_commits:
                conn.commit()
            else:
                conn.rollback()
        assert current_revision(engine) == revision
    finally:
        engine.dispose()
    assert snapshot(bystander) == before


class NoConnection:
    """An object whose connect() yields something that is not a Connection."""

    @contextmanager
    def connect(self) -> Iterator[object]:
        yield object()


class NotAContextManager:
    """An object whose connect() returns a plain value."""

    def connect(self) -> object:
        return object()


@pytest.mark.parametrize(
    "handed",
    [None, object(), "sqlite:///elsewhere.sqlite", NoConnection(), NotAContextManager()],
    ids=["None", "object", "a URL string", "connect yields no Connection", "no context"],
)
def test_anything_else_handed_is_refused_and_no_database_is_migrated(
    handed: object, empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MNESTOMA_DATABASE_URL", empty_db_url)  # the fall-back it must not take
    cfg = alembic_config()
    cfg.attributes[HANDED] = handed
    with pytest.raises(mnestoma.InvalidInput, match="Nothing was migrated"):
        command.upgrade(cfg, "head")
    assert current_revision(empty_db_url) is None


def test_an_async_engine_handed_is_refused_with_what_to_hand_instead(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MNESTOMA_DATABASE_URL", empty_db_url)
    async_engine = create_async_engine("sqlite+aiosqlite://")
    try:
        with pytest.raises(mnestoma.InvalidInput, match="async engine"):
            command.upgrade(alembic_config(async_engine), "head")
    finally:
        async_engine.sync_engine.dispose()
    assert current_revision(empty_db_url) is None
