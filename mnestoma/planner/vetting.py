"""The sieve's door (contract §11): what the store knows of each link of a proposed chain.

A plan checker proposes a chain of executors, each a name or ``(name, version)``; the
verdict says, link by link, whether the store holds an active edge for it, how strong it is
now, how often it was used and how often what followed it succeeded. It is evidence, never
proof: a link the store has never seen is *unknown*, not wrong (the planner may be trying
something new), and a known link may still fail.

Decisions, stated once:

- a chain has at least :data:`MIN_VET_STEPS` steps (one link) and at most
  :data:`MAX_VET_STEPS`, so that one statement stays bounded;
- each link reports its best matching row in any state (active first, then the highest
  effective weight now, then more uses); only an active row makes the link ``known``;
- ``weight`` is the effective weight now of that row, whatever its state (a decaying or
  proto row's weight is shown as evidence); in the chain's ``score`` and ``weakest``, a link
  that is not known counts as 0, since no active edge stands behind it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from mnestoma.core.errors import InvalidInput
from mnestoma.core.records import fields_record
from mnestoma.core.rules import MnestState, probability_of, success_rate
from mnestoma.core.validation import check_name, check_optional_name
from mnestoma.schema.runner import StatementRunner
from mnestoma.schema.sql import vet as sql

__all__ = [
    "MAX_VET_STEPS",
    "MIN_VET_STEPS",
    "LinkVerdict",
    "Step",
    "Verdict",
    "normalise_steps",
    "vet_chain",
]

# One link at least; at most 64 steps (63 links), which keeps the one statement's branches
# and parameters well inside both engines' limits.
MIN_VET_STEPS = 2
MAX_VET_STEPS = 64

Step = tuple[str, str | None]


@dataclass(frozen=True, slots=True)
class LinkVerdict:
    """Link ``index`` (step ``index`` → step ``index + 1``), as the steps name it, and the
    evidence of its best matching row.

    ``known``: an active edge matches. Without any matching row: not known, weight 0,
    counts 0, ``success`` = ``success_rate(0, 0)``, no state, no id: unknown, not wrong.
    ``weight`` is the row's effective weight now in any state; ``last_seen`` its last use.
    """

    index: int
    src_executor: str
    src_version: str | None
    dst_executor: str
    dst_version: str | None
    known: bool
    weight: float
    uses: int
    ok_count: int
    error_count: int
    success: float
    last_seen: datetime | None
    state: str | None
    mnest_id: str | None
    p: float = 1.0  # P(this step | the two before it), contract §13; set by vet_chain

    @property
    def standing(self) -> float:
        """What this link adds to the chain's score: its weight when known, else 0."""
        return self.weight if self.known else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (the last use as ISO-8601 UTC)."""
        return fields_record(self, json=True)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the store knows of a chain: each link, and for the whole chain ``score`` (the
    product of the links' effective weights, 0 when a link is unknown), ``weakest`` (the
    index of the link that adds the least to the score, the first on ties; None without
    links) and ``unknown`` (the indexes of the links not known: never seen active, which
    says nothing against them)."""

    steps: tuple[Step, ...]
    links: tuple[LinkVerdict, ...]
    score: float
    weakest: int | None
    unknown: tuple[int, ...]
    # Σ ln p of the links (contract §13): the chain's log-likelihood under predict_next's
    # probabilities; an unseen link lowers it by ln of its share of the unseen mass.
    log_likelihood: float = 0.0

    @property
    def known(self) -> bool:
        """True when every link of the chain is known."""
        return not self.unknown

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields: the steps as ``{"executor", "version"}`` objects."""
        return {
            "steps": [{"executor": e, "version": v} for e, v in self.steps],
            "links": [link.as_dict() for link in self.links],
            "score": self.score,
            "weakest": self.weakest,
            "unknown": list(self.unknown),
            "log_likelihood": self.log_likelihood,
        }


def normalise_steps(steps: object) -> list[Step]:
    """``steps`` as (executor, version or None) pairs, checked: each step an executor name
    or an ``(executor, version)`` pair (a None version: any version); between
    :data:`MIN_VET_STEPS` and :data:`MAX_VET_STEPS` of them. Else :class:`InvalidInput`."""
    if isinstance(steps, str | bytes) or not isinstance(steps, Iterable):
        raise InvalidInput("steps must be a list of executor names or (name, version) pairs")
    out: list[Step] = []
    for step in steps:
        if len(out) == MAX_VET_STEPS:
            raise InvalidInput(f"a chain has at most {MAX_VET_STEPS} steps")
        what = f"step {len(out)}"
        if isinstance(step, str):
            out.append((check_name(step, what), None))
        elif isinstance(step, tuple | list) and len(step) == 2:
            out.append(
                (
                    check_name(step[0], f"{what} executor"),
                    check_optional_name(step[1], f"{what} version"),
                )
            )
        else:
            raise InvalidInput(
                f"{what} must be an executor name or an (executor, version) pair, got {step!r}"
            )
    if len(out) < MIN_VET_STEPS:
        raise InvalidInput(f"a chain has at least {MIN_VET_STEPS} steps (one link), got {len(out)}")
    return out


def vet_chain(ex: StatementRunner, steps: list[Step], now: datetime) -> Verdict:
    """The verdict on ``steps`` (as :func:`normalise_steps` returns them) at ``now``, read in
    one statement whatever the chain's length."""
    stmt = sql.vet_statement(ex.dialect, len(steps))
    params = sql.step_params(steps)
    params["now"] = now
    found: dict[int, tuple[Any, ...]] = {}
    edges: dict[int, tuple[float, int, float]] = {}
    chains: dict[int, tuple[float, int, float]] = {}
    for r in ex.rows(stmt, params):
        kind, idx = int(r[0]), int(r[1])
        if kind == sql.BEST_ROW:
            found[idx] = r[1:9]
        else:
            summary = (float(r[9]), int(r[10]), float(r[11]))
            (edges if kind == sql.EDGE_SUMMARY else chains)[idx] = summary
    links = tuple(
        replace(
            _link(i, steps[i], steps[i + 1], found.get(i)),
            p=probability_of(edges.get(i, (0.0, 0, 0.0)), chains.get(i)),
        )
        for i in range(len(steps) - 1)
    )
    return verdict(tuple(steps), links)


def verdict(steps: tuple[Step, ...], links: tuple[LinkVerdict, ...]) -> Verdict:
    """The chain's figures from its links: score, weakest, unknown."""
    score = 1.0
    for link in links:
        score *= link.standing
    weakest = min(range(len(links)), key=lambda i: links[i].standing) if links else None
    unknown = tuple(link.index for link in links if not link.known)
    likelihood = math.fsum(math.log(link.p) for link in links)
    return Verdict(steps, links, score if links else 0.0, weakest, unknown, likelihood)


def _link(index: int, src: Step, dst: Step, row: tuple[Any, ...] | None) -> LinkVerdict:
    """One link from its best row (a row of :func:`mnestoma.schema.sql.vet.vet_statement`), or
    the unknown link without one."""
    if row is None:
        return LinkVerdict(
            index, *src, *dst, False, 0.0, 0, 0, 0, success_rate(0, 0), None, None, None
        )
    _, mnest_id, state, effective, uses, ok, error, ts_last = row
    return LinkVerdict(
        index,
        *src,
        *dst,
        state == MnestState.ACTIVE.value,
        float(effective),
        int(uses),
        int(ok),
        int(error),
        success_rate(int(ok), int(error)),
        ts_last,
        str(state),
        str(mnest_id),
    )
