"""The planner's door (contract §9): one ordering for ``rank`` and ``suggest_next``.

Both read active edges with their effective weight (computed in SQL by the same expression)
and sort them here with :func:`mnestoma.rules.ranking_key`: the higher effective weight
first, ties broken by the activation of :func:`mnestoma.rules.activation`, then by name so
that the order never depends on random ids. The SQL cannot finish the job itself because
SQLite may lack ``ln``; Python does it, once, here.

Each ranked candidate also carries ``success`` (contract §11), the
:func:`mnestoma.rules.success_rate` of its edge's outcomes; ``rank`` orders by it only
when asked (``order_by="success"``), and ``decayed_uses`` (contract §12), the decayed count
of the edge's passings (:func:`mnestoma.rules.decayed_count`), which ``rank`` and
``suggest_next`` order by when asked (``order_by="decayed_uses"``): the highest count first,
ties broken as the weight's order is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from mnestoma.core.errors import InvalidInput
from mnestoma.core.rules import (
    DECAYED_USES_ORDER,
    PROBABILITY_ORDER,
    activation,
    decayed_count,
    ranking_key,
    spread_count,
    success_rate,
)
from mnestoma.core.validation import check_name
from mnestoma.planner.planning import Forecast
from mnestoma.schema.models import Mnest

__all__ = [
    "ORDER_BY",
    "SUGGEST_ORDER_BY",
    "Candidate",
    "Ranked",
    "check_order_by",
    "check_suggest_order_by",
    "edge_key",
    "normalise_candidates",
    "order_edges",
    "rank_candidates",
]

Candidate = str | tuple[str, str]

# What ``rank`` may order by: the effective weight (the default, contract §9), the success
# of what followed the edge (contract §11), then the weight's order, or the decayed count of
# passings (contract §12), then the weight's order, or P(next | context) (contract §13),
# then the weight's order.
ORDER_BY = ("weight", "success", DECAYED_USES_ORDER, PROBABILITY_ORDER)
# What ``suggest_next`` may order by: the weight (the default), or the decayed count.
SUGGEST_ORDER_BY = ("weight", DECAYED_USES_ORDER)


@dataclass(frozen=True, slots=True)
class Ranked:
    """One candidate in the order a planner should try it, with its score and why.

    ``score`` is what ranks first: the effective weight of ``src → candidate`` now (0.0 when
    there is no active edge, ``weight`` likewise); ``activation`` breaks ties of score (None
    without an edge); ``mnest`` is the edge that gave the score (the best one over the
    versions when the candidate names no version), or None. ``success`` is
    :func:`~mnestoma.rules.success_rate` of that edge's ``ok_count`` and ``error_count``
    (``success_rate(0, 0)`` without an edge): evidence of what followed, not of weight.
    ``decayed_uses`` is the edge's decayed count of passings now
    (:func:`~mnestoma.rules.decayed_count`; 0.0 without an edge). ``p`` is P(candidate next
    | context) and ``context`` the context that answered (``chain``, ``edge`` or ``none``,
    contract §13), with ``order_by="p"`` only (else None).
    """

    candidate: Candidate
    executor: str
    version: str | None
    score: float
    weight: float
    activation: float | None
    success: float
    mnest: Mnest | None
    reason: str
    decayed_uses: float = 0.0
    p: float | None = None
    context: str | None = None

    @property
    def mnest_id(self) -> str | None:
        """The id of the edge that gave the score, or None."""
        return None if self.mnest is None else self.mnest.id

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (the edge by id)."""
        return {
            "candidate": list(self.candidate)
            if isinstance(self.candidate, tuple)
            else self.candidate,
            "executor": self.executor,
            "version": self.version,
            "score": self.score,
            "weight": self.weight,
            "activation": self.activation,
            "success": self.success,
            "mnest_id": self.mnest_id,
            "reason": self.reason,
            "decayed_uses": self.decayed_uses,
            "p": self.p,
            "context": self.context,
        }


def edge_key(m: Mnest, effective: float, now: datetime) -> tuple[Any, ...]:
    """Sort key of one active edge, best first; the trailing names make the order total."""
    act = activation(m.uses, m.ts_first, m.ts_last, now)
    return (
        *ranking_key(effective, act),
        m.dst_executor,
        m.dst_version or "",
        m.src_version,
        m.id,
    )


def count_key(m: Mnest, effective: float, count: float, now: datetime) -> tuple[Any, ...]:
    """Sort key of one active edge by its decayed count ``count``, best first; the weight's
    order (:func:`edge_key`) among equal counts."""
    return (-count, *edge_key(m, effective, now))


def order_by_count(
    edges: Iterable[tuple[Mnest, float, float]], now: datetime
) -> list[tuple[Mnest, float, float]]:
    """Active edges with their effective weights and decayed counts, highest count first."""
    return sorted(edges, key=lambda e: count_key(e[0], e[1], e[2], now))


def order_edges(edges: Iterable[tuple[Mnest, float]], now: datetime) -> list[tuple[Mnest, float]]:
    """Active edges with their effective weights, in the order a planner should try them.

    The same order as sorting by :func:`edge_key`; the activation is only computed where
    effective weights tie, since it decides nothing elsewhere.
    """
    by_weight = sorted(edges, key=lambda e: -e[1])
    out: list[tuple[Mnest, float]] = []
    i, n = 0, len(by_weight)
    while i < n:
        j = i + 1
        while j < n and by_weight[j][1] == by_weight[i][1]:
            j += 1
        if j - i == 1:
            out.append(by_weight[i])
        else:
            out.extend(sorted(by_weight[i:j], key=lambda e: edge_key(e[0], e[1], now)))
        i = j
    return out


