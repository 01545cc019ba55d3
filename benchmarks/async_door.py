"""The async door against the sync door: the same operations, in the same run, per engine.

``python -m benchmarks.async_door [--quick] [--rounds N] [--postgresql URL] [--json FILE]``

Per engine (SQLite; PostgreSQL too with ``--postgresql URL``, in throwaway databases on that
server), each door writes to a fresh store in every round, the doors' order alternating from
round to round; wall time, medians over rounds:

* ``record_passing`` one call after another (one transaction each): µs per call;
* ``record_turn`` of 8 passings, one turn after another: µs per turn;
* ``record_passing`` from 16 concurrent callers (threads on the sync door, tasks on one
  event loop on the async door), each alternating one hot edge and edges of its own:
  calls per second, and the hot edge's lost updates (must be 0).

Both doors run the same statements (the async door runs the sync repository through
SQLAlchemy's ``run_sync``); what differs is the hand-over: a greenlet switch per call, and on
SQLite aiosqlite's thread per statement. A third column, ``to_thread``, is the sync door
called from the event loop through ``asyncio.to_thread``: one thread hand-over per call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mnestoma
from mnestoma.doors.asynchronous import AsyncMnestoma

from .data import NOW, FixedClock, PostgresServer, SqliteFiles
from .workloads import HOT_EDGE, Edge, make_edges, make_turns

__all__ = ["DoorFigures", "main", "measure"]

TURN_SIZE = 8
CALLERS = 16
DOORS = ("sync", "async", "to_thread")


@dataclass
class Sizes:
    """How much each workload does per round."""

    edges: int = 200
    repeats: int = 5
    turns: int = 200
    calls_per_caller: int = 50

    @classmethod
    def quick(cls) -> Sizes:
        return cls(edges=20, repeats=2, turns=20, calls_per_caller=6)


@dataclass
class DoorFigures:
    """One engine's figures: each workload on the sync door and on the async door."""

    engine: str
    server: str
    record_passing_us: dict[str, float] = field(default_factory=dict)
    record_turn_us: dict[str, float] = field(default_factory=dict)
    concurrent_calls_per_s: dict[str, float] = field(default_factory=dict)
    concurrent_lost: dict[str, int] = field(default_factory=dict)


# --- the workloads, one door each ---------------------------------------------------------------


def _calls(edges: Sequence[Edge], repeats: int, seed: int = 3) -> list[Edge]:
    calls = [e for e in edges for _ in range(repeats)]
    random.Random(seed).shuffle(calls)
    return calls


def _sync_passings(store: mnestoma.Mnestoma, calls: Sequence[Edge]) -> float:
    start = time.perf_counter()
    for e in calls:
        store.record_passing(*e)
    return time.perf_counter() - start


async def _async_passings(store: AsyncMnestoma, calls: Sequence[Edge]) -> float:
    start = time.perf_counter()
    for e in calls:
        await store.record_passing(*e)
    return time.perf_counter() - start


async def _thread_passings(store: mnestoma.Mnestoma, calls: Sequence[Edge]) -> float:
    start = time.perf_counter()
    for e in calls:
        await asyncio.to_thread(store.record_passing, *e)
    return time.perf_counter() - start


def _sync_turns(store: mnestoma.Mnestoma, turns: Sequence[tuple[str, list[Edge]]]) -> float:
    start = time.perf_counter()
    for turn_id, passings in turns:
        store.record_turn(turn_id, passings)
    return time.perf_counter() - start


async def _async_turns(store: AsyncMnestoma, turns: Sequence[tuple[str, list[Edge]]]) -> float:
    start = time.perf_counter()
    for turn_id, passings in turns:
        await store.record_turn(turn_id, passings)
    return time.perf_counter() - start


async def _thread_turns(store: mnestoma.Mnestoma, turns: Sequence[tuple[str, list[Edge]]]) -> float:
    start = time.perf_counter()
    for turn_id, passings in turns:
        await asyncio.to_thread(store.record_turn, turn_id, passings)
    return time.perf_counter() - start


def _caller_calls(caller: int, calls: int) -> list[Edge]:
    own = make_edges(calls, prefix=f"c{caller}-")
    return [HOT_EDGE if k % 2 == 0 else own[k] for k in range(calls)]


