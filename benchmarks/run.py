"""Run every workload on the package and on the baseline, interleaved, and print a table.

``python -m benchmarks [--quick] [--postgresql URL] [--only NAME[,NAME]] [--rounds N]``

Ratios are package time / baseline time (lower is better; 1.0 means as fast as
hand-written ``sqlite3``). The exit status is 1 when a consistency check fails (the package
and the baseline disagree after the same work); a missed performance target only prints MISS.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from . import workloads as w
from .data import (
    PostgresServer,
    SqliteFiles,
    ager_rows,
    demoting_rows,
    graph_rows,
    graph_sources,
)

__all__ = ["FULL", "QUICK", "WORKLOADS", "Check", "Report", "Result", "Sizes", "main", "run"]

PKG, BASE, PG, BASE_PG = "package", "baseline", "package-pg", "baseline-pg"
LEAN_PG = "lean-pg"
# The targets the report checks (package / hand-written loop), as the performance issues set
# them: a call, a turn, and the SQLite lock hold under 8 writers.
PASSING_TARGET = 2.0
TURN_TARGET = 1.1
SQLITE_HOLD_TARGET = 1.0
PG_IMPLS = (PG, BASE_PG, LEAN_PG)
LABELS = {
    PKG: "package SQLite",
    BASE: "baseline sqlite3",
    PG: "package PostgreSQL",
    BASE_PG: "baseline psycopg",
    LEAN_PG: "lean psycopg loop",
}
WORKLOADS = (
    "record_passing",
    "record_turn",
    "apply_ager",
    "ager_batches",
    "walk",
    "suggest_next",
    "writers",
)


@dataclass(frozen=True)
class Sizes:
    """How big each workload is and how many rounds it runs."""

    rounds: int
    passing_edges: int
    passing_repeats: int
    turns: int
    turn_size: int
    turn_pool: int
    ager_sizes: tuple[int, ...]
    ager_rounds: int
    batches_sizes: tuple[int, ...]  # the ager's default run against its one-batch run
    graph_executors: int
    walk_sources: int
    big_turns: int
    suggest_calls: int
    writers: int
    writer_calls: int
    writer_rounds: int
    isolate: bool  # ager in a fresh process (memory figures), writers as processes


FULL = Sizes(
    rounds=5,
    passing_edges=1_000,
    passing_repeats=3,
    turns=200,
    turn_size=50,
    turn_pool=2_000,
    ager_sizes=(100_000, 300_000, 1_000_000),
    ager_rounds=3,
    batches_sizes=(200_000, 1_000_000),
    graph_executors=100_000,
    walk_sources=5,
    big_turns=20,
    suggest_calls=200,
    writers=8,
    writer_calls=250,
    writer_rounds=7,
    isolate=True,
)
QUICK = Sizes(
    rounds=1,
    passing_edges=50,
    passing_repeats=2,
    turns=4,
    turn_size=50,
    turn_pool=120,
    ager_sizes=(2_000, 5_000, 10_000),
    ager_rounds=1,
    batches_sizes=(5_000,),
    graph_executors=1_000,
    walk_sources=2,
    big_turns=2,
    suggest_calls=20,
    writers=8,
    writer_calls=10,
    writer_rounds=1,
    isolate=False,
)


@dataclass
class Result:
    """One measured figure for each implementation, and package / baseline."""

    workload: str
    metric: str
    values: dict[str, float | None]
    ratio: float | None = None
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Verdict:
    """One performance target: what it asks, what was measured, PASS or MISS."""

    target: str
    measured: str
    ok: bool | None  # None: not measured in this run


@dataclass
class Check:
    """A consistency check between implementations (never about time)."""

    name: str
    ok: bool
    detail: str = ""


@dataclass
class Report:
    """Everything one run measured."""

    mode: str
    machine: str
    results: list[Result] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    curve: list[dict[str, Any]] = field(default_factory=list)
    wall_seconds: dict[str, float] = field(default_factory=dict)
    load: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    @property
    def consistent(self) -> bool:
        """True when every consistency check passed."""
        return all(c.ok for c in self.checks)


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def _ratio(values: dict[str, float | None]) -> float | None:
    p, b = values.get(PKG), values.get(BASE)
    return p / b if p and b else None


class Bench:
    """Databases and implementations for one run."""

    def __init__(self, sizes: Sizes, folder: Path, pg: PostgresServer | None) -> None:
        self.sizes = sizes
        self.files = SqliteFiles(folder)
        self.pg = pg
        self.impls = [PKG, BASE] + ([PG] if pg else [])

    def order(self, r: int, impls: Sequence[str] | None = None) -> list[str]:
        """The implementations in round ``r``'s order (rotated: interleaved, no fixed first)."""
        xs = list(impls or self.impls)
        k = r % len(xs)
        return xs[k:] + xs[:k]

    def _side(self, impl: str) -> Any:
        return self.pg if impl in PG_IMPLS else self.files

    def fresh(self, impl: str, name: str, rows: Callable[[], Any] | None = None) -> str:
        """A writable copy of template ``name`` for ``impl``: a file path or a URL."""
        side = self._side(impl)
        made = side.clone(name, rows)
        return side.url(made) if impl in PG_IMPLS else str(made)

    def shared(self, impl: str, name: str, rows: Callable[[], Any] | None = None) -> str:
        """Template ``name`` itself, for read-only workloads."""
        side = self._side(impl)
        made = side.template(name, rows)
        return side.url(made) if impl in PG_IMPLS else str(made)

    def discard(self, impl: str, where: str) -> None:
        """Throw away a copy made by :meth:`fresh`."""
        if impl in PG_IMPLS:
            assert self.pg is not None
            self.pg.discard(where.rsplit("/", 1)[-1].split("?", 1)[0])
        else:
            self.files.discard(where)

    def close(self) -> None:
        """Drop every database and file of this run."""
        self.files.close()
        if self.pg is not None:
            self.pg.close()