def normalise_candidates(candidates: Any) -> list[tuple[Candidate, str, str | None]]:
    """(as given, executor, version or None) for each candidate; names and versions checked."""
    if isinstance(candidates, str | bytes) or not isinstance(candidates, Iterable):
        raise InvalidInput("candidates must be an iterable of executor names or (name, version)")
    out: list[tuple[Candidate, str, str | None]] = []
    seen: set[tuple[str, str | None]] = set()
    for c in candidates:
        if isinstance(c, str):
            given: Candidate = c
            executor, version = check_name(c, "candidate"), None
        elif isinstance(c, tuple | list) and len(c) == 2:
            executor = check_name(c[0], "candidate executor")
            version = check_name(c[1], "candidate version")
            given = (executor, version)
        else:
            raise InvalidInput(
                f"a candidate is an executor name or an (executor, version) pair, got {c!r}"
            )
        if (executor, version) in seen:
            raise InvalidInput(f"candidate {_label(executor, version)!r} is given twice")
        seen.add((executor, version))
        out.append((given, executor, version))
    return out


def check_order_by(value: object, allowed: tuple[str, ...] = ORDER_BY) -> str:
    """One of ``allowed`` (:data:`ORDER_BY`), else InvalidInput."""
    if isinstance(value, str) and value in allowed:
        return value
    raise InvalidInput(f"unknown order {value!r}; expected one of {', '.join(allowed)}")


def check_suggest_order_by(value: object) -> str:
    """One of :data:`SUGGEST_ORDER_BY`, else InvalidInput."""
    return check_order_by(value, SUGGEST_ORDER_BY)


def rank_candidates(
    src_executor: str,
    candidates: Sequence[tuple[Candidate, str, str | None]],
    edges: Iterable[tuple[Mnest, float] | tuple[Mnest, float, float]],
    now: datetime,
    order_by: str = "weight",
    forecast: Forecast | None = None,
) -> list[Ranked]:
    """Rank ``candidates`` from the active edges of the source to them (see :class:`Ranked`).

    Each edge comes with its effective weight now, and may come with its decayed count
    (computed by the SQL; else here, from the row). A candidate without a version is scored
    by its best edge over every version; those without any edge follow the others in the
    order given. With ``order_by="success"``, the same list is sorted again by ``success``,
    highest first, keeping that order among equals: a candidate without an edge (success 0.5)
    then goes before an edge whose errors outnumber its successes, and after one whose
    successes outnumber its errors. With ``order_by="decayed_uses"``, the highest decayed
    count first (its best edge over the versions likewise), the weight's order among equals.
    With ``order_by="p"``, the highest P(candidate next | context) of ``forecast`` first (a
    candidate never seen after the context: its share of the unseen mass), the weight's
    order among equals.
    """
    order = check_order_by(order_by)
    by_count = order == DECAYED_USES_ORDER
    best: dict[tuple[str, str | None], tuple[tuple[Any, ...], Mnest, float, float]] = {}
    for edge in edges:
        m, eff = edge[0], edge[1]
        count = edge[2] if len(edge) > 2 else _count_of(m, now)
        key = count_key(m, eff, count, now) if by_count else edge_key(m, eff, now)
        for ident in ((m.dst_executor, None), (m.dst_executor, m.dst_version)):
            held = best.get(ident)
            if held is None or key < held[0]:
                best[ident] = (key, m, eff, count)
    scored: list[tuple[tuple[Any, ...], Ranked]] = []
    missing: list[Ranked] = []
    for given, executor, version in candidates:
        found = best.get((executor, version))
        if found is None:
            why = f"no active edge {src_executor} -> {_label(executor, version)}"
            missing.append(
                Ranked(given, executor, version, 0.0, 0.0, None, success_rate(0, 0), None, why)
            )
            continue
        key, m, eff, count = found
        act = -key[2] if by_count else -key[1]  # the activation, from the key
        why = (
            f"{m.src_executor}@{m.src_version} -> {m.dst_executor}@{m.dst_version}: "
            f"effective weight {eff:.4f}, activation {act:.3f} "
            f"({m.uses} use{'' if m.uses == 1 else 's'}, last {_age(m.ts_last, now)} ago)"
        )
        if by_count:
            why = f"decayed count {count:.3f}; " + why
        success = success_rate(m.ok_count, m.error_count)
        if m.ok_count or m.error_count:
            why += f"; {m.ok_count} ok, {m.error_count} error: success {success:.3f}"
        ranked = Ranked(given, executor, m.dst_version, eff, eff, act, success, m, why, count)
        scored.append((key, ranked))
    scored.sort(key=lambda s: s[0])
    ranked_list = [r for _, r in scored] + missing
    if order == "success":
        ranked_list.sort(key=lambda r: -r.success)  # stable: the weight's order among equals
    elif order == PROBABILITY_ORDER:
        if forecast is None:
            raise InvalidInput("ordering by p needs the forecast of the context")
        used = forecast.used.value
        ranked_list = [replace(r, p=forecast.p(r.executor), context=used) for r in ranked_list]
        ranked_list.sort(key=lambda r: -(r.p or 0.0))  # stable: the weight's order among equals
    return ranked_list


def _count_of(m: Mnest, now: datetime) -> float:
    """The edge's decayed count at ``now``; a transient row not yet given one (its column
    unset before a flush) counts its uses as revision 0010 does (:func:`spread_count`)."""
    count = m.decayed_uses
    if count is None:
        count = spread_count(m.uses, m.decay_lambda, m.ts_first, m.ts_last)
    return decayed_count(count, m.decay_lambda, m.ts_last, now)


def _label(executor: str, version: str | None) -> str:
    return executor if version is None else f"{executor}@{version}"


def _age(then: datetime, now: datetime) -> str:
    seconds = max(0.0, (now - then).total_seconds())
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
