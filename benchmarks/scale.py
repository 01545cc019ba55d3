"""The store past one server: status, and reads through a replica, on a large PostgreSQL store
with writers running, open loop.

``python -m benchmarks.scale [--events N | --large | --huge] [--only NAME[,NAME]]
[--writers W] [--period-ms MS] [--seconds S] [--sqlite] [--json FILE]``

It starts a PostgreSQL primary and a streaming replica of its own (``benchmarks.replication``:
the server's binaries, free ports, a temporary folder), builds on the primary a store of
``N / 33`` mnests and ``N`` events in SQL (1M by default, a few minutes here; ``--large``
10M, ``--huge`` 100M), lets the replica catch up, then runs each measurement of
:data:`MEASUREMENTS` in turn. Each is a function ``(Context) -> dict`` of figures; another
measurement is one more function and one more entry.

- ``status``: ``collect_status`` (the catalogue's estimates) and ``collect_status(exact=True)``
  (a scan), interleaved, while ``W`` writers record passings; the ratio is exact / estimated.
  With ``--sqlite``, the same store's events in a SQLite file, whose status is exact;
- ``replica_reads``: ``vet`` of a 4-step chain and ``suggest_next`` through a facade with the
  replica, and the same through its ``primary`` view, interleaved, while ``W`` writers
  saturate the primary (a call due every ``MS`` ms each): p50 / p99 of each, and the ratio;
- ``replica_lag``: the replica's lag (seconds, as the package measures it, and WAL bytes
  behind the primary) sampled every 50 ms during a burst of ``W`` writers, and the time it
  takes to catch up after it;
- ``capacity``: what a capacity plan starts from: the database's size, the events' (their
  partitions with their indexes) and the mnests', bytes per event and per mnest, and the
  WAL one passing writes (``W`` writers through the package for ``S`` seconds);
- ``retention``: ``prune_events`` of the older half (the first six of the store's twelve
  months, dropped whole; the ``created`` events of the edges among them kept), while 4
  writers record passings at the store's newest month: its time, the writers' p50 / p99 /
  max, the database's size before and after (the disk given back), and who waited for
  whom meanwhile (``benchmarks.locks``: ``pg_stat_activity`` and ``pg_locks`` sampled);
- ``split``: ``split_history`` of a store of its own upgraded from before 0015 (the run's
  mnests and events over twelve months, all in the partition 0011 made of the history),
  while 4 writers record passings into it, then ``prune_events`` of the older half of the
  months it made: each one's time, the writers' figures and who waited for whom;
- ``upgrade``: ``upgrade`` 0002 → head of a store of its own on the primary (300,000
  mnests and ``N`` events, 10M at most: ``--large`` and ``--huge``) while writers of the
  previous release write raw SQL (``benchmarks.writer_latency``'s upgrade phase).

The store's events span twelve months (partitioned by month), a twelfth of them in each:
each edge's ``created`` event at an instant of its own drawn over the year (so half of them
lie in the older half, and retention keeps them), its reinforcements spread over the year.

Figures on a shared machine are noisy: compare the ratios, not the times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from .data import graph_rows, load_postgresql, load_sqlite
from .locks import LockSampler, StatementTimes, writer_url
from .replication import Cluster, binaries_missing
from .writer_latency import (
    OpenLoop,
    RunningClock,
    add_events,
    api_writer,
    database_mb,
    make_months,
    month_after,
    percentile,
    pick_edges,
    settle,
    summarize,
)

EVENTS_PER_MNEST = 33  # 10M events on 300k mnests, as the issue measured
DEGREE = 10  # edges per executor in the built graph


@dataclass
class Context:
    """What every measurement works on: the pair, its store and the run's settings."""

    cluster: Cluster
    events: int
    mnests: int
    writers: int
    period_s: float
    seconds: float
    sqlite: bool
    workdir: Path
    edges: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    first: datetime = datetime(2000, 1, 1, tzinfo=UTC)  # the first month of the events


