"""Read replicas (contract §12) on a real PostgreSQL primary and streaming replica that the
suite starts itself (``benchmarks/replication.py``): routing, read-your-writes under concurrent
writers, a replica stopped mid-run, lagging, frozen, cut off from its primary or of another
database, both doors, the command line; and SQLite, which has no replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest
from click.testing import CliRunner
from conftest import REQUIRE_PG

from benchmarks.replication import Cluster, binaries_missing
from mnestoma import InvalidInput, Mnest, Mnestoma, Settings
from mnestoma.cli import cli
from mnestoma.cli.options import split_replica_urls
from mnestoma.core.rules import REPLICA_CONNECT_TIMEOUT_S
from mnestoma.doors.asynchronous import AsyncMnestoma

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A primary and a streaming replica of its own, for the session."""
    missing = binaries_missing()
    if missing is not None:
        pytest.skip(f"no primary and replica can be started here: {missing}")
    pair = Cluster()
    try:
        pair.start()
    except Exception as err:
        pair.stop()
        if REQUIRE_PG:
            raise
        pytest.skip(f"could not start a primary and a replica: {err}")
    yield pair
    pair.stop()


@pytest.fixture
def pair(cluster: Cluster) -> Iterator[Cluster]:
    """The pair with an empty store, the replica running, replaying and caught up; left so
    (thawed and streaming again after a test that froze it or cut it off)."""
    if not cluster.replica_running():
        cluster.start_replica()
    cluster.resume_replay()
    cluster.reset()
    yield cluster
    if cluster.replica_running():
        cluster.thaw_replica()  # a test that failed frozen
    cluster.reconnect_replica()  # a test that failed cut off (nothing otherwise)
    if not cluster.replica_running():
        cluster.start_replica()
    cluster.resume_replay()


# Quick to skip and to come back, for the tests.
QUICK = Settings(replica_max_lag=0.5, replica_skip=0.5)


def _stats(store: Mnestoma | AsyncMnestoma) -> tuple[int, int]:
    """(reads the replica served, skips) of a one-replica facade."""
    (replica,) = store.replica_stats()["replicas"]
    return replica["reads"], replica["skips"]


def _served_soon(store: Mnestoma, read: Callable[[], object]) -> None:
    """Read until the replica serves a read. The first read after a while may go to the
    primary: it reads the primary's WAL position, then the replica's, and the replica is
    proven within the bound only once it has replayed a reading."""
    before, _ = _stats(store)
    for _ in range(50):
        read()
        if _stats(store)[0] > before:
            return
        time.sleep(0.02)
    raise AssertionError(f"the replica served none of 50 reads: {store.replica_stats()}")


async def _served_soon_async(store: AsyncMnestoma, read: Callable[[], Awaitable[object]]) -> None:
    """:func:`_served_soon`, through the async facade."""
    before, _ = _stats(store)
    for _ in range(50):
        await read()
        if _stats(store)[0] > before:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the replica served none of 50 reads: {store.replica_stats()}")


@contextlib.asynccontextmanager
async def _async_store_with_an_edge(
    pair: Cluster, settings: Settings
) -> AsyncIterator[tuple[AsyncMnestoma, Mnest]]:
    """An async facade reading from the pair's replica, with one edge written through it and
    replayed by the replica."""
    async with AsyncMnestoma(
        pair.primary_url, replicas=[pair.replica_url], settings=settings
    ) as store:
        m = await store.record_passing("a", "1", "b", "2")
        await asyncio.to_thread(pair.wait_caught_up)
        yield store, m


