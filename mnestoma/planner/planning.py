"""The planner's probabilities (contract §13): what follows a context, with P(next | context),
the evidence behind each candidate and the context used.

The counts come from the store in one statement (:func:`mnestoma.schema.sql.chains.next_counts`);
the formula is :func:`mnestoma.rules.next_probabilities` (Witten-Bell smoothing, the chain
interpolated with the edge). This module turns them into the answer a planner reads.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mnestoma.core.errors import InvalidInput
from mnestoma.core.rules import ContextUsed, next_probabilities, unseen_probability
from mnestoma.core.validation import check_name
from mnestoma.schema.runner import StatementRunner
from mnestoma.schema.sql.chains import next_counts

__all__ = [
    "Forecast",
    "Prediction",
    "forecast",
    "normalise_context",
    "read_forecast",
]


@dataclass(frozen=True, slots=True)
class Prediction:
    """One candidate next executor: its probability after the context, and the evidence.

    ``support`` is the decayed count of passings to it in the context used (the chain's, or
    the edge's), ``uses`` the raw count of those passings.
    """

    executor: str
    p: float
    support: float
    uses: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {"executor": self.executor, "p": self.p, "support": self.support, "uses": self.uses}


@dataclass(frozen=True)
class Forecast:
    """What follows the context: the candidates seen after it, most likely first, and the
    probability left to executors never seen after it (``unseen``): the candidates' ``p`` and
    ``unseen`` sum to 1 (all candidates; ``k`` may cut the list). ``context`` is the context
    used (two executors for a chain, else the last one), ``used`` which kind it is, and
    ``support`` its decayed count of passings.
    """

    context: tuple[str, ...]
    used: ContextUsed
    support: float
    unseen: float
    candidates: tuple[Prediction, ...]

    def p(self, executor: str) -> float:
        """P(``executor`` next after the context).

        Returns:
            Its candidate's ``p``, or, for an executor never seen after the context, its share
            of the unseen mass (:func:`~mnestoma.rules.unseen_probability`): never 0.
        """
        found = self._by_executor.get(executor)
        return unseen_probability(self.unseen) if found is None else found.p

    @functools.cached_property
    def _by_executor(self) -> dict[str, Prediction]:
        """The candidates by name, made once: ``rank`` asks ``p`` once per candidate."""
        return {c.executor: c for c in self.candidates}

    @property
    def top(self) -> Prediction | None:
        """The most likely candidate, or None when nothing was seen after the context."""
        return self.candidates[0] if self.candidates else None

    def as_dict(self) -> dict[str, Any]:
        """The forecast as JSON-ready fields.

        Returns:
            ``context``, ``used``, ``support``, ``unseen`` and ``candidates`` (each as
            :meth:`Prediction.as_dict`), as ``mnestoma predict --json`` prints them.
        """
        return {
            "context": list(self.context),
            "used": self.used.value,
            "support": self.support,
            "unseen": self.unseen,
            "candidates": [c.as_dict() for c in self.candidates],
        }


def normalise_context(context: object) -> tuple[str, ...]:
    """The last one or two executors of a turn, oldest first (a name alone is the last one);
    longer sequences keep their last two. InvalidInput for anything else."""
    if isinstance(context, str):
        return (check_name(context, "context"),)
    if isinstance(context, bytes) or not isinstance(context, Iterable):
        raise InvalidInput("context must be an executor name or a sequence of executor names")
    names = [check_name(c, "context executor") for c in context]
    if not names:
        raise InvalidInput("context must name at least the last executor of the turn")
    return tuple(names[-2:])


def forecast(
    context: tuple[str, ...], rows: Iterable[Sequence[Any]], k: int | None = None
) -> Forecast:
    """The forecast from :func:`mnestoma.schema.sql.chains.next_counts`' rows ``(level, dst,
    decayed count, uses)``: level 1 the edges out of the last executor, level 2 the chains
    after the last two."""
    edge: dict[str, float] = {}
    chain: dict[str, float] = {}
    uses: dict[int, dict[str, int]] = {1: {}, 2: {}}
    for level, dst, counted, n in rows:
        (edge if int(level) == 1 else chain)[dst] = float(counted)
        uses[int(level)][dst] = int(n)
    probs = next_probabilities(edge, chain if len(context) == 2 else None)
    level = 2 if probs.context is ContextUsed.CHAIN else 1
    support = chain if level == 2 else edge
    ranked = sorted(probs.p.items(), key=lambda kv: (-kv[1], -support.get(kv[0], 0.0), kv[0]))
    if k is not None:
        ranked = ranked[:k]
    candidates = tuple(
        Prediction(dst, p, support.get(dst, 0.0), uses[level].get(dst, 0)) for dst, p in ranked
    )
    used_context = context if level == 2 else context[-1:]
    return Forecast(used_context, probs.context, probs.support, probs.unseen, candidates)


def read_forecast(
    ex: StatementRunner,
    context: tuple[str, ...],
    src_version: str | None,
    now: datetime,
    k: int | None = None,
) -> Forecast:
    """The forecast after ``context`` (one or two names, checked) at ``now``, read in one
    statement (:func:`mnestoma.schema.sql.chains.next_counts`)."""
    params: dict[str, Any] = {"src": context[-1], "now": now}
    if src_version is not None:
        params["sv"] = src_version
    if len(context) == 2:
        params["prev"] = context[0]
    stmt = next_counts(ex.dialect, src_version is not None, len(context) == 2)
    return forecast(context, ex.rows(stmt, params), k)
