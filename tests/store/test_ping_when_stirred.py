"""PostgreSQL's pre-ping sends its round trip only to a connection whose socket stirred while
it was idle: a quiet one is checked out as it is, a terminated one is replaced, and one with
a notification waiting is pinged for real and kept (contract §3; docs/performance.md)."""

from __future__ import annotations

import asyncio
import time

from conftest import package_engine
from invariants import plain_engine
from sqlalchemy import Engine, text

from mnestoma.aio import make_async_engine

MARK = "SELECT 'checked in quiet'"
# A connection is checked in after its transaction ended: the server's last statement.
ENDED = "COMMIT"
# What SQLAlchemy's ping sends (its dialect's "select one").
PINGS = (";", "SELECT 1")


def _last_statement(url: str, pid: int) -> str:
    """What the server shows as the last statement of backend ``pid``."""
    with plain_engine(url).connect() as watcher:
        # the statistics snapshot of this transaction: read fresh each time
        return str(
            watcher.execute(
                text("SELECT query FROM pg_stat_activity WHERE pid = :p"), {"p": pid}
            ).scalar_one()
        )


def _pid_after_mark(engine: Engine) -> int:
    """The backend of the pool's one connection, checked in after :data:`MARK` committed."""
    with engine.connect() as conn:
        pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
        conn.execute(text(MARK))
        conn.commit()
    return pid


def test_a_quiet_idle_connection_is_checked_out_without_a_round_trip(pg_store_url: str) -> None:
    with package_engine(pg_store_url) as engine:
        assert engine.pool._pre_ping is True
        pid = _pid_after_mark(engine)
        with engine.connect() as conn:
            # checked out (pre-ping done), nothing run yet: the server saw no ping
            assert _last_statement(pg_store_url, pid) == ENDED
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() == pid


def test_a_connection_whose_backend_ended_is_replaced_at_checkout(pg_store_url: str) -> None:
    with package_engine(pg_store_url) as engine:
        pid = _pid_after_mark(engine)
        with plain_engine(pg_store_url).connect() as killer:
            # waits until the backend has ended (its socket then says so)
            assert killer.execute(text("SELECT pg_terminate_backend(:p, 5000)"), {"p": pid})
        with engine.connect() as conn:
            now = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        assert now != pid


def test_a_connection_with_a_notification_waiting_is_pinged_for_real_and_kept(
    pg_store_url: str,
) -> None:
    with package_engine(pg_store_url) as engine:
        with engine.connect() as conn:
            pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
            conn.execute(text("LISTEN mnestoma_ping_test"))
            conn.commit()
        with plain_engine(pg_store_url).connect() as other:
            other.execute(text("NOTIFY mnestoma_ping_test"))
            other.commit()
        time.sleep(0.2)  # the notification reaches the idle connection's socket
        with engine.connect() as conn:
            assert _last_statement(pg_store_url, pid) in PINGS  # the real ping
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() == pid


def test_the_async_engine_checks_a_quiet_connection_out_without_a_round_trip(
    pg_store_url: str,
) -> None:
    async def run() -> int:
        engine = make_async_engine(pg_store_url)
        try:
            async with engine.connect() as conn:
                pid = int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())
                await conn.execute(text(MARK))
                await conn.commit()
            async with engine.connect() as conn:
                assert _last_statement(pg_store_url, pid) == ENDED
                again = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
                assert again == pid
            return pid
        finally:
            await engine.dispose()

    assert asyncio.run(run()) > 0
