"""The next tool on AutoTool's ScienceWorld trajectories: the baseline a planner call must beat.

``python -m benchmarks.planner --autotool PATH`` (beside the BFCL tables), or on its own
``python -m benchmarks.scienceworld --autotool PATH [--folds N] [--seed N] [--json FILE]``.

The traces are the ReAct runs AutoTool (arXiv 2511.14650) publishes: four runs of the same 89
ScienceWorld tasks, ``scienceworld_react_baseline_log_*.json`` in the repository's
``agentboard/visualisation/trajectories`` folder. ``PATH`` is a clone of that repository, or
the folder, or one file; nothing is downloaded. Calls are read as AutoTool's ``markov.py``
reads them (each step's ``action.parsed_content.tool_name``, ``unknown`` left out), and the
entropies it reports are computed again, to show the parse is the same.

The trajectories are split into folds by task (``--folds``, ``--seed``): every run of a task,
and every task with the same goal word for word, on one side. For each fold the training
trajectories are recorded into a new store, each one ``record_turn`` of its consecutive
calls an hour after the previous one (the clock is moved, not waited for), and every call of
a held-out trajectory after its first is predicted from the call before it and the one
before that: hit@1, hit@3 and MRR, pooled over the folds, with the lowest and highest fold.
Predictors that give a probability also get a coverage-at-precision table and the expected
calibration error of their first choice. :data:`PREDICTORS` lists them; one more (a store call
answering P(next | context)) is one more entry.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mnestoma
from mnestoma.testing.clock import MovableClock

from .planner import T0, TURN_GAP, VERSION, Hits, MissingData

__all__ = [
    "PREDICTORS",
    "Trajectory",
    "autotool_files",
    "calibration",
    "entropies",
    "evaluate",
    "folds",
    "load_trajectories",
    "main",
    "run",
]

AUTOTOOL_FOLDER = "agentboard/visualisation/trajectories"
FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "autotool_scienceworld"
AUTOTOOL_GLOB = "scienceworld_react_baseline_log_*.json"
GET_HINT = (
    "git clone https://github.com/jiajingyyyyyy/AutoTool and pass --autotool with the clone"
    f" (or its {AUTOTOOL_FOLDER} folder)"
)
UNKNOWN = "unknown"  # the tool name AutoTool gives an action it could not parse
PAPER_ENTROPIES = (3.50, 2.52, 1.93)  # bits: no context, the current tool, the last two
FOLDS = 5
SEED = 40
ADD_K = 0.5  # add-k smoothing of the counting predictors' probabilities
THRESHOLDS = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))  # 0.50 … 0.95
BINS = 10  # equal-width bins of the expected calibration error
AUTOTOOL_MIN_PATH = 3  # ToolGraph.record_tool_sequence keeps sequences this long or longer
AUTOTOOL_CONFIDENCE_BASE = 1.1  # ToolGraph._get_confidence: 1 - 1.1 ** -total


@dataclass(frozen=True)
class Trajectory:
    """One run of one task: the log it came from, the task's index, its goal, its tools."""

    run: str
    task: str
    goal: str
    calls: tuple[str, ...]


def autotool_files(path: str | None) -> list[Path]:
    """AutoTool's ScienceWorld logs under ``path`` (a clone, its trajectories folder, a file)."""
    if path is None:
        raise MissingData(f"no ScienceWorld trajectories given: {GET_HINT}")
    root = Path(path)
    if root.is_file():
        return [root]
    for folder in (root / AUTOTOOL_FOLDER, root):
        files = sorted(folder.glob(AUTOTOOL_GLOB)) if folder.is_dir() else []
        if files:
            return files
    raise MissingData(f"no {AUTOTOOL_GLOB} at {path}: {GET_HINT}")


def load_trajectories(files: Iterable[Path]) -> list[Trajectory]:
    """Each log's sequences as tool names, as ``markov.py`` extracts them (``unknown`` left
    out, a sequence with no tool left out)."""
    out: list[Trajectory] = []
    for f in files:
        data = json.loads(f.read_text(encoding="utf-8"))
        for i, seq in enumerate(data.get("sequences", [])):
            calls = tuple(
                step["action"]["parsed_content"]["tool_name"]
                for step in seq.get("steps", [])
                if "action" in step
                and "parsed_content" in step["action"]
                and "tool_name" in step["action"]["parsed_content"]
                and step["action"]["parsed_content"]["tool_name"] != UNKNOWN
            )
            if calls:
                task = str(seq.get("trajectory_id", i))
                out.append(
                    Trajectory(f.stem, task, seq.get("metadata", {}).get("goal", task), calls)
                )
    return out


