"""Read replicas (contract §12) on a real PostgreSQL primary and streaming replica that the
suite starts itself (``benchmarks/replication.py``): routing, read-your-writes under concurrent
writers, a replica stopped mid-run or lagging, both doors, the command line; and SQLite,
which has no replicas.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from conftest import REQUIRE_PG

from benchmarks.replication import Cluster, binaries_missing
from mnestoma import InvalidInput, Mnestoma, Settings
from mnestoma.aio import AsyncMnestoma
from mnestoma.cli import cli

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
    """The pair with an empty store, the replica running, replaying and caught up; left so."""
    if not cluster.replica_running():
        cluster.start_replica()
    cluster.resume_replay()
    cluster.reset()
    yield cluster
    if not cluster.replica_running():
        cluster.start_replica()
    cluster.resume_replay()


# Quick to skip and to come back, for the tests.
QUICK = Settings(replica_max_lag=0.5, replica_skip=0.5)


def _stats(store: Mnestoma) -> tuple[int, int]:
    """(reads the replica served, skips) of a one-replica facade."""
    (replica,) = store.replica_stats()["replicas"]
    return replica["reads"], replica["skips"]


def test_reads_go_to_a_replica_that_has_replayed_and_never_miss_the_facades_own_write(
    pair: Cluster,
) -> None:
    with Mnestoma(pair.primary_url, replicas=[pair.replica_url]) as store:
        m = store.record_passing("plan", "1", "search", "2")
        got = store.get(m.id)  # at once: on the primary if the replica is behind
        assert got is not None and got.uses == 1
        pair.wait_caught_up()
        before, _ = _stats(store)
        for read in (
            lambda: store.get(m.id),
            lambda: store.edges(),
            lambda: store.find("plan", "1", "search", "2"),
            lambda: store.events(mnest_id=m.id),
            lambda: store.walk("plan"),
            lambda: store.suggest_next("plan", "1"),
            lambda: store.rank("plan", ["search"]),
            lambda: store.vet(["plan", "search"]),
            lambda: store.graph(),
            lambda: store.recurring_protos(),
            lambda: store.top_queries(),
        ):
            read()
        reads, skips = _stats(store)
        assert (reads - before, skips) == (11, 0)
        assert store.vet(["plan", "search"]).known


def test_writes_units_of_work_and_the_primary_view_read_the_primary(pair: Cluster) -> None:
    with (
        Mnestoma(pair.primary_url, replicas=[pair.replica_url]) as store,
        Mnestoma(pair.primary_url) as other,
    ):
        pair.pause_replay()
        other.record_passing("a", "1", "b", "2")  # another facade's write: not this one's
        assert store.edges() == []  # the replica, paused, has not replayed it: allowed
        assert len(store.primary.edges()) == 1
        with store.unit_of_work() as unit:
            assert len(unit.mnests.edges()) == 1
        reads, _ = _stats(store)
        assert reads == 1
        # the facade's own write: its reads go to the primary until the replica replays it
        store.record_passing("a", "1", "c", "2")
        assert len(store.edges()) == 2
        assert store.replica_stats()["not_caught_up"] >= 1
        assert store.prune_events(store.clock(), dry_run=True) == 0  # on the primary
        pair.resume_replay()
        pair.wait_caught_up()
        assert len(store.edges()) == 2
        assert _stats(store)[0] == reads + 1


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
        served, _ = _stats(store)
        assert store.get(m.id) is not None
        assert _stats(store) == (served + 1, 1)


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
        edges = store.edges()  # the replica lags past the bound: the primary answers
        assert len(edges) == 3
        assert store.replica_stats()["replicas"][0]["skips"] == 0  # seen once: to confirm
        time.sleep(0.2)
        assert len(store.edges()) == 3  # confirmed: skipped
        (replica,) = store.replica_stats()["replicas"]
        assert replica["skips"] == 1 and replica["lag_s"] > QUICK.replica_max_lag
        assert "lags" in replica["reason"]
        warnings = [r for r in caplog.records if r.name == "mnestoma.replicas"]
        assert len(warnings) == 1
        pair.resume_replay()
        pair.wait_caught_up()
        time.sleep(QUICK.replica_skip)
        assert len(store.edges()) == 3
        assert store.replica_stats()["replicas"][0]["reads"] >= 1


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
