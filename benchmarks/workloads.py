"""The workloads, each runnable on the package (SQLite or PostgreSQL) or on the baseline.

A *store* is either a :class:`mnestoma.Mnestoma` or a :class:`benchmarks.baseline.Baseline`:
both offer the same five methods. ``impl`` names which one: ``package``, ``baseline`` or
``package-pg``, and for the writers only ``baseline-pg`` (:class:`PgBaseline`, the package's
schema by hand) and ``lean-pg`` (:class:`LeanLoop`, two plain tables of its own); ``where``
is a SQLite file path or a PostgreSQL URL.
"""

from __future__ import annotations

import random
import resource
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from mnestoma.store.repository import MAX_WALK_LIMIT

from . import lean_pg
from .baseline import Baseline
from .baseline_pg import PgBaseline, psycopg_conninfo
from .data import NOW, FixedClock
from .lean_pg import LeanLoop
from .lock_hold import HAND_WRITTEN, HoldTimes, install_lock_marks, timing_lock_holds

__all__ = [
    "Edge",
    "PeakMemory",
    "ager_once",
    "ager_summary",
    "edge_snapshot",
    "make_big_store_turns",
    "make_edges",
    "make_turns",
    "open_store",
    "path_ids",
    "run_record_passing",
    "run_record_turn",
    "run_suggest",
    "run_walk",
    "run_writers",
    "summary",
]

Edge = tuple[str, str, str, str]
HOT_EDGE: Edge = ("planner", "1", "search", "1")
# The implementations that run on PostgreSQL, and the table each one's hot edge lives in.
POSTGRESQL_IMPLS = {"package-pg": "mnests", "baseline-pg": "mnests", "lean-pg": "lean_edges"}


def _url(impl: str, where: str) -> str:
    if impl in POSTGRESQL_IMPLS:
        return where
    return f"sqlite:///{Path(where).absolute()}"


def open_store(impl: str, where: str, clock: Any = None) -> Any:
    """The package's facade or the baseline on ``where``, with a stopped clock at NOW."""
    clock = clock if clock is not None else FixedClock(NOW)
    if impl == "baseline":
        return Baseline(where, clock=clock)
    if impl == "baseline-pg":
        return PgBaseline(where, clock=clock)
    if impl == "lean-pg":
        return LeanLoop(where, clock=clock)
    from mnestoma import Mnestoma

    return Mnestoma(_url(impl, where), clock=clock)


@contextmanager
def _reading(impl: str, where: str) -> Iterator[Any]:
    """A connection to the store, on an engine of its own that is disposed afterwards."""
    from sqlalchemy import create_engine

    url = _url(impl, where)
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


# --- the recording workloads ----------------------------------------------------------------


def make_edges(n: int, prefix: str = "t") -> list[Edge]:
    """``n`` distinct active edges."""
    return [(f"{prefix}{i}", "1", f"{prefix}{i + 1}", "2") for i in range(n)]


def run_record_passing(store: Any, edges: Sequence[Edge], repeats: int, seed: int = 3) -> float:
    """One ``record_passing`` per call (one transaction each) over ``edges``, each edge
    ``repeats`` times in a shuffled order; returns the seconds taken."""
    calls = [e for e in edges for _ in range(repeats)]
    random.Random(seed).shuffle(calls)
    record = store.record_passing
    start = time.perf_counter()
    for e in calls:
        record(*e)
    return time.perf_counter() - start


def make_turns(turns: int, size: int, pool: int, seed: int = 5) -> list[tuple[str, list[Edge]]]:
    """``turns`` turns of ``size`` distinct passings drawn from ``pool`` edges."""
    rng = random.Random(seed)
    edges = make_edges(pool, prefix="u")
    return [(f"turn-{t}", rng.sample(edges, size)) for t in range(turns)]