# --- entropies, as markov.py computes them ------------------------------------------------------


def _entropy(counts: Iterable[float]) -> float:
    values = [c for c in counts if c > 0]
    total = sum(values)
    return -sum(c / total * math.log2(c / total) for c in values) if total else 0.0


def entropies(seqs: Sequence[Sequence[str]]) -> tuple[float, float, float]:
    """Bits of the next tool with no context, given the current tool, given the last two:
    ``markov.analyze_entropy_reduction`` (the current tool weighted by its share of all calls,
    the last two by their share of the pairs that have a successor)."""
    tools = Counter(t for s in seqs for t in s)
    after1: dict[str, Counter[str]] = defaultdict(Counter)
    after2: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for s in seqs:
        for a, b in itertools.pairwise(s):
            after1[a][b] += 1
        for a, b, c in zip(s, s[1:], s[2:], strict=False):
            after2[(a, b)][c] += 1
    n = sum(tools.values())
    h0 = _entropy(tools.values())
    h1 = sum(tools[a] / n * _entropy(c.values()) for a, c in after1.items())
    pairs = sum(sum(c.values()) for c in after2.values())
    h2 = (
        sum(sum(c.values()) / pairs * _entropy(c.values()) for c in after2.values())
        if pairs
        else h1
    )
    return h0, h1, h2


# --- the split ----------------------------------------------------------------------------------


def folds(
    trajs: Sequence[Trajectory], n: int, seed: int
) -> list[tuple[list[Trajectory], list[Trajectory]]]:
    """``n`` folds (at most one a goal) of (training, held out): the goals shuffled by the
    seed and dealt round, so each trajectory is held out exactly once; each side in a seeded
    order."""
    goals = sorted({t.goal for t in trajs})
    rng = random.Random(seed)
    rng.shuffle(goals)
    n = max(1, min(n, len(goals)))
    out = []
    for i in range(n):
        held = set(goals[i::n])
        train = [t for t in trajs if t.goal not in held]
        test = [t for t in trajs if t.goal in held]
        rng.shuffle(train)
        rng.shuffle(test)
        out.append((train, test))
    return out


# --- predictors ---------------------------------------------------------------------------------

# Context: (the call before the previous one, or None for the second call; the previous call).
# A prediction: the tools best first, and the confidence of the first (None: an order only).
Prediction = tuple[list[str], float | None]
Predict = Callable[[str | None, str], Prediction]


@dataclass
class Trained:
    """What one fold's predictors learn from: its store and the training calls, counted."""

    store: mnestoma.Mnestoma
    catalog: list[str]
    popularity: Counter[str]
    after1: dict[str, Counter[str]]
    after2: dict[tuple[str, str], Counter[str]]
    once: dict[str, Counter[str]]  # a successor counted once per trajectory, as the store does
    first_after: dict[tuple[str, ...], Counter[str]]  # AutoTool's paths, matched (below)

    @classmethod
    def of(cls, store: mnestoma.Mnestoma, train: Sequence[Trajectory]) -> Trained:
        """Count the training trajectories every way a predictor below needs."""
        popularity = Counter(c for t in train for c in t.calls)
        after1: dict[str, Counter[str]] = defaultdict(Counter)
        after2: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        once: dict[str, Counter[str]] = defaultdict(Counter)
        for t in train:
            for a, b in itertools.pairwise(t.calls):
                after1[a][b] += 1
            for a, b, c in zip(t.calls, t.calls[1:], t.calls[2:], strict=False):
                after2[(a, b)][c] += 1
            for a, b in set(itertools.pairwise(t.calls)):
                once[a][b] += 1
        # ToolGraph.paths: each distinct sequence of the minimum length or longer, counted
        paths = Counter(t.calls for t in train if len(t.calls) >= AUTOTOOL_MIN_PATH)
        return cls(store, sorted(popularity), popularity, after1, after2, once, _first_after(paths))

    def order(self, scores: Mapping[str, float]) -> list[str]:
        """Every tool seen in training, highest score first; popularity, then name, break ties."""
        return sorted(self.catalog, key=lambda f: (-scores.get(f, 0), -self.popularity[f], f))

    def from_probabilities(self, p: Mapping[str, float]) -> Prediction:
        """A prediction from P(next | context): how a store call answering it plugs in."""
        ranked = self.order(p)
        return ranked, (p.get(ranked[0], 0.0) if ranked else None)

    def smoothed(self, counts: Mapping[str, int]) -> Prediction:
        """Relative frequency with add-k smoothing over the tools seen in training."""
        total = sum(counts.values()) + ADD_K * len(self.catalog)
        return self.from_probabilities(
            {f: (counts.get(f, 0) + ADD_K) / total for f in self.catalog}
        )