# --- the workloads as benchmark steps -------------------------------------------------------


def _compare(
    report: Report, name: str, per_impl: dict[str, Any], same: Callable[[Any, Any], bool]
) -> None:
    ref = per_impl.get(BASE)
    for impl, value in per_impl.items():
        if impl == BASE or ref is None:
            continue
        ok = same(value, ref)
        detail = "" if ok else f"{impl}: {_short(value)} vs baseline: {_short(ref)}"
        report.checks.append(Check(f"{name}: {impl} agrees with baseline", ok, detail))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 300 else text[:300] + "..."


def bench_record_passing(b: Bench, report: Report) -> None:
    """Per-call record_passing, one transaction each, over distinct edges."""
    s = b.sizes
    edges = w.make_edges(s.passing_edges)
    calls = len(edges) * s.passing_repeats
    per_call: dict[str, list[float]] = {i: [] for i in b.impls}
    snaps: dict[str, Any] = {}
    for r in range(s.rounds):
        for impl in b.order(r):
            where = b.fresh(impl, "empty")
            store = w.open_store(impl, where)
            store.record_passing("warm", "1", "up", "1")
            seconds = w.run_record_passing(store, edges, s.passing_repeats)
            store.close()
            if r == 0:
                snaps[impl] = w.edge_snapshot(impl, where)
            b.discard(impl, where)
            per_call[impl].append(seconds / calls * 1e6)
    values: dict[str, float | None] = {i: _median(v) for i, v in per_call.items()}
    ratio = _ratio(values)
    report.results.append(
        Result(
            "record_passing",
            f"µs per call ({len(edges)} edges × {s.passing_repeats})",
            values,
            ratio,
        )
    )
    report.verdicts.append(
        Verdict(
            f"record_passing ratio ≤ {PASSING_TARGET}",
            _fmt(ratio, "×"),
            _le(ratio, PASSING_TARGET),
        )
    )
    _compare(report, "record_passing rows", snaps, lambda a, b_: a == b_)


def bench_record_turn(b: Bench, report: Report) -> None:
    """record_turn with turns of ``turn_size`` passings; passings per second."""
    s = b.sizes
    turns = w.make_turns(s.turns, s.turn_size, s.turn_pool)
    passings = s.turns * s.turn_size
    seconds: dict[str, list[float]] = {i: [] for i in b.impls}
    snaps: dict[str, Any] = {}
    for r in range(s.rounds):
        for impl in b.order(r):
            where = b.fresh(impl, "empty")
            store = w.open_store(impl, where)
            store.record_turn("warm-up", [("warm", "1", "up", "1"), ("warm", "1", "up2", "1")])
            seconds[impl].append(w.run_record_turn(store, turns))
            # A retried turn is a no-op (the turn's edges count once).
            store.record_turn(*turns[0])
            store.close()
            if r == 0:
                snaps[impl] = w.edge_snapshot(impl, where)
            b.discard(impl, where)
    med = {i: _median(v) for i, v in seconds.items()}
    rates: dict[str, float | None] = {i: passings / t for i, t in med.items()}
    ratio = _ratio(dict(med))
    report.results.append(
        Result(
            "record_turn",
            f"passings/s (turns of {s.turn_size}, {passings} passings)",
            rates,
            ratio,
            "ratio = package time / baseline time",
        )
    )
    report.verdicts.append(
        Verdict(
            f"record_turn ratio ≤ {TURN_TARGET}",
            f"{_fmt(ratio, '×')} ({_fmt(rates.get(PKG), ' /s')};"
            f" sqlite3 by hand: {_fmt(rates.get(BASE), ' /s')})",
            _le(ratio, TURN_TARGET),
        )
    )
    _compare(report, "record_turn rows", snaps, lambda a, b_: a == b_)
    _record_turn_into_big_store(b, report)


def _record_turn_into_big_store(b: Bench, report: Report) -> None:
    """record_turn into a store that already holds the whole graph: half the passings
    reinforce existing edges, half create new ones. Shows whether the lookup of a turn's
    edges uses the edge-key index or scans the table."""
    s = b.sizes
    rows = _graph_rows(b)
    turns = w.make_big_store_turns(s.graph_executors, s.big_turns, s.turn_size)
    passings = s.big_turns * s.turn_size
    seconds: dict[str, list[float]] = {i: [] for i in b.impls}
    sums: dict[str, Any] = {}
    for impl in b.impls:
        b.shared(impl, "graph", rows)
    for r in range(min(s.rounds, 3)):
        for impl in b.order(r):
            where = b.fresh(impl, "graph", rows)
            store = w.open_store(impl, where)
            seconds[impl].append(w.run_record_turn(store, turns))
            store.close()
            if r == 0:
                sums[impl] = w.summary(impl, where)
            b.discard(impl, where)
    med = {i: _median(v) for i, v in seconds.items()}
    rates: dict[str, float | None] = {i: passings / t for i, t in med.items()}
    report.results.append(
        Result(
            "record_turn",
            f"passings/s into a {s.graph_executors * 10:,}-edge store ({passings} passings)",
            rates,
            _ratio(dict(med)),
            "ratio = package time / baseline time",
        )
    )
    _compare(report, "record_turn into a big store", sums, _same_summary)


def _ager_job(
    impl: str, where: str, one_transaction: bool = False, batch_rows: int | None = None
) -> dict[str, Any]:
    return w.ager_once(impl, where, one_transaction=one_transaction, batch_rows=batch_rows)


