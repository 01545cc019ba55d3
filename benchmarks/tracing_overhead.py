"""What the in-process tracer adds to a call, and what a turn's end costs.

``python -m benchmarks.tracing_overhead [--quick] [--rounds N] [--database-url URL] [--json FILE]``

Per-call figures are CPU time of the measuring thread (so that other processes on a shared
machine do not inflate them), each the median over rounds, the plain and traced loops
interleaved in a round; the flush figures are wall time, since the store's I/O counts.

* a plain call, and the same function under ``@executor`` outside a turn: the added time;
* inside a turn, per call, small arguments: a chain where each call receives the previous
  call's output (a lineage hit and a passing), and calls that link to nothing;
* the turn's flush: ``record_turn`` of an 8-call turn (7 passings and a proto) to a store
  (a migrated SQLite file unless ``--database-url`` names another migrated store), and the
  same turn handed to a :class:`~mnestoma.tracing.BackgroundWriter` instead.

Targets: outside a turn < 1 µs added; inside a turn < 20 µs per call (small arguments).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mnestoma
from mnestoma.recording.tracing import BackgroundWriter, executor, turn, wish

__all__ = ["Figures", "main", "measure"]

OUTSIDE_TARGET_US = 1.0
INSIDE_TARGET_US = 20.0
CHAIN = 8  # executors per flushed turn


@dataclass
class Figures:
    """The measured figures, in microseconds unless the name says otherwise."""

    python: str = field(default_factory=lambda: platform.python_version())
    machine: str = field(default_factory=lambda: f"{platform.system()} {platform.machine()}")
    rounds: int = 0
    calls_per_round: int = 0
    plain_us: float = 0.0
    outside_us: float = 0.0
    outside_added_us: float = 0.0
    inside_linked_us: float = 0.0
    inside_linked_added_us: float = 0.0
    inside_unlinked_us: float = 0.0
    inside_unlinked_added_us: float = 0.0
    empty_turn_us: float = 0.0
    flush_store_us: float = 0.0
    flush_writer_us: float = 0.0
    passings_per_turn: int = 0
    store: str = ""

    def verdicts(self) -> list[tuple[str, str, bool]]:
        """(target, measured, ok) for each target."""
        return [
            (
                f"outside a turn < {OUTSIDE_TARGET_US:g} µs added",
                f"{self.outside_added_us:.3f} µs",
                self.outside_added_us < OUTSIDE_TARGET_US,
            ),
            (
                f"inside a turn < {INSIDE_TARGET_US:g} µs per call",
                f"{max(self.inside_linked_added_us, self.inside_unlinked_added_us):.2f} µs",
                max(self.inside_linked_added_us, self.inside_unlinked_added_us) < INSIDE_TARGET_US,
            ),
        ]


class NullStore:
    """A store that accepts every turn and does nothing: isolates the tracer's own cost."""

    def record_turn(self, turn_id: str, passings: Any, *, recorder: str = "call") -> list[Any]:
        return []


def tool(value: Any) -> list[str]:
    """A small tool: a short list of two strings derived from its argument."""
    head = value[0] if isinstance(value, list) else str(value)
    return [head[:24] + " (done)", "second item"]


_clock = time.thread_time  # CPU time of this thread: other processes' load does not count


def _loop_plain(fn: Callable[[Any], Any], n: int) -> float:
    value: Any = "first query"
    start = _clock()
    for _ in range(n):
        value = fn(value)  # each call receives the previous call's output
    return _clock() - start


def _loop_unlinked(fn: Callable[[Any], Any], n: int) -> float:
    start = _clock()
    for i in range(n):
        fn(i)  # a small int argument: trivial, never linked
    return _clock() - start