def _first_after(paths: Mapping[tuple[str, ...], int]) -> dict[tuple[str, ...], Counter[str]]:
    """For each context of one or two tools, what follows its first occurrence in each path,
    weighted by the path's count: what AutoTool's ``is_subsequence`` match finds."""
    out: dict[tuple[str, ...], Counter[str]] = defaultdict(Counter)
    for path, count in paths.items():
        for size in (1, 2):
            seen: set[tuple[str, ...]] = set()
            for i in range(len(path) - size + 1):
                ctx = path[i : i + size]
                if ctx in seen:
                    continue
                seen.add(ctx)
                if i + size < len(path):
                    out[ctx][path[i + size]] += count
    return out


def _suggest_next(order: str) -> Callable[[Trained], Predict]:
    def build(t: Trained) -> Predict:
        def predict(before: str | None, prev: str) -> Prediction:
            got = t.store.suggest_next(prev, k=max(len(t.catalog), 1), order_by=order)
            return [m.dst_executor for m, _ in got], None

        return predict

    return build


def _successors(t: Trained) -> Predict:
    return lambda before, prev: t.smoothed(t.after1.get(prev, Counter()))


def _successors_once(t: Trained) -> Predict:
    return lambda before, prev: t.smoothed(t.once.get(prev, Counter()))


def _last_two(t: Trained) -> Predict:
    def predict(before: str | None, prev: str) -> Prediction:
        two = t.after2.get((before, prev)) if before is not None else None
        return t.smoothed(two or t.after1.get(prev, Counter()))

    return predict


def _autotool(t: Trained) -> Predict:
    """``ToolGraph``'s frequency score: the last two tools, or the last one when no path
    continues them (``evaluate_candidate_tools``' fall-back); the semantic half of its score
    needs the model's thought at that step, which the logs do not keep."""

    def predict(before: str | None, prev: str) -> Prediction:
        found = t.first_after.get((before, prev), Counter()) if before is not None else Counter()
        found = found or t.first_after.get((prev,), Counter())
        total = sum(found.values())
        confidence = 1 - AUTOTOOL_CONFIDENCE_BASE**-total
        scores = {f: c / total * confidence for f, c in found.items()} if total else {}
        ranked = t.order(scores)
        return ranked, (scores.get(ranked[0], 0.0) if ranked else None)

    return predict


def _predict_next(t: Trained) -> Predict:
    """The planner's call (contract §13): P(next | the last two calls), the chain falling back
    to the last call; the candidates never seen after it follow by popularity."""

    def predict(before: str | None, prev: str) -> Prediction:
        f = t.store.predict_next([before, prev] if before is not None else [prev])
        return t.from_probabilities({c.executor: c.p for c in f.candidates})

    return predict


PREDICTORS: dict[str, Callable[[Trained], Predict]] = {
    "suggest_next order_by=weight": _suggest_next("weight"),
    "suggest_next order_by=decayed_uses": _suggest_next("decayed_uses"),
    "predict_next: P(next | the last two), else the last": _predict_next,
    "count: successors of the last call": _successors,
    "count: successors of the last call, once a trajectory": _successors_once,
    "count: successors of the last two, else of the last": _last_two,
    "AutoTool: ToolGraph frequency score": _autotool,
}


# --- scores -------------------------------------------------------------------------------------


def calibration(answers: Sequence[tuple[float, bool]]) -> dict[str, Any]:
    """Coverage at precision (for each τ: the share of answers whose confidence is ≥ τ, and
    the share of those that are right) and the expected calibration error over equal-width
    bins, of (confidence of the first choice, was it right) pairs."""
    n = len(answers)
    coverage = []
    for tau in THRESHOLDS:
        kept = [hit for p, hit in answers if p >= tau - 1e-12]
        coverage.append(
            {
                "tau": tau,
                "share": len(kept) / n if n else 0.0,
                "precision": sum(kept) / len(kept) if kept else None,
            }
        )
    bins: dict[int, list[tuple[float, bool]]] = defaultdict(list)
    for p, hit in answers:
        bins[min(int(p * BINS), BINS - 1)].append((p, hit))
    ece = sum(
        abs(sum(h for _, h in b) - sum(p for p, _ in b)) / n for b in bins.values()
    )  # Σ |b|/n · |accuracy(b) − confidence(b)|
    return {"coverage": coverage, "ece": ece if n else 0.0, "n": n}