def test_reads_go_to_a_replica_that_has_replayed_and_never_miss_the_facades_own_write(
    pair: Cluster,
) -> None:
    with Mnestoma(pair.primary_url, replicas=[pair.replica_url]) as store:
        m = store.record_passing("plan", "1", "search", "2")
        got = store.get(m.id)  # at once: on the primary if the replica is behind
        assert got is not None and got.uses == 1
        pair.wait_caught_up()
        _served_soon(store, lambda: store.get(m.id))
        before, _ = _stats(store)
        for read in (
            lambda: store.get(m.id),
            lambda: store.edges(),
            lambda: store.find("plan", "1", "search", "2"),
            lambda: store.events(mnest_id=m.id),
            lambda: store.walk("plan"),
            lambda: store.suggest_next("plan", "1"),
            lambda: store.rank("plan", ["search"]),
            lambda: store.rank("plan", ["search"], order_by="p"),
            lambda: store.predict_next("plan"),
            lambda: store.vet(["plan", "search"]),
            lambda: store.graph(),
            lambda: store.recurring_protos(),
            lambda: store.top_queries(),
        ):
            read()
        reads, skips = _stats(store)
        assert (reads - before, skips) == (13, 0)
        assert store.vet(["plan", "search"]).known


def test_writes_units_of_work_and_the_primary_view_read_the_primary(pair: Cluster) -> None:
    with (
        Mnestoma(pair.primary_url, replicas=[pair.replica_url]) as store,
        Mnestoma(pair.primary_url) as other,
    ):
        _served_soon(store, store.edges)  # the replica proven fresh as of now
        reads, _ = _stats(store)
        pair.pause_replay()
        other.record_passing("a", "1", "b", "2")  # another facade's write: not this one's
        assert store.edges() == []  # the replica, paused, has not replayed it: allowed
        assert len(store.primary.edges()) == 1
        with store.unit_of_work() as unit:
            assert len(unit.mnests.edges()) == 1
        assert _stats(store)[0] == reads + 1  # within the bound: the replica served it
        # the facade's own write: its reads go to the primary until the replica replays it
        store.record_passing("a", "1", "c", "2")
        assert len(store.edges()) == 2
        assert store.replica_stats()["not_caught_up"] >= 1
        assert store.prune_events(store.clock(), dry_run=True) == 0  # on the primary
        pair.resume_replay()
        pair.wait_caught_up()
        _served_soon(store, lambda: len(store.edges()) == 2 or pytest.fail("a stale read"))


