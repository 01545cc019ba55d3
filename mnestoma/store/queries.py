"""The queries of a repository (contract §4, §9, §13): rows by id or key, listings,
walks, suggestions, rankings, forecasts and a chain's verdict. They read, never write."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from mnestoma.core.errors import InvalidInput
from mnestoma.core.rules import (
    DECAYED_USES_ORDER,
    PROBABILITY_ORDER,
    RECURRING_MIN_USES,
    RECURRING_MIN_WEIGHT,
    MnestState,
)
from mnestoma.core.validation import (
    check_mnest_id,
    check_name,
    check_optional_name,
    check_positive_int,
    check_state,
    check_states,
    check_weight_threshold,
)
from mnestoma.planner import ranking
from mnestoma.planner.planning import Forecast, normalise_context, read_forecast
from mnestoma.planner.vetting import Verdict, normalise_steps, vet_chain
from mnestoma.schema import snapshots as snap
from mnestoma.schema.models import Event, Mnest
from mnestoma.schema.sql import read as rd
from mnestoma.store.plumbing import StoreBase
from mnestoma.store.rows import key_params

__all__ = ["MAX_LIMIT", "MAX_WALK_DEPTH", "MAX_WALK_LIMIT", "WALK_LIMIT", "Queries"]

MAX_WALK_DEPTH = 16
# walk(): the paths returned by default (best first), and the most a caller may ask for.
WALK_LIMIT = 1000
MAX_WALK_LIMIT = 100_000
MAX_LIMIT = 2**31 - 1  # the largest LIMIT both engines take as a plain integer
RANK_NAMES_PER_STATEMENT = 500


class Queries(StoreBase):
    """The reads of :class:`~mnestoma.MnestRepository`: none of them writes."""

    def get(self, mnest_id: str) -> Mnest | None:
        """The mnest with this id, or None.

        Returns:
            The mnest, or None when no row has this id.

        Raises:
            InvalidInput: ``mnest_id`` is not a non-empty string.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        check_mnest_id(mnest_id)
        row = self._ex().first(rd.SELECT_BY_ID, {"id": mnest_id})
        return snap.mnest(row) if row is not None else None

    def find(
        self,
        src_executor: str,
        src_version: str,
        dst_executor: str,
        dst_version: str | None,
        state: str = MnestState.ACTIVE,
    ) -> Mnest | None:
        """The row with this key and state, or None.

        Returns:
            The row, or None when no row has this key in this state.

        Raises:
            InvalidInput: a name or version, or a state, the contract refuses.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        key = (
            check_name(src_executor, "src_executor"),
            check_name(src_version, "src_version"),
            check_name(dst_executor, "dst_executor"),
            check_optional_name(dst_version, "dst_version"),
        )
        stmt = rd.find_statement(dst_version is None, check_state(state))
        row = self._ex().first(stmt, key_params(key))
        return snap.mnest(row) if row is not None else None

    def edges(
        self,
        *,
        src_executor: str | None = None,
        dst_executor: str | None = None,
        states: Iterable[str] | str | None = None,
        limit: int | None = None,
    ) -> list[Mnest]:
        """Rows filtered by source, destination and states (None: every state), oldest
        first; at most ``limit`` of them (in the SQL, so a big store is not read whole).

        Returns:
            The rows, oldest first.

        Raises:
            InvalidInput: a name, a state, or a ``limit`` that is not a positive integer
                within the package's maximum.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        params: dict[str, Any] = {}
        if src_executor is not None:
            params["src"] = check_name(src_executor, "src_executor")
        if dst_executor is not None:
            params["dst"] = check_name(dst_executor, "dst_executor")
        st = check_states(states)
        if st is not None:
            params["states"] = [s.value for s in st]
        if limit is not None:
            params["limit"] = check_positive_int(limit, "limit", maximum=MAX_LIMIT)
        stmt = rd.edges_statement(
            src_executor is not None, dst_executor is not None, st is not None, limit is not None
        )
        return snap.mnests(self._ex().rows(stmt, params))

    def events(
        self,
        *,
        mnest_id: str | None = None,
        turn_id: str | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """Events, oldest first, optionally for one mnest and/or one turn; at most
        ``limit`` of them (in the SQL).

        Returns:
            The events, oldest first.

        Raises:
            InvalidInput: ``mnest_id``, ``turn_id`` or ``limit`` is refused.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        params: dict[str, Any] = {}
        if mnest_id is not None:
            params["mnest_id"] = check_mnest_id(mnest_id)
        if turn_id is not None:
            params["turn_id"] = check_name(turn_id, "turn_id")
        if limit is not None:
            params["limit"] = check_positive_int(limit, "limit", maximum=MAX_LIMIT)
        stmt = rd.events_statement(mnest_id is not None, turn_id is not None, limit is not None)
        return [snap.event(r) for r in self._ex().rows(stmt, params)]

    def walk(
        self,
        src_executor: str,
        *,
        max_depth: int = 3,
        min_weight: float = 0.0,
        limit: int = WALK_LIMIT,
    ) -> list[list[Mnest]]:
        """The best ``limit`` simple paths of 1..max_depth active edges from ``src_executor``.

        One recursive query: an edge follows another when its source (executor and version)
        is the previous destination; no executor appears twice; each edge's effective
        weight is at least ``min_weight``; paths are ordered by the product of weights, best
        first, and only the first ``limit`` are computed (the work grows with ``limit``,
        not with the number of paths a dense graph has).

        Returns:
            The paths, each the list of its edges from the source, best first.

        Raises:
            InvalidInput: ``src_executor``, ``max_depth``, ``min_weight`` (a weight from 0 to
                1) or ``limit`` is refused.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        src = check_name(src_executor, "src_executor")
        depth = check_positive_int(max_depth, "max_depth", maximum=MAX_WALK_DEPTH)
        floor = check_weight_threshold(min_weight, "min_weight")
        most = check_positive_int(limit, "limit", maximum=MAX_WALK_LIMIT)
        ex = self._ex()
        stmt = rd.walk_statement(ex.dialect, with_floor=floor > 0)
        params = {"src": src, "max_depth": depth, "now": self._now(), "limit": most}
        if floor > 0:
            params["min_weight"] = floor
        # A row is (path of ids, *the columns of its last edge). Every prefix of a path is a
        # path too and scores at least as much (weights are ≤ 1; ties go to the shorter), so
        # it came in an earlier row: each path is its parent's list plus one edge.
        by_id: dict[str, Mnest] = {}
        by_path: dict[str, list[Mnest]] = {}
        out: list[list[Mnest]] = []
        for r in ex.rows(stmt, params):
            edge = by_id.get(r[1])
            if edge is None:
                edge = by_id[r[1]] = snap.mnest(r[1:])
            parent = r[0].rpartition(",")[0]
            path = by_path[r[0]] = [*by_path[parent], edge] if parent else [edge]
            out.append(path)
        return out

    def suggest_next(
        self,
        src_executor: str,
        src_version: str | None = None,
        *,
        k: int = 5,
        order_by: str = "weight",
    ) -> list[tuple[Mnest, float]]:
        """The k active edges out of the source that a planner should try first, each with
        the value it was ordered by.

        Highest effective weight first, ties broken by activation (more uses, more recent
        use), then by name: the ordering of :meth:`rank` (see :mod:`mnestoma.ranking`). With
        ``order_by="decayed_uses"``, the highest decayed count of passings first (contract
        §12), that order among equal counts; each edge then comes with its count.

        Returns:
            At most ``k`` pairs (edge, the value it was ordered by: its effective weight, or
            its decayed count of passings), best first.

        Raises:
            InvalidInput: a name or version, ``k`` or ``order_by`` is refused.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        src = check_name(src_executor, "src_executor")
        version = check_optional_name(src_version, "src_version")
        limit = check_positive_int(k, "k", maximum=10_000)
        by_count = ranking.check_suggest_order_by(order_by) == DECAYED_USES_ORDER
        ex = self._ex()
        now = self._now()
        params: dict[str, Any] = {"src": src, "k": limit + 1, "now": now}
        if version is not None:
            params["sv"] = version
        with_version = version is not None
        stmt = rd.suggest_statement(ex.dialect, with_version, by_count=by_count)
        rows = ex.rows(stmt, params)
        if len(rows) > limit and rows[limit][-1] == rows[limit - 1][-1]:
            # a tie across the k-th place: read every edge of that strength, so that the
            # activation (not the SQL's order) decides which of them make the cut
            params["floor"] = rows[limit - 1][-1]
            stmt = rd.suggest_statement(ex.dialect, with_version, ties=True, by_count=by_count)
            rows = ex.rows(stmt, params)
        if by_count:
            counted = [(snap.mnest(r), float(r[-2]), float(r[-1])) for r in rows]
            return [(m, count) for m, _, count in ranking.order_by_count(counted, now)[:limit]]
        edges = [(snap.mnest(r), float(r[-1])) for r in rows]
        return ranking.order_edges(edges, now)[:limit]

    def predict_next(
        self,
        context: Sequence[str] | str,
        *,
        src_version: str | None = None,
        k: int | None = None,
    ) -> Forecast:
        """What follows the last one or two executors of a turn, with a probability a planner
        can act on (contract §13): P(next | context) for each executor seen after it, the
        passings behind each, and which context answered (the chain of the last two, or the
        last executor alone when the chain has too little evidence).

        ``context`` is the turn's executors so far, oldest first (only the last two are
        read), or the last one's name; ``src_version`` narrows the last executor's edges to
        that version (chains are by name); ``k`` keeps the ``k`` most likely candidates.

        Returns:
            A :class:`~mnestoma.Forecast`: the candidates most likely first, and the
            mass left to executors never seen after the context (``unseen``).

        Raises:
            InvalidInput: the context, a name or version, or ``k`` is refused.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        ctx = normalise_context(context)
        version = check_optional_name(src_version, "src_version")
        limit = None if k is None else check_positive_int(k, "k", maximum=10_000)
        return read_forecast(self._ex(), ctx, version, self._now(), limit)

    def rank(
        self,
        src_executor: str,
        candidates: Iterable[Any],
        *,
        src_version: str | None = None,
        order_by: str = "weight",
        prev: str | None = None,
    ) -> list[ranking.Ranked]:
        """The candidates (names, or (name, version) pairs) in the order a planner should
        try them after ``src_executor``, each with its score and why (contract §9); with
        ``order_by="success"``, the most successful edges first (contract §11); with
        ``order_by="decayed_uses"``, the highest decayed count of passings first (§12); with
        ``order_by="p"``, the highest P(candidate next | context) first (§13), the context
        being ``prev → src_executor`` (``prev``: the executor before it in the turn) or
        ``src_executor`` alone.

        Returns:
            One :class:`~mnestoma.ranking.Ranked` per candidate, best first (an empty list
            for no candidates).

        Raises:
            InvalidInput: a name or version, a candidate or ``order_by`` is refused.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        src = check_name(src_executor, "src_executor")
        version = check_optional_name(src_version, "src_version")
        by = ranking.check_order_by(order_by)
        before = check_optional_name(prev, "prev")
        if before is not None and by != PROBABILITY_ORDER:
            raise InvalidInput(f"prev is read by order_by={PROBABILITY_ORDER!r} only")
        wanted = ranking.normalise_candidates(candidates)
        if not wanted:
            return []
        ex = self._ex()
        stmt = rd.rank_statement(ex.dialect, version is not None)
        now = self._now()
        names = sorted({executor for _, executor, _ in wanted})
        edges: list[tuple[Mnest, float]] = []
        for i in range(0, len(names), RANK_NAMES_PER_STATEMENT):
            params: dict[str, Any] = {
                "src": src,
                "names": names[i : i + RANK_NAMES_PER_STATEMENT],
                "now": now,
            }
            if version is not None:
                params["sv"] = version
            edges.extend((snap.mnest(r), float(r[-1])) for r in ex.rows(stmt, params))
        told = None
        if by == PROBABILITY_ORDER:
            context = (src,) if before is None else (before, src)
            told = read_forecast(ex, context, version, now)
        return ranking.rank_candidates(src, wanted, edges, now, order_by=by, forecast=told)

    def vet(self, steps: Iterable[Any]) -> Verdict:
        """The sieve's verdict on a proposed chain of executors (each a name or a
        ``(name, version)`` pair): per link whether an active edge was seen, how strong and
        how successful, and for the chain its score, weakest and unknown links, read in one
        statement (see :mod:`mnestoma.planner.vetting`). Evidence, never proof: a link never seen
        is unknown, not wrong.

        Returns:
            The :class:`~mnestoma.Verdict` of the chain, and of each of its links.

        Raises:
            InvalidInput: a step that is neither a name nor a (name, version) pair, or a
                chain shorter than one link or longer than the package's maximum.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        chain = normalise_steps(steps)
        return vet_chain(self._ex(), chain, self._now())

    def recurring_protos(
        self, *, min_uses: int = RECURRING_MIN_USES, min_weight: float = RECURRING_MIN_WEIGHT
    ) -> list[Mnest]:
        """Protos with at least ``min_uses`` uses and effective weight ≥ ``min_weight``.

        Returns:
            The protos that qualify, as a list (empty when none does).

        Raises:
            InvalidInput: ``min_uses`` is not a positive integer, or ``min_weight`` not a
                weight from 0 to 1.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        uses = check_positive_int(min_uses, "min_uses")
        floor = check_weight_threshold(min_weight, "min_weight")
        ex = self._ex()
        stmt = rd.recurring_protos_statement(ex.dialect)
        rows = ex.rows(stmt, {"uses": uses, "floor": floor, "now": self._now()})
        return snap.mnests(rows)