def _same_summary(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a["events"] != b["events"] or a["states"].keys() != b["states"].keys():
        return False
    for state, (count, uses, weight) in a["states"].items():
        c2, u2, w2 = b["states"][state]
        if count != c2 or uses != u2 or abs(weight - w2) > 1e-6 * max(1.0, abs(w2)):
            return False
    return True


def _same_ager_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal rows per state (count, uses, weights, anchors) and equal events per kind and
    states (count, weights), sums compared to a relative 1e-9; one ager_runs row each."""

    def close(x: Any, y: Any) -> bool:
        return all(
            v1 == v2 if isinstance(v1, int) else abs(v1 - v2) <= 1e-9 * max(1.0, abs(v2))
            for v1, v2 in zip(x, y, strict=True)
        )

    return (
        a["runs"] == b["runs"] == 1
        and a["states"].keys() == b["states"].keys()
        and a["events"].keys() == b["events"].keys()
        and all(close(a["states"][k], b["states"][k]) for k in a["states"])
        and all(close(a["events"][k], b["events"][k]) for k in a["events"])
    )


# The ager's data shapes: the mixed store (28 % of rows change state, with merges and
# archive candidates) and the mostly-demoting one (93 % change state, no merge).
AGER_SHAPES: dict[str, tuple[str, Callable[[int], Any]]] = {
    "mixed": ("mixed store", ager_rows),
    "demoting": ("mostly-demoting store", demoting_rows),
}


def bench_apply_ager(b: Bench, report: Report) -> None:
    """apply_ager on growing tables of both shapes: time, peak-memory growth, the curve."""
    s = b.sizes
    pool = (
        ProcessPoolExecutor(1, mp_context=get_context("spawn"), max_tasks_per_child=1)
        if s.isolate
        else None
    )
    try:
        for shape in AGER_SHAPES:
            for n in s.ager_sizes:
                _ager_size(b, report, shape, n, pool)
    finally:
        if pool is not None:
            pool.shutdown()
    _ager_verdicts(report, s)


def ager_rows_of(shape: str, n: int) -> Callable[[], Any]:
    """The rows of ``n``-row store of ``shape``, as a factory for the templates."""
    make = AGER_SHAPES[shape][1]

    def rows() -> Any:
        return make(n)

    return rows


def run_ager_rounds(
    b: Bench,
    shape: str,
    n: int,
    impls: Sequence[str],
    pool: Any,
    rounds: int,
    *,
    one_transaction: bool = False,
) -> dict[str, Any]:
    """``rounds`` interleaved runs of the ager per implementation on fresh copies of one
    template: times, memory, and the first round's reports and end states (the package's
    ager in one transaction with ``one_transaction``, else in batches)."""
    name = f"ager-{shape}-{n}"
    rows = ager_rows_of(shape, n)
    out: dict[str, Any] = {
        k: {i: [] for i in impls} for k in ("seconds", "rss_growth_mb", "rss_peak_mb")
    }
    out["report"], out["state"] = {}, {}
    for impl in impls:  # build the templates before timing anything
        b.shared(impl, name, rows)
    for r in range(rounds):
        for impl in b.order(r, impls):
            where = b.fresh(impl, name, rows)
            # Start each run with no write-back pending (of the copy just made, or of the
            # last run's writes): it would slow down whichever run comes next.
            _sync()
            if pool is not None:
                got = pool.submit(_ager_job, impl, where, one_transaction).result()
            else:
                got = w.ager_once(impl, where, one_transaction=one_transaction)
            for k in ("seconds", "rss_growth_mb", "rss_peak_mb"):
                out[k][impl].append(got[k])
            if r == 0:
                out["report"][impl] = got["report"]
                out["state"][impl] = w.ager_summary(impl, where)
            b.discard(impl, where)
    return out


def _sync() -> None:
    """Flush the system's dirty pages to disk, where the platform can."""
    sync = getattr(os, "sync", None)
    if sync is not None:
        sync()


# The ager's run in one batch: batch_rows larger than any store, one transaction per run
# through the facade's batched path (its run lock, progress row and bounds read included).
ONE_BATCH_ROWS = 10**9
DEFAULT, ONE_BATCH = "default", "one batch"


def sync_seconds(folder: Path, rounds: int = 200) -> float:
    """The disk's sync time under ``folder``: median seconds of ``rounds`` 8 kB writes each
    followed by ``fdatasync`` (what a commit or a checkpoint waits for)."""
    path = folder / "fdatasync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    times = []
    try:
        block = b"\0" * 8192
        for _ in range(rounds):
            os.pwrite(fd, block, 0)
            start = time.perf_counter()
            (getattr(os, "fdatasync", None) or os.fsync)(fd)
            times.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times)


def run_ager_vs_one_batch(
    b: Bench, shape: str, n: int, impl: str, pool: Any, rounds: int
) -> dict[str, Any]:
    """``rounds`` runs each of the package's ager as the facade runs it by default and in
    one batch (:data:`ONE_BATCH_ROWS`), interleaved (the order alternates), each on a fresh
    copy of one template: the seconds of each, and whether the two left equal reports and
    tables (first round)."""
    name = f"ager-{shape}-{n}"
    rows = ager_rows_of(shape, n)
    b.shared(impl, name, rows)
    sizes = {DEFAULT: None, ONE_BATCH: ONE_BATCH_ROWS}
    seconds: dict[str, list[float]] = {v: [] for v in sizes}
    reports: dict[str, Any] = {}
    states: dict[str, Any] = {}
    for r in range(rounds):
        for variant in b.order(r, list(sizes)):
            where = b.fresh(impl, name, rows)
            _sync()
            if pool is not None:
                got = pool.submit(_ager_job, impl, where, False, sizes[variant]).result()
            else:
                got = w.ager_once(impl, where, batch_rows=sizes[variant])
            seconds[variant].append(got["seconds"])
            if r == 0:
                reports[variant] = got["report"]
                states[variant] = w.ager_summary(impl, where)
            b.discard(impl, where)
    return {"seconds": seconds, "report": reports, "state": states}


