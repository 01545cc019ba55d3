"""Repositories: every operation of contract §4 on a caller's session.

A repository takes a session, may flush, and never commits: the unit of work (or the
calling service) owns the transaction. Hot paths run Core statements built once at import
and executed with bound parameters on the session's connection.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Session, configure_mappers, scoped_session
from sqlalchemy.orm.base import instance_state
from sqlalchemy.sql import Executable

from . import ranking
from . import sqlite_driver as lite
from . import statements as stm
from .ager import run_ager
from .errors import ConflictError, InvalidInput, InvalidTransition, NotFound, translate_errors
from .locking import take_write_lock
from .models import CanonicalQuery, Event, Mnest
from .rules import (
    DEFAULT_DECAY_LAMBDA,
    INITIAL_WEIGHT,
    RECURRING_MIN_USES,
    RECURRING_MIN_WEIGHT,
    AgerReport,
    EventKind,
    MnestState,
    Recorder,
    check_transition,
    decayed_weight,
    new_mnest_id,
    reinforce,
)
from .sqlrules import decayed, now_param
from .statements import EVENT_COLUMNS, MNEST_COLUMNS, QUERY_COLUMNS, E, Key, M, Q
from .validation import (
    Clock,
    Passing,
    check_mnest_id,
    check_name,
    check_optional_name,
    check_positive_int,
    check_recorder,
    check_state,
    check_states,
    check_text,
    check_weight_threshold,
    normalise_passing,
    read_clock,
    shorten,
    utc_now,
)

__all__ = ["CanonicalQueryRepository", "MnestRepository", "QueryFrequency"]

T = TypeVar("T")
MAX_WALK_DEPTH = 16
# walk(): the paths returned by default (best first), and the most a caller may ask for.
WALK_LIMIT = 1000
MAX_WALK_LIMIT = 100_000
MAX_LIMIT = 2**31 - 1  # the largest LIMIT both engines take as a plain integer
RANK_NAMES_PER_STATEMENT = 500
_MAX_RACE_ROUNDS = 8


def _key(p: Passing) -> Key:
    return (p.src_executor, p.src_version, p.dst_executor, p.dst_version)


def _detached(cls: type[T], values: Iterable[tuple[str, Any]] | dict[str, Any], ident: Any) -> T:
    """A detached instance with every column loaded, built without ``__init__`` or events.

    What ``make_transient_to_detached`` does for a fresh object, minus its generic
    bookkeeping: the hot paths build one per returned row.
    """
    manager = cls._sa_class_manager  # type: ignore[attr-defined]
    if not manager.mapper.configured:
        configure_mappers()
    obj = manager.new_instance()
    state = instance_state(obj)
    state.dict.update(values)
    state.key = (cls, (ident,), None)
    return obj  # type: ignore[no-any-return]


def _snapshot(values: Any) -> Mnest:
    """A detached Mnest with every column set, from a row mapping or dict."""
    return _detached(Mnest, {k: values[k] for k in MNEST_COLUMNS}, values["id"])


def _event_snapshot(values: Any) -> Event:
    return _detached(Event, {k: values[k] for k in EVENT_COLUMNS}, values["id"])


def _version_is(dst_version: str | None) -> Any:
    """``dst_version`` equal to the given version, NULL-safe."""
    return M.c.dst_version.is_(None) if dst_version is None else M.c.dst_version == dst_version


def _run(conn: Connection, stmt: Executable, params: Any = None) -> Any:
    """Execute on ``conn``, translating driver errors into the package's."""
    with translate_errors():
        return conn.execute(stmt, params) if params is not None else conn.execute(stmt)


def _event(
    mnest_id: str,
    kind: EventKind,
    ts: datetime,
    *,
    turn_id: str | None = None,
    weight_before: float | None = None,
    weight_after: float | None = None,
    state_before: str | None = None,
    state_after: str | None = None,
    reason: str | None = None,
    related_id: str | None = None,
    recorder: str,
) -> dict[str, Any]:
    return {
        "mnest_id": mnest_id,
        "kind": kind.value,
        "ts": ts,
        "turn_id": turn_id,
        "weight_before": weight_before,
        "weight_after": weight_after,
        "state_before": state_before,
        "state_after": state_after,
        "reason": reason,
        "related_id": related_id,
        "recorder": recorder,
    }