def evaluate(
    store: mnestoma.Mnestoma,
    train: Sequence[Trajectory],
    test: Sequence[Trajectory],
    predictors: Mapping[str, Callable[[Trained], Predict]] = PREDICTORS,
) -> tuple[dict[str, Hits], dict[str, list[tuple[float, bool]]]]:
    """Every predictor on every held-out call after the first, from a store that already
    holds ``train``: its hits, and (confidence, right) of those that give one."""
    trained = Trained.of(store, train)
    built = {name: make(trained) for name, make in predictors.items()}
    hits: dict[str, Hits] = {name: Hits() for name in built}
    answers: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    for traj in test:
        calls = traj.calls
        for i in range(1, len(calls)):
            before = calls[i - 2] if i >= 2 else None
            for name, predict in built.items():
                ranked, p = predict(before, calls[i - 1])
                hits[name].add(ranked, calls[i])
                if p is not None:
                    answers[name].append((p, bool(ranked) and ranked[0] == calls[i]))
    return hits, dict(answers)


def record(store: mnestoma.Mnestoma, clock: MovableClock, train: Sequence[Trajectory]) -> None:
    """Record each trajectory as one turn of its consecutive calls, an hour apart, as a
    runtime would."""
    for t in train:
        passings = [(a, VERSION, b, VERSION) for a, b in itertools.pairwise(t.calls)]
        if passings:
            store.record_turn(f"{t.run}:{t.task}", passings)
        clock.advance(hours=TURN_GAP.total_seconds() / 3600)


def _pooled(folds_hits: Sequence[Hits]) -> dict[str, Any]:
    """hit@1, hit@3 and MRR over every fold's calls, and the lowest and highest fold's."""
    total = Hits(
        sum(h.n for h in folds_hits),
        sum(h.at1 for h in folds_hits),
        sum(h.at3 for h in folds_hits),
        sum(h.rr for h in folds_hits),
    )
    row: dict[str, Any] = total.as_dict()
    for key in ("hit@1", "hit@3", "mrr"):
        values = [h.as_dict()[key] for h in folds_hits]
        row[f"{key} folds"] = [min(values), max(values)]
    return row


# --- the whole run ------------------------------------------------------------------------------


@dataclass
class ScienceWorldReport:
    """Everything measured, JSON-ready."""

    files: int
    trajectories: int
    tasks: int
    goals: int
    calls: int
    tools: int
    entropies: list[float]
    paper_entropies: list[float]
    folds: int
    seed: int
    held_out_calls: int
    passings_given: int  # over the folds' training trajectories
    passings_once_a_turn: int  # the distinct (turn, edge) pairs among them
    passings_counted: int  # the ``uses`` of every edge in the folds' stores
    engine: str
    prediction: dict[str, dict[str, Any]] = field(default_factory=dict)
    calibration: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def same_parse(self) -> bool:
        """The entropies round to AutoTool's figures."""
        return [round(h, 2) for h in self.entropies] == list(self.paper_entropies)


def run(
    *, autotool: str | None, n_folds: int = FOLDS, seed: int = SEED, workdir: str | None = None
) -> ScienceWorldReport:
    """Load, check the parse, and measure every predictor over the folds."""
    files = autotool_files(autotool)
    trajs = load_trajectories(files)
    if not trajs:
        raise MissingData(f"no tool call in {autotool}: {GET_HINT}")
    split = folds(trajs, n_folds, seed)
    per_fold: dict[str, list[Hits]] = defaultdict(list)
    answers: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    counted = 0
    engine = ""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for i, (train, test) in enumerate(split):
            url = f"sqlite:///{Path(tmp) / f'fold{i}.sqlite'}"
            mnestoma.upgrade(url)
            clock = MovableClock(T0)
            with mnestoma.Mnestoma(url, clock=clock) as store:
                engine = store.engine.dialect.name
                record(store, clock, train)
                counted += sum(m.uses for m in store.edges())
                hits, fold_answers = evaluate(store, train, test)
            for name, h in hits.items():
                per_fold[name].append(h)
            for name, a in fold_answers.items():
                answers[name] += a
    report = ScienceWorldReport(
        files=len(files),
        trajectories=len(trajs),
        tasks=len({t.task for t in trajs}),
        goals=len({t.goal for t in trajs}),
        calls=sum(len(t.calls) for t in trajs),
        tools=len({c for t in trajs for c in t.calls}),
        entropies=list(entropies([t.calls for t in trajs])),
        paper_entropies=list(PAPER_ENTROPIES),
        folds=len(split),
        seed=seed,
        held_out_calls=sum(len(t.calls) - 1 for t in trajs),
        passings_given=sum(len(t.calls) - 1 for train, _ in split for t in train),
        passings_once_a_turn=sum(
            len(set(itertools.pairwise(t.calls))) for train, _ in split for t in train
        ),
        passings_counted=counted,
        engine=engine,
    )
    report.prediction = {name: _pooled(h) for name, h in per_fold.items()}
    report.calibration = {name: calibration(a) for name, a in answers.items()}
    return report