def _hot_calls(calls: int) -> int:
    return CALLERS * len([k for k in range(calls) if k % 2 == 0])


def _sync_concurrent(store: mnestoma.Mnestoma, calls: int) -> tuple[float, int]:
    def caller(i: int) -> None:
        for e in _caller_calls(i, calls):
            store.record_passing(*e)

    start = time.perf_counter()
    with ThreadPoolExecutor(CALLERS) as pool:
        list(pool.map(caller, range(CALLERS)))
    elapsed = time.perf_counter() - start
    return CALLERS * calls / elapsed, _lost(store.find(*HOT_EDGE), calls)


async def _async_concurrent(store: AsyncMnestoma, calls: int) -> tuple[float, int]:
    async def caller(i: int) -> None:
        for e in _caller_calls(i, calls):
            await store.record_passing(*e)

    start = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(CALLERS)))
    elapsed = time.perf_counter() - start
    return CALLERS * calls / elapsed, _lost(await store.find(*HOT_EDGE), calls)


async def _thread_concurrent(store: mnestoma.Mnestoma, calls: int) -> tuple[float, int]:
    async def caller(i: int) -> None:
        for e in _caller_calls(i, calls):
            await asyncio.to_thread(store.record_passing, *e)

    start = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(CALLERS)))
    elapsed = time.perf_counter() - start
    return CALLERS * calls / elapsed, _lost(store.find(*HOT_EDGE), calls)


def _lost(hot: Any, calls: int) -> int:
    return _hot_calls(calls) - (hot.uses if hot is not None else 0)


# --- one engine ---------------------------------------------------------------------------------


class _Stores:
    """Fresh migrated stores on one engine: SQLite file copies or PostgreSQL clones."""

    def __init__(self, sqlite: SqliteFiles | None, pg: PostgresServer | None) -> None:
        self._sqlite, self._pg = sqlite, pg
        self._made: list[Any] = []

    def fresh(self) -> str:
        if self._pg is not None:
            db = self._pg.clone("async_door")
            self._made.append(db)
            return self._pg.url(db)
        assert self._sqlite is not None
        path = self._sqlite.clone("async_door")
        self._made.append(path)
        return self._sqlite.url(path)

    def discard_all(self) -> None:
        for made in self._made:
            (self._pg or self._sqlite).discard(made)  # type: ignore[union-attr]
        self._made.clear()


def _measure_engine(
    name: str, server: str, stores: _Stores, sizes: Sizes, rounds: int, loop: asyncio.Runner
) -> DoorFigures:
    calls = _calls(make_edges(sizes.edges), sizes.repeats)
    turns = make_turns(sizes.turns, TURN_SIZE, pool=sizes.edges)
    times: dict[str, dict[str, list[float]]] = {
        w: {d: [] for d in DOORS} for w in ("passing", "turn", "concurrent")
    }
    lost = dict.fromkeys(DOORS, 0)
    for r in range(rounds):
        for door in DOORS[r % len(DOORS) :] + DOORS[: r % len(DOORS)]:  # rotate who goes first
            for workload in ("passing", "turn", "concurrent"):
                url = stores.fresh()
                if door == "sync":
                    with mnestoma.Mnestoma(url, clock=FixedClock(NOW)) as store:
                        store.get("mn_warmupwarmup00")  # connect and check the schema first
                        if workload == "passing":
                            value = _sync_passings(store, calls) / len(calls) * 1e6
                        elif workload == "turn":
                            value = _sync_turns(store, turns) / len(turns) * 1e6
                        else:
                            value, n = _sync_concurrent(store, sizes.calls_per_caller)
                            lost["sync"] += n
                else:
                    value, n = loop.run(_async_round(door, workload, url, calls, turns, sizes))
                    lost[door] += n
                times[workload][door].append(value)
                stores.discard_all()
    med = {w: {d: statistics.median(v) for d, v in doors.items()} for w, doors in times.items()}
    return DoorFigures(
        engine=name,
        server=server,
        record_passing_us=med["passing"],
        record_turn_us=med["turn"],
        concurrent_calls_per_s=med["concurrent"],
        concurrent_lost=lost,
    )