class MnestRepository:
    """Every rule of contract §4 on one session; flushes, never commits.

    A bare ``Connection`` is accepted too (the facade uses one: a Session adds nothing to
    Core statements but its own bookkeeping).
    """

    def __init__(
        self,
        session: Session | Connection,
        *,
        clock: Clock | None = None,
        recorder: str = Recorder.CALL.value,
        before_write: Callable[[], None] | None = None,
    ) -> None:
        self._session = _check_session(session, type(self).__name__)
        self._clock: Clock = clock or utc_now
        self._recorder = check_recorder(recorder).value
        self._before_write = before_write

    # --- plumbing ---------------------------------------------------------------------

    @property
    def session(self) -> Session | Connection:
        """The session (or connection) this repository works in."""
        return self._session

    def _conn(self) -> Connection:
        return _connection_of(self._session)

    def _write_conn(self) -> Connection:
        return _write_connection(self._session, self._before_write)

    def _now(self) -> datetime:
        return read_clock(self._clock)

    def _select_mnests(self, conn: Connection, stmt: Any, params: dict[str, Any]) -> list[Any]:
        """Rows of ``mnests`` as mappings; on SQLite read through the driver directly."""
        if conn.dialect.name != "sqlite":
            return list(_run(conn, stmt, params).mappings().all())
        with translate_errors():
            return [lite.mnest_mapping(r) for r in lite.fetch_tuples(conn, stmt, params)]

    def _run_many(self, conn: Connection, stmt: Any, rows: list[dict[str, Any]]) -> None:
        """executemany; on SQLite with driver-ready rows (see :func:`lite.execute`)."""
        if conn.dialect.name != "sqlite":
            _run(conn, stmt, rows)
            return
        with translate_errors():
            lite.execute(conn, stmt, rows)

    # --- recording --------------------------------------------------------------------

    def record_passing(
        self,
        src_executor: str,
        src_version: str,
        dst_executor: str,
        dst_version: str | None = None,
        *,
        dst_exists: bool = True,
        turn_id: str | None = None,
        tags: Any = None,
        desired_sig: Any = None,
        recorder: str | None = None,
    ) -> Mnest:
        """Create or reinforce the edge of one passing (see contract §4)."""
        passing = normalise_passing(
            Passing(
                src_executor, src_version, dst_executor, dst_version, dst_exists, tags, desired_sig
            )
        )
        turn = check_optional_name(turn_id, "turn_id")
        who = self._recorder if recorder is None else check_recorder(recorder).value
        return self._record_one(passing, turn, who)

    def record_proto(
        self,
        src_executor: str,
        src_version: str,
        dst_executor: str,
        *,
        turn_id: str | None = None,
        tags: Any = None,
        desired_sig: Any = None,
        recorder: str | None = None,
    ) -> Mnest:
        """Record a passing to an executor that does not exist yet: the proto row of
        (src, src_version, dst), created at 0.30 or reinforced. The same as
        ``record_passing(..., None, dst_exists=False, ...)``, with the same checks."""
        return self.record_passing(
            src_executor,
            src_version,
            dst_executor,
            None,
            dst_exists=False,
            turn_id=turn_id,
            tags=tags,
            desired_sig=desired_sig,
            recorder=recorder,
        )

    def record_turn(
        self,
        turn_id: str,
        passings: Iterable[Passing | tuple[Any, ...]],
        *,
        recorder: str | None = None,
    ) -> list[Mnest]:
        """Record every passing of one turn; each edge counts once per turn."""
        turn = check_name(turn_id, "turn_id")
        who = self._recorder if recorder is None else check_recorder(recorder).value
        if isinstance(passings, str | bytes) or not isinstance(passings, Iterable):
            raise InvalidInput("passings must be an iterable of Passing or tuples")
        items = [normalise_passing(p) for p in passings]
        if not items:
            return []
        if len(items) == 1:
            return [self._record_one(items[0], turn, who)]
        return self._record_many(items, turn, who)

    def _record_one(self, p: Passing, turn_id: str | None, recorder: str) -> Mnest:
        conn = self._write_conn()
        proto = not p.dst_exists
        sel = stm.SEL_ONE_PROTO if proto else stm.SEL_ONE_ACTIVE
        params = {"s": p.src_executor, "sv": p.src_version, "d": p.dst_executor}
        if not proto:
            params["dv"] = p.dst_version
        insert_stmt = stm.INSERT_MNEST[conn.dialect.name]
        for _ in range(_MAX_RACE_ROUNDS):
            found = self._select_mnests(conn, sel, params)
            row = found[0] if found else None
            now = self._now()  # read once the write lock is held
            if row is not None:
                if turn_id is not None and (
                    _run(
                        conn, stm.SEL_TURN_DONE_ONE, {"turn_id": turn_id, "mid": row["id"]}
                    ).first()
                    is not None
                ):
                    return _snapshot(row)
                values, ev = self._reinforcement(row, p, turn_id, now, recorder)
                if conn.dialect.name == "postgresql":
                    ev_params = {k: ev[k] for k in stm.PG_REINFORCE_EVENT_PARAMS}
                    _run(conn, stm.PG_REINFORCE_WITH_EVENT, {**values, **ev_params})
                else:
                    self._run_many(conn, stm.UPD_REINFORCE, [values])
                    self._run_many(conn, stm.INSERT_EVENT, [ev])
                return _snapshot({**row, **_unprefix(values), "uses": row["uses"] + 1})
            values, ev = self._creation(p, turn_id, now, recorder)
            if _run(conn, insert_stmt, values).first() is not None:
                self._run_many(conn, stm.INSERT_EVENT, [ev])
                return _snapshot(values)
            # Another transaction created the row first: lock it and reinforce instead.
        raise ConflictError("could not record the passing: the edge kept changing under us")

    def _record_many(self, items: list[Passing], turn_id: str, recorder: str) -> list[Mnest]:
        conn = self._write_conn()
        unique: dict[tuple[bool, Key], Passing] = {}
        for p in items:
            # The last tags / desired_sig given for an edge in the turn win.
            unique[(p.dst_exists, _key(p))] = p
        if conn.dialect.name == "sqlite":
            # BEGIN IMMEDIATE: no other writer can create one of our keys meanwhile
            result = self._record_many_once(conn, unique, turn_id, recorder)
            if result is None:
                raise ConflictError("another writer created a key of this turn meanwhile")
            return [result[(p.dst_exists, _key(p))] for p in items]
        for attempt in range(_MAX_RACE_ROUNDS + len(unique)):
            # A savepoint per attempt: when another transaction creates one of our keys
            # first, rolling back to it releases every row lock this attempt took, so the
            # next attempt locks all the turn's rows again in one (id) order. Continuing
            # instead would lock the new row after the others and could deadlock.
            if attempt == 1:
                # Between attempts the ager could demote our keys again, and again. From the
                # first retry on, hold it off: ROW EXCLUSIVE waits for a running ager and
                # keeps the next one out until this turn ends, and conflicts with no other
                # writer. Taken outside the savepoints, it outlives their rollbacks; every
                # further retry then means a key another writer created and committed.
                _run(conn, stm.HOLD_OFF_AGER)
            with translate_errors():
                savepoint = conn.begin_nested()
            try:
                result = self._record_many_once(conn, unique, turn_id, recorder)
            except BaseException:
                if savepoint.is_active:
                    savepoint.rollback()
                raise
            if result is not None:
                with translate_errors():
                    savepoint.commit()
                return [result[(p.dst_exists, _key(p))] for p in items]
            savepoint.rollback()
        raise ConflictError("could not record the turn: its edges kept changing under us")

    def _record_many_once(
        self,
        conn: Connection,
        pending: dict[tuple[bool, Key], Passing],
        turn_id: str,
        recorder: str,
    ) -> dict[tuple[bool, Key], Mnest] | None:
        """One attempt at a turn; None when another transaction created one of its keys."""
        result: dict[tuple[bool, Key], Mnest] = {}
        rows = self._lock_keys(conn, list(pending))
        now = self._now()
        found = {(r["state"] == "active", _row_key(r)): r for r in rows}
        done: set[str] = set()
        if found and _run(conn, stm.SEL_TURN_SEEN, {"turn_id": turn_id}).first() is not None:
            # a retried (or continued) turn: which of its rows did it already count?
            ids = [r["id"] for r in found.values()]
            done = set(_run(conn, stm.SEL_TURN_DONE, {"turn_id": turn_id, "ids": ids}).scalars())
        updates: list[dict[str, Any]] = []
        creations: list[tuple[tuple[bool, Key], dict[str, Any], dict[str, Any]]] = []
        events: list[dict[str, Any]] = []
        for ident, p in pending.items():
            row = found.get(ident)
            if row is None:
                values, ev = self._creation(p, turn_id, now, recorder)
                creations.append((ident, values, ev))
            elif row["id"] in done:
                result[ident] = _snapshot(row)
            else:
                values, ev = self._reinforcement(row, p, turn_id, now, recorder)
                updates.append(values)
                events.append(ev)
                result[ident] = _snapshot({**row, **_unprefix(values), "uses": row["uses"] + 1})
        if updates:
            self._run_many(conn, stm.UPD_REINFORCE, updates)
        if creations:
            # one multi-row INSERT ... ON CONFLICT DO NOTHING RETURNING id, in key order; a
            # key that another transaction created meanwhile comes back missing
            creations.sort(key=lambda c: _sort_key(c[0]))
            params = [values for _, values, _ in creations]
            inserted = set(_run(conn, stm.INSERT_MNEST[conn.dialect.name], params).scalars())
            if len(inserted) < len(creations):
                return None
            for ident, values, ev in creations:
                events.append(ev)
                result[ident] = _snapshot(values)
        if events:
            self._run_many(conn, stm.INSERT_EVENT, events)
        return result

    def _lock_keys(self, conn: Connection, idents: list[tuple[bool, Key]]) -> list[Any]:
        """Lock and read the rows of these keys, every chunk in id order."""
        idents = sorted(idents, key=_sort_key)
        rows: list[Any] = []
        for i in range(0, len(idents), stm.KEYS_PER_STATEMENT):
            chunk = idents[i : i + stm.KEYS_PER_STATEMENT]
            akeys = [k for (exists_, k) in chunk if exists_]
            pkeys = [k for (exists_, k) in chunk if not exists_]
            stmt = stm.select_keys(len(akeys), len(pkeys))
            rows.extend(self._select_mnests(conn, stmt, stm.key_params(akeys, pkeys)))
        return rows

    def _reinforcement(
        self, row: Any, p: Passing, turn_id: str | None, now: datetime, recorder: str
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        ts_last = max(row["ts_last"], now)
        ts_weight = max(row["ts_weight"], now)
        before = decayed_weight(row["weight"], row["decay_lambda"], row["ts_weight"], ts_weight)
        after = reinforce(before)
        values = {
            "b_id": row["id"],
            "b_weight": after,
            "b_ts_last": ts_last,
            "b_ts_weight": ts_weight,
            "b_tags": p.tags if p.tags is not None else row["tags"],
            "b_desired_sig": (p.desired_sig if p.desired_sig is not None else row["desired_sig"]),
        }
        ev = _event(
            row["id"],
            EventKind.REINFORCED,
            ts_last,
            turn_id=turn_id,
            weight_before=before,
            weight_after=after,
            state_before=row["state"],
            state_after=row["state"],
            recorder=recorder,
        )
        return values, ev

    def _creation(
        self, p: Passing, turn_id: str | None, now: datetime, recorder: str
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        state = MnestState.ACTIVE if p.dst_exists else MnestState.PROTO
        values = {
            "id": new_mnest_id(),
            "src_executor": p.src_executor,
            "src_version": p.src_version,
            "dst_executor": p.dst_executor,
            "dst_version": p.dst_version,
            "weight": INITIAL_WEIGHT,
            "uses": 1,
            "ts_first": now,
            "ts_last": now,
            "ts_weight": now,
            "decay_lambda": DEFAULT_DECAY_LAMBDA,
            "state": state.value,
            "tags": p.tags,
            "desired_sig": p.desired_sig,
        }
        ev = _event(
            values["id"],
            EventKind.CREATED,
            now,
            turn_id=turn_id,
            weight_before=None,
            weight_after=INITIAL_WEIGHT,
            state_before=None,
            state_after=state.value,
            recorder=recorder,
        )
        return values, ev

    # --- reading ----------------------------------------------------------------------

    def get(self, mnest_id: str) -> Mnest | None:
        """The mnest with this id, or None."""
        check_mnest_id(mnest_id)
        row = _run(self._conn(), stm.SEL_BY_ID, {"id": mnest_id}).mappings().first()
        return _snapshot(row) if row is not None else None

    def find(
        self,
        src_executor: str,
        src_version: str,
        dst_executor: str,
        dst_version: str | None,
        state: str = "active",
    ) -> Mnest | None:
        """The row with this key and state, or None."""
        check_name(src_executor, "src_executor")
        check_name(src_version, "src_version")
        check_name(dst_executor, "dst_executor")
        check_optional_name(dst_version, "dst_version")
        st = check_state(state)
        stmt = select(M).where(
            M.c.src_executor == src_executor,
            M.c.src_version == src_version,
            M.c.dst_executor == dst_executor,
            _version_is(dst_version),
            M.c.state == st.value,
        )
        row = _run(self._conn(), stmt).mappings().first()
        return _snapshot(row) if row is not None else None

    def edges(
        self,
        *,
        src_executor: str | None = None,
        dst_executor: str | None = None,
        states: Iterable[str] | str | None = None,
        limit: int | None = None,
    ) -> list[Mnest]:
        """Rows filtered by source, destination and states (None: every state), oldest
        first; at most ``limit`` of them (in the SQL, so a big store is not read whole)."""
        stmt = select(M)
        if src_executor is not None:
            stmt = stmt.where(M.c.src_executor == check_name(src_executor, "src_executor"))
        if dst_executor is not None:
            stmt = stmt.where(M.c.dst_executor == check_name(dst_executor, "dst_executor"))
        st = check_states(states)
        if st is not None:
            stmt = stmt.where(M.c.state.in_([s.value for s in st]))
        stmt = stmt.order_by(M.c.ts_first, M.c.id)
        if limit is not None:
            stmt = stmt.limit(check_positive_int(limit, "limit", maximum=MAX_LIMIT))
        return [_snapshot(r) for r in _run(self._conn(), stmt).mappings()]

    def events(
        self,
        *,
        mnest_id: str | None = None,
        turn_id: str | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """Events, oldest first, optionally for one mnest and/or one turn; at most
        ``limit`` of them (in the SQL)."""
        stmt = select(E)
        if mnest_id is not None:
            stmt = stmt.where(E.c.mnest_id == check_mnest_id(mnest_id))
        if turn_id is not None:
            stmt = stmt.where(E.c.turn_id == check_name(turn_id, "turn_id"))
        stmt = stmt.order_by(E.c.ts, E.c.id)
        if limit is not None:
            stmt = stmt.limit(check_positive_int(limit, "limit", maximum=MAX_LIMIT))
        return [_event_snapshot(r) for r in _run(self._conn(), stmt).mappings()]

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
        """
        src = check_name(src_executor, "src_executor")
        depth = check_positive_int(max_depth, "max_depth", maximum=MAX_WALK_DEPTH)
        floor = check_weight_threshold(min_weight, "min_weight")
        most = check_positive_int(limit, "limit", maximum=MAX_WALK_LIMIT)
        conn = self._conn()
        stmt = stm.walk_statement(conn.dialect.name, with_floor=floor > 0)
        params = {"src": src, "max_depth": depth, "now": self._now(), "limit": most}
        if floor > 0:
            params["min_weight"] = floor
        if conn.dialect.name == "sqlite":
            with translate_errors():
                rows = lite.fetch_tuples(conn, stmt, params)
            values = lite.mnest_values
        else:
            rows = _run(conn, stmt, params).all()
            values = list
        # A row is (path of ids, *the columns of its last edge). Every prefix of a path is a
        # path too and scores at least as much (weights are ≤ 1; ties go to the shorter), so
        # it came in an earlier row: each path is its parent's list plus one edge.
        by_id: dict[str, Mnest] = {}
        by_path: dict[str, list[Mnest]] = {}
        out: list[list[Mnest]] = []
        for r in rows:
            edge = by_id.get(r[1])
            if edge is None:
                columns = zip(MNEST_COLUMNS, values(r[1:]), strict=True)
                edge = by_id[r[1]] = _detached(Mnest, columns, r[1])
            parent = r[0].rpartition(",")[0]
            path = by_path[r[0]] = [*by_path[parent], edge] if parent else [edge]
            out.append(path)
        return out

    def suggest_next(
        self, src_executor: str, src_version: str | None = None, *, k: int = 5
    ) -> list[tuple[Mnest, float]]:
        """The k active edges out of the source that a planner should try first.

        Highest effective weight first, ties broken by activation (more uses, more recent
        use), then by name: the ordering of :meth:`rank` (see :mod:`mnestoma.ranking`).
        """
        src = check_name(src_executor, "src_executor")
        version = check_optional_name(src_version, "src_version")
        limit = check_positive_int(k, "k", maximum=10_000)
        conn = self._conn()
        dialect = conn.dialect.name
        now = self._now()
        params: dict[str, Any] = {"src": src, "k": limit + 1, "now": now}
        if version is not None:
            params["sv"] = version
        stmt = stm.suggest_statement(dialect, version is not None)
        rows = _run(conn, stmt, params).mappings().all()
        if len(rows) > limit and rows[limit]["effective"] == rows[limit - 1]["effective"]:
            # a tie across the k-th place: read every edge of that strength, so that the
            # activation (not the SQL's order) decides which of them make the cut
            params["floor"] = rows[limit - 1]["effective"]
            stmt = stm.suggest_statement(dialect, version is not None, ties=True)
            rows = _run(conn, stmt, params).mappings().all()
        edges = [(_snapshot(r), float(r["effective"])) for r in rows]
        return ranking.order_edges(edges, now)[:limit]

    def rank(
        self, src_executor: str, candidates: Iterable[Any], *, src_version: str | None = None
    ) -> list[ranking.Ranked]:
        """The candidates (names, or (name, version) pairs) in the order a planner should
        try them after ``src_executor``, each with its score and why (contract §9)."""
        src = check_name(src_executor, "src_executor")
        version = check_optional_name(src_version, "src_version")
        wanted = ranking.normalise_candidates(candidates)
        if not wanted:
            return []
        conn = self._conn()
        stmt = stm.rank_statement(conn.dialect.name, version is not None)
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
            rows = _run(conn, stmt, params).mappings().all()
            edges.extend((_snapshot(r), float(r["effective"])) for r in rows)
        return ranking.rank_candidates(src, wanted, edges, now)

    def recurring_protos(
        self, *, min_uses: int = RECURRING_MIN_USES, min_weight: float = RECURRING_MIN_WEIGHT
    ) -> list[Mnest]:
        """Protos with at least ``min_uses`` uses and effective weight ≥ ``min_weight``."""
        uses = check_positive_int(min_uses, "min_uses")
        floor = check_weight_threshold(min_weight, "min_weight")
        conn = self._conn()
        dialect = conn.dialect.name
        eff = decayed(dialect, M.c.weight, M.c.decay_lambda, M.c.ts_weight, now_param())
        stmt = (
            select(M)
            .where(M.c.state == "proto", M.c.uses >= uses, eff >= floor)
            .order_by(M.c.uses.desc(), eff.desc(), M.c.id)
        )
        rows = _run(conn, stmt, {"now": self._now()}).mappings()
        return [_snapshot(r) for r in rows]

    # --- changing state ---------------------------------------------------------------

    def _locked(self, conn: Connection, mnest_id: Any) -> Any:
        if not check_mnest_id(mnest_id):
            raise InvalidInput("mnest_id must be a non-empty string")
        row = _run(conn, stm.SEL_BY_ID_LOCK, {"id": mnest_id}).mappings().first()
        if row is None:
            raise NotFound(f"no mnest with id {shorten(mnest_id)!r}")
        return row

    def _key_taken(
        self, conn: Connection, row: Any, state: str, dst_version: str | None, own_id: str
    ) -> bool:
        stmt = select(M.c.id).where(
            M.c.src_executor == row["src_executor"],
            M.c.src_version == row["src_version"],
            M.c.dst_executor == row["dst_executor"],
            _version_is(dst_version),
            M.c.state == state,
            M.c.id != own_id,
        )
        return _run(conn, stmt).first() is not None

    def transition_state(
        self, mnest_id: str, new_state: str, *, reason: str | None = None
    ) -> Mnest:
        """Move a row to another state, with a ``transition`` event (same state: no-op)."""
        target = check_state(new_state)
        if reason is not None:
            reason = check_text(reason, "reason", max_length=2_000)
        conn = self._write_conn()
        row = self._locked(conn, mnest_id)
        current = MnestState(row["state"])
        if current == target:
            return _snapshot(row)
        why = check_transition(current, target, has_version=row["dst_version"] is not None)
        if why is not None:
            raise InvalidTransition(why)
        if self._key_taken(conn, row, target.value, row["dst_version"], row["id"]):
            raise ConflictError(
                f"a {target.value} row with the same key as {row['id']} already exists"
            )
        changes = {"state": target.value}
        self._change_row(conn, row, changes, EventKind.TRANSITION, reason=reason)
        return _snapshot({**row, **changes})

    def promote_proto_to_active(self, mnest_id: str, dst_version: str) -> Mnest:
        """Give a proto its destination version and make it active (event ``promoted``)."""
        version = check_name(dst_version, "dst_version")
        conn = self._write_conn()
        row = self._locked(conn, mnest_id)
        if row["state"] != MnestState.PROTO.value:
            raise InvalidTransition(f"{row['id']} is {row['state']}, not a proto")
        if self._key_taken(conn, row, "active", version, row["id"]):
            raise ConflictError(
                f"an active edge {row['src_executor']}@{row['src_version']} -> "
                f"{row['dst_executor']}@{version} already exists"
            )
        changes = {"dst_version": version, "desired_sig": None, "state": "active"}
        self._change_row(conn, row, changes, EventKind.PROMOTED)
        return _snapshot({**row, **changes})

    def _change_row(
        self,
        conn: Connection,
        row: Any,
        changes: dict[str, Any],
        kind: EventKind,
        *,
        reason: str | None = None,
    ) -> None:
        """Apply ``changes`` to a locked row and record the event; the weight is untouched."""
        now = max(self._now(), row["ts_last"])
        _run(conn, update(M).where(M.c.id == row["id"]).values(**changes))
        eff = decayed_weight(row["weight"], row["decay_lambda"], row["ts_weight"], now)
        event_row = _event(
            row["id"],
            kind,
            now,
            weight_before=eff,
            weight_after=eff,
            state_before=row["state"],
            state_after=changes["state"],
            reason=reason,
            recorder=self._recorder,
        )
        _run(conn, stm.INSERT_EVENT, [event_row])

    # --- ageing -----------------------------------------------------------------------

    def apply_ager(self) -> AgerReport:
        """Decay, demote, merge, prune and count archive candidates, in set-based SQL."""
        return run_ager(self._write_conn(), self._now())

    # --- query log --------------------------------------------------------------------

    def log_canonical_query(
        self, raw_query: str, canonical_query: str, *, turn_id: str | None = None
    ) -> CanonicalQuery:
        """Append to the canonical query log (touches no mnest)."""
        return CanonicalQueryRepository(
            self._session, clock=self._clock, before_write=self._before_write
        ).log(raw_query, canonical_query, turn_id=turn_id)


def _check_session(session: Any, owner: str) -> Session | Connection:
    """A Session (or scoped_session) or Connection, else InvalidInput naming what was given."""
    if not isinstance(session, Session | Connection | scoped_session):
        raise InvalidInput(
            f"{owner} needs a SQLAlchemy Session or Connection, got {type(session).__name__}"
        )
    return session  # type: ignore[return-value]


def _connection_of(session: Session | Connection) -> Connection:
    """The connection of the current transaction, after flushing pending ORM changes."""
    if isinstance(session, Connection):
        return session
    with translate_errors():
        session.flush()  # returns at once when nothing is pending (no scan of the session)
        return session.connection()


def _write_connection(
    session: Session | Connection, before_write: Callable[[], None] | None
) -> Connection:
    """The connection, in a transaction that holds the write lock (SQLite) before the first
    statement of a write: see :mod:`mnestoma.locking`."""
    if before_write is not None:
        before_write()
    conn = _connection_of(session)
    with translate_errors():
        take_write_lock(conn)
    return conn


def _unprefix(values: dict[str, Any]) -> dict[str, Any]:
    return {k[2:]: v for k, v in values.items() if k.startswith("b_") and k != "b_id"}


def _sort_key(ident: tuple[bool, Key]) -> tuple[str, str, str, str, bool]:
    exists_, (s, sv, d, dv) = ident
    return (s, sv, d, dv or "", exists_)


def _row_key(r: Any) -> Key:
    return (r["src_executor"], r["src_version"], r["dst_executor"], r["dst_version"])


# --- the canonical query log ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueryFrequency:
    """How often one canonical form was logged, and when last."""

    canonical_query: str
    canonical_hash: str
    count: int
    last_ts: datetime


_INSERT_QUERY = insert(Q).returning(Q.c.id)


class CanonicalQueryRepository:
    """The request-normalisation log; it never touches ``mnests`` or ``events``."""

    def __init__(
        self,
        session: Session | Connection,
        *,
        clock: Clock | None = None,
        before_write: Callable[[], None] | None = None,
    ) -> None:
        self._session = _check_session(session, type(self).__name__)
        self._clock: Clock = clock or utc_now
        self._before_write = before_write

    def log(
        self, raw_query: str, canonical_query: str, *, turn_id: str | None = None
    ) -> CanonicalQuery:
        """Append one normalised request; the hash is SHA-256 of the canonical form."""
        raw = check_text(raw_query, "raw_query")
        canonical = check_text(canonical_query, "canonical_query")
        turn = check_optional_name(turn_id, "turn_id")
        values = {
            "ts": read_clock(self._clock),
            "turn_id": turn,
            "raw_query": raw,
            "canonical_query": canonical,
            "canonical_hash": hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
        }
        conn = _write_connection(self._session, self._before_write)
        new_id = _run(conn, _INSERT_QUERY, values).scalar_one()
        return _detached(CanonicalQuery, {"id": new_id, **values}, new_id)

    def recent(self, *, limit: int = 20) -> list[CanonicalQuery]:
        """The latest entries, newest first."""
        n = check_positive_int(limit, "limit", maximum=100_000)
        stmt = select(Q).order_by(Q.c.ts.desc(), Q.c.id.desc()).limit(n)
        rows = _run(_connection_of(self._session), stmt).mappings().all()
        return [_detached(CanonicalQuery, {k: r[k] for k in QUERY_COLUMNS}, r["id"]) for r in rows]

    def top(self, *, limit: int = 10) -> list[QueryFrequency]:
        """The most frequent canonical forms, most frequent first."""
        n = check_positive_int(limit, "limit", maximum=100_000)
        count = func.count().label("count")
        last = func.max(Q.c.ts).label("last_ts")
        stmt = (
            select(Q.c.canonical_query, Q.c.canonical_hash, count, last)
            .group_by(Q.c.canonical_hash, Q.c.canonical_query)
            .order_by(count.desc(), last.desc())
            .limit(n)
        )
        rows = _run(_connection_of(self._session), stmt).all()
        return [
            QueryFrequency(r.canonical_query, r.canonical_hash, int(r.count), r.last_ts)
            for r in rows
        ]
