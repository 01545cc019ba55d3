"""PostgreSQL: the WAL one passing writes on a server as it is configured, full-page images
included.

``python -m benchmarks.wal --postgresql URL [--mnests N] [--writers W] [--seconds S]``

The scale benchmark's own servers run with ``full_page_writes`` off (``benchmarks.replication``),
so its WAL per passing leaves out the images of whole pages that a production server writes
the first time it changes a page after each checkpoint. This measures on a server of the
caller's (``URL``'s database is made anew as ``mnestoma_wal``, then dropped): a store of
``N`` active edges, a ``CHECKPOINT``, then ``W`` threads recording passings on random edges
for ``S`` seconds; WAL bytes and full-page images per passing from ``pg_stat_wal`` (the
server's, so run it on a quiet server), in the window right after the checkpoint (every
page changed for the first time since: the most images) and in the last third of it.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from .data import graph_rows, load_postgresql
from .writer_latency import pick_edges

DATABASE = "mnestoma_wal"
_STATS = "SELECT wal_bytes, wal_fpi FROM pg_stat_wal"


def _stats(url: str) -> tuple[int, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            wal_bytes, fpi = conn.execute(text(_STATS)).one()
            return int(wal_bytes), int(fpi)
    finally:
        engine.dispose()


def measure(url: str, mnests: int, writers: int, seconds: float) -> dict[str, Any]:
    """The figures of one run (module docstring)."""
    import mnestoma

    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {DATABASE}"))
        conn.execute(text(f"CREATE DATABASE {DATABASE}"))
    store_url = make_url(url).set(database=DATABASE).render_as_string(hide_password=False)
    try:
        mnestoma.upgrade(store_url)
        load_postgresql(store_url, graph_rows(max(mnests // 10, 12), 10))
        edges = pick_edges(store_url, min(mnests, 200_000))
        store = mnestoma.Mnestoma(store_url)
        counts = [0] * writers
        stop = threading.Event()

        def write(i: int) -> None:
            rng = random.Random(i)
            while not stop.is_set():
                e = rng.choice(edges)
                store.record_passing(e[1], e[2], e[3], e[4])
                counts[i] += 1

        with admin.connect() as conn:
            conn.execute(text("CHECKPOINT"))
        marks = [(time.monotonic(), _stats(url), 0)]
        threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
        for t in threads:
            t.start()
        for _ in range(3):
            time.sleep(seconds / 3)
            marks.append((time.monotonic(), _stats(url), sum(counts)))
        stop.set()
        for t in threads:
            t.join()
        store.close()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
        admin.dispose()

    def window(a: int, b: int) -> dict[str, Any]:
        (_, (wal0, fpi0), n0), (_, (wal1, fpi1), n1) = marks[a], marks[b]
        n = max(1, n1 - n0)
        return {
            "passings": n1 - n0,
            "wal_bytes_per_passing": round((wal1 - wal0) / n),
            "fpi_per_passing": round((fpi1 - fpi0) / n, 2),
            "wal_gb_per_day_at_1000_per_s": round((wal1 - wal0) / n * 1000 * 86400 / 1e9, 1),
        }

    return {
        "mnests": mnests,
        "writers": writers,
        "seconds": seconds,
        "whole_run": window(0, 3),
        "first_third": window(0, 1),
        "last_third": window(2, 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wal", description=__doc__)
    parser.add_argument("--postgresql", required=True, help="a server's URL (any database)")
    parser.add_argument("--mnests", type=int, default=3_000_000)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.postgresql, args.mnests, args.writers, args.seconds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