def bench_ager_batches(b: Bench, report: Report) -> None:
    """The ager's default run (online, in batches) against the same run in one batch, both
    shapes, SQLite and (with --postgresql) PostgreSQL, with the disk's sync time stated."""
    s = b.sizes
    sync_ms = sync_seconds(b.files.folder) * 1000
    pool = (
        ProcessPoolExecutor(1, mp_context=get_context("spawn"), max_tasks_per_child=1)
        if s.isolate
        else None
    )
    impls = [PKG] + ([PG] if b.pg else [])
    try:
        for impl in impls:
            for shape in AGER_SHAPES:
                for n in s.batches_sizes:
                    got = run_ager_vs_one_batch(b, shape, n, impl, pool, s.ager_rounds)
                    default = _median(got["seconds"][DEFAULT])
                    one = _median(got["seconds"][ONE_BATCH])
                    ratio = default / one if one else None
                    label = f"{AGER_SHAPES[shape][0]}, {n:,} rows, {LABELS[impl]}"
                    report.results.append(
                        Result(
                            "ager_batches",
                            f"apply_ager default / one batch, {label}",
                            {impl: default},
                            ratio,
                            f"seconds default {_fmt(default)} against one batch {_fmt(one)}"
                            f" (medians of {s.ager_rounds} interleaved rounds: "
                            f"{', '.join(_fmt(x) for x in got['seconds'][DEFAULT])} / "
                            f"{', '.join(_fmt(x) for x in got['seconds'][ONE_BATCH])});"
                            f" the disk's fdatasync of 8 kB: {sync_ms:.2f} ms median",
                            details=got,
                        )
                    )
                    report.verdicts.append(
                        Verdict(
                            f"apply_ager default ≤ 1.2× one batch, {label}",
                            f"{_fmt(ratio, '×')} (sync {sync_ms:.2f} ms)",
                            _le(ratio, 1.2),
                        )
                    )
                    for what, same in (
                        ("report", lambda a, b_: a == b_),
                        ("state", _same_ager_state),
                    ):
                        x, y = got[what][DEFAULT], got[what][ONE_BATCH]
                        ok = same(x, y)
                        report.checks.append(
                            Check(
                                f"apply_ager {label} {what}: default agrees with one batch",
                                ok,
                                "" if ok else f"{_short(x)} vs {_short(y)}",
                            )
                        )
    finally:
        if pool is not None:
            pool.shutdown()


def _ager_size(b: Bench, report: Report, shape: str, n: int, pool: Any) -> None:
    s = b.sizes
    label = AGER_SHAPES[shape][0]
    got = run_ager_rounds(b, shape, n, b.impls, pool, s.ager_rounds)
    t: dict[str, float | None] = {i: _median(v) for i, v in got["seconds"].items()}
    m = {i: max(v) for i, v in got["rss_growth_mb"].items()}
    ratio = _ratio(t)
    changed = _changed_share(got["report"].get(PKG), n)
    report.results.append(
        Result(
            "apply_ager",
            f"seconds, {n:,} rows, {label}",
            t,
            ratio,
            _mem_note(m, s.isolate) + (f"; {changed:.0%} of rows change state" if changed else ""),
        )
    )
    report.curve.append(
        {
            "shape": shape,
            "rows": n,
            "seconds": t,
            "us_per_row": {i: (v or 0) / n * 1e6 for i, v in t.items()},
            "rss_growth_mb": m,
            "rss_peak_mb": {i: max(v) for i, v in got["rss_peak_mb"].items()},
            "ratio": ratio,
            "report": got["report"].get(PKG),
        }
    )
    _compare(report, f"apply_ager {label} {n:,} report", got["report"], lambda a, b_: a == b_)
    _compare(report, f"apply_ager {label} {n:,} table", got["state"], _same_ager_state)


def _changed_share(fields: dict[str, int] | None, n: int) -> float | None:
    """The share of rows whose state the run changed (demoted, merged away or pruned)."""
    if not fields or not n:
        return None
    return (fields["to_decaying"] + fields["protos_pruned"]) / n


def _mem_note(m: dict[str, float], isolated: bool) -> str:
    where = "own process" if isolated else "in-process, indicative"
    return "peak RSS growth MB (" + where + "): " + ", ".join(f"{k} {v:.1f}" for k, v in m.items())


def _ager_verdicts(report: Report, s: Sizes) -> None:
    curves = {shape: [c for c in report.curve if c["shape"] == shape] for shape in AGER_SHAPES}
    if not all(curves.values()):
        return
    for shape, curve in curves.items():
        big = curve[-1]
        label = AGER_SHAPES[shape][0]
        ratio = big["ratio"]
        report.verdicts.append(
            Verdict(
                f"apply_ager {label}, {big['rows']:,} rows ≤ 1.1× best sqlite3",
                _fmt(ratio, "×"),
                _le(ratio, 1.1),
            )
        )
    big = curves["demoting"][-1]
    t_big = big["seconds"].get(PKG)
    report.verdicts.append(
        Verdict(
            f"apply_ager mostly-demoting store, {big['rows']:,} rows ≤ 15 s",
            _fmt(t_big, " s"),
            _le(t_big, 15.0),
        )
    )
    mixed = curves["mixed"]
    big, small = mixed[-1], mixed[0]
    t_big, t_small = big["seconds"].get(PKG), small["seconds"].get(PKG)
    slope = None
    if t_big and t_small and big["rows"] > small["rows"]:
        slope = math.log(t_big / t_small) / math.log(big["rows"] / small["rows"])
    report.verdicts.append(
        Verdict("apply_ager linear (log-log slope ≤ 1.15)", _fmt(slope, ""), _le(slope, 1.15))
    )
    growths = [c["rss_growth_mb"].get(PKG) for c in curves["mixed"] + curves["demoting"]]
    growth = max((g for g in growths if g is not None), default=None)
    report.verdicts.append(
        Verdict(
            f"apply_ager memory growth < 100 MB at {big['rows']:,} rows",
            _fmt(growth, " MB"),
            None if growth is None else growth < 100,
        )
    )
    ends = (mixed[-1], curves["demoting"][-1])
    pg = [(c["seconds"].get(PG), c["seconds"].get(PKG)) for c in ends]
    measured = (
        "not run (no --postgresql)"
        if pg[0][0] is None
        else ", ".join(
            f"{label}: {_fmt(p, ' s')} vs {_fmt(q, ' s')}"
            for label, (p, q) in zip(("mixed", "mostly-demoting"), pg, strict=True)
        )
    )
    report.verdicts.append(
        Verdict(
            f"apply_ager PostgreSQL, {big['rows']:,} rows ≤ SQLite",
            measured,
            None if pg[0][0] is None else all(p is not None and q and p <= q for p, q in pg),
        )
    )


