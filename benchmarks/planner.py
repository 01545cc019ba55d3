"""Does the store help a planner? Next-call prediction on public tool-call traces.

``python -m benchmarks.planner [--data PATH] [--autotool PATH] [--seed N] [--database-url URL]
[--json FILE] [--quick]``

The traces are the multi-turn ground truth of the Berkeley Function Calling Leaderboard
(``bfcl_eval/data/possible_answer/BFCL_v4_multi_turn_*.json`` in the ``bfcl-eval`` package,
the ``planner`` extra): JSON lines, each ``{"id": ..., "ground_truth": [[call, ...], ...]}``,
one list of calls (``"cd(folder='document')"``) per turn of the conversation. Nothing is
downloaded: the files of the installed package are read, or ``--data`` (a file or a folder
of files in that format).

The conversations are split 80/20 by conversation (``--seed``; the variants of one
conversation across the sets, which share its number, stay on one side). The training
conversations are replayed into a new store, in the split's order, each turn one
``record_turn`` an hour after the previous one (the clock is moved, not waited for): the
passings of a turn are its consecutive calls, and the last call of the turn before to the
first of this one. Then, for each call of the held-out conversations after the first, the
planner asks what follows the previous call:

- hit@1, hit@3 and MRR of ``suggest_next`` (each order it has) and of ``rank`` over every
  function seen (each ``order_by``); of ``predict_next`` asked with the previous call and the
  one before it in the conversation (every function ranked by its P(next), popularity
  breaking ties and ordering those never seen after the context); and of two references
  computed here from the same training calls: popularity (the most called functions first)
  and the undecayed count of successors (what followed the previous call most often;
  popularity breaks its ties);
- ``vet`` on each held-out chain against the same chain corrupted (one step replaced by
  another function; two steps swapped), the chains being whole conversations and, apart,
  each turn's calls (what one request plans): the share of pairs whose real chain scores higher
  (ties count half) by ``Verdict.score`` alone (0 as soon as one link is unknown), by
  ``Verdict.log_likelihood`` (``predict_next``'s probabilities, an unseen link lowering it
  instead of zeroing it), and by the number of unknown links first, then the score; and how
  often ``Verdict.weakest`` is a
  link that touches a corrupted step;
- drift, which real runtimes have and these traces do not: from the middle of the replay on,
  the most frequent successor of the most frequent source is replaced by a new executor (a
  new version of it, under a new name); how many of the new successor's passings each order
  needs before it ranks the new successor first;
- latency: ``rank`` and ``suggest_next`` with each order, and ``predict_next``, interleaved
  on the trained store (median and p99 per call, and the ratio to the default order;
  ``predict_next``'s to ``suggest_next``'s).

With ``--autotool PATH`` (a clone of AutoTool's repository), the next-tool benchmark on its
ScienceWorld trajectories follows, :mod:`benchmarks.scienceworld`. ``--quick`` runs both on the
small fixtures of ``tests/fixtures`` (a smoke run: the figures mean nothing).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import json
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import mnestoma
from mnestoma.planner.ranking import ORDER_BY, SUGGEST_ORDER_BY
from mnestoma.testing.clock import MovableClock

from .writer_latency import percentile

__all__ = [
    "BFCL_GLOB",
    "Conversation",
    "MissingData",
    "PlannerReport",
    "bfcl_files",
    "load_conversations",
    "main",
    "run",
]

BFCL_DIST = "bfcl-eval"
BFCL_DATA = "bfcl_eval/data/possible_answer"
BFCL_GLOB = "BFCL_v4_multi_turn_*.json"
INSTALL_HINT = (
    'pip install "mnestoma[planner]" (or: pip install --no-deps bfcl-eval, whose data files'
    " are all this reads)"
)
SEED = 40
TRAIN_SHARE = 0.8
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
TURN_GAP = timedelta(hours=1)
VERSION = "1"
NEW_SUFFIX = "_v2"  # the drift's new successor: a new version of the old one, by name
LATENCY_CALLS = 200  # calls per order in the latency section
PREDICT_NEXT = "predict_next: P(next | the last two), else the last"
FIXTURE = (
    Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "BFCL_v4_multi_turn_sample.json"
)


class MissingData(Exception):
    """The traces are not there (bfcl-eval not installed, or ``--data`` names nothing)."""


@dataclass(frozen=True)
class Conversation:
    """One conversation: its id, the number shared by its variants, and its turns (each a
    list of function names, in call order)."""

    id: str
    group: str
    turns: tuple[tuple[str, ...], ...]

    @property
    def calls(self) -> list[str]:
        """Every call of the conversation, in order."""
        return [c for t in self.turns for c in t]


def bfcl_files() -> list[Path]:
    """The multi-turn ground-truth files of the installed ``bfcl-eval``, read through its
    metadata (the package itself, heavy to import, is never imported)."""
    try:
        dist = importlib.metadata.distribution(BFCL_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise MissingData(f"bfcl-eval is not installed: {INSTALL_HINT}") from None
    folder = Path(str(dist.locate_file(BFCL_DATA)))
    files = sorted(folder.glob(BFCL_GLOB))
    if not files:
        raise MissingData(f"bfcl-eval has no {BFCL_DATA}/{BFCL_GLOB}: {INSTALL_HINT}")
    return files


def _data_files(data: str | None) -> list[Path]:
    if data is None:
        return bfcl_files()
    path = Path(data)
    files = sorted(path.glob(BFCL_GLOB) or path.glob("*.json")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise MissingData(f"no BFCL multi-turn file at {data}")
    return files


_NAME = re.compile(r"\s*([A-Za-z_][\w.]*)\s*\(")
_NUMBER = re.compile(r"(\d+)$")


def function_name(call: str) -> str:
    """``"cd(folder='document')"`` → ``"cd"``."""
    found = _NAME.match(call)
    if found is None:
        raise ValueError(f"not a call: {call!r}")
    return found.group(1)


def load_conversations(files: Iterable[Path]) -> list[Conversation]:
    """The conversations of BFCL multi-turn files (JSON lines), calls as function names."""
    out: list[Conversation] = []
    for f in files:
        for line in f.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            turns = tuple(tuple(function_name(c) for c in turn) for turn in item["ground_truth"])
            number = _NUMBER.search(item["id"])
            out.append(Conversation(item["id"], number.group(1) if number else item["id"], turns))
    return out


def split(
    convs: Sequence[Conversation], seed: int
) -> tuple[list[Conversation], list[Conversation]]:
    """80/20 by group (a conversation's variants together), each side in a seeded order."""
    groups = sorted({c.group for c in convs})
    rng = random.Random(seed)
    rng.shuffle(groups)
    held = set(groups[round(len(groups) * TRAIN_SHARE) :])
    train = [c for c in convs if c.group not in held]
    test = [c for c in convs if c.group in held]
    rng.shuffle(train)
    rng.shuffle(test)
    return train, test


# --- scores -----------------------------------------------------------------------------------


@dataclass
class Hits:
    """hit@1, hit@3 and MRR of one predictor over the held-out calls."""

    n: int = 0
    at1: int = 0
    at3: int = 0
    rr: float = 0.0

    def add(self, ranked: Sequence[str], truth: str) -> None:
        self.n += 1
        if truth in ranked:
            rank = ranked.index(truth) + 1
            self.at1 += rank == 1
            self.at3 += rank <= 3
            self.rr += 1.0 / rank

    def as_dict(self) -> dict[str, float]:
        n = max(self.n, 1)
        return {"hit@1": self.at1 / n, "hit@3": self.at3 / n, "mrr": self.rr / n, "n": self.n}


@dataclass
class PlannerReport:
    """Everything the benchmark measured, JSON-ready."""

    seed: int
    conversations: int
    train: int
    test: int
    functions: int
    held_out_calls: int
    engine: str
    prediction: dict[str, dict[str, float]] = field(default_factory=dict)
    vet: dict[str, dict[str, float]] = field(default_factory=dict)
    drift: dict[str, Any] = field(default_factory=dict)
    latency: dict[str, dict[str, float]] = field(default_factory=dict)
    scienceworld: dict[str, Any] | None = None  # benchmarks.scienceworld's report, when asked


# --- the replay -------------------------------------------------------------------------------


def _turn_passings(prev_last: str | None, turn: Sequence[str]) -> list[tuple[str, str]]:
    calls = ([prev_last] if prev_last is not None else []) + list(turn)
    return list(itertools.pairwise(calls))


def replay(
    store: mnestoma.Mnestoma,
    clock: MovableClock,
    convs: Sequence[Conversation],
    *,
    rename: Callable[[int, str, str], str] | None = None,
    after_turn: Callable[[int, list[tuple[str, str]]], None] | None = None,
) -> None:
    """Record ``convs`` as turns an hour apart. ``rename(i, src, dst)`` may change the
    destination of a passing of conversation ``i``; ``after_turn`` sees what each recorded."""
    for i, conv in enumerate(convs):
        last: str | None = None
        for t, turn in enumerate(conv.turns):
            passings = _turn_passings(last, turn)
            if rename is not None:
                passings = [(s, rename(i, s, d)) for s, d in passings]
            if passings:
                store.record_turn(f"{conv.id}:{t}", [(s, VERSION, d, VERSION) for s, d in passings])
            if after_turn is not None:
                after_turn(i, passings)
            if turn:
                last = turn[-1]
            clock.advance(hours=TURN_GAP.total_seconds() / 3600)


def _references(train: Sequence[Conversation]) -> tuple[Counter[str], dict[str, Counter[str]]]:
    """Popularity (calls of each function) and successor counts, from the training calls as
    replayed (a turn counts an edge once, as the store does)."""
    popularity: Counter[str] = Counter()
    successors: dict[str, Counter[str]] = defaultdict(Counter)
    for conv in train:
        popularity.update(conv.calls)
        last: str | None = None
        for turn in conv.turns:
            for s, d in set(_turn_passings(last, turn)):
                successors[s][d] += 1
            if turn:
                last = turn[-1]
    return popularity, successors


def _by_count(
    counts: Mapping[str, float], popularity: Counter[str], catalog: Sequence[str]
) -> list[str]:
    """Every function of the catalog, the highest count (or probability) first; popularity,
    then name, break ties."""
    return sorted(catalog, key=lambda f: (-counts.get(f, 0), -popularity.get(f, 0), f))


def contexts_of(conv: Conversation) -> list[tuple[tuple[str, ...], str]]:
    """Each call of a conversation after its first, with its context: the call before it
    and the one before that (one call for the second), across turns as the calls came."""
    calls = conv.calls
    return [(tuple(calls[max(0, i - 2) : i]), calls[i]) for i in range(1, len(calls))]


def predict(
    store: mnestoma.Mnestoma, train: Sequence[Conversation], test: Sequence[Conversation]
) -> tuple[dict[str, dict[str, float]], int]:
    """hit@1/hit@3/MRR of every predictor over the held-out calls.

    ``predict_next`` is asked with the last two calls wherever a turn ends. The store
    counts the chains of one recorded turn, whose first passing comes from the turn before
    (its last call to this turn's first): so the chain into a turn's first call (the last
    two calls of the turn before, then it) is never counted, and that call is predicted by
    what followed the same two calls within turns, else by the last call's edges."""
    popularity, successors = _references(train)
    catalog = sorted(popularity)
    by_popularity = _by_count(popularity, popularity, catalog)
    hits: dict[str, Hits] = defaultdict(Hits)
    n = 0
    for conv in test:
        for context, truth in contexts_of(conv):
            prev = context[-1]
            n += 1
            for order in SUGGEST_ORDER_BY:
                got = store.suggest_next(prev, k=len(catalog) or 1, order_by=order)
                hits[f"suggest_next order_by={order}"].add([m.dst_executor for m, _ in got], truth)
            for order in ORDER_BY:
                ranked = store.rank(prev, catalog, order_by=order)
                hits[f"rank order_by={order}"].add([r.executor for r in ranked], truth)
            forecast = store.predict_next(context)
            p = {c.executor: c.p for c in forecast.candidates}
            hits[PREDICT_NEXT].add(_by_count(p, popularity, catalog), truth)
            hits["reference: popularity"].add(by_popularity, truth)
            after = successors.get(prev, Counter())
            hits["reference: undecayed successor count"].add(
                _by_count(after, popularity, catalog), truth
            )
    return {name: h.as_dict() for name, h in hits.items()}, n


# --- vet ----------------------------------------------------------------------------------------


def vet_separation(
    store: mnestoma.Mnestoma, test: Sequence[Conversation], catalog: Sequence[str], seed: int
) -> dict[str, dict[str, float]]:
    """How ``vet`` tells real held-out chains from corrupted ones, per kind of corruption."""
    rng = random.Random(seed + 1)
    out: dict[str, dict[str, float]] = {}
    # A conversation's whole chain of calls, and each turn's own (what one request plans).
    units = {
        "": [conv.calls for conv in test],
        ", a turn's calls": [list(turn) for conv in test for turn in conv.turns],
    }
    for (unit, chains), kind in itertools.product(
        units.items(), ("one step replaced", "two steps swapped")
    ):
        wins = 0.0
        likely = 0.0
        evidence = 0.0
        pointed = 0
        n = 0
        for chain in chains:
            if len(chain) < 2:
                continue
            corrupted = list(chain)
            if kind == "one step replaced":
                j = rng.randrange(len(chain))
                corrupted[j] = rng.choice([f for f in catalog if f != chain[j]])
                touched = {j - 1, j}
            else:
                spots = [(i, j) for i in range(len(chain)) for j in range(i + 1, len(chain))]
                spots = [(i, j) for i, j in spots if chain[i] != chain[j]]
                if not spots:
                    continue
                i, j = rng.choice(spots)
                corrupted[i], corrupted[j] = corrupted[j], corrupted[i]
                touched = {i - 1, i, j - 1, j}
            real, fake = store.vet(chain), store.vet(corrupted)
            n += 1
            wins += _beats((real.score,), (fake.score,))
            likely += _beats((real.log_likelihood,), (fake.log_likelihood,))
            evidence += _beats((-len(real.unknown), real.score), (-len(fake.unknown), fake.score))
            pointed += fake.weakest in touched
        out[kind + unit] = {
            "separation": wins / max(n, 1),
            "separation_log_likelihood": likely / max(n, 1),
            "separation_unknown_then_score": evidence / max(n, 1),
            "weakest_on_corrupted_step": pointed / max(n, 1),
            "pairs": n,
        }
    return out


def _beats(real: tuple[float, ...], fake: tuple[float, ...]) -> float:
    """1 when the real chain's verdict is the better one, 0.5 on a tie, else 0."""
    return 1.0 if real > fake else 0.5 if real == fake else 0.0


# --- drift --------------------------------------------------------------------------------------


def drift(url: str, train: Sequence[Conversation], limit: int = 500) -> dict[str, Any]:
    """Replay the training set into a store of its own; from its middle on, the most frequent
    successor of the most frequent source is replaced by a new executor. After each passing
    to the new one, which orders rank it first among the two?"""
    _, successors = _references(train)
    src, (old, _) = max(
        ((s, c.most_common(1)[0]) for s, c in successors.items() if c),
        key=lambda x: (x[1][1], x[0]),
    )
    new = old + NEW_SUFFIX
    half = len(train) // 2
    clock = MovableClock(T0)
    orders = [f"rank order_by={o}" for o in ORDER_BY] + ["reference: undecayed successor count"]
    needed: dict[str, int | None] = {o: None for o in orders}
    state = {"new": 0, "old_before": 0}
    undecayed: Counter[str] = Counter()

    def rename(i: int, s: str, d: str) -> str:
        return new if (i >= half and s == src and d == old) else d

    with mnestoma.Mnestoma(url, clock=clock) as store:

        def after_turn(i: int, passings: list[tuple[str, str]]) -> None:
            seen = {d for s, d in set(passings) if s == src}
            for d in seen:
                undecayed[d] += 1
            if i < half:
                state["old_before"] = undecayed[old]
            if new not in seen or state["new"] >= limit:
                return
            state["new"] += 1
            for order in ORDER_BY:
                key = f"rank order_by={order}"
                if needed[key] is None:
                    ranked = store.rank(src, [old, new], order_by=order)
                    if ranked[0].executor == new:
                        needed[key] = state["new"]
            ref = "reference: undecayed successor count"
            if needed[ref] is None and undecayed[new] > undecayed[old]:
                needed[ref] = state["new"]

        replay(store, clock, train, rename=rename, after_turn=after_turn)
    return {
        "source": src,
        "old_successor": old,
        "new_successor": new,
        "old_passings_before_change": state["old_before"],
        "new_passings_after_change": state["new"],
        "passings_needed": needed,
    }


# --- latency ------------------------------------------------------------------------------------


def latency(
    store: mnestoma.Mnestoma,
    contexts: Sequence[tuple[str, ...]],
    catalog: Sequence[str],
    rounds: int = 5,
) -> dict[str, dict[str, float]]:
    """Median and p99 ms per call of ``suggest_next`` and ``rank`` with each order (from the
    last call of each context) and of ``predict_next`` (the whole context), interleaved call
    by call (the calls' turn rotating, so that none always goes first), and each one's ratio
    to the default order of its door (weight; ``predict_next``'s to ``suggest_next``'s): the
    median over ``rounds`` rounds of each round's figure, which a busy machine disturbs less
    than one long round."""
    calls: dict[str, Callable[[tuple[str, ...]], object]] = {}
    for o in SUGGEST_ORDER_BY:
        calls[f"suggest_next order_by={o}"] = lambda c, o=o: store.suggest_next(c[-1], order_by=o)
    for o in ORDER_BY:
        calls[f"rank order_by={o}"] = lambda c, o=o: store.rank(c[-1], catalog, order_by=o)
    calls[PREDICT_NEXT] = store.predict_next
    names = list(calls)
    figures: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for _ in range(rounds):
        times: dict[str, list[float]] = defaultdict(list)
        for i, c in enumerate(contexts):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                t = time.perf_counter()
                calls[name](c)
                times[name].append((time.perf_counter() - t) * 1000)
        for name, ts in times.items():
            door = "rank" if name.startswith("rank") else "suggest_next"
            median = statistics.median(ts)
            figures[name]["median_ms"].append(median)
            figures[name]["p99_ms"].append(percentile(sorted(ts), 0.99) or 0.0)
            figures[name]["ratio"].append(
                median / statistics.median(times[f"{door} order_by=weight"])
            )
    return {
        name: {key: statistics.median(values) for key, values in figures[name].items()}
        for name in names
        if name in figures
    }


# --- the whole run ------------------------------------------------------------------------------


def run(
    *, data: str | None = None, seed: int = SEED, url: str | None = None, workdir: str | None = None
) -> PlannerReport:
    """Load the traces, replay, and measure everything (see the module's docstring)."""
    convs = load_conversations(_data_files(data))
    train, test = split(convs, seed)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        main_url = url or f"sqlite:///{Path(tmp) / 'planner.sqlite'}"
        drift_url = url or f"sqlite:///{Path(tmp) / 'drift.sqlite'}"
        clock = MovableClock(T0)
        mnestoma.upgrade(main_url)
        with mnestoma.Mnestoma(main_url, clock=clock) as store:
            engine = store.engine.dialect.name
            replay(store, clock, train)
            catalog = sorted({c for conv in train for c in conv.calls})
            prediction, n = predict(store, train, test)
            report = PlannerReport(
                seed=seed,
                conversations=len(convs),
                train=len(train),
                test=len(test),
                functions=len(catalog),
                held_out_calls=n,
                engine=engine,
                prediction=prediction,
            )
            report.vet = vet_separation(store, test, catalog, seed)
            contexts = [c for conv in test for c, _ in contexts_of(conv)]
            rng = random.Random(seed + 2)
            report.latency = latency(
                store,
                [rng.choice(contexts) for _ in range(LATENCY_CALLS)] if contexts else [],
                catalog,
            )
        if url is not None:
            _empty(url)
        mnestoma.upgrade(drift_url)
        report.drift = drift(drift_url, train)
        if url is not None:
            _empty(url)
    return report


def _empty(url: str) -> None:
    """Empty the store a run was given (``--database-url``), for the next part."""
    from sqlalchemy import text

    from mnestoma.engines import make_engine

    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            for table in ("events", "mnests", "ager_runs", "canonical_query_log"):
                conn.execute(text(f"DELETE FROM {table}"))
    finally:
        engine.dispose()


def format_report(r: PlannerReport) -> str:
    """The report as the tables the docs show."""
    lines = [
        f"BFCL multi-turn: {r.conversations} conversations, {r.functions} functions; split "
        f"{r.train}/{r.test} (seed {r.seed}); {r.held_out_calls} held-out calls; {r.engine}",
        "",
        "| predictor | hit@1 | hit@3 | MRR |",
        "|---|---|---|---|",
    ]
    for name, h in r.prediction.items():
        lines.append(f"| {name} | {h['hit@1']:.3f} | {h['hit@3']:.3f} | {h['mrr']:.3f} |")
    lines += [
        "",
        "| vet: corruption | separation by score | by log-likelihood"
        " | by unknown links, then score | weakest on a corrupted step | pairs |",
        "|---|---|---|---|---|---|",
    ]
    for kind, v in r.vet.items():
        lines.append(
            f"| {kind} | {v['separation']:.3f} | {v['separation_log_likelihood']:.3f} |"
            f" {v['separation_unknown_then_score']:.3f} |"
            f" {v['weakest_on_corrupted_step']:.3f} | {v['pairs']:.0f} |"
        )
    d = r.drift
    lines += [
        "",
        f"drift: {d['source']} → {d['old_successor']} ({d['old_passings_before_change']}"
        f" passings before the change) becomes {d['source']} → {d['new_successor']}"
        f" ({d['new_passings_after_change']} passings after it)",
        "",
        "| order | passings of the new successor to rank it first |",
        "|---|---|",
    ]
    for order, k in d["passings_needed"].items():
        lines.append(f"| {order} | {k if k is not None else 'not within the replay'} |")
    lines += [
        "",
        "| call | median ms | p99 ms | ratio to order_by=weight"
        " (predict_next: to suggest_next's) |",
        "|---|---|---|---|",
    ]
    for name, t in r.latency.items():
        lines.append(f"| {name} | {t['median_ms']:.3f} | {t['p99_ms']:.3f} | {t['ratio']:.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: the tables on stdout; exit 2 when the traces are missing."""
    from . import scienceworld  # it builds on this module

    parser = argparse.ArgumentParser(prog="python -m benchmarks.planner", description=__doc__)
    parser.add_argument("--data", metavar="PATH", help="BFCL multi-turn file or folder")
    scienceworld.add_arguments(parser)
    parser.add_argument("--seed", type=int, default=SEED, help=f"the split's seed ({SEED})")
    parser.add_argument("--database-url", metavar="URL", help="a store to use (emptied)")
    parser.add_argument("--workdir", help="folder for the SQLite files (default: temp)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    args = parser.parse_args(argv)
    data = str(FIXTURE) if args.quick and args.data is None else args.data
    autotool = scienceworld.autotool_path(args)
    world = None
    try:
        if autotool is not None:
            scienceworld.autotool_files(autotool)  # missing: said before the long part
        report = run(data=data, seed=args.seed, url=args.database_url, workdir=args.workdir)
        if autotool is not None:
            world = scienceworld.run(
                autotool=autotool, n_folds=args.folds, seed=args.seed, workdir=args.workdir
            )
    except MissingData as err:
        print(f"python -m benchmarks.planner: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    print()
    if world is None:
        print(f"ScienceWorld: not measured; to measure it, {scienceworld.GET_HINT}")
    else:
        print(scienceworld.format_report(world))
        report.scienceworld = asdict(world)
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=2))
    return 0


if __name__ == "__main__":
    # Run the importable module, whose MissingData benchmarks.scienceworld raises, and not
    # this second copy of it that ``python -m`` made.
    from benchmarks import planner

    raise SystemExit(planner.main())
