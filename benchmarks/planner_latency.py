"""What ``predict_next`` costs on a big store: median and p99 per call, on SQLite.

``python -m benchmarks.planner_latency [--edges N] [--sources S] [--chains-per-edge C]
[--calls N] [--workdir DIR] [--json FILE] [--quick]``

It builds a store in a temporary folder (``mnestoma.upgrade``, then plain ``executemany``):

- ``mnests``: ``N`` active edges (1,000,000 by default) out of ``S`` executors (50,000), each
  to ``N / S`` others drawn at random, used 1 to 40 times, last within 60 days, with a
  decayed count of passings to match;
- ``mnest_chains``: for each edge ``w → x``, ``C`` chains ``w → x → y`` (2 by default), ``y``
  among ``x``'s successors: what ``record_turn`` counts when turns walk the graph.

Then ``predict_next`` on ``--calls`` contexts drawn at random (after untimed warm-up calls),
interleaved with ``suggest_next`` on the same last executor for the ratio: most are a pair
``w → x`` of the graph (the chain answers), a tenth a pair never seen (the chain is empty,
the edge answers), a tenth one executor alone. ``--quick`` builds a small store and makes a
few calls: a smoke run, its figures mean nothing.

Figures on a shared machine are noisy: compare the ratio, not the times.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import mnestoma

from .baseline import COLUMNS, format_ts
from .data import NOW, FixedClock
from .writer_latency import percentile

__all__ = ["FULL", "QUICK", "LatencyReport", "Shape", "build", "main", "measure"]

WARMUP = 50  # untimed calls before the measured ones
PAIR_SHARE = 0.8  # contexts that are a pair of the graph; the rest split below
UNSEEN_PAIR_SHARE = 0.1  # a pair never seen (the edge answers); the last tenth: one executor
LAMBDA = 0.018  # the weight's default λ, a day


@dataclass(frozen=True)
class Shape:
    """How big the store is and how many calls are timed."""

    edges: int
    sources: int
    chains_per_edge: int
    calls: int


FULL = Shape(edges=1_000_000, sources=50_000, chains_per_edge=2, calls=2_000)
QUICK = Shape(edges=2_000, sources=100, chains_per_edge=2, calls=100)


@dataclass
class LatencyReport:
    """What was built, and the figures of each call (ms), JSON-ready."""

    edges: int
    sources: int
    chains: int
    build_s: float
    calls: int
    sqlite: str
    predict_next: dict[str, float] = field(default_factory=dict)
    suggest_next: dict[str, float] = field(default_factory=dict)
    by_context: dict[str, dict[str, float]] = field(default_factory=dict)
    answered_by: dict[str, int] = field(default_factory=dict)
    ratio: float = 0.0  # predict_next's median / suggest_next's


def _successors(shape: Shape, rng: random.Random) -> list[list[int]]:
    """Each executor's distinct successors (no self-loop), ``edges / sources`` of them."""
    degree = max(1, shape.edges // shape.sources)
    out = []
    for e in range(shape.sources):
        picked = rng.sample(range(shape.sources), min(degree + 1, shape.sources))
        out.append([t for t in picked if t != e][:degree])
    return out


def _edge_rows(succ: list[list[int]], rng: random.Random) -> Iterator[tuple[Any, ...]]:
    n = 0
    for e, targets in enumerate(succ):
        for t in targets:
            age = rng.uniform(0, 60)
            last = NOW - timedelta(days=age)
            first = last - timedelta(days=rng.uniform(0, 30))
            uses = rng.randint(1, 40)
            decayed = uses * rng.uniform(0.3, 1.0)
            ts, tf = format_ts(last), format_ts(first)
            yield (f"mn_p{n:012d}", f"e{e}", "1", f"e{t}", "1", rng.uniform(0.3, 1.0), uses,
                   tf, ts, ts, LAMBDA, "active", None, None, decayed)  # fmt: skip
            n += 1


def _chain_rows(
    succ: list[list[int]], per_edge: int, rng: random.Random
) -> Iterator[tuple[Any, ...]]:
    for w, targets in enumerate(succ):
        for x in targets:
            for y in rng.sample(succ[x], min(per_edge, len(succ[x]))):
                last = NOW - timedelta(days=rng.uniform(0, 30))
                uses = rng.randint(1, 20)
                ts = format_ts(last)
                yield (f"e{w}", f"e{x}", f"e{y}", uses * rng.uniform(0.5, 1.0), uses, ts, ts)


def build(path: Path, shape: Shape, seed: int = 17) -> tuple[list[list[int]], int, float]:
    """The store of the module's docstring at ``path``: the successors of each executor, the
    chains written and the seconds it took."""
    started = time.perf_counter()
    rng = random.Random(seed)
    succ = _successors(shape, rng)
    mnestoma.upgrade(f"sqlite:///{path}")
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode = WAL")
        con.execute("PRAGMA synchronous = OFF")
        con.execute("BEGIN")
        columns = (*COLUMNS, "decayed_uses")
        con.executemany(
            f"INSERT INTO mnests ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
            _edge_rows(succ, rng),
        )
        before = con.total_changes
        con.executemany(
            "INSERT INTO mnest_chains (prev_executor, src_executor, dst_executor, decayed_uses,"
            " uses, ts_first, ts_last) VALUES (?, ?, ?, ?, ?, ?, ?)",
            _chain_rows(succ, shape.chains_per_edge, rng),
        )
        chains = con.total_changes - before
        con.execute("COMMIT")
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()
    return succ, chains, time.perf_counter() - started


def contexts(succ: list[list[int]], n: int, seed: int = 23) -> list[tuple[str, tuple[str, ...]]]:
    """``n`` contexts drawn at random, each with its kind: ``pair`` (an edge ``w → x`` of the
    graph), ``unseen pair`` (``w`` never fed ``x``) or ``one`` (``x`` alone)."""
    rng = random.Random(seed)
    out: list[tuple[str, tuple[str, ...]]] = []
    for _ in range(n):
        w = rng.randrange(len(succ))
        x = rng.choice(succ[w])
        u = rng.random()
        if u < PAIR_SHARE:
            out.append(("pair", (f"e{w}", f"e{x}")))
        elif u < PAIR_SHARE + UNSEEN_PAIR_SHARE:
            out.append(("unseen pair", (f"never{w}", f"e{x}")))
        else:
            out.append(("one", (f"e{x}",)))
    return out


def _figures(times: Sequence[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_ms": statistics.median(ordered),
        "p99_ms": percentile(ordered, 0.99) or 0.0,
        "max_ms": ordered[-1],
        "calls": len(ordered),
    }


def measure(url: str, drawn: Sequence[tuple[str, tuple[str, ...]]]) -> dict[str, Any]:
    """``predict_next`` and ``suggest_next`` on each context past the first :data:`WARMUP`
    (untimed calls of each, to warm the caches), interleaved (which goes first alternating):
    their figures, by kind of context too, and which context answered each
    ``predict_next``."""
    predict: list[float] = []
    suggest: list[float] = []
    by_kind: dict[str, list[float]] = {}
    answered: Counter[str] = Counter()
    with mnestoma.Mnestoma(url, clock=FixedClock(NOW)) as store:
        for _, ctx in drawn[:WARMUP]:
            store.predict_next(ctx)
            store.suggest_next(ctx[-1])
        for i, (kind, ctx) in enumerate(drawn[WARMUP:]):
            for which in ("predict", "suggest") if i % 2 == 0 else ("suggest", "predict"):
                t = time.perf_counter()
                if which == "predict":
                    forecast = store.predict_next(ctx)
                    ms = (time.perf_counter() - t) * 1000
                    predict.append(ms)
                    by_kind.setdefault(kind, []).append(ms)
                    answered[forecast.used.value] += 1
                else:
                    store.suggest_next(ctx[-1])
                    suggest.append((time.perf_counter() - t) * 1000)
    p, s = _figures(predict), _figures(suggest)
    return {
        "predict_next": p,
        "suggest_next": s,
        "by_context": {kind: _figures(ts) for kind, ts in by_kind.items()},
        "answered_by": dict(answered),
        "ratio": p["median_ms"] / s["median_ms"],
    }


def run(shape: Shape, workdir: str | None = None) -> LatencyReport:
    """Build the store in a temporary folder, measure, and remove it."""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = Path(tmp) / "planner-latency.sqlite"
        succ, chains, seconds = build(path, shape)
        edges = sum(len(t) for t in succ)
        figures = measure(f"sqlite:///{path}", contexts(succ, shape.calls + WARMUP))
    return LatencyReport(
        edges=edges,
        sources=shape.sources,
        chains=chains,
        build_s=round(seconds, 1),
        calls=shape.calls,
        sqlite=sqlite3.sqlite_version,
        **figures,
    )


def format_report(r: LatencyReport) -> str:
    """The figures as a table."""
    lines = [
        f"predict_next on SQLite {r.sqlite}: {r.edges:,} edges out of {r.sources:,} executors,"
        f" {r.chains:,} chains (built in {r.build_s} s); {r.calls:,} calls of each",
        "",
        "| call | median ms | p99 ms | max ms |",
        "|---|---|---|---|",
    ]
    rows = [("predict_next", r.predict_next), ("suggest_next", r.suggest_next)]
    rows += [(f"predict_next, {kind}", f) for kind, f in sorted(r.by_context.items())]
    for name, f in rows:
        lines.append(f"| {name} | {f['median_ms']:.3f} | {f['p99_ms']:.3f} | {f['max_ms']:.3f} |")
    answered = ", ".join(f"{kind} {n}" for kind, n in sorted(r.answered_by.items()))
    lines += ["", f"predict_next / suggest_next (medians): {r.ratio:.2f}; answered by: {answered}"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: the table on stdout."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.planner_latency", description=__doc__
    )
    parser.add_argument("--quick", action="store_true", help="a small store, a few calls")
    parser.add_argument("--edges", type=int, help=f"edges in the store ({FULL.edges:,})")
    parser.add_argument("--sources", type=int, help=f"executors with edges ({FULL.sources:,})")
    parser.add_argument(
        "--chains-per-edge", type=int, help=f"chains after each edge ({FULL.chains_per_edge})"
    )
    parser.add_argument("--calls", type=int, help=f"timed calls of each ({FULL.calls:,})")
    parser.add_argument("--workdir", help="folder for the SQLite file (default: temp)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    given = {f.name: getattr(args, f.name) for f in fields(Shape)}
    shape = Shape(**{k: getattr(base, k) if v is None else v for k, v in given.items()})
    if min(asdict(shape).values()) < 1 or shape.sources < 2:
        print(
            "python -m benchmarks.planner_latency: every size must be at least 1"
            " (--sources at least 2)",
            file=sys.stderr,
        )
        return 2
    report = run(shape, args.workdir)
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