def build(ctx: Context) -> dict[str, Any]:
    """The store on the primary: ``mnests`` active edges by COPY, ``events`` in SQL over
    :data:`MONTHS` months (:func:`add_year_of_events`), VACUUM ANALYZE; the replica caught
    up."""
    started = time.perf_counter()
    executors = max(ctx.mnests // DEGREE, DEGREE + 2)
    rows = load_postgresql(ctx.cluster.primary_url, graph_rows(executors, DEGREE))
    per_row = max(1, round(ctx.events / rows))
    events, ctx.first = add_year_of_events(ctx.cluster.primary_url, per_row)
    ctx.cluster.wait_caught_up(timeout=3600)
    ctx.edges = pick_edges(ctx.cluster.primary_url, 400)
    return {
        "mnests": rows,
        "events": events,
        "months": MONTHS,
        "first_month": ctx.first.isoformat(),
        "build_s": round(time.perf_counter() - started, 1),
    }


MONTHS = 12  # the months the built store's events span
_SPAN = f"interval '{MONTHS * 30} days'"
# Each edge's created event at an instant of its own over the months (from its id's hash),
# its reinforcements spread over all of them from there (steps of the golden ratio's
# fraction, modulo the span): the events of a month are a twelfth of all.
_STEP = "0.6180339887"
_CREATED_AT = "SELECT id, weight, state, (hashtext(id)::bigint & 65535) / 65536.0 AS u FROM mnests"


def add_year_of_events(url: str, per_row: int) -> tuple[int, datetime]:
    """Events over :data:`MONTHS` months from the first month the store's partitions
    leave free (every partition made first): each row's ``created`` event at its own
    instant, and ``per_row - 1`` ``reinforced`` events spread evenly over the months; then
    VACUUM ANALYZE and a CHECKPOINT (:func:`~benchmarks.writer_latency.settle`). How many
    events, and the first month's start."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            first = make_months(conn, MONTHS)
            conn.execute(
                text(
                    f"WITH c AS ({_CREATED_AT}) INSERT INTO events (mnest_id, kind, ts,"
                    f" weight_after, state_after) SELECT id, 'created', :first + {_SPAN} * u,"
                    " weight, state FROM c"
                ),
                {"first": first},
            )
            conn.execute(
                text(
                    f"WITH c AS ({_CREATED_AT}) INSERT INTO events (mnest_id, kind, ts,"
                    " weight_before, weight_after, state_before, state_after)"
                    f" SELECT c.id, 'reinforced', :first + {_SPAN} * (c.u + s * {_STEP}"
                    f" - floor(c.u + s * {_STEP})), c.weight, c.weight, c.state, c.state"
                    " FROM c CROSS JOIN generate_series(1, :more) AS s"
                ),
                {"first": first, "more": per_row - 1},
            )
            count = int(conn.execute(text("SELECT count(*) FROM events")).scalar_one())
        settle(engine)
        return count, first
    finally:
        engine.dispose()


# While ``status`` is measured: the writers, 4 threads each due every 10 ms.
STATUS_WRITERS, STATUS_PERIOD_S = 4, 0.010


def _writer_process(
    url: str,
    edges: list[Any],
    n: int,
    period: float,
    stop: Any,
    out: Any,
    at: datetime | None = None,
) -> None:
    """In a process of its own (the writers must not share the GIL with what is measured):
    ``n`` open-loop writers until ``stop`` is set; their window sent back on ``out``. With
    ``at``, their clock starts there (else the system's)."""
    from mnestoma import Mnestoma

    clock = None if at is None else RunningClock(at, time.monotonic())
    store = Mnestoma(writer_url(url), clock=clock)
    loop = OpenLoop(api_writer(store, edges, n), n, period)
    t0 = loop.start()
    out.send("started")
    stop.wait()
    calls = loop.stop(time.monotonic())
    store.close()
    out.send((t0, calls))


class Writers:
    """Open-loop writers recording passings through a facade of their own, in a child
    process: ``with Writers(...) as w: ...``, then ``w.figures``."""

    def __init__(
        self,
        ctx: Context,
        writers: int | None = None,
        period_s: float | None = None,
        at: datetime | None = None,
        url: str | None = None,
        edges: list[Any] | None = None,
    ):
        spawn = get_context("spawn")
        self._stop = spawn.Event()
        self._receive, send = spawn.Pipe(duplex=False)
        args = (
            url or ctx.cluster.primary_url,
            edges or ctx.edges,
            writers or ctx.writers,
            period_s or ctx.period_s,
            self._stop,
            send,
            at,
        )
        self._process = spawn.Process(target=_writer_process, args=args, daemon=True)
        self.figures: dict[str, Any] = {}
        self.calls: list[Any] = []

    def __enter__(self) -> Writers:
        self._process.start()
        # the measurement begins once the writers run (a loaded machine takes seconds to
        # start a Python process)
        if not self._receive.poll(300) or self._receive.recv() != "started":
            raise RuntimeError("the writers' process did not start")
        time.sleep(1.0)  # their first calls: the primary is busy before the measurement
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._receive.poll(900):
            t0, self.calls = self._receive.recv()
            self.figures = _window(summarize(self.calls, t0))
        self._process.join(30)

    def window(self, lo: float, hi: float) -> dict[str, Any]:
        """The writers' figures for the calls due between ``lo`` and ``hi`` (monotonic)."""
        return _window(summarize(self.calls, lo, hi))


def _ms(values: Sequence[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    p50, p99 = percentile(ordered, 0.5), percentile(ordered, 0.99)
    return {
        "n": len(ordered),
        "p50_ms": None if p50 is None else round(p50 * 1e3, 2),
        "p99_ms": None if p99 is None else round(p99 * 1e3, 2),
        "max_ms": round(ordered[-1] * 1e3, 2) if ordered else None,
    }


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def measure_status(ctx: Context) -> dict[str, Any]:
    """``status`` estimated and exact, interleaved, with writers running."""
    from mnestoma.maintenance.status import collect_status

    url = ctx.cluster.primary_url
    estimated: list[float] = []
    exact: list[float] = []
    shown = collect_status(url)
    with Writers(ctx, STATUS_WRITERS, STATUS_PERIOD_S) as writers:
        for _ in range(3):
            estimated.append(_timed(lambda: collect_status(url)))
            exact.append(_timed(lambda: collect_status(url, exact=True)))
            estimated.append(_timed(lambda: collect_status(url)))
    figures: dict[str, Any] = {
        "estimated": shown.estimated,
        "events_shown": shown.events,
        "estimated_s": round(statistics.median(estimated), 3),
        "exact_s": round(statistics.median(exact), 3),
        "ratio_exact_to_estimated": round(
            statistics.median(exact) / statistics.median(estimated), 1
        ),
        "writers": writers.figures,
    }
    if ctx.sqlite:
        figures["sqlite"] = _sqlite_status(ctx)
    return figures


def _sqlite_status(ctx: Context) -> dict[str, Any]:
    """The same numbers of mnests and events in a SQLite file; its (exact) status."""
    import mnestoma
    from mnestoma.maintenance.status import collect_status

    path = ctx.workdir / "scale.sqlite"
    url = f"sqlite:///{path}"
    mnestoma.upgrade(url)
    executors = max(ctx.mnests // DEGREE, DEGREE + 2)
    rows = load_sqlite(str(path), graph_rows(executors, DEGREE))
    add_events(url, max(1, round(ctx.events / rows)))
    times = [_timed(lambda: collect_status(url)) for _ in range(3)]
    exact = _timed(lambda: collect_status(url, exact=True))
    shown = collect_status(url)
    return {
        "estimated": shown.estimated,
        "events_shown": shown.events,
        "status_s": round(statistics.median(times), 3),
        "exact_s": round(exact, 3),
    }


def _window(w: Any) -> dict[str, Any]:
    return {
        "calls": w.calls,
        "p50_ms": w.p50_ms and round(w.p50_ms, 2),
        "p99_ms": w.p99_ms and round(w.p99_ms, 2),
        "max_ms": w.max_ms and round(w.max_ms, 2),
        "errors": w.errors,
    }


def _chain(store: Any) -> list[str]:
    """A 4-step chain the store knows (3 active edges in a row)."""
    for edge in store.edges(limit=50):
        for path in store.walk(edge.src_executor, max_depth=3):
            if len(path) == 3:
                return [path[0].src_executor, *(m.dst_executor for m in path)]
    raise RuntimeError("no path of 3 edges in the store")


def measure_replica_reads(ctx: Context) -> dict[str, Any]:
    """``vet`` of a 4-step chain and ``suggest_next`` on the replica and on the primary,
    interleaved, while the writers saturate the primary."""
    from mnestoma import Mnestoma

    reader = Mnestoma(ctx.cluster.primary_url, replicas=[ctx.cluster.replica_url])
    chain = _chain(reader.primary)
    src = chain[0]
    reads: dict[str, list[float]] = {
        "vet_replica": [],
        "vet_primary": [],
        "suggest_replica": [],
        "suggest_primary": [],
    }
    with Writers(ctx) as writers:
        end = time.monotonic() + ctx.seconds
        while time.monotonic() < end:
            reads["vet_replica"].append(_timed(lambda: reader.vet(chain)))
            reads["vet_primary"].append(_timed(lambda: reader.primary.vet(chain)))
            reads["suggest_replica"].append(_timed(lambda: reader.suggest_next(src, "1")))
            reads["suggest_primary"].append(_timed(lambda: reader.primary.suggest_next(src, "1")))
    stats = reader.replica_stats()
    reader.close()
    figures: dict[str, Any] = {name: _ms(values) for name, values in reads.items()}
    for what in ("vet", "suggest"):
        primary, replica = figures[f"{what}_primary"], figures[f"{what}_replica"]
        if primary["p99_ms"] and replica["p99_ms"]:
            figures[f"{what}_p99_replica_to_primary"] = round(
                replica["p99_ms"] / primary["p99_ms"], 2
            )
    figures["replica_served"] = stats["replicas"][0]["reads"]
    figures["primary_served"] = stats["primary_reads"]
    figures["writers"] = writers.figures
    return figures


def measure_replica_lag(ctx: Context) -> dict[str, Any]:
    """The replica's lag, sampled every 50 ms during a write burst, and its catch-up."""
    from sqlalchemy import create_engine, text

    from mnestoma.schema.sql.replication import REPLICA_PROBE

    primary = create_engine(ctx.cluster.primary_url, isolation_level="AUTOCOMMIT")
    replica = create_engine(ctx.cluster.replica_url, isolation_level="AUTOCOMMIT")
    lags: list[float] = []
    behind: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        with primary.connect() as p, replica.connect() as r:
            while not stop.is_set():
                here = p.execute(text("SELECT pg_current_wal_lsn()::text")).scalar_one()
                _standby, replayed, _received, lag = r.execute(REPLICA_PROBE).one()
                diff = r.execute(
                    text("SELECT pg_wal_lsn_diff(:a, :b)"), {"a": here, "b": replayed}
                ).scalar_one()
                lags.append(float(lag or 0.0))
                behind.append(int(diff))
                time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    with Writers(ctx) as writers:
        sampler.start()
        time.sleep(ctx.seconds)
    stop.set()
    sampler.join()
    caught = _timed(lambda: ctx.cluster.wait_caught_up(timeout=600))
    primary.dispose()
    replica.dispose()
    ordered_lag, ordered_bytes = sorted(lags), sorted(behind)
    return {
        "samples": len(lags),
        "lag_p50_s": percentile(ordered_lag, 0.5),
        "lag_p99_s": percentile(ordered_lag, 0.99),
        "lag_max_s": ordered_lag[-1] if lags else None,
        "behind_p99_bytes": percentile(ordered_bytes, 0.99),
        "behind_max_bytes": ordered_bytes[-1] if behind else None,
        "catch_up_after_s": round(caught, 3),
        "writers": writers.figures,
    }


def _pruned(
    ctx: Context,
    store: Any,
    url: str,
    before: datetime,
    *,
    at: datetime | None = None,
    edges: list[Any] | None = None,
) -> dict[str, Any]:
    """``store.prune_events(before)`` with 4 open-loop writers (at ``at``, else now) and the
    waits sampled: its time, the writers' figures, the database's size before and after."""
    size_before = database_mb(url)
    with (
        Writers(ctx, STATUS_WRITERS, STATUS_PERIOD_S, at=at, url=url, edges=edges) as writers,
        LockSampler(url) as sampler,
        StatementTimes() as statements,
    ):
        started = time.monotonic()
        deleted = store.prune_events(before)
        ended = time.monotonic()
        statements.stop()
        time.sleep(0.5)  # the writers' calls the drop delayed end before they stop
    return {
        "before": before.isoformat(),
        "deleted": deleted,
        "prune_s": round(ended - started, 2),
        "database_mb_before": size_before,
        "database_mb_after": database_mb(url),
        "writers_during": writers.window(started, ended),
        "writers": writers.figures,
        "waits": sampler.summary(started - 0.5, ended + 0.5),
        "statements": statements.summary(),
    }


def measure_retention(ctx: Context) -> dict[str, Any]:
    """``prune_events`` of the older half of the months, with writers at the newest."""
    from mnestoma import Mnestoma

    url = ctx.cluster.primary_url
    before = month_after(ctx.first, MONTHS // 2)
    newest = month_after(ctx.first, MONTHS - 1) + timedelta(days=3)
    store = Mnestoma(url)
    try:
        return _pruned(ctx, store, url, before, at=newest)
    finally:
        store.close()


# The sizes a capacity plan starts from: the database, events (its partitions and their
# indexes), mnests, the side table of turns.
_SIZES = """
SELECT pg_database_size(current_database()),
       (SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c
        WHERE c.relkind = 'r' AND c.relispartition
          AND c.relname ~ '^events_' ),
       pg_total_relation_size('mnests'),
       pg_total_relation_size('event_turn_edges'),
       (SELECT count(*) FROM pg_class c WHERE c.relispartition AND c.relname ~ '^events_'
          AND c.relkind IN ('r', 'p')),
       (SELECT count(*) FROM mnests)
"""


def measure_capacity(ctx: Context) -> dict[str, Any]:
    """What a capacity plan needs: bytes on disk per event and per mnest, and the WAL one
    passing writes (8 writers through the package at the store's newest month for the
    run's seconds: WAL bytes between the primary's positions before and after, over the
    passings recorded)."""
    from sqlalchemy import create_engine, text

    url = ctx.cluster.primary_url
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    newest = month_after(ctx.first, MONTHS - 1) + timedelta(days=3)
    try:
        with engine.connect() as conn:
            database, events, mnests, turns, partitions, rows = conn.execute(text(_SIZES)).one()
            lsn0 = conn.execute(text("SELECT pg_current_wal_lsn()::text")).scalar_one()
            with Writers(ctx, at=newest) as writers:
                time.sleep(ctx.seconds)
            lsn1 = conn.execute(text("SELECT pg_current_wal_lsn()::text")).scalar_one()
            wal = int(
                conn.execute(
                    text("SELECT pg_wal_lsn_diff(:b, :a)"), {"a": lsn0, "b": lsn1}
                ).scalar_one()
            )
    finally:
        engine.dispose()
    calls = writers.figures.get("calls") or 0
    per_passing = wal / calls if calls else None
    return {
        "database_mb": round(int(database) / 1e6, 1),
        "events_mb": round(int(events) / 1e6, 1),
        "mnests_mb": round(int(mnests) / 1e6, 1),
        "event_turn_edges_mb": round(int(turns) / 1e6, 1),
        "partitions": int(partitions),
        "bytes_per_event": round(int(events) / max(1, ctx.events), 1),
        "bytes_per_mnest": round(int(mnests) / max(1, int(rows)), 1),
        "passings": calls,
        "wal_bytes": wal,
        "wal_bytes_per_passing": None if per_passing is None else round(per_passing),
        "wal_gb_per_day_at_1000_per_s": None
        if per_passing is None
        else round(per_passing * 1000 * 86400 / 1e9, 1),
        "writers": writers.figures,
    }


# The store split-history rebuilds: the history of a store from before 0015, in the
# partition that holds everything before the bound revision 0011 set.
SPLIT_DATABASE = "scale_split"


def _old_layout_store(ctx: Context) -> tuple[str, datetime, int]:
    """A database of its own on the primary, built as a store upgraded from before 0015
    holds its history: at revision 0014, the run's mnests and events over the
    :data:`MONTHS` months before the partition of everything before 0011's bound ends (so
    every event lies in that one partition, the current month's writes too), then
    upgraded to head (0015 leaves a partition that holds rows as it is). Its URL, the
    first month, and how many events."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    import mnestoma

    admin = create_engine(ctx.cluster.primary_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {SPLIT_DATABASE}"))
        conn.execute(text(f"CREATE DATABASE {SPLIT_DATABASE}"))
    admin.dispose()
    url = (
        make_url(ctx.cluster.primary_url)
        .set(database=SPLIT_DATABASE)
        .render_as_string(hide_password=False)
    )
    mnestoma.upgrade(url, "0014")
    executors = max(ctx.mnests // DEGREE, DEGREE + 2)
    rows = load_postgresql(url, graph_rows(executors, DEGREE))
    per_row = max(1, round(ctx.events / rows))
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            bound = conn.execute(
                text("SELECT max(upper) FROM mnestoma_events_bounds() WHERE lower = '-infinity'")
            ).scalar_one()
            first = month_after(bound, -MONTHS)
            for statement, more in ((_CREATED_SQL, 0), (_REINFORCED_SQL, per_row - 1)):
                conn.execute(text(statement), {"first": first, "more": more})
            count = int(conn.execute(text("SELECT count(*) FROM events")).scalar_one())
        settle(engine)
    finally:
        engine.dispose()
    mnestoma.upgrade(url)
    return url, first, count


_CREATED_SQL = (
    f"WITH c AS ({_CREATED_AT}) INSERT INTO events (mnest_id, kind, ts, weight_after,"
    f" state_after) SELECT id, 'created', :first + {_SPAN} * u, weight, state FROM c"
)
_REINFORCED_SQL = (
    f"WITH c AS ({_CREATED_AT}) INSERT INTO events (mnest_id, kind, ts, weight_before,"
    f" weight_after, state_before, state_after) SELECT c.id, 'reinforced',"
    f" :first + {_SPAN} * (c.u + s * {_STEP} - floor(c.u + s * {_STEP})), c.weight,"
    " c.weight, c.state, c.state FROM c CROSS JOIN generate_series(1, :more) AS s"
)


def measure_split(ctx: Context) -> dict[str, Any]:
    """``split_history`` of a store upgraded from before 0015 (every event in one
    partition), with 4 open-loop writers recording passings now (into that partition,
    mirrored); then ``prune_events`` of the older half of the months it made, with the
    writers again: each one's time, the writers' figures and who waited for whom."""
    from mnestoma import Mnestoma

    url, first, count = _old_layout_store(ctx)
    edges = pick_edges(url, 400)
    store = Mnestoma(url)
    figures: dict[str, Any] = {"events": count, "first_month": first.isoformat()}
    try:
        waiting = store.split_history(dry_run=True).waiting
        figures["partitions_waiting"] = [p.as_dict() for p in waiting]
        with (
            Writers(ctx, STATUS_WRITERS, STATUS_PERIOD_S, url=url, edges=edges) as writers,
            LockSampler(url) as sampler,
        ):
            started = time.monotonic()
            report = store.split_history()
            ended = time.monotonic()
            time.sleep(0.5)
        figures["split"] = {
            "split_s": round(ended - started, 1),
            "months": len(report.months),
            "copied": report.copied,
            "batches": report.batches,
            "writers_during": writers.window(started, ended),
            "waits": sampler.summary(started, ended),
        }
        before = month_after(first, MONTHS // 2)
        figures["retention"] = _pruned(ctx, store, url, before, edges=edges)
    finally:
        store.close()
    return figures


UPGRADE_MNESTS = 300_000  # an old store: 300,000 mnests and (at most) 10M events
UPGRADE_EVENTS_MAX = 10_000_000


def measure_upgrade(ctx: Context) -> dict[str, Any]:
    """``upgrade`` 0002 → head of a store of its own on the primary (``UPGRADE_MNESTS``
    mnests and the run's events, :data:`UPGRADE_EVENTS_MAX` at most), writers of the
    previous release running."""
    from .writer_latency import Settings, run

    per_row = max(1, round(min(ctx.events, UPGRADE_EVENTS_MAX) / UPGRADE_MNESTS))
    found = run(
        ["postgresql"],
        [UPGRADE_MNESTS],
        Settings(phases=("upgrade",), events_per_row=per_row),
        postgresql=ctx.cluster.primary_url,
    )
    (result,) = found["results"]
    return {
        "events": result.detail.get("events"),
        "upgrade_s": None if result.maintenance_s is None else round(result.maintenance_s, 1),
        "writers": _window(result.window),
        "result": result.detail.get("result"),
    }


# Each measurement: its name and its function (Context -> figures). More are added here.
MEASUREMENTS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "status": measure_status,
    "replica_reads": measure_replica_reads,
    "replica_lag": measure_replica_lag,
    "capacity": measure_capacity,
    "retention": measure_retention,
    "split": measure_split,
    "upgrade": measure_upgrade,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--events", type=int, default=1_000_000, help="events in the store")
    size.add_argument("--large", action="store_const", const=10_000_000, dest="events")
    size.add_argument("--huge", action="store_const", const=100_000_000, dest="events")
    parser.add_argument("--only", default=",".join(MEASUREMENTS), help="measurements to run")
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--period-ms", type=float, default=10.0, help="each writer's period")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of a read/lag run")
    parser.add_argument("--sqlite", action="store_true", help="also SQLite's status")
    parser.add_argument("--json", type=Path, help="write the figures there too")
    args = parser.parse_args(argv)
    missing = binaries_missing()
    if missing is not None:
        print(f"cannot start a primary and a replica: {missing}", file=sys.stderr)
        return 2
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in MEASUREMENTS]
    if unknown:
        parser.error(f"unknown measurement(s): {', '.join(unknown)}")
    cluster = Cluster()
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mnestoma-scale-") as workdir:
        try:
            cluster.start()
            ctx = Context(
                cluster,
                args.events,
                max(args.events // EVENTS_PER_MNEST, 100),
                args.writers,
                args.period_ms / 1e3,
                args.seconds,
                args.sqlite,
                Path(workdir),
            )
            report["store"] = build(ctx)
            print(json.dumps({"store": report["store"]}), flush=True)
            for name in chosen:
                report[name] = MEASUREMENTS[name](ctx)
                print(json.dumps({name: report[name]}), flush=True)
        finally:
            cluster.stop()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