def _us(seconds: float, n: int) -> float:
    return seconds / n * 1e6


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def measure(
    *, rounds: int = 7, calls: int = 50_000, turns: int = 200, database_url: str | None = None
) -> Figures:
    """Run every measurement and return the figures."""
    traced = executor("bench.tool", "1")(tool)
    chain = [executor(f"bench.step{i}", "1")(tool) for i in range(CHAIN)]
    null = NullStore()
    plain, outside, linked, unlinked, plain_unlinked, empty = ([] for _ in range(6))
    for r in range(rounds):
        for which in (r % 2, 1 - r % 2):  # alternate who goes first
            if which == 0:
                plain.append(_us(_loop_plain(tool, calls), calls))
                plain_unlinked.append(_us(_loop_unlinked(tool, calls), calls))
            else:
                outside.append(_us(_loop_plain(traced, calls), calls))
        with turn(null, f"bench-linked-{r}"):
            linked.append(_us(_loop_plain(traced, calls), calls))
        with turn(null, f"bench-unlinked-{r}"):
            unlinked.append(_us(_loop_unlinked(traced, calls), calls))
        start = _clock()
        for k in range(1000):
            with turn(null, f"bench-empty-{r}-{k}"):
                pass
        empty.append(_us(_clock() - start, 1000))

    folder = tempfile.TemporaryDirectory(prefix="mnestoma-tracing-bench-")
    try:
        url = database_url or f"sqlite:///{Path(folder.name) / 'store.sqlite'}"
        if database_url is None:
            mnestoma.upgrade(url)
        store = mnestoma.Mnestoma(url)
        try:
            flush_store, passings = _flush(store, None, chain, turns, "bench-store")
            with BackgroundWriter(store, maxsize=turns + 1) as writer:
                flush_writer, _ = _flush(store, writer, chain, turns, "bench-writer")
                writer.flush()
        finally:
            store.close()
    finally:
        folder.cleanup()

    f = Figures(rounds=rounds, calls_per_round=calls, store=url.split(":", 1)[0])
    f.plain_us = _median(plain)
    f.outside_us = _median(outside)
    f.outside_added_us = f.outside_us - f.plain_us
    f.inside_linked_us = _median(linked)
    f.inside_linked_added_us = f.inside_linked_us - f.plain_us
    f.inside_unlinked_us = _median(unlinked)
    f.inside_unlinked_added_us = f.inside_unlinked_us - _median(plain_unlinked)
    f.empty_turn_us = _median(empty)
    f.flush_store_us = flush_store
    f.flush_writer_us = flush_writer
    f.passings_per_turn = passings
    return f


def _flush(
    store: mnestoma.Mnestoma,
    writer: BackgroundWriter | None,
    chain: Sequence[Callable[[Any], Any]],
    turns: int,
    prefix: str,
) -> tuple[float, int]:
    """Median µs of the end of a turn calling ``chain`` (its record_turn, or its hand-off).

    The same executors every turn: from the second turn on its edges are reinforced.
    """
    times: list[float] = []
    passings = 0
    for k in range(turns):
        t = turn(store, f"{prefix}-{k}", writer=writer)
        t.__enter__()
        value: Any = f"query number {k}"
        for step in chain:
            value = step(value)
        wish("bench.missing", consumed=value, desired_sig={"summary": "what is missing"})
        passings = len(t.passings)
        start = time.perf_counter()  # wall time: the store's I/O and locks count here
        t.__exit__(None, None, None)
        times.append(time.perf_counter() - start)
        if t.store_failures or t.dropped:
            raise RuntimeError(f"turn {t.turn_id} was not recorded: {t.error!r}")
    return _median(times) * 1e6, passings


def format_figures(f: Figures) -> str:
    """The figures as a small table and the verdicts."""
    rows = [
        ("plain call", f.plain_us, None),
        ("@executor, outside a turn", f.outside_us, f.outside_added_us),
        ("@executor, inside a turn, linked", f.inside_linked_us, f.inside_linked_added_us),
        ("@executor, inside a turn, no link", f.inside_unlinked_us, f.inside_unlinked_added_us),
    ]
    lines = [
        f"tracer overhead — Python {f.python}, {f.machine}, "
        f"{f.rounds} rounds × {f.calls_per_round} calls (medians)",
        f"{'':36}{'µs per call':>13}{'added':>11}",
    ]
    for name, value, added in rows:
        extra = "" if added is None else f"{added:>11.3f}"
        lines.append(f"{name:36}{value:>13.3f}{extra}")
    lines += [
        "",
        f"{'an empty turn (enter + exit)':36}{f.empty_turn_us:>13.2f} µs",
        f"{'turn flush: record_turn, ' + f.store:36}{f.flush_store_us:>13.1f} µs"
        f"  ({f.passings_per_turn} passings per turn)",
        f"{'turn flush: to a BackgroundWriter':36}{f.flush_writer_us:>13.1f} µs",
        "",
    ]
    for target, measured, ok in f.verdicts():
        lines.append(f"{'PASS' if ok else 'MISS'}  {target}: {measured}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; exit status 0 (a missed target only prints MISS)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tracing_overhead", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round")
    parser.add_argument("--rounds", type=int, help="rounds (default 7; quick: 1)")
    parser.add_argument(
        "--database-url", metavar="URL", help="a migrated store for the flush (default: temp)"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 7)
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    figures = measure(
        rounds=rounds,
        calls=2_000 if args.quick else 50_000,
        turns=20 if args.quick else 200,
        database_url=args.database_url,
    )
    print(format_figures(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(figures), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