def test_a_replica_stopped_mid_run_is_skipped_with_one_warning_and_no_read_fails(
    pair: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    with Mnestoma(pair.primary_url, replicas=[pair.replica_url], settings=QUICK) as store:
        m = store.record_passing("a", "1", "b", "2")
        pair.wait_caught_up()
        failures: list[BaseException] = []
        reads = [0]
        stop = threading.Event()

        def reader() -> None:
            while not stop.is_set():
                try:
                    got = store.get(m.id)
                    assert got is not None and got.uses == 1
                    reads[0] += 1
                except BaseException as err:
                    failures.append(err)
                    return

        caplog.set_level(logging.WARNING, "mnestoma.replicas")
        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        pair.stop_replica()
        time.sleep(0.3)
        stop.set()
        for t in threads:
            t.join()
        assert failures == []
        warnings = [r for r in caplog.records if r.name == "mnestoma.replicas"]
        assert len(warnings) == 1 and "skipped" in warnings[0].getMessage()
        assert store.replica_stats()["replicas"][0]["skips"] == 1
        # back once it answers again and the skip has run out
        pair.start_replica()
        time.sleep(QUICK.replica_skip)
        _served_soon(store, lambda: store.get(m.id))
        assert _stats(store)[1] == 1


def test_a_lagging_replica_is_skipped_and_its_reads_go_to_the_primary(
    pair: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        Mnestoma(pair.primary_url, replicas=[pair.replica_url], settings=QUICK) as store,
        Mnestoma(pair.primary_url) as other,
    ):
        caplog.set_level(logging.WARNING, "mnestoma.replicas")
        pair.pause_replay()
        for i in range(3):  # another facade writes: the paused replica falls behind
            other.record_passing("a", "1", f"b{i}", "2")
            time.sleep(0.4)
        time.sleep(QUICK.replica_max_lag)
        edges = store.edges()  # the replica is behind the primary's position: the primary
        assert len(edges) == 3
        # seen behind once: not yet known to be behind for longer than the bound
        assert store.replica_stats()["replicas"][0]["skips"] == 0
        time.sleep(QUICK.replica_max_lag + 0.1)
        assert len(store.edges()) == 3  # behind the same position past the bound: skipped
        (replica,) = store.replica_stats()["replicas"]
        assert replica["skips"] == 1 and replica["lag_s"] > QUICK.replica_max_lag
        assert "has not replayed" in replica["reason"]
        warnings = [r for r in caplog.records if r.name == "mnestoma.replicas"]
        assert len(warnings) == 1
        pair.resume_replay()
        pair.wait_caught_up()
        time.sleep(QUICK.replica_skip)
        _served_soon(store, lambda: len(store.edges()) == 3 or pytest.fail("a stale read"))


def test_writes_resuming_after_an_idle_primary_do_not_get_the_replica_skipped(
    pair: Cluster,
) -> None:
    with (
        Mnestoma(pair.primary_url, replicas=[pair.replica_url], settings=QUICK) as store,
        Mnestoma(pair.primary_url) as other,
    ):
        other.record_passing("a", "1", "b", "2")
        pair.wait_caught_up()
        time.sleep(2 * QUICK.replica_max_lag)  # the primary idle, longer than the bound
        for i in range(20):  # writes resume; reads go on
            other.record_passing("a", "1", f"c{i}", "2")
            store.edges()
            time.sleep(0.02)
        assert store.replica_stats()["replicas"][0]["skips"] == 0


def test_no_caller_reads_a_state_older_than_its_own_last_write_under_concurrent_writers(
    pair: Cluster,
) -> None:
    with Mnestoma(pair.primary_url, replicas=[pair.replica_url]) as store:
        failures: list[str] = []

        def caller(n: int) -> None:
            for written in range(1, 16):
                m = store.record_passing(f"caller{n}", "1", "tool", "1")
                got = store.get(m.id)
                seen = 0 if got is None else got.uses
                listed = {e.id: e.uses for e in store.edges(src_executor=f"caller{n}")}
                if seen < written or listed.get(m.id, 0) < written:
                    failures.append(f"caller {n} wrote {written}, read {seen}/{listed}")

        threads = [threading.Thread(target=caller, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        stats = store.replica_stats()
        # both doors were taken: the replica served reads, the primary those it had not replayed
        assert stats["replicas"][0]["reads"] + stats["primary_reads"] == 4 * 15 * 2


def test_the_async_facade_routes_the_same_way(pair: Cluster) -> None:
    async def run() -> None:
        async with AsyncMnestoma(
            pair.primary_url, replicas=[pair.replica_url], settings=QUICK
        ) as store:
            failures: list[str] = []

            async def caller(n: int) -> None:
                for written in range(1, 8):
                    m = await store.record_passing(f"caller{n}", "1", "tool", "1")
                    got = await store.get(m.id)
                    if got is None or got.uses < written:
                        failures.append(f"caller {n} read a state older than its write")

            await asyncio.gather(*(caller(n) for n in range(3)))
            assert failures == []
            await asyncio.to_thread(pair.wait_caught_up)

            async def three_edges() -> None:
                assert len(await store.edges()) == 3

            await _served_soon_async(store, three_edges)
            served = store.replica_stats()["replicas"][0]["reads"]
            assert len(await store.edges()) == 3
            assert store.replica_stats()["replicas"][0]["reads"] == served + 1
            assert len(await store.primary.edges()) == 3
            assert store.replica_stats()["replicas"][0]["reads"] == served + 1
            await asyncio.to_thread(pair.stop_replica)
            assert len(await store.edges()) == 3  # the primary answers
            assert store.replica_stats()["replicas"][0]["skips"] == 1

    asyncio.run(run())


def test_the_command_line_reads_through_the_replicas_it_is_given(
    pair: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Mnestoma(pair.primary_url) as store:
        store.record_passing("a", "1", "b", "2")
    pair.wait_caught_up()
    monkeypatch.setenv("MNESTOMA_REPLICA_URLS", pair.replica_url)
    runner = CliRunner()
    listed = runner.invoke(cli, ["edges", "--database-url", pair.primary_url])
    assert listed.exit_code == 0, listed.output
    assert "a@1" in listed.output and "b" in listed.output
    status = runner.invoke(cli, ["status", "--database-url", pair.primary_url])
    assert status.exit_code == 0, status.output
    assert f"replica    {pair.replica_url}: standby, lag 0.0 s" in status.output
    assert "this is a read replica" not in status.output
    pair.stop_replica()
    down = runner.invoke(cli, ["status", "--database-url", pair.primary_url])
    assert down.exit_code == 0, down.output
    assert f"replica    {pair.replica_url}: does not answer" in down.output
    pair.start_replica()
    monkeypatch.delenv("MNESTOMA_REPLICA_URLS")
    on_replica = runner.invoke(cli, ["status", "--database-url", pair.replica_url])
    assert on_replica.exit_code == 0, on_replica.output
    assert "role       this is a read replica" in on_replica.output
    assert "mnests     1 " in on_replica.output


def test_replicas_are_refused_on_sqlite_and_a_sqlite_replica_anywhere(
    store_url: str, tmp_path: object
) -> None:
    other = f"sqlite:///{tmp_path}/other.sqlite"
    for door in (Mnestoma, AsyncMnestoma):
        with pytest.raises(InvalidInput, match=r"SQLite|PostgreSQL standby"):
            door(store_url, replicas=[other])  # type: ignore[operator]
    with pytest.raises(InvalidInput, match="list of URLs"):
        Mnestoma(store_url, replicas=other)  # type: ignore[arg-type]


def test_the_command_line_refuses_replicas_for_a_sqlite_store(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MNESTOMA_REPLICA_URLS", "postgresql+psycopg://u@127.0.0.1:1/x")
    result = CliRunner().invoke(cli, ["edges", "--database-url", f"sqlite:///{tmp_path}/s.sqlite"])
    assert result.exit_code == 2
    assert "MNESTOMA_REPLICA_URLS" in result.output


@pytest.mark.parametrize("field", ["replica_max_lag", "replica_skip"])
@pytest.mark.parametrize("value", [-1, float("inf"), "5", True])
def test_a_bad_replica_bound_is_refused_when_the_settings_are_built(
    field: str, value: object
) -> None:
    with pytest.raises(InvalidInput, match=field):
        Settings(**{field: value})  # type: ignore[arg-type]


# --- replicas fail safe (contract §12) ----------------------------------------------------

# A short deadline for reads on a replica, and a skip that outlasts the freeze: a read that
# tried the frozen replica again would wait for a new connection (libpq's 2 s at least).
FROZEN = Settings(replica_read_timeout=0.5, replica_skip=30.0)
# What a read may take beyond the deadline: the primary's read, a loaded machine.
SLACK_S = 0.75
# The documented bound: the deadline, or libpq's connect timeout (2 s at least) for a read
# that had to open a new connection to the frozen replica.
FROZEN_BOUND_S = max(FROZEN.replica_read_timeout, REPLICA_CONNECT_TIMEOUT_S) + SLACK_S


def test_a_frozen_replica_holds_no_read_past_the_bound_and_is_skipped(
    pair: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    with Mnestoma(pair.primary_url, replicas=[pair.replica_url], settings=FROZEN) as store:
        m = store.record_passing("a", "1", "b", "2")
        pair.wait_caught_up()
        _served_soon(store, lambda: store.get(m.id))
        caplog.set_level(logging.WARNING, "mnestoma.replicas")
        took: list[float] = []
        failures: list[BaseException] = []
        stop = threading.Event()

        def reader() -> None:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    got = store.get(m.id)
                    assert got is not None and got.uses == 1
                except BaseException as err:
                    failures.append(err)
                    return
                took.append(time.monotonic() - started)
                time.sleep(0.01)

        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.3)  # the three hold the replica's connections
        served_before, _ = _stats(store)
        with pair.frozen_replica():
            time.sleep(FROZEN.replica_read_timeout + 2.0)
            stop.set()
            for t in threads:
                t.join(timeout=30)
        assert failures == []
        assert max(took) < FROZEN_BOUND_S, max(took)
        stats = store.replica_stats()
        (replica,) = stats["replicas"]
        assert replica["skipped"] and replica["skips"] == 1
        assert replica["reason"] == "it did not answer within 0.5 s"
        assert 1 <= stats["timeouts"] <= 3 and stats["fallbacks"] >= stats["timeouts"]
        assert replica["reads"] >= served_before  # then the primary served every read
        warnings = [r for r in caplog.records if r.name == "mnestoma.replicas"]
        assert len(warnings) == 1 and "did not answer" in warnings[0].getMessage()


def test_the_async_facade_skips_a_frozen_replica_within_the_bound(pair: Cluster) -> None:
    async def run() -> None:
        async with _async_store_with_an_edge(pair, FROZEN) as (store, m):
            await _served_soon_async(store, lambda: store.get(m.id))
            took: list[float] = []
            stop = asyncio.Event()

            async def reader() -> None:
                while not stop.is_set():
                    started = time.monotonic()
                    got = await store.get(m.id)
                    assert got is not None and got.uses == 1
                    took.append(time.monotonic() - started)
                    await asyncio.sleep(0.01)

            tasks = [asyncio.create_task(reader()) for _ in range(3)]
            await asyncio.sleep(0.3)
            await asyncio.to_thread(pair.freeze_replica)
            try:
                await asyncio.sleep(FROZEN.replica_read_timeout + 2.0)
                stop.set()
                await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
            finally:
                pair.thaw_replica()
            assert max(took) < FROZEN_BOUND_S, max(took)
            stats = store.replica_stats()
            assert stats["replicas"][0]["skipped"] and stats["timeouts"] >= 1
            assert stats["replicas"][0]["reason"] == "it did not answer within 0.5 s"

    asyncio.run(run())


def test_a_replica_cut_off_from_its_primary_serves_no_read_staler_than_the_bound(
    pair: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    bound = Settings(replica_max_lag=1.0, replica_skip=30.0)
    with (
        Mnestoma(pair.primary_url, replicas=[pair.replica_url], settings=bound) as store,
        Mnestoma(pair.primary_url) as other,  # another process's writes: this facade never writes
    ):
        other.record_passing("a", "1", "b", "2")
        pair.wait_caught_up()
        _served_soon(store, store.edges)
        pair.cut_off_replica()
        try:
            other.record_passing("a", "1", "c", "2")
            committed = time.monotonic()
            stale: list[float] = []
            while time.monotonic() < committed + bound.replica_max_lag + 1.0:
                started = time.monotonic()
                if len(store.edges()) != 2 and started > committed + bound.replica_max_lag:
                    stale.append(started - committed)
                time.sleep(0.02)
            assert stale == []  # no read begun past the bound missed the edge
            (replica,) = store.replica_stats()["replicas"]
            assert replica["skipped"] and "has not replayed" in replica["reason"]
            assert replica["lag_s"] > bound.replica_max_lag
            # the status says so, and never "lag 0.0 s"
            monkeypatch.setenv("MNESTOMA_REPLICA_URLS", pair.replica_url)
            runner = CliRunner()
            status = runner.invoke(cli, ["status", "--database-url", pair.primary_url])
            assert status.exit_code == 0, status.output
            assert "standby, lag 0.0 s" not in status.output
            assert f"replica    {pair.replica_url}: standby CUT OFF from its primary" in (
                status.output
            )
            assert "bytes of WAL behind the primary" in status.output
            monkeypatch.delenv("MNESTOMA_REPLICA_URLS")
            itself = runner.invoke(cli, ["status", "--database-url", pair.replica_url])
            assert itself.exit_code == 0, itself.output
            assert "CUT OFF from its primary (no WAL receiver streams to it): lag not known" in (
                itself.output
            )
        finally:
            pair.reconnect_replica()


def test_the_async_facade_skips_a_replica_stopped_mid_run_and_no_read_fails(
    pair: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    async def run() -> None:
        async with _async_store_with_an_edge(pair, QUICK) as (store, m):
            failures: list[BaseException] = []
            stop = asyncio.Event()

            async def reader() -> None:
                while not stop.is_set():
                    try:
                        got = await store.get(m.id)
                        assert got is not None and got.uses == 1
                    except BaseException as err:
                        failures.append(err)
                        return
                    await asyncio.sleep(0.005)

            caplog.set_level(logging.WARNING, "mnestoma.replicas")
            tasks = [asyncio.create_task(reader()) for _ in range(3)]
            await asyncio.sleep(0.3)
            await asyncio.to_thread(pair.stop_replica)
            await asyncio.sleep(0.3)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
            assert failures == []
            warnings = [r for r in caplog.records if r.name == "mnestoma.replicas"]
            assert len(warnings) == 1 and "skipped" in warnings[0].getMessage()
            assert _stats(store)[1] == 1
            # back once it answers again and the skip has run out
            await asyncio.to_thread(pair.start_replica)
            await asyncio.sleep(QUICK.replica_skip)
            await _served_soon_async(store, lambda: store.get(m.id))
            assert _stats(store)[1] == 1

    asyncio.run(run())


def test_the_async_facade_reads_nothing_staler_than_the_bound_from_a_cut_off_replica(
    pair: Cluster,
) -> None:
    bound = Settings(replica_max_lag=1.0, replica_skip=30.0)

    async def run() -> None:
        async with AsyncMnestoma(
            pair.primary_url, replicas=[pair.replica_url], settings=bound
        ) as store:
            with Mnestoma(pair.primary_url) as other:  # another process's writes
                other.record_passing("a", "1", "b", "2")
                await asyncio.to_thread(pair.wait_caught_up)
                await _served_soon_async(store, store.edges)
                await asyncio.to_thread(pair.cut_off_replica)
                try:
                    other.record_passing("a", "1", "c", "2")
                    committed = time.monotonic()
                    stale: list[float] = []
                    while time.monotonic() < committed + bound.replica_max_lag + 1.0:
                        started = time.monotonic()
                        edges = await store.edges()
                        if len(edges) != 2 and started > committed + bound.replica_max_lag:
                            stale.append(started - committed)
                        await asyncio.sleep(0.02)
                    assert stale == []  # no read begun past the bound missed the edge
                    (replica,) = store.replica_stats()["replicas"]
                    assert replica["skipped"] and "has not replayed" in replica["reason"]
                finally:
                    await asyncio.to_thread(pair.reconnect_replica)

    asyncio.run(run())


def test_a_write_after_an_idle_spell_does_not_get_a_replica_a_moment_behind_skipped(
    pair: Cluster,
) -> None:
    bound = Settings(replica_max_lag=1.0, replica_skip=30.0)
    with (
        Mnestoma(pair.primary_url, replicas=[pair.replica_url], settings=bound) as store,
        Mnestoma(pair.primary_url) as other,
    ):
        other.record_passing("a", "1", "b", "2")
        pair.wait_caught_up()
        _served_soon(store, store.edges)
        time.sleep(2.2 * bound.replica_max_lag)  # the primary idle, longer than the bound
        pair.pause_replay()  # the next write reaches the replica, which replays it later
        other.record_passing("a", "1", "c", "2")
        for _ in range(10):  # a standby's own lag would be the idle spell's, 2.2 s
            assert len(store.edges()) in (1, 2)
            time.sleep(0.03)
        pair.resume_replay()
        pair.wait_caught_up()
        _served_soon(store, lambda: len(store.edges()) == 2 or pytest.fail("a stale read"))
        assert _stats(store)[1] == 0


def test_a_replica_of_another_database_is_refused_with_one_warning(
    pair: Cluster, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair.create_database("other_store")  # a store of its own, on the same standby
    elsewhere = pair.url(pair.replica_port, "other_store")
    caplog.set_level(logging.WARNING, "mnestoma.replicas")
    with (
        Mnestoma(pair.primary_url, replicas=[elsewhere]) as store,
        Mnestoma(pair.primary_url) as other,
    ):
        other.record_passing("a", "1", "b", "2")
        pair.wait_caught_up()
        for _ in range(3):
            assert len(store.edges()) == 1  # the primary's, never the other store's none
        stats = store.replica_stats()
        (replica,) = stats["replicas"]
        assert (replica["reads"], replica["skips"], stats["refused"]) == (0, 1, 1)
        assert replica["skipped"]
        assert replica["reason"] == "it is database 'other_store', the primary's is 'mnestoma'"
        warnings = [r for r in caplog.records if r.name == "mnestoma.replicas"]
        assert len(warnings) == 1 and "is not used" in warnings[0].getMessage()
    monkeypatch.setenv("MNESTOMA_REPLICA_URLS", elsewhere)
    status = CliRunner().invoke(cli, ["status", "--database-url", pair.primary_url])
    assert status.exit_code == 0, status.output
    assert (
        f"replica    {elsewhere}: not a replica of this store (it is database 'other_store', "
        "the primary's is 'mnestoma'): not used for reads"
    ) in status.output


@pytest.mark.parametrize(
    ("command", "separator"),
    [
        (["status"], " "),
        (["status"], ","),  # as before: a comma before the next URL's scheme
        (["suggest", "a"], " "),
        (["edges"], "\n"),
        (["vet", "a", "b"], " "),
    ],
)
def test_the_command_line_reads_a_replica_url_whose_password_holds_a_comma(
    pair: Cluster, monkeypatch: pytest.MonkeyPatch, command: list[str], separator: str
) -> None:
    with Mnestoma(pair.primary_url) as store:
        store.record_passing("a", "1", "b", "2")
    pair.wait_caught_up()
    # the server trusts the connection: the password is only carried, and must stay hidden
    secret = pair.replica_url.replace("postgres@", "postgres:Top,Secret99@")
    # two URLs, one with a comma of its own
    monkeypatch.setenv("MNESTOMA_REPLICA_URLS", f"{secret}{separator}{pair.replica_url}")
    result = CliRunner().invoke(cli, [*command, "--database-url", pair.primary_url])
    assert result.exit_code == 0, result.output
    assert "Top" not in result.output and "Secret99" not in result.output
    if command == ["status"]:
        hidden = pair.replica_url.replace("postgres@", "postgres:***@")
        assert f"replica    {hidden}: standby, lag 0.0 s" in result.output
        assert f"replica    {pair.replica_url}: standby, lag 0.0 s" in result.output


@pytest.mark.parametrize("command", [["status"], ["suggest", "a"], ["edges"], ["vet", "a", "b"]])
def test_the_command_line_never_echoes_a_replica_url_it_cannot_read(
    monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    # a port that is not a number: not a URL, and its password must not show
    monkeypatch.setenv(
        "MNESTOMA_REPLICA_URLS",
        "postgresql://app:Top,Secret99@db.example:port/mnestoma postgresql://app@db2/mnestoma",
    )
    result = CliRunner().invoke(
        cli, [*command, "--database-url", "postgresql+psycopg://app@127.0.0.1:1/mnestoma"]
    )
    assert result.exit_code == 2, result.output
    assert "Top" not in result.output and "Secret99" not in result.output
    assert "MNESTOMA_REPLICA_URLS: its 1st URL (of 2) is not a database URL" in result.output


def test_the_replica_urls_of_the_environment_are_split_on_spaces_and_before_a_scheme() -> None:
    assert split_replica_urls(
        " postgresql://app:Top,Secret99@h1/db\tpostgresql://a@h2/db,postgresql+psycopg://a@h3/db,"
    ) == [
        "postgresql://app:Top,Secret99@h1/db",
        "postgresql://a@h2/db",
        "postgresql+psycopg://a@h3/db",
    ]
    assert split_replica_urls("postgresql://a@h1/db , postgresql://a@h2/db") == [
        "postgresql://a@h1/db",
        "postgresql://a@h2/db",
    ]
    assert split_replica_urls(" , ") == []


@pytest.mark.parametrize("replicas", [5, 3.5, object()])
def test_replicas_that_are_not_a_list_of_urls_are_bad_input_on_both_doors(
    store_url: str, replicas: object
) -> None:
    for door in (Mnestoma, AsyncMnestoma):
        with pytest.raises(InvalidInput, match="replicas must be a list of URLs, got"):
            door(store_url, replicas=replicas)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, -1, float("nan"), "2", True])
def test_a_bad_replica_read_timeout_is_refused_when_the_settings_are_built(value: object) -> None:
    with pytest.raises(InvalidInput, match="replica_read_timeout"):
        Settings(replica_read_timeout=value)  # type: ignore[arg-type]