def make_big_store_turns(
    executors: int, turns: int, size: int, seed: int = 19
) -> list[tuple[str, list[Edge]]]:
    """Turns for a store holding :func:`benchmarks.data.graph_rows`: in each turn, half the
    passings reinforce edges of the graph and half create new edges."""
    from .data import graph_rows

    rng = random.Random(seed)
    wanted = turns * (size // 2)
    step = max(1, executors * 10 // max(1, wanted))
    existing = [
        (r[1], r[2], r[3], r[4]) for i, r in enumerate(graph_rows(executors)) if i % step == 0
    ][:wanted]
    out = []
    for t in range(turns):
        old = existing[t * (size // 2) : (t + 1) * (size // 2)]
        new = [
            (f"e{rng.randrange(executors)}", "1", f"n{t}-{k}", "1") for k in range(size - len(old))
        ]
        out.append((f"big-turn-{t}", old + new))
    return out


def run_record_turn(store: Any, turns: Sequence[tuple[str, list[Edge]]]) -> float:
    """One ``record_turn`` per turn; returns the seconds taken."""
    start = time.perf_counter()
    for turn_id, passings in turns:
        store.record_turn(turn_id, passings)
    return time.perf_counter() - start


# --- reading --------------------------------------------------------------------------------


def path_ids(path: Sequence[Any]) -> tuple[str, ...]:
    """The ids along a path of Mnest objects or baseline rows."""
    return tuple(m.id if hasattr(m, "id") else m[0] for m in path)


def run_walk(
    store: Any, sources: Sequence[str], depth: int = 3
) -> tuple[list[float], list[list[tuple[str, ...]]]]:
    """One walk per source after one untimed warm-up; per-call seconds and the paths.

    The package is asked for every path (its default stops at ``WALK_LIMIT``), as the
    baseline returns them all.
    """
    every = {} if isinstance(store, Baseline | PgBaseline) else {"limit": MAX_WALK_LIMIT}
    store.walk(sources[0], max_depth=depth, **every)
    times, found = [], []
    for src in sources:
        start = time.perf_counter()
        paths = store.walk(src, max_depth=depth, **every)
        times.append(time.perf_counter() - start)
        found.append([path_ids(p) for p in paths])
    return times, found


def run_suggest(
    store: Any, sources: Sequence[str], k: int = 5
) -> tuple[list[float], list[list[str]]]:
    """One ``suggest_next`` per source after one untimed warm-up; per-call seconds and ids."""
    store.suggest_next(sources[0], k=k)
    times, found = [], []
    for src in sources:
        start = time.perf_counter()
        hits = store.suggest_next(src, k=k)
        times.append(time.perf_counter() - start)
        found.append([path_ids([m])[0] for m, _w in hits])
    return times, found


# --- the ager -------------------------------------------------------------------------------


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _proc_status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (Linux), so that VmHWM is the peak from now on."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """Peak resident memory growth of this process over a block, in MB.

    Linux: the peak mark is reset on entry, so ``growth`` = peak during the block − RSS at
    entry. Elsewhere: the ``ru_maxrss`` high-water mark's growth (a lower bound).
    """

    def __enter__(self) -> PeakMemory:
        self._exact = _reset_peak() and _proc_status_mb("VmRSS") is not None
        self.before = (_proc_status_mb("VmRSS") if self._exact else None) or _maxrss_mb()
        return self

    def __exit__(self, *exc: object) -> None:
        self.peak = (_proc_status_mb("VmHWM") if self._exact else None) or _maxrss_mb()
        self.growth = max(0.0, self.peak - self.before)


def ager_once(
    impl: str,
    where: str,
    now: datetime = NOW,
    *,
    one_transaction: bool = False,
    batch_rows: int | None = None,
) -> dict[str, Any]:
    """Open a store, run the ager once; seconds, peak-RSS growth (MB) and its report. The
    package's facade runs it in batches (of ``batch_rows`` rows when given); with
    ``one_transaction``, a unit of work runs it whole, as before batches (the baseline
    always runs one transaction).

    Run it in a fresh process to read the memory figure: ``ru_maxrss`` is a high-water mark.
    """
    store = open_store(impl, where, FixedClock(now))
    try:
        store.suggest_next("warm-up")  # connections, pragmas and imports before the baseline
        with PeakMemory() as mem:
            start = time.perf_counter()
            if one_transaction and hasattr(store, "unit_of_work"):
                with store.unit_of_work() as unit:
                    report = unit.mnests.apply_ager()
                    unit.commit()
            elif batch_rows is not None:
                report = store.apply_ager(batch_rows=batch_rows)
            else:
                report = store.apply_ager()
            seconds = time.perf_counter() - start
    finally:
        store.close()
    fields = report if isinstance(report, dict) else _report_dict(report)
    return {
        "seconds": seconds,
        "rss_growth_mb": mem.growth,
        "rss_peak_mb": mem.peak,
        "report": fields,
    }


def _report_dict(report: Any) -> dict[str, int]:
    keys = ("decayed", "to_decaying", "merged", "protos_pruned", "archive_candidates")
    return {k: int(getattr(report, k)) for k in keys}


# --- concurrent writers ---------------------------------------------------------------------


def _writer(
    impl: str,
    where: str,
    calls: int,
    barrier: Any,
    results: Any,
    use_real_clock: bool,
    timed_here: bool,
) -> None:
    """One writer: ``calls`` passings on the hot edge; puts its outcome on ``results`` (calls
    done and failed, start and end, the lock holds). ``timed_here``: this writer times its
    own lock holds (a process); the threads of one process are timed by :func:`run_writers`
    instead."""
    from datetime import UTC

    clock = (lambda: datetime.now(UTC)) if use_real_clock else None
    store = open_store(impl, where, clock)
    ok = failed = 0
    times: HoldTimes | None = None
    try:
        store.suggest_next("warm-up")
        with _timed(impl, store, timed_here) as times:
            barrier.wait()
            start = time.perf_counter()
            for _ in range(calls):
                try:
                    store.record_passing(*HOT_EDGE)
                    ok += 1
                except Exception:
                    failed += 1
            end = time.perf_counter()
    finally:
        store.close()
    results.put({"ok": ok, "failed": failed, "start": start, "end": end, **_held(times)})


def _held(times: HoldTimes | None) -> dict[str, Any]:
    """What ``times`` recorded, as plain data (empty without it)."""
    if times is None:
        return {"holds": [], "server_holds": [], "return_holds": [], "unmarked_locks": 0}
    return {
        "holds": list(times.holds),
        "server_holds": list(times.server_holds),
        "return_holds": list(times.return_holds),
        "unmarked_locks": times.unmarked_locks,
    }


@contextmanager
def _timed(impl: str, store: Any, timed_here: bool) -> Iterator[HoldTimes | None]:
    """This writer's lock holds, timed for the block when ``timed_here`` (a process); a
    baseline's thread marks them into its run's shared record (see :func:`run_writers`)."""
    if timed_here:
        with timing_lock_holds(impl, store) as times:
            yield times
        return
    shared = _RUN_HOLDS.get(impl)
    if shared is not None:
        store.holds = shared
    yield None


# The lock holds of a run of writer threads, per implementation (see run_writers).
_RUN_HOLDS: dict[str, HoldTimes] = {}


def _spread(xs: Sequence[float]) -> dict[str, float]:
    """Median, 10th and 90th percentile of ``xs`` (nan when empty)."""
    if not xs:
        return {"median": float("nan"), "p10": float("nan"), "p90": float("nan")}
    ys = sorted(xs)
    at = lambda q: ys[min(len(ys) - 1, int(q * len(ys)))]  # noqa: E731
    return {"median": statistics.median(ys), "p10": at(0.1), "p90": at(0.9)}


def _prepare_postgresql(impl: str, where: str) -> None:
    """Before a race on PostgreSQL: the lean loop's tables, and the server's grant and
    commit marks on the hot table (:mod:`benchmarks.lock_hold`)."""
    if impl == "lean-pg":
        lean_pg.create_tables(where)
    install_lock_marks(psycopg_conninfo(where), POSTGRESQL_IMPLS[impl])


def _hot_edge_counts(impl: str, where: str) -> tuple[int, int]:
    """The hot edge's ``uses`` and the number of reinforcement events."""
    if impl == "lean-pg":
        return lean_pg.counts(where, HOT_EDGE)
    from sqlalchemy import text

    with _reading(impl, where) as conn:
        uses = conn.execute(
            text(
                "SELECT uses FROM mnests WHERE src_executor = :s AND src_version = :sv"
                " AND dst_executor = :d AND dst_version = :dv AND state = 'active'"
            ),
            dict(zip(("s", "sv", "d", "dv"), HOT_EDGE, strict=True)),
        ).scalar_one()
        reinforced = conn.execute(
            text("SELECT count(*) FROM events WHERE kind = 'reinforced'")
        ).scalar_one()
    return int(uses), int(reinforced)


def run_writers(
    impl: str, where: str, writers: int, calls: int, *, processes: bool = True
) -> dict[str, Any]:
    """``writers`` concurrent writers on one hot edge; calls/s, the lost-update check, and
    how long each call held the write lock (:mod:`benchmarks.lock_hold`): ``hold_us`` timed
    by the client; on PostgreSQL ``server_hold_us`` from the server's grant mark to its
    commit mark, ``return_hold_us`` from the grant mark to ``COMMIT``'s return at the
    client."""
    import multiprocessing
    import queue as queue_mod

    if impl in POSTGRESQL_IMPLS:
        _prepare_postgresql(impl, where)
    store = open_store(impl, where)
    store.record_passing(*HOT_EDGE)  # the edge exists before the race: uses starts at 1
    store.close()
    if processes:
        ctx = multiprocessing.get_context("spawn")
        barrier, results = ctx.Barrier(writers), ctx.Queue()
        workers: list[Any] = [
            ctx.Process(target=_writer, args=(impl, where, calls, barrier, results, True, True))
            for _ in range(writers)
        ]
        for w in workers:
            w.start()
        outcomes = [results.get(timeout=600) for _ in workers]
        for w in workers:
            w.join()
    else:
        barrier, results = threading.Barrier(writers), queue_mod.Queue()
        workers = [
            threading.Thread(
                target=_writer, args=(impl, where, calls, barrier, results, True, False)
            )
            for _ in range(writers)
        ]
        with _threads_timed(impl) as times:
            for w in workers:
                w.start()
            outcomes = [results.get(timeout=600) for _ in workers]
            for w in workers:
                w.join()
        outcomes[0] = {**outcomes[0], **_held(times)}  # the threads' holds, timed as one
    ok = sum(o["ok"] for o in outcomes)
    failed = sum(o["failed"] for o in outcomes)
    elapsed = max(o["end"] for o in outcomes) - min(o["start"] for o in outcomes)
    holds = [h for o in outcomes for h in o["holds"]]
    server_holds = [h for o in outcomes for h in o["server_holds"]]
    return_holds = [h for o in outcomes for h in o["return_holds"]]
    uses, reinforced = _hot_edge_counts(impl, where)
    return {
        "calls": ok,
        "failed": failed,
        "seconds": elapsed,
        "calls_per_s": ok / elapsed if elapsed > 0 else float("nan"),
        "uses": uses,
        "lost": (1 + ok) - uses,
        "reinforced_events": reinforced,
        "hold_us": {k: v * 1e6 for k, v in _spread(holds).items()},
        "holds": len(holds),
        "server_hold_us": {k: v * 1e6 for k, v in _spread(server_holds).items()},
        "server_holds": len(server_holds),
        "return_hold_us": {k: v * 1e6 for k, v in _spread(return_holds).items()},
        "return_holds": len(return_holds),
        "unmarked_locks": sum(o["unmarked_locks"] for o in outcomes),
    }


@contextmanager
def _threads_timed(impl: str) -> Iterator[HoldTimes]:
    """The lock holds of a run of writer threads in this process: the package's functions
    wrapped once for all of them, the baselines' threads marking into one shared record."""
    if impl in HAND_WRITTEN:
        times = _RUN_HOLDS[impl] = HoldTimes()
        try:
            yield times
        finally:
            del _RUN_HOLDS[impl]
        return
    with timing_lock_holds(impl) as times:
        yield times


# --- what a run left behind -----------------------------------------------------------------


def summary(impl: str, where: str) -> dict[str, Any]:
    """Aggregates to compare two stores: rows, uses and weights by state, events by kind."""
    from sqlalchemy import text

    with _reading(impl, where) as conn:
        states = {
            r[0]: (int(r[1]), int(r[2]), round(float(r[3]), 6))
            for r in conn.execute(
                text(
                    "SELECT state, count(*), sum(uses), sum(weight) FROM mnests"
                    " GROUP BY state ORDER BY state"
                )
            )
        }
        events = {
            r[0]: int(r[1])
            for r in conn.execute(
                text("SELECT kind, count(*) FROM events GROUP BY kind ORDER BY kind")
            )
        }
    return {"states": states, "events": events}


def ager_summary(impl: str, where: str, now: datetime = NOW) -> dict[str, Any]:
    """What an ager run leaves, in aggregates both engines compute alike: rows per state
    (count, uses, weights, rows anchored at ``now``, days from first to last passing),
    events per (kind, state before, state after) (count, weights, recorded by the ager),
    and the number of ``ager_runs`` rows."""
    from sqlalchemy import text

    with _reading(impl, where) as conn:
        pg = conn.dialect.name == "postgresql"
        days = (
            "extract(epoch FROM ts_last - ts_first) / 86400.0"
            if pg
            else "julianday(ts_last) - julianday(ts_first)"
        )
        states = {
            r[0]: (int(r[1]), int(r[2]), float(r[3]), int(r[4]), float(r[5]))
            for r in conn.execute(
                text(
                    "SELECT state, count(*), sum(uses), sum(weight),"
                    f" sum(CASE WHEN ts_weight = :now THEN 1 ELSE 0 END), sum({days})"
                    " FROM mnests GROUP BY state"
                ),
                {"now": now if pg else now.strftime("%Y-%m-%d %H:%M:%S.%f")},
            )
        }
        events = {
            (r[0], r[1], r[2]): (int(r[3]), float(r[4]), float(r[5]), int(r[6]))
            for r in conn.execute(
                text(
                    "SELECT kind, coalesce(state_before, ''), coalesce(state_after, ''),"
                    " count(*), coalesce(sum(weight_before), 0), coalesce(sum(weight_after), 0),"
                    " sum(CASE WHEN recorder = 'ager' THEN 1 ELSE 0 END)"
                    " FROM events GROUP BY 1, 2, 3"
                )
            )
        }
        runs = int(conn.execute(text("SELECT count(*) FROM ager_runs")).scalar_one())
    return {"states": states, "events": events, "runs": runs}


def edge_snapshot(impl: str, where: str) -> list[tuple[Any, ...]]:
    """Every row's key, state, uses and weight (rounded), sorted: equal for equal work."""
    from sqlalchemy import text

    with _reading(impl, where) as conn:
        rows = conn.execute(
            text(
                "SELECT src_executor, src_version, dst_executor, dst_version, state, uses,"
                " weight FROM mnests"
            )
        ).all()
    return sorted((*r[:6], round(float(r[6]), 9)) for r in rows)
