"""The package's ager from 10,000 to 1,000,000 rows, on both data shapes.

``python -m benchmarks.ager_curve [--sizes N,N,...] [--shapes mixed,demoting] [--rounds N]
[--postgresql URL] [--baseline] [--one-transaction] [--workdir DIR] [--json FILE]``

Each run ages a fresh copy of a loaded store in a process of its own (so that its peak-RSS
growth is its own); the figures are medians over ``--rounds`` runs, the implementations of
one size interleaved. ``--baseline`` adds the hand-written ``sqlite3`` ager beside it.
The package's ager runs as its facade runs it, in batches; ``--one-transaction`` runs it in
one transaction instead (a unit of work's): the two runs' times give the cost of batches.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from .data import PostgresServer
from .run import (
    AGER_SHAPES,
    BASE,
    FULL,
    LABELS,
    PG,
    PKG,
    Bench,
    _changed_share,
    _fmt,
    _machine,
    _median,
    _table,
    run_ager_rounds,
)

__all__ = ["SIZES", "curve", "main"]

SIZES = (10_000, 30_000, 100_000, 300_000, 1_000_000)


def curve(
    sizes: Sequence[int] = SIZES,
    shapes: Sequence[str] = tuple(AGER_SHAPES),
    *,
    rounds: int = 3,
    postgresql: str | None = None,
    baseline: bool = False,
    one_transaction: bool = False,
    workdir: str | None = None,
    echo: Any = None,
) -> list[dict[str, Any]]:
    """One line per (shape, size): medians of seconds and µs per row, the largest peak-RSS
    growth, the share of rows whose state changed, for each implementation asked for."""
    impls = [PKG] + ([BASE] if baseline else []) + ([PG] if postgresql else [])
    lines = []
    with tempfile.TemporaryDirectory(prefix="mnestoma-ager-curve-", dir=workdir) as folder:
        pg = PostgresServer(postgresql) if postgresql else None
        bench = Bench(FULL, Path(folder), pg)
        pool = ProcessPoolExecutor(1, mp_context=get_context("spawn"), max_tasks_per_child=1)
        try:
            for shape in shapes:
                for n in sizes:
                    if echo:
                        echo(f"ager {shape} {n:,} rows...")
                    got = run_ager_rounds(
                        bench, shape, n, impls, pool, rounds, one_transaction=one_transaction
                    )
                    seconds = {i: _median(v) for i, v in got["seconds"].items()}
                    lines.append(
                        {
                            "shape": shape,
                            "rows": n,
                            "seconds": seconds,
                            "us_per_row": {i: t / n * 1e6 for i, t in seconds.items()},
                            "rss_growth_mb": {i: max(v) for i, v in got["rss_growth_mb"].items()},
                            "changed": _changed_share(got["report"].get(PKG), n),
                            "report": got["report"].get(PKG),
                        }
                    )
                    # the templates of this size are no longer needed
                    bench.files.close()
        finally:
            pool.shutdown()
            bench.close()
    return lines


def format_curve(lines: Sequence[dict[str, Any]]) -> str:
    """The curve as a markdown table."""
    impls = [i for i in (PKG, BASE, PG) if any(i in line["seconds"] for line in lines)]
    headers = ["store", "rows", "changed"]
    for i in impls:
        headers += [f"{LABELS[i]} s", f"{LABELS[i]} µs/row", f"{LABELS[i]} RSS growth MB"]
    rows = []
    for line in lines:
        row = [
            AGER_SHAPES[line["shape"]][0],
            f"{line['rows']:,}",
            "–" if line["changed"] is None else f"{line['changed']:.0%}",
        ]
        for i in impls:
            row += [
                _fmt(line["seconds"].get(i)),
                _fmt(line["us_per_row"].get(i)),
                _fmt(line["rss_growth_mb"].get(i)),
            ]
        rows.append(row)
    return _table(headers, rows)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ager_curve", description=__doc__)
    parser.add_argument("--sizes", default=",".join(str(n) for n in SIZES))
    parser.add_argument("--shapes", default=",".join(AGER_SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgresql", metavar="URL")
    parser.add_argument("--baseline", action="store_true", help="also the sqlite3 ager")
    parser.add_argument(
        "--one-transaction",
        action="store_true",
        help="the package's ager in one transaction (a unit of work), not in batches",
    )
    parser.add_argument("--workdir")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.sizes.split(",") if n.strip()]
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in AGER_SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {unknown}; choose from {', '.join(AGER_SHAPES)}")
    lines = curve(
        sizes,
        shapes,
        rounds=args.rounds,
        postgresql=args.postgresql,
        baseline=args.baseline,
        one_transaction=args.one_transaction,
        workdir=args.workdir,
        echo=lambda m: print(m, file=sys.stderr, flush=True),
    )
    pg = PostgresServer(args.postgresql) if args.postgresql else None
    try:
        machine = _machine(pg)
    finally:
        if pg is not None:
            pg.close()
    load = os.getloadavg()
    print(f"apply_ager curve; {machine}; load average at the end {load[0]:.2f}")
    print()
    print(format_curve(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(lines, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
