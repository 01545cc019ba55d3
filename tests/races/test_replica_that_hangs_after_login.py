"""A replica that lets the login through and then never answers (a pooler in front of a
dead standby, a standby that hangs after authentication) holds a read no longer than the
read's deadline (contract §12), through both doors, although the first queries on a new
connection are SQLAlchemy's own (the dialect's set-up), not the package's.

The "replica" is the primary itself behind a proxy that passes the startup and
authentication and swallows every query after them: the read never gets as far as the
replica's identity, so no standby is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from click.testing import CliRunner
from sqlalchemy.engine import make_url

from mnestoma import Mnestoma, Settings
from mnestoma.cli import cli
from mnestoma.core.rules import REPLICA_CONNECT_TIMEOUT_S
from mnestoma.doors.asynchronous import AsyncMnestoma
from mnestoma.maintenance.status import ReplicaFacts

HANGING = Settings(replica_read_timeout=0.5, replica_skip=30.0)
BOUND_S = max(HANGING.replica_read_timeout, REPLICA_CONNECT_TIMEOUT_S) + 1.5
QUERIES = (b"Q", b"P")  # a simple query, a parse: the first message of any query
GIVE_UP_S = 60.0  # a read held past this is the bug itself: fail rather than hang the suite
T = TypeVar("T")


def within(work: Callable[[], T]) -> T:
    """``work``'s result, run in a thread of its own; a failure if it runs past GIVE_UP_S."""
    outcome: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as err:
            failed.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(GIVE_UP_S)
    if thread.is_alive():
        pytest.fail(f"still held after {GIVE_UP_S:g} s")
    if failed:
        raise failed[0]
    return outcome[0]


class SwallowingProxy:
    """A TCP proxy to ``host:port`` that forwards each connection's startup and
    authentication both ways, then swallows everything the client sends from its first
    query on (the server never sees it, so never answers)."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                server = socket.create_connection(self._target)
                self._sockets += [client, server]
                threading.Thread(
                    target=self._pipe, args=(client, server, True), daemon=True
                ).start()
                threading.Thread(
                    target=self._pipe, args=(server, client, False), daemon=True
                ).start()

    @staticmethod
    def _pipe(source: socket.socket, target: socket.socket, from_client: bool) -> None:
        swallowing = False
        first = True
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if from_client and not first and data[:1] in QUERIES:
                    swallowing = True
                first = False
                if not swallowing:
                    target.sendall(data)

    def close(self) -> None:
        """Stop listening and end every proxied connection: shut down first, since a socket
        closed while a thread waits in ``recv`` on it stays open until that call returns
        (the server's session would outlive the test)."""
        for s in self._sockets:
            with contextlib.suppress(OSError):
                if s is not self._listener:
                    s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


@pytest.fixture
def hanging_replica(pg_store_url: str) -> Iterator[str]:
    """The URL of the store behind a :class:`SwallowingProxy` (no TLS: the proxy reads the
    messages' types)."""
    url = make_url(pg_store_url)
    proxy = SwallowingProxy(url.host or "127.0.0.1", url.port or 5432)
    try:
        yield url.set(port=proxy.port, query={**url.query, "sslmode": "disable"}).render_as_string(
            hide_password=False
        )
    finally:
        proxy.close()


def test_a_replica_that_hangs_after_login_holds_a_read_no_longer_than_its_deadline(
    pg_store_url: str, hanging_replica: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "mnestoma.replicas")

    def reads() -> None:
        with Mnestoma(pg_store_url, replicas=[hanging_replica], settings=HANGING) as store:
            m = store.record_passing("a", "1", "b", "2")
            started = time.monotonic()
            got = store.get(m.id)
            took = time.monotonic() - started
            assert got is not None and got.uses == 1  # the primary served it
            assert took < BOUND_S, took
            started = time.monotonic()
            assert store.get(m.id) is not None  # the replica is skipped now: no wait
            assert time.monotonic() - started < HANGING.replica_read_timeout
            stats = store.replica_stats()
            (replica,) = stats["replicas"]
            assert replica["skipped"] and replica["reads"] == 0
            assert stats["fallbacks"] == 1

    within(reads)
    warnings = [r for r in caplog.records if r.name == "mnestoma.replicas"]
    assert len(warnings) == 1, [w.getMessage() for w in warnings]


def test_the_async_facade_bounds_a_read_on_a_replica_that_hangs_after_login(
    pg_store_url: str, hanging_replica: str
) -> None:
    async def main() -> float:
        async with AsyncMnestoma(pg_store_url, replicas=[hanging_replica], settings=HANGING) as am:
            m = await am.record_passing("a", "1", "b", "2")
            started = time.monotonic()
            got = await am.get(m.id)
            took = time.monotonic() - started
            assert got is not None and got.uses == 1
            (replica,) = am.replica_stats()["replicas"]
            assert replica["skipped"] and replica["reads"] == 0
            return took

    took = within(lambda: asyncio.run(main()))  # leaving the facade included
    assert took < BOUND_S, took


def test_status_gives_up_on_a_replica_that_hangs_after_login_within_its_deadline(
    pg_store_url: str, hanging_replica: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MNESTOMA_REPLICA_URLS", hanging_replica)

    def status() -> tuple[int, str, float]:
        started = time.monotonic()
        done = CliRunner().invoke(cli, ["status", "--database-url", pg_store_url])
        return done.exit_code, done.output, time.monotonic() - started

    code, output, took = within(status)
    assert code == 0, output
    assert "does not answer" in output
    default_timeout = Settings().replica_read_timeout
    assert took < max(default_timeout, REPLICA_CONNECT_TIMEOUT_S) + 10.0, took


def test_status_names_another_clusters_server_as_not_a_replica_of_this_store() -> None:
    other = ReplicaFacts(
        "postgresql://other/mnestoma",
        standby=False,
        behind_bytes=None,
        refused="it is cluster 1, the primary is cluster 2: it is no standby of it",
    )
    assert "not a replica of this store (it is cluster 1" in other.line()
    assert "promoted" not in other.line()