async def _async_round(
    door: str,
    workload: str,
    url: str,
    calls: Sequence[Edge],
    turns: Sequence[tuple[str, list[Edge]]],
    sizes: Sizes,
) -> tuple[float, int]:
    if door == "to_thread":
        with mnestoma.Mnestoma(url, clock=FixedClock(NOW)) as sync:
            await asyncio.to_thread(sync.get, "mn_warmupwarmup00")
            if workload == "passing":
                return await _thread_passings(sync, calls) / len(calls) * 1e6, 0
            if workload == "turn":
                return await _thread_turns(sync, turns) / len(turns) * 1e6, 0
            return await _thread_concurrent(sync, sizes.calls_per_caller)
    async with AsyncMnestoma(url, clock=FixedClock(NOW)) as store:
        await store.get("mn_warmupwarmup00")
        if workload == "passing":
            return await _async_passings(store, calls) / len(calls) * 1e6, 0
        if workload == "turn":
            return await _async_turns(store, turns) / len(turns) * 1e6, 0
        return await _async_concurrent(store, sizes.calls_per_caller)


def measure(
    *, sizes: Sizes, rounds: int, postgresql: str | None = None, workdir: str | None = None
) -> list[DoorFigures]:
    """Both doors on SQLite, and on PostgreSQL when a server URL is given."""
    out: list[DoorFigures] = []
    folder = tempfile.TemporaryDirectory(prefix="mnestoma-async-bench-", dir=workdir)
    files = SqliteFiles(Path(folder.name))
    try:
        with asyncio.Runner() as loop:
            out.append(
                _measure_engine(
                    "sqlite",
                    f"SQLite {sqlite3.sqlite_version}",
                    _Stores(files, None),
                    sizes,
                    rounds,
                    loop,
                )
            )
            if postgresql:
                pg = PostgresServer(postgresql)
                try:
                    out.append(
                        _measure_engine(
                            "postgresql",
                            f"PostgreSQL {pg.version()}",
                            _Stores(None, pg),
                            sizes,
                            rounds,
                            loop,
                        )
                    )
                finally:
                    pg.close()
    finally:
        files.close()
        folder.cleanup()
    return out


# --- the report ---------------------------------------------------------------------------------


def format_figures(figures: Sequence[DoorFigures], rounds: int, sizes: Sizes) -> str:
    """A table: each workload on each door, and async relative to sync."""
    lines = [
        f"async door vs sync door — Python {platform.python_version()}, "
        f"{rounds} round(s), medians of wall time",
        f"{'':44}{'sync':>10}{'async':>10}{'async/sync':>12}{'to_thread':>11}",
    ]
    for f in figures:
        rows = [
            (f"record_passing (µs per call, {sizes.edges * sizes.repeats})", f.record_passing_us),
            (f"record_turn of {TURN_SIZE} (µs per turn, {sizes.turns})", f.record_turn_us),
            (f"{CALLERS} concurrent callers (calls per s)", f.concurrent_calls_per_s),
        ]
        lines.append(f.server)
        for label, value in rows:
            ratio = value["async"] / value["sync"] if value["sync"] else float("nan")
            lines.append(
                f"  {label:42}{value['sync']:>10.0f}{value['async']:>10.0f}{ratio:>12.2f}"
                f"{value['to_thread']:>11.0f}"
            )
        lines.append(
            f"  {'hot edge: lost reinforcements':42}"
            f"{f.concurrent_lost['sync']:>10}{f.concurrent_lost['async']:>10}{'':>12}"
            f"{f.concurrent_lost['to_thread']:>11}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; exit status 1 when a door lost an update of the hot edge."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.async_door", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round")
    parser.add_argument("--rounds", type=int, help="rounds (default 5; quick: 1)")
    parser.add_argument(
        "--postgresql", metavar="URL", help="a PostgreSQL server URL; throwaway databases"
    )
    parser.add_argument("--workdir", help="folder for the SQLite files (default: temp)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 5)
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    sizes = Sizes.quick() if args.quick else Sizes()
    figures = measure(sizes=sizes, rounds=rounds, postgresql=args.postgresql, workdir=args.workdir)
    print(format_figures(figures, rounds, sizes))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(f) for f in figures], indent=2))
    lost = sum(n for f in figures for n in f.concurrent_lost.values())
    return 1 if lost else 0


if __name__ == "__main__":
    raise SystemExit(main())