def _graph_rows(b: Bench) -> Callable[[], Any]:
    n = b.sizes.graph_executors

    def rows() -> Any:
        return graph_rows(n)

    return rows


def bench_walk(b: Bench, report: Report) -> None:
    """walk(depth 3) from executors of out-degree 10 in a 10×executors-edge graph."""
    s = b.sizes
    rows = _graph_rows(b)
    sources = graph_sources(s.graph_executors, s.walk_sources)
    for impl in b.impls:
        b.shared(impl, "graph", rows)
    per_walk: dict[str, list[float]] = {i: [] for i in b.impls}
    found: dict[str, Any] = {}
    for r in range(s.rounds):
        for impl in b.order(r):
            store = w.open_store(impl, b.shared(impl, "graph", rows))
            times, paths = w.run_walk(store, sources)
            store.close()
            per_walk[impl].append(_median(times) * 1e3)
            if r == 0:
                found[impl] = paths
    values: dict[str, float | None] = {i: _median(v) for i, v in per_walk.items()}
    ratio = _ratio(values)
    n_paths = [len(p) for p in found.get(PKG, found.get(BASE, []))]
    report.results.append(
        Result(
            "walk",
            f"ms per walk, depth 3 ({s.graph_executors * 10:,} edges)",
            values,
            ratio,
            f"paths per walk: {n_paths}",
            {"paths_per_walk": {i: [len(p) for p in f] for i, f in found.items()}},
        )
    )
    report.verdicts.append(
        Verdict("walk depth 3 ≤ 1.5× baseline", _fmt(ratio, "×"), _le(ratio, 1.5))
    )
    _compare(
        report,
        "walk paths (set)",
        found,
        lambda a, b_: [sorted(x) for x in a] == [sorted(x) for x in b_],
    )
    _compare(report, "walk paths (best first)", found, _same_order)


def _same_order(a: list[list[tuple[str, ...]]], b: list[list[tuple[str, ...]]]) -> bool:
    # Paths with equal scores may come in either order; the ten best must match as sets.
    return all(set(x[:10]) == set(y[:10]) or len(x) != len(y) for x, y in zip(a, b, strict=True))


def bench_suggest_next(b: Bench, report: Report) -> None:
    """suggest_next(k=5) from many sources of the same graph; median latency."""
    s = b.sizes
    rows = _graph_rows(b)
    sources = graph_sources(s.graph_executors, s.suggest_calls, seed=17)
    per_call: dict[str, list[float]] = {i: [] for i in b.impls}
    found: dict[str, Any] = {}
    for r in range(s.rounds):
        for impl in b.order(r):
            store = w.open_store(impl, b.shared(impl, "graph", rows))
            times, ids = w.run_suggest(store, sources)
            store.close()
            per_call[impl].append(_median(times) * 1e3)
            if r == 0:
                found[impl] = ids
    values: dict[str, float | None] = {i: _median(v) for i, v in per_call.items()}
    ratio = _ratio(values)
    report.results.append(
        Result("suggest_next", f"ms per call, median of {len(sources)}", values, ratio)
    )
    med = values.get(PKG)
    report.verdicts.append(
        Verdict("suggest_next median < 5 ms", _fmt(med, " ms"), None if med is None else med < 5)
    )
    _compare(report, "suggest_next ids", found, lambda a, b_: a == b_)