def format_report(r: ScienceWorldReport) -> str:
    """The report as the tables the docs show."""
    h0, h1, h2 = r.entropies
    paper = ", ".join(f"{h:.2f}" for h in r.paper_entropies)
    lines = [
        f"ScienceWorld, AutoTool's ReAct logs: {r.files} runs, {r.trajectories} trajectories"
        f" of {r.tasks} tasks ({r.goals} goals), {r.calls} calls over {r.tools} tools",
        f"entropy of the next tool, bits: {h0:.2f} with no context, {h1:.2f} given the current"
        f" tool, {h2:.2f} given the last two (AutoTool: {paper}:"
        f" {'the same parse' if r.same_parse else 'NOT the same'})",
        f"split: {r.folds} folds by goal (seed {r.seed}), every run of a task and every task"
        f" with the same goal on one side; {r.held_out_calls} held-out calls; {r.engine}",
        f"training: one record_turn per trajectory, its consecutive calls; {r.passings_given}"
        f" passings given, {r.passings_once_a_turn} distinct in their turn; the stores counted"
        f" {r.passings_counted}: {_counting(r)}",
        "",
        "| predictor | hit@1 | hit@3 | MRR | hit@1 over folds | hit@3 over folds |",
        "|---|---|---|---|---|---|",
    ]
    for name, h in r.prediction.items():
        lo1, hi1 = h["hit@1 folds"]
        lo3, hi3 = h["hit@3 folds"]
        lines.append(
            f"| {name} | {h['hit@1']:.3f} | {h['hit@3']:.3f} | {h['mrr']:.3f} |"
            f" {lo1:.2f}–{hi1:.2f} | {lo3:.2f}–{hi3:.2f} |"
        )
    names = list(r.calibration)
    lines += [
        "",
        "Coverage at precision of the first choice (share of calls with p ≥ τ, precision of"
        f" those; add-{ADD_K} smoothing), and expected calibration error ({BINS} bins):",
        "",
        "| τ | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for i, tau in enumerate(THRESHOLDS):
        cells = []
        for name in names:
            c = r.calibration[name]["coverage"][i]
            precision = "–" if c["precision"] is None else f"{c['precision']:.2f}"
            cells.append(f"{c['share']:.2f} at {precision}")
        lines.append(f"| {tau:.2f} | " + " | ".join(cells) + " |")
    lines.append("| ECE | " + " | ".join(f"{r.calibration[n]['ece']:.3f}" for n in names) + " |")
    return "\n".join(lines)


def _counting(r: ScienceWorldReport) -> str:
    if r.passings_counted == r.passings_given:
        return "every passing counts"
    if r.passings_counted == r.passings_once_a_turn:
        return "a turn counts an edge once"
    return "neither every passing nor once a turn"


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: the tables on stdout; exit 2 when the trajectories are missing."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scienceworld", description=__doc__)
    add_arguments(parser)
    parser.add_argument("--seed", type=int, default=SEED, help=f"the folds' seed ({SEED})")
    parser.add_argument("--workdir", help="folder for the SQLite files (default: temp)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    args = parser.parse_args(argv)
    try:
        report = run(
            autotool=autotool_path(args), n_folds=args.folds, seed=args.seed, workdir=args.workdir
        )
    except MissingData as err:
        print(f"python -m benchmarks.scienceworld: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=2))
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options both command lines take."""
    parser.add_argument(
        "--autotool",
        metavar="PATH",
        help="AutoTool's ScienceWorld logs: a clone of the repository, its trajectories folder,"
        " or one file",
    )
    parser.add_argument(
        "--folds", type=int, default=FOLDS, help=f"folds of the split by task ({FOLDS})"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run on the small hand-written fixtures of tests/fixtures (figures mean"
        " nothing)",
    )


def autotool_path(args: argparse.Namespace) -> str | None:
    """The ``--autotool`` given, or the fixture with ``--quick``."""
    return str(FIXTURE) if args.quick and args.autotool is None else args.autotool


if __name__ == "__main__":
    raise SystemExit(main())