def bench_writers(b: Bench, report: Report) -> None:
    """``writers`` concurrent writers on one hot edge, each engine's package against its
    hand-written loops (on PostgreSQL the psycopg reference on the package's schema and the
    lean loop on two plain tables): calls/s and how long each call held the write lock,
    medians of ``writer_rounds`` interleaved rounds (one round is a few seconds, and on a
    shared machine its rate moves by a third), each round's ratio listed; no lost update in
    any round."""
    s = b.sizes
    impls = [*([PG, BASE_PG, LEAN_PG] if b.pg else []), PKG, BASE]
    rounds: dict[str, list[dict[str, Any]]] = {i: [] for i in impls}
    for r in range(s.writer_rounds):
        for impl in b.order(r, impls):
            where = b.fresh(impl, "empty")
            o = w.run_writers(impl, where, s.writers, s.writer_calls, processes=s.isolate)
            b.discard(impl, where)
            rounds[impl].append(o)
            report.checks.append(
                Check(
                    f"writers {impl}, round {r + 1}: no lost update (uses == calls)",
                    o["lost"] == 0 and o["failed"] == 0 and o["reinforced_events"] == o["calls"],
                    f"calls={o['calls']} failed={o['failed']} uses-1={o['uses'] - 1} "
                    f"reinforced events={o['reinforced_events']}",
                )
            )
    outcome = {i: _writers_outcome(runs) for i, runs in rounds.items()}
    rates: dict[str, float | None] = {i: o["calls_per_s"] for i, o in outcome.items()}
    kind = "processes" if s.isolate else "threads"
    pairs = [(PKG, BASE)] + ([(PG, BASE_PG), (PG, LEAN_PG)] if b.pg else [])
    shares = {_pair(p): _shares(rounds[p[0]], rounds[p[1]], "calls_per_s") for p in pairs}
    holds = {_pair(p): _shares(rounds[p[0]], rounds[p[1]], "hold_us") for p in pairs}
    server_pairs = [(PG, LEAN_PG), (PG, BASE_PG)] if b.pg else []
    server_holds = {
        _pair(p): _shares(rounds[p[0]], rounds[p[1]], "server_hold_us") for p in server_pairs
    }
    return_holds = {
        _pair(p): _shares(rounds[p[0]], rounds[p[1]], "return_hold_us") for p in server_pairs
    }
    note = "lost updates: " + ", ".join(f"{i} {o['lost']}" for i, o in outcome.items())
    for pkg, ref in pairs:
        share = _over(outcome[pkg]["calls_per_s"], outcome[ref]["calls_per_s"])
        spread = _spread_text(shares[_pair((pkg, ref))])
        note += f"; {_vs(pkg, ref)} = {_fmt(share)} (medians; {spread})"
    note += (
        "; lock held per call, client-side (the locking statement returns → COMMIT returns),"
        " µs, median (p90): " + ", ".join(f"{LABELS[i]} {_us(outcome[i], 'hold')}" for i in impls)
    )
    for pkg, ref in pairs:
        hold = _over(outcome[pkg]["hold_us"], outcome[ref]["hold_us"])
        note += (
            f"; hold {_vs(pkg, ref)} = {_fmt(hold, '×')} ({_spread_text(holds[_pair((pkg, ref))])})"
        )
    if b.pg:
        note += _hold_note(
            outcome,
            server_pairs,
            server_holds,
            "server_hold",
            "lock held per call, server-side (the server's mark as the row is granted →"
            " its mark at COMMIT, before the commit record)",
            "server-side hold",
        )
        note += _hold_note(
            outcome,
            server_pairs,
            return_holds,
            "return_hold",
            "from the same mark to COMMIT returning at the client (with the WAL flush,"
            " the release and the way back)",
            "to COMMIT's return",
        )
        if outcome[PG]["unmarked_locks"]:
            note += "; " + _unmarked_text(outcome[PG]["unmarked_locks"])
    report.results.append(
        Result(
            "writers",
            f"calls/s, {s.writers} {kind} × {s.writer_calls} on one edge,"
            f" median of {s.writer_rounds}",
            rates,
            _ratio({PKG: 1 / rates[PKG], BASE: 1 / rates[BASE]}) if rates[PKG] else None,
            note,
            {
                "outcome": outcome,
                "shares": shares,
                "hold_ratios": holds,
                "server_hold_ratios": server_holds,
                "return_hold_ratios": return_holds,
            },
        )
    )
    ratios = {"calls_per_s": shares, "hold_us": holds, "server_hold_us": server_holds}
    _writers_verdicts(report, outcome, ratios, s.writers, kind)


def _hold_note(
    outcome: dict[str, Any],
    pairs: Sequence[tuple[str, str]],
    ratios: dict[str, Any],
    key: str,
    what: str,
    short: str,
) -> str:
    """The note's text for one PostgreSQL hold figure (``key``: ``server_hold`` or
    ``return_hold``): each side's median (p90), then each pair's ratio and its rounds."""
    text = f"; {what}, µs, median (p90): " + ", ".join(
        f"{LABELS[i]} {_us(outcome[i], key)}" for i in PG_IMPLS
    )
    for pkg, ref in pairs:
        hold = _over(outcome[pkg][f"{key}_us"], outcome[ref][f"{key}_us"])
        spread = _spread_text(ratios[_pair((pkg, ref))])
        text += f"; {short} {_vs(pkg, ref)} = {_fmt(hold, '×')} ({spread})"
    return text


def _writers_outcome(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One implementation's writers rounds: medians of the rounds' rates and holds."""
    return {
        "calls_per_s": _median([o["calls_per_s"] for o in runs]),
        "hold_us": _median([o["hold_us"]["median"] for o in runs]),
        "hold_p90_us": _median([o["hold_us"]["p90"] for o in runs]),
        "server_hold_us": _median([o["server_hold_us"]["median"] for o in runs]),
        "server_hold_p90_us": _median([o["server_hold_us"]["p90"] for o in runs]),
        "return_hold_us": _median([o["return_hold_us"]["median"] for o in runs]),
        "return_hold_p90_us": _median([o["return_hold_us"]["p90"] for o in runs]),
        "unmarked_locks": sum(o["unmarked_locks"] for o in runs),
        # a round with more uses than calls is as wrong as one with fewer: no cancelling
        "lost": sum(abs(o["lost"]) for o in runs),
        "failed": sum(o["failed"] for o in runs),
        "rounds": list(runs),
    }


def _writers_verdicts(
    report: Report,
    outcome: dict[str, dict[str, Any]],
    ratios: dict[str, dict[str, list[float]]],
    writers: int,
    kind: str,
) -> None:
    """The writers' targets: calls/s against each hand-written loop, the lock holds.
    ``ratios``: each round's package / loop ratio, per figure and per pair."""
    shares, holds = ratios["calls_per_s"], ratios["hold_us"]
    for pkg, ref, target, floor in (
        (PKG, BASE, f"SQLite {writers} {kind} on one edge ≥ 0.8 × sqlite3 by hand, 0 lost", 0.8),
        (PG, BASE_PG, f"PostgreSQL {writers} writers ≥ 1.3 × the psycopg reference, 0 lost", 1.3),
        (PG, LEAN_PG, f"PostgreSQL {writers} writers ≥ 1.0 × the lean psycopg loop, 0 lost", 1.0),
    ):
        mine, theirs = outcome.get(pkg), outcome.get(ref)
        if mine is None or theirs is None:
            report.verdicts.append(Verdict(target, "not run (no --postgresql)", None))
            continue
        share = mine["calls_per_s"] / theirs["calls_per_s"]
        report.verdicts.append(
            Verdict(
                target,
                f"{share:.2f} × ({mine['calls_per_s']:,.0f} /s, lost {mine['lost']};"
                f" {LABELS[ref]}: {theirs['calls_per_s']:,.0f} /s;"
                f" {_spread_text(shares[_pair((pkg, ref))])})",
                share >= floor and mine["lost"] == 0,
            )
        )
    for pkg, ref, target, ceiling in (
        (PKG, BASE, f"lock hold on SQLite ≤ {SQLITE_HOLD_TARGET} × by hand", SQLITE_HOLD_TARGET),
        (
            PG,
            BASE_PG,
            "lock hold on PostgreSQL ≤ 1.3 × the psycopg reference (client-side)",
            1.3,
        ),
    ):
        mine, theirs = outcome.get(pkg), outcome.get(ref)
        if mine is None or theirs is None:
            report.verdicts.append(Verdict(target, "not run (no --postgresql)", None))
            continue
        hold = _over(mine["hold_us"], theirs["hold_us"])
        if hold is None:
            measured = "not measured: no lock taken by a statement of its own"
            report.verdicts.append(Verdict(target, measured, None))
            continue
        report.verdicts.append(
            Verdict(
                target,
                f"{hold:.2f} × ({mine['hold_us']:.0f} µs; by hand {theirs['hold_us']:.0f} µs;"
                f" {_spread_text(holds[_pair((pkg, ref))])})",
                hold <= ceiling,
            )
        )
    target = "PostgreSQL lock hold ≤ 0.7 × the hand-written loop's (server-side)"
    mine, lean, reference = outcome.get(PG), outcome.get(LEAN_PG), outcome.get(BASE_PG)
    if mine is None or lean is None or reference is None:
        report.verdicts.append(Verdict(target, "not run (no --postgresql)", None))
        return
    hold = _over(mine["server_hold_us"], lean["server_hold_us"])
    against_ref = _over(mine["server_hold_us"], reference["server_hold_us"])
    measured = (
        f"{_fmt(hold, ' ×')} ({_us(mine, 'server_hold')} µs; lean loop"
        f" {_us(lean, 'server_hold')} µs; psycopg reference {_us(reference, 'server_hold')} µs,"
        f" package / reference {_fmt(against_ref, ' ×')};"
        f" {_spread_text(ratios['server_hold_us'][_pair((PG, LEAN_PG))])})"
    )
    ok = None if hold is None else hold <= 0.7
    if mine["unmarked_locks"]:
        measured += f"; {_unmarked_text(mine['unmarked_locks'])}"
        ok = None
    report.verdicts.append(Verdict(target, measured, ok))


def _pair(pair: tuple[str, str]) -> str:
    """The key of a package / reference pair in a report's details."""
    return f"{pair[0]}/{pair[1]}"


def _vs(pkg: str, ref: str) -> str:
    return f"{LABELS[pkg]} / {LABELS[ref]}"


def _over(a: float | None, b: float | None) -> float | None:
    """``a / b``, or None when either is missing or not a number."""
    if a is None or b is None or math.isnan(a) or math.isnan(b) or not b:
        return None
    return a / b


def _us(outcome: dict[str, Any], key: str) -> str:
    """A hold's median (p90) in µs, "–" where nothing was measured."""
    med, p90 = outcome[f"{key}_us"], outcome[f"{key}_p90_us"]
    if math.isnan(med):
        return "–"
    return f"{med:,.0f} ({p90:,.0f})"


def _unmarked_text(count: int) -> str:
    return (
        f"the package locked its row with a plain SELECT … FOR UPDATE before its write"
        f" ({count} calls), which the server does not mark: its server-side figure starts at"
        " its UPDATE, after the lock, so it is not compared"
    )


def _shares(
    mine: Sequence[dict[str, Any]], theirs: Sequence[dict[str, Any]], key: str
) -> list[float]:
    """Each round's package / reference ratio of ``key`` (rates, or hold medians)."""

    def value(o: dict[str, Any]) -> float:
        v = o[key]
        return float(v["median"] if isinstance(v, dict) else v)

    return [
        value(a) / value(z) if value(z) else math.nan for a, z in zip(mine, theirs, strict=True)
    ]


def _spread_text(ratios: Sequence[float]) -> str:
    """Each round's ratio, and their median and range."""
    ratios = [x for x in ratios if not math.isnan(x)]
    if not ratios:
        return "no rounds measured"
    each = ", ".join(f"{x:.2f}" for x in ratios)
    return f"rounds {each}: median {_median(ratios):.2f}, {min(ratios):.2f}–{max(ratios):.2f}"


STEPS: dict[str, Callable[[Bench, Report], None]] = {
    "record_passing": bench_record_passing,
    "record_turn": bench_record_turn,
    "apply_ager": bench_apply_ager,
    "ager_batches": bench_ager_batches,
    "walk": bench_walk,
    "suggest_next": bench_suggest_next,
    "writers": bench_writers,
}


# --- formatting -----------------------------------------------------------------------------


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if abs(value) >= 1000:
        text = f"{value:,.0f}"
    elif abs(value) >= 100:
        text = f"{value:.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return text + unit


def _le(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(n) for h, n in zip(headers, widths, strict=True)) + " |"
    rule = "|" + "|".join("-" * (n + 2) for n in widths) + "|"
    body = [
        "| " + " | ".join(c.ljust(n) for c, n in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    return "\n".join([line, rule, *body])


def format_report(report: Report, with_pg: bool) -> str:
    """The report as markdown tables: figures, the ager's curve, targets, checks."""
    impls = [PKG, BASE] + (list(PG_IMPLS) if with_pg else [])
    out = [f"mnestoma benchmarks ({report.mode}); {report.machine}", ""]
    headers = ["workload", "metric", *(LABELS[i] for i in impls), "ratio pkg/base"]
    rows = [
        [r.workload, r.metric, *(_fmt(r.values.get(i)) for i in impls), _fmt(r.ratio, "×")]
        for r in report.results
    ]
    if rows:
        out += [_table(headers, rows), ""]
    notes = [f"- {r.workload} ({r.metric}): {r.note}" for r in report.results if r.note]
    if notes:
        out += ["Notes:", *notes, ""]
    if report.curve:
        out += [format_curve(report.curve, with_pg), ""]
    if report.verdicts:
        vrows = [
            [v.target, v.measured, "–" if v.ok is None else ("PASS" if v.ok else "MISS")]
            for v in report.verdicts
        ]
        out += [_table(["target", "measured", "result"], vrows), ""]
        if report.mode == "quick":
            out += ["(quick mode: sizes are too small for PASS/MISS to mean anything)", ""]
    bad = [c for c in report.checks if not c.ok]
    out.append(f"consistency checks: {len(report.checks) - len(bad)}/{len(report.checks)} agree")
    out += [f"  DISAGREE {c.name}: {c.detail}" for c in bad]
    if report.load:
        out.append(
            "load average (1, 5, 15 min): "
            + ", ".join(f"{k} {' '.join(f'{x:.2f}' for x in v)}" for k, v in report.load.items())
        )
    if report.wall_seconds:
        out.append(
            "wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in report.wall_seconds.items())
        )
    return "\n".join(out)


def format_curve(curve: Sequence[dict[str, Any]], with_pg: bool) -> str:
    """The ager's scaling table: both shapes, both implementations, memory."""
    ch = [
        "store",
        "rows",
        "package s",
        "baseline s",
        "ratio",
        "package µs/row",
        "baseline µs/row",
        "package RSS growth MB",
        "baseline RSS growth MB",
    ]
    if with_pg:
        ch += ["PostgreSQL s"]
    crow = []
    for c in curve:
        line = [
            AGER_SHAPES[c["shape"]][0],
            f"{c['rows']:,}",
            _fmt(c["seconds"].get(PKG)),
            _fmt(c["seconds"].get(BASE)),
            _fmt(c["ratio"], "×"),
            _fmt(c["us_per_row"].get(PKG)),
            _fmt(c["us_per_row"].get(BASE)),
            _fmt(c["rss_growth_mb"].get(PKG)),
            _fmt(c["rss_growth_mb"].get(BASE)),
        ]
        if with_pg:
            line.append(_fmt(c["seconds"].get(PG)))
        crow.append(line)
    return "apply_ager scaling:\n" + _table(ch, crow)


def _machine(pg: PostgresServer | None) -> str:
    text = (
        f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}"
    )
    if pg is not None:
        text += ", PostgreSQL " + pg.version()
    return text


# --- entry points ---------------------------------------------------------------------------


def run(
    *,
    quick: bool = False,
    postgresql: str | None = None,
    only: Sequence[str] | None = None,
    rounds: int | None = None,
    workdir: str | None = None,
    echo: Callable[[str], None] | None = None,
) -> Report:
    """Run the chosen workloads (all by default) and return what they measured."""
    sizes = QUICK if quick else FULL
    if rounds is not None:
        sizes = replace(sizes, rounds=rounds, ager_rounds=rounds, writer_rounds=rounds)
    names = list(only) if only else list(WORKLOADS)
    unknown = [n for n in names if n not in STEPS]
    if unknown:
        raise ValueError(f"unknown workload(s) {unknown}; choose from {', '.join(WORKLOADS)}")
    with tempfile.TemporaryDirectory(prefix="mnestoma-bench-", dir=workdir) as folder:
        pg = PostgresServer(postgresql) if postgresql else None
        bench = Bench(sizes, Path(folder), pg)
        report = Report("quick" if quick else "full", _machine(pg))
        report.load["start"] = os.getloadavg()
        try:
            for name in names:
                start = time.perf_counter()
                if echo:
                    echo(f"running {name}...")
                STEPS[name](bench, report)
                report.wall_seconds[name] = time.perf_counter() - start
        finally:
            bench.close()
            report.load["end"] = os.getloadavg()
    return report


def _json_ready(value: Any) -> Any:
    """``value`` with every mapping's keys made strings (a tuple key joined by "/"), so that
    a report whose figures are keyed by (workload, size) pairs can be written as JSON."""
    if isinstance(value, dict):
        return {
            "/".join(map(str, k)) if isinstance(k, tuple) else k: _json_ready(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; exit status 1 when the implementations disagree."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round (CI)")
    parser.add_argument(
        "--postgresql", metavar="URL", help="a PostgreSQL server URL; throwaway databases"
    )
    parser.add_argument(
        "--only", metavar="NAME", help=f"comma-separated subset of: {', '.join(WORKLOADS)}"
    )
    parser.add_argument(
        "--rounds", type=int, help="rounds per workload (default 5, ager 3, writers 7)"
    )
    parser.add_argument("--workdir", help="folder for the SQLite files (default: temp)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    args = parser.parse_args(argv)
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    try:
        report = run(
            quick=args.quick,
            postgresql=args.postgresql,
            only=only,
            rounds=args.rounds,
            workdir=args.workdir,
            echo=lambda m: print(m, file=sys.stderr, flush=True),
        )
    except ValueError as err:
        parser.error(str(err))
    print(format_report(report, with_pg=bool(args.postgresql)))
    if args.json:
        Path(args.json).write_text(json.dumps(_json_ready(asdict(report)), indent=2, default=str))
    return 0 if report.consistent else 1
