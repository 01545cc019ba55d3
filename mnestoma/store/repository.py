"""Repositories: every operation of contract §4 on a caller's session.

A repository takes a session, may flush, and never commits: the unit of work (or the
calling service) owns the transaction. Hot paths run Core statements built once at import
and executed with bound parameters on the session's connection.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

from sqlalchemy import Connection, Executable
from sqlalchemy.orm import Session, scoped_session

from mnestoma.core.clock import Clock
from mnestoma.core.errors import (
    ConflictError,
    InvalidInput,
    InvalidTransition,
    NotFound,
    RaceLost,
    translate_errors,
)
from mnestoma.core.rules import (
    DECAYED_USES_ORDER,
    DEFAULT_DECAY_LAMBDA,
    INITIAL_WEIGHT,
    PROBABILITY_ORDER,
    RECURRING_MIN_USES,
    RECURRING_MIN_WEIGHT,
    AgerReport,
    EventKind,
    MnestState,
    advance,
    chain_increments,
    check_transition,
    counted_passing,
    decayed_weight,
    new_mnest_id,
    outcome_counts,
    reinforce,
)
from mnestoma.core.settings import Settings, settings_of
from mnestoma.core.types import ensure_instant
from mnestoma.core.validation import (
    Passing,
    check_dry_run,
    check_mnest_id,
    check_name,
    check_occurrence,
    check_optional_name,
    check_positive_int,
    check_recorder,
    check_state,
    check_states,
    check_text,
    check_weight_threshold,
    normalise_passing,
    shorten,
)
from mnestoma.engines.locking import take_write_lock
from mnestoma.engines.partitions import (
    note_written,
    upkeep_before_write,
)
from mnestoma.maintenance import retention
from mnestoma.maintenance.ager import run_ager_now
from mnestoma.planner import ranking
from mnestoma.planner.graph import GraphReads
from mnestoma.planner.planning import Forecast, normalise_context, read_forecast
from mnestoma.planner.vetting import Verdict, normalise_steps, vet_chain
from mnestoma.schema import snapshots as snap
from mnestoma.schema.models import CanonicalQuery, Event, Mnest
from mnestoma.schema.runner import StatementRunner, as_mappings, runner_for
from mnestoma.schema.sql import chains as chains_sql
from mnestoma.schema.sql import read as rd
from mnestoma.schema.sql import record as rec
from mnestoma.schema.sql.tables import MNEST_COLUMNS, Key

__all__ = ["CanonicalQueryRepository", "MnestRepository", "QueryFrequency", "built"]

T = TypeVar("T")

MAX_WALK_DEPTH = 16
# walk(): the paths returned by default (best first), and the most a caller may ask for.
WALK_LIMIT = 1000
MAX_WALK_LIMIT = 100_000
MAX_LIMIT = 2**31 - 1  # the largest LIMIT both engines take as a plain integer
RANK_NAMES_PER_STATEMENT = 500
# A passing whose INSERT finds its key created by another transaction meanwhile reads that
# row again and reinforces it: a race round, not a retry of a failed transaction (those are
# the unit of work's, see mnestoma.store.uow.with_retries). The second round finds the committed
# row; a third covers the ager demoting it in between. Past that: RaceLost, which the
# retry policy runs again in a new transaction.
RACE_ROUNDS = 3

# Positions of the columns in a row of ``select(mnests)``.
_COL = {name: i for i, name in enumerate(MNEST_COLUMNS)}
_ID, _STATE, _USES = _COL["id"], _COL["state"], _COL["uses"]
_SRC, _SRC_V, _DST, _DST_V = (
    _COL["src_executor"],
    _COL["src_version"],
    _COL["dst_executor"],
    _COL["dst_version"],
)
_WEIGHT, _LAMBDA, _TS_WEIGHT, _TS_LAST = (
    _COL["weight"],
    _COL["decay_lambda"],
    _COL["ts_weight"],
    _COL["ts_last"],
)
_TAGS, _SIG = _COL["tags"], _COL["desired_sig"]
_OK, _ERROR = _COL["ok_count"], _COL["error_count"]
_DECAYED_USES = _COL["decayed_uses"]
# SQLite's lookup with a turn (sql.record.select_one_counted): the row, then its flag.
_COUNTED = len(MNEST_COLUMNS)
Row = tuple[Any, ...]
_REINFORCED = EventKind.REINFORCED.value
# Where PostgreSQL's one-statement reinforcement finds its event values in an event tuple.
_PG_REINFORCE_EVENT_AT = tuple(rec.EVENT_ROW.index(n) for n in rec.PG_REINFORCE_EVENT_PARAMS)


# The statements a write will run, per dialect: looked up before it takes the write lock.
Plans = Mapping[str, Sequence[tuple[Executable, tuple[str, ...]]]]


def _one_passing_plans(proto: bool, turn: bool) -> Plans:
    """What :meth:`MnestRepository._record_one` runs, on each engine, for a passing with a
    turn or without one."""
    sel: Executable = rec.SELECT_ONE_PROTO if proto else rec.SELECT_ONE_ACTIVE
    event = (rec.INSERT_EVENT, rec.EVENT_ROW)
    return {
        "sqlite": (
            (rec.select_one_counted(proto) if turn else sel, ()),
            (rec.UPDATE_REINFORCE, rec.REINFORCE_ROW),
            event,
            (rec.INSERT_MNEST_LOCKED, MNEST_COLUMNS),
        ),
        "postgresql": (
            (sel, ()),
            (rec.PG_REINFORCE_WITH_EVENT, rec.PG_REINFORCE_ROW),
            event,
            (rec.insert_mnest("postgresql"), ()),
        ),
    }


_ONE_PASSING_PLANS = {
    (proto, turn): _one_passing_plans(proto, turn)
    for proto in (False, True)
    for turn in (False, True)
}


def _key(p: Passing) -> Key:
    return (p.src_executor, p.src_version, p.dst_executor, p.dst_version)


def _row_key(r: Row) -> Key:
    return (r[_SRC], r[_SRC_V], r[_DST], r[_DST_V])


def _key_params(key: Key) -> dict[str, Any]:
    """The parameters of :func:`~mnestoma.schema.sql.tables.key_is` for one key."""
    s, sv, d, dv = key
    params: dict[str, Any] = {"s": s, "sv": sv, "d": d}
    if dv is not None:
        params["dv"] = dv
    return params


def _with(row: Row, changes: dict[int, Any]) -> Row:
    """``row`` with the values at some positions replaced."""
    values = list(row)
    for i, v in changes.items():
        values[i] = v
    return tuple(values)


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
    outcome: str | None = None,
    occurrence: int = 1,
) -> Row:
    """An event's values in :data:`~mnestoma.schema.sql.record.EVENT_ROW` order."""
    return (
        mnest_id,
        kind.value,
        ts,
        turn_id,
        weight_before,
        weight_after,
        state_before,
        state_after,
        reason,
        related_id,
        recorder,
        outcome,
        occurrence,
    )


class MnestRepository(GraphReads):
    """Every rule of contract §4 on one session; flushes, never commits.

    A bare ``Connection`` is accepted too (the facade's connection units use one: a Session
    adds nothing to Core statements but its own bookkeeping).

    Raises:
        InvalidInput: ``session`` is neither a Session nor a Connection, or settings are refused.
    """

    def __init__(
        self,
        session: Session | Connection,
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
        recorder: str | None = None,
        before_write: Callable[[], None] | None = None,
    ) -> None:
        self._session = _check_session(session, type(self).__name__)
        self.settings = settings_of(settings, clock=clock, recorder=recorder)
        self._before_write = before_write
        self._after_commit = False

    # --- plumbing ---------------------------------------------------------------------

    @property
    def session(self) -> Session | Connection:
        """The session (or connection) this repository works in."""
        return self._session

    def _ex(self) -> StatementRunner:
        return runner_for(_connection_of(self._session))

    def _write_ex(self, plans: Plans | None = None) -> StatementRunner:
        return _write_runner(self._session, self._before_write, plans)

    def _now(self) -> datetime:
        return self.settings.now()

    def _write_now(self, ex: StatementRunner) -> datetime:
        """The clock's now for a write's events, read once its locks are held; on
        PostgreSQL, a month whose partition is not known made is made after the commit."""
        now = self._now()
        note_written(ex.conn, now)
        return now

    def _who(self, recorder: str | None) -> str:
        """Who a call's events say recorded them: the call's ``recorder``, else the settings'."""
        return self.settings.recorder if recorder is None else check_recorder(recorder).value

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
        outcome: str | None = None,
        occurrence: int = 1,
    ) -> Mnest:
        """Create or reinforce the edge of one passing (see contract §4); ``outcome`` ("ok",
        "error" or None: unknown) is counted beside ``uses`` and never changes the weight.
        With a ``turn_id``, ``occurrence`` says which passing of the edge in the turn this
        is (contract §13): the same (turn, edge, occurrence) again is a no-op.

        Returns:
            The edge's row after the passing (created, or reinforced), a detached snapshot.

        Raises:
            InvalidInput: a name or version, ``tags``, ``desired_sig``, ``recorder`` or
                ``outcome`` the contract refuses (contract §5), or an ``occurrence`` that is
                not an int ≥ 1, or other than 1 without a ``turn_id``.
            ConflictError: the write lock was not had within the lock timeout
                (:class:`WriteLockTimeout`), or other writers kept changing the rows it needed.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        passing = normalise_passing(
            Passing(
                src_executor,
                src_version,
                dst_executor,
                dst_version,
                dst_exists,
                tags,
                desired_sig,
                outcome,
            )
        )
        turn = check_optional_name(turn_id, "turn_id")
        nth = check_occurrence(occurrence, turn)
        who = self._who(recorder)
        return self._result(self._record_one(passing, turn, who, nth))

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
        occurrence: int = 1,
    ) -> Mnest:
        """Record a passing to an executor that does not exist yet: the proto row of
        (src, src_version, dst), created at :data:`~mnestoma.rules.INITIAL_WEIGHT` or
        reinforced. The same as ``record_passing(..., None, dst_exists=False, ...)``, with the
        same checks.

        Returns:
            The proto row after the passing (created, or reinforced).

        Raises:
            InvalidInput: a name or version, ``tags``, ``desired_sig``, ``recorder`` or
                ``occurrence`` the contract refuses.
            ConflictError: the write lock was not had within the lock timeout
                (:class:`WriteLockTimeout`), or other writers kept changing the rows it needed.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
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
            occurrence=occurrence,
        )

    def record_turn(
        self,
        turn_id: str,
        passings: Iterable[Passing | tuple[Any, ...]],
        *,
        recorder: str | None = None,
    ) -> list[Mnest]:
        """Record every passing of one turn: the k-th time an edge occurs in ``passings`` is
        its occurrence k, counted once (contract §13), with its own outcome; the same turn
        recorded again adds nothing.

        Returns:
            The row of each passing's edge after the turn, in the order the passings were
            given (an empty list for none).

        Raises:
            InvalidInput: ``turn_id``, ``recorder``, ``passings`` or one of its passings is
                refused; nothing of the turn is then recorded.
            ConflictError: the write lock was not had within the lock timeout
                (:class:`WriteLockTimeout`), or other writers kept changing the rows it needed.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        turn = check_name(turn_id, "turn_id")
        who = self._who(recorder)
        if isinstance(passings, str | bytes) or not isinstance(passings, Iterable):
            raise InvalidInput("passings must be an iterable of Passing or tuples")
        items = [normalise_passing(p) for p in passings]
        if not items:
            return []
        if len(items) == 1:
            return [self._record_one(items[0], turn, who, 1)()]
        return self._record_many(items, turn, who)

    def _record_one(
        self, p: Passing, turn_id: str | None, recorder: str, occurrence: int
    ) -> Callable[[], Mnest]:
        """Record one passing (occurrence ``occurrence`` of its edge in its turn); what builds
        its snapshot (a step left out of the write lock where the unit of work builds it
        after the commit, see :meth:`_result`)."""
        proto = not p.dst_exists
        sel = rec.SELECT_ONE_PROTO if proto else rec.SELECT_ONE_ACTIVE
        params = _key_params(_key(p))
        ex = self._write_ex(_ONE_PASSING_PLANS[(proto, turn_id is not None)])
        if ex.dialect == "sqlite":
            if turn_id is None:
                return self._record_one_locked(ex, sel, params, p, None, recorder, occurrence)
            lookup = rec.select_one_counted(proto)  # the row, and whether the turn counted it
            counted = {**params, "turn_id": turn_id, "occ": occurrence}
            return self._record_one_locked(ex, lookup, counted, p, turn_id, recorder, occurrence)
        for _ in range(RACE_ROUNDS):
            row = ex.first(sel, params)
            now = self._write_now(ex)  # read once the write lock is held
            if row is not None:
                counted = {"turn_id": turn_id, "mid": row[_ID], "occ": occurrence}
                if turn_id is not None and ex.first(rec.TURN_COUNTED_ONE, counted) is not None:
                    return functools.partial(snap.mnest, row)
                values, ev = self._reinforcement(row, p, turn_id, now, recorder, occurrence)
                both = values + tuple(ev[i] for i in _PG_REINFORCE_EVENT_AT)
                ex.many(rec.PG_REINFORCE_WITH_EVENT, [both], rec.PG_REINFORCE_ROW)
                return functools.partial(_reinforced_mnest, row, values)
            values, ev = self._creation(p, turn_id, now, recorder, occurrence)
            (new_row,) = as_mappings(MNEST_COLUMNS, [values])
            if ex.first(rec.insert_mnest(ex.dialect), new_row) is not None:
                ex.many(rec.INSERT_EVENT, [ev], rec.EVENT_ROW)
                return functools.partial(snap.mnest, values)
            # Another transaction created the row first: lock it and reinforce instead.
        raise RaceLost("could not record the passing: the edge kept changing under us")

    def _record_one_locked(
        self,
        ex: StatementRunner,
        lookup: Executable,
        params: dict[str, Any],
        p: Passing,
        turn_id: str | None,
        recorder: str,
        occurrence: int,
    ) -> Callable[[], Mnest]:
        """SQLite, under the write lock (no other writer can create the key meanwhile): one
        lookup, which with a turn also says whether the turn counted this occurrence already,
        then the row's write and its event. A read and two writes, the fewest for numbers
        Python computes; SQLite computing them in two statements (an INSERT ... SELECT and
        an UPDATE ... RETURNING, exact on its text instants) spends more time in the
        database than the statement saves in Python."""
        row = ex.first(lookup, params)
        now = self._write_now(ex)  # read once the write lock is held
        if row is None:
            values, ev = self._creation(p, turn_id, now, recorder, occurrence)
            ex.many(rec.INSERT_MNEST_LOCKED, [values], MNEST_COLUMNS)
            ex.many(rec.INSERT_EVENT, [ev], rec.EVENT_ROW)
            return functools.partial(snap.mnest, values)
        if turn_id is not None and row[_COUNTED]:
            return functools.partial(snap.mnest, row)
        values, ev = self._reinforcement(row, p, turn_id, now, recorder, occurrence)
        ex.many(rec.UPDATE_REINFORCE, [values], rec.REINFORCE_ROW)
        ex.many(rec.INSERT_EVENT, [ev], rec.EVENT_ROW)
        return functools.partial(_reinforced_mnest, row, values)

    def _result(self, build: Callable[[], T]) -> T:
        """The result ``build`` makes: now, or, where the unit of work asked for it
        (:meth:`_build_results_after_commit`), once it has committed, outside the write lock
        (:func:`built`)."""
        if self._after_commit:
            return cast(T, _AfterCommit(build))
        return build()

    def _build_results_after_commit(self) -> None:
        """Have the writes that return a snapshot leave it to be built once the unit of work
        has committed (:func:`built`): building it is Python work other writers would wait
        for while the write lock is held. For a unit of work that resolves every result it
        returns; a caller of the repository gets the snapshots themselves."""
        self._after_commit = True

    def _record_many(self, items: list[Passing], turn_id: str, recorder: str) -> list[Mnest]:
        ex = self._write_ex()
        # Each edge's passings in the order given: the k-th is its occurrence k (each with
        # its own outcome; the last tags / desired_sig given win).
        idents = [(p.dst_exists, _key(p)) for p in items]  # each passing's edge, in order
        unique: dict[tuple[bool, Key], list[Passing]] = {}
        for ident, p in zip(idents, items, strict=True):
            unique.setdefault(ident, []).append(p)
        if ex.dialect == "sqlite":
            # BEGIN IMMEDIATE: no other writer can create one of our keys meanwhile
            result = self._record_many_once(ex, unique, turn_id, recorder, idents)
            if result is None:
                raise ConflictError("another writer created a key of this turn meanwhile")
            return [result[ident] for ident in idents]
        conn = ex.conn
        for attempt in range(RACE_ROUNDS + len(unique)):
            # A savepoint per attempt: when another transaction creates one of our keys
            # first, rolling back to it releases every row lock this attempt took, so the
            # next attempt locks all the turn's rows again in one (id) order. Continuing
            # instead would lock the new row after the others and could deadlock.
            if attempt == 1:
                # Between attempts a whole run of the ager (one transaction, a table lock)
                # could demote our keys again, and again. From the first retry on, hold it
                # off: ROW EXCLUSIVE waits for such a run and keeps the next one out until
                # this turn ends, and conflicts with no other writer (nor with the ager's
                # batches, which lock rows only and never create a key, so never make an
                # attempt fail). Taken outside the savepoints, it outlives their rollbacks;
                # every further retry then means a key another writer created and committed.
                ex.execute(rec.HOLD_OFF_AGER)
            with translate_errors():
                savepoint = conn.begin_nested()
            try:
                result = self._record_many_once(ex, unique, turn_id, recorder, idents)
            except BaseException:
                if savepoint.is_active:
                    savepoint.rollback()
                raise
            if result is not None:
                with translate_errors():
                    savepoint.commit()
                return [result[ident] for ident in idents]
            savepoint.rollback()
        raise RaceLost("could not record the turn: its edges kept changing under us")

    def _record_many_once(
        self,
        ex: StatementRunner,
        pending: dict[tuple[bool, Key], list[Passing]],
        turn_id: str,
        recorder: str,
        order: list[tuple[bool, Key]],
    ) -> dict[tuple[bool, Key], Mnest] | None:
        """One attempt at a turn (``order``: each passing's edge, as given); None when another
        transaction created one of its keys."""
        result: dict[tuple[bool, Key], Mnest] = {}
        rows = self._lock_keys(ex, list(pending))
        now = self._write_now(ex)
        found = {(r[_STATE] == MnestState.ACTIVE, _row_key(r)): r for r in rows}
        done: set[tuple[str, int]] = set()
        if found and ex.first(rec.TURN_SEEN, {"turn_id": turn_id}) is not None:
            # a retried (or continued) turn: which occurrences of its rows did it count?
            ids = [r[_ID] for r in found.values()]
            counted = ex.rows(rec.TURN_COUNTED, {"turn_id": turn_id, "ids": ids})
            done = {(mid, int(occ)) for mid, occ in counted}
        updates: list[Row] = []
        creations: list[tuple[tuple[bool, Key], Row, list[Row]]] = []
        events: list[Row] = []
        for ident, passings in pending.items():
            row = found.get(ident)
            if row is None:
                values, ev = self._creation(passings[0], turn_id, now, recorder, 1)
                new_events = [ev]
                for k, p in enumerate(passings[1:], 2):
                    again, ev = self._reinforcement(values, p, turn_id, now, recorder, k)
                    values = _reinforced(values, again)
                    new_events.append(ev)
                creations.append((ident, values, new_events))
                continue
            for k, p in enumerate(passings, 1):
                if (row[_ID], k) in done:
                    continue
                values, ev = self._reinforcement(row, p, turn_id, now, recorder, k)
                updates.append(values)  # run in order: one row's occurrences one after another
                events.append(ev)
                row = _reinforced(row, values)
            result[ident] = snap.mnest(row)
        ex.many(rec.UPDATE_REINFORCE, updates, rec.REINFORCE_ROW)
        if creations:
            # In key order. PostgreSQL: one multi-row INSERT ... ON CONFLICT DO NOTHING
            # RETURNING id, where a key another transaction created meanwhile comes back
            # missing. SQLite: a plain batch, since the write lock keeps other writers out.
            creations.sort(key=lambda c: _sort_key(c[0]))
            params = [values for _, values, _ in creations]
            if ex.dialect == "sqlite":
                ex.many(rec.INSERT_MNEST_LOCKED, params, MNEST_COLUMNS)  # under the write lock
            else:
                new_rows = as_mappings(MNEST_COLUMNS, params)
                if len(ex.execute(rec.insert_mnest(ex.dialect), new_rows).all()) < len(params):
                    return None
            for ident, values, new_events in creations:
                events.extend(new_events)
                result[ident] = snap.mnest(values)
        ex.many(rec.INSERT_EVENT, events, rec.EVENT_ROW)
        self._count_chains(ex, order, found, done, now)
        return result

    def _count_chains(
        self,
        ex: StatementRunner,
        order: list[tuple[bool, Key]],
        found: dict[tuple[bool, Key], Row],
        done: set[tuple[str, int]],
        now: datetime,
    ) -> None:
        """Count the chains of the passings this attempt counted (contract §13), in key order,
        after every row lock of the turn is held. Links to protos are left out of chains."""
        seen: dict[tuple[bool, Key], int] = {}
        links: list[tuple[str, str]] = []
        counted: list[bool] = []
        for ident in order:
            exists, (src, _, dst, _) = ident
            if not exists:
                continue
            k = seen[ident] = seen.get(ident, 0) + 1
            row = found.get(ident)
            links.append((src, dst))
            counted.append(row is None or (row[_ID], k) not in done)
        added = chain_increments(links, counted)
        if added:
            rows = [(*key, n, now) for key, n in sorted(added.items())]
            ex.many(chains_sql.count_chains(ex.dialect), rows, chains_sql.CHAIN_ROW)

    def _lock_keys(self, ex: StatementRunner, idents: list[tuple[bool, Key]]) -> list[Row]:
        """Lock and read the rows of these keys, every chunk in id order."""
        idents = sorted(idents, key=_sort_key)
        rows: list[Row] = []
        for i in range(0, len(idents), rec.KEYS_PER_STATEMENT):
            chunk = idents[i : i + rec.KEYS_PER_STATEMENT]
            akeys = [k for (exists_, k) in chunk if exists_]
            pkeys = [k for (exists_, k) in chunk if not exists_]
            stmt = rec.select_keys(rec.shape_size(len(akeys)), rec.shape_size(len(pkeys)))
            rows.extend(ex.rows(stmt, rec.key_params(akeys, pkeys)))
        return rows

    def _reinforcement(
        self,
        row: Row,
        p: Passing,
        turn_id: str | None,
        now: datetime,
        recorder: str,
        occurrence: int = 1,
    ) -> tuple[Row, Row]:
        """A reinforcement's UPDATE_REINFORCE values (:data:`~.record.REINFORCE_ROW`
        order) and its event (:func:`_event`'s tuple, written out: this runs while the write
        lock is held)."""
        ts_last = advance(row[_TS_LAST], now)
        ts_weight = advance(row[_TS_WEIGHT], now)
        before = decayed_weight(row[_WEIGHT], row[_LAMBDA], row[_TS_WEIGHT], ts_weight)
        after = reinforce(before)
        mnest_id, state, outcome = row[_ID], row[_STATE], p.outcome
        values = (
            mnest_id,
            after,
            ts_last,
            ts_weight,
            p.tags if p.tags is not None else row[_TAGS],
            p.desired_sig if p.desired_sig is not None else row[_SIG],
            *outcome_counts(outcome),
            counted_passing(row[_DECAYED_USES], row[_LAMBDA], row[_TS_LAST], ts_last),
        )
        ev = (
            mnest_id,
            _REINFORCED,
            ts_last,
            turn_id,
            before,
            after,
            state,
            state,
            None,  # reason
            None,  # related_id
            recorder,
            outcome,
            occurrence,
        )
        return values, ev

    def _creation(
        self, p: Passing, turn_id: str | None, now: datetime, recorder: str, occurrence: int = 1
    ) -> tuple[Row, Row]:
        """A new row (the table's columns in order, as :func:`~mnestoma.schema.snapshots.mnest`
        takes them) and its event."""
        state = MnestState.ACTIVE if p.dst_exists else MnestState.PROTO
        mnest_id = new_mnest_id()
        values = (
            mnest_id,
            p.src_executor,
            p.src_version,
            p.dst_executor,
            p.dst_version,
            INITIAL_WEIGHT,
            1,
            now,
            now,
            now,
            DEFAULT_DECAY_LAMBDA,
            state.value,
            p.tags,
            p.desired_sig,
            *outcome_counts(p.outcome),
            1.0,  # decayed_uses: one passing, now
        )
        ev = _event(
            mnest_id,
            EventKind.CREATED,
            now,
            turn_id=turn_id,
            weight_before=None,
            weight_after=INITIAL_WEIGHT,
            state_before=None,
            state_after=state.value,
            recorder=recorder,
            outcome=p.outcome,
            occurrence=occurrence,
        )
        return values, ev

    # --- reading ----------------------------------------------------------------------

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
        row = self._ex().first(stmt, _key_params(key))
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
        return [snap.mnest(r) for r in self._ex().rows(stmt, params)]

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
        return [snap.mnest(r) for r in rows]

    # --- changing state ---------------------------------------------------------------

    def _locked(self, ex: StatementRunner, mnest_id: Any) -> Row:
        if not check_mnest_id(mnest_id):
            raise InvalidInput("mnest_id must be a non-empty string")
        row = ex.first(rec.SELECT_BY_ID_LOCKED, {"id": mnest_id})
        if row is None:
            raise NotFound(f"no mnest with id {shorten(mnest_id)!r}")
        return row

    def _key_taken(
        self, ex: StatementRunner, row: Row, state: MnestState, dst_version: str | None
    ) -> bool:
        """Does another row hold this row's key (with ``dst_version``) in ``state``?"""
        key = (row[_SRC], row[_SRC_V], row[_DST], dst_version)
        params = {**_key_params(key), "own_id": row[_ID]}
        return ex.first(rec.key_taken(dst_version is None, state), params) is not None

    def transition_state(
        self, mnest_id: str, new_state: str, *, reason: str | None = None
    ) -> Mnest:
        """Move a row to another state, with a ``transition`` event (same state: no-op).

        Returns:
            The row in its new state (as it was, when it was in that state already).

        Raises:
            InvalidInput: ``mnest_id``, ``new_state`` or ``reason`` is refused.
            NotFound: no mnest has this id.
            InvalidTransition: the contract's transition table does not allow the change.
            ConflictError: another row of the same key is in ``new_state`` already, or the
                write lock was not had within the lock timeout.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        target = check_state(new_state)
        if reason is not None:
            reason = check_text(reason, "reason", max_length=2_000)
        ex = self._write_ex()
        row = self._locked(ex, mnest_id)
        current = MnestState(row[_STATE])
        if current == target:
            return snap.mnest(row)
        why = check_transition(current, target, has_version=row[_DST_V] is not None)
        if why is not None:
            raise InvalidTransition(why)
        if self._key_taken(ex, row, target, row[_DST_V]):
            raise ConflictError(
                f"a {target.value} row with the same key as {row[_ID]} already exists"
            )
        ex.many(rec.SET_STATE, [{"b_id": row[_ID], "b_state": target.value}])
        self._record_change(ex, row, target, EventKind.TRANSITION, reason=reason)
        return snap.mnest(_with(row, {_STATE: target.value}))

    def promote_proto_to_active(self, mnest_id: str, dst_version: str) -> Mnest:
        """Give a proto its destination version and make it active (event ``promoted``).

        Returns:
            The row, now active with ``dst_version``.

        Raises:
            InvalidInput: ``mnest_id`` or ``dst_version`` is refused.
            NotFound: no mnest has this id.
            InvalidTransition: the row is not a proto.
            ConflictError: an active edge with the same key and ``dst_version`` exists, or
                the write lock was not had within the lock timeout.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        version = check_name(dst_version, "dst_version")
        ex = self._write_ex()
        row = self._locked(ex, mnest_id)
        if row[_STATE] != MnestState.PROTO:
            raise InvalidTransition(f"{row[_ID]} is {row[_STATE]}, not a proto")
        if self._key_taken(ex, row, MnestState.ACTIVE, version):
            raise ConflictError(
                f"an active edge {row[_SRC]}@{row[_SRC_V]} -> {row[_DST]}@{version} already exists"
            )
        target = MnestState.ACTIVE
        ex.many(
            rec.PROMOTE, [{"b_id": row[_ID], "b_state": target.value, "b_dst_version": version}]
        )
        self._record_change(ex, row, target, EventKind.PROMOTED)
        return snap.mnest(_with(row, {_DST_V: version, _SIG: None, _STATE: target.value}))

    def _record_change(
        self,
        ex: StatementRunner,
        row: Row,
        target: MnestState,
        kind: EventKind,
        *,
        reason: str | None = None,
    ) -> None:
        """The event of a state change of a locked row; the weight is untouched."""
        now = advance(row[_TS_LAST], self._write_now(ex))
        eff = decayed_weight(row[_WEIGHT], row[_LAMBDA], row[_TS_WEIGHT], now)
        event_row = _event(
            row[_ID],
            kind,
            now,
            weight_before=eff,
            weight_after=eff,
            state_before=row[_STATE],
            state_after=target.value,
            reason=reason,
            recorder=self.settings.recorder,
        )
        ex.many(rec.INSERT_EVENT, [event_row], rec.EVENT_ROW)

    # --- ageing -----------------------------------------------------------------------

    def apply_ager(self) -> AgerReport:
        """Decay, demote, merge, prune and count archive candidates, in set-based SQL, all
        in this unit's transaction; the facades run it in batches instead, each its own
        transaction (:func:`mnestoma.maintenance.ager.age_in_batches`).

        Returns:
            The :class:`~mnestoma.AgerReport`: how many rows each step changed.

        Raises:
            ConflictError: the write lock was not had within the lock timeout
                (:class:`WriteLockTimeout`), or other writers kept changing the rows it needed.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        return run_ager_now(self._write_ex().conn, self.settings)

    # --- retention --------------------------------------------------------------------

    def prune_events(self, before: datetime, *, dry_run: bool = False) -> int:
        """Delete the events older than ``before``, except the ``created`` event of each row
        still in ``mnests``; how many were (with ``dry_run``: would be, nothing deleted).

        All in this unit's transaction; the facades delete in batches instead, each its own
        transaction (:func:`mnestoma.maintenance.retention.prune_steps`).

        Returns:
            How many events were deleted (with ``dry_run``: would be).

        Raises:
            InvalidInput: ``before`` is not an aware datetime the store can hold, or
                ``dry_run`` not a bool.
            ConflictError: the write lock was not had within the lock timeout
                (:class:`WriteLockTimeout`), or other writers kept changing the rows it needed.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        cutoff = _cutoff(before)
        if check_dry_run(dry_run):
            return retention.count_prunable(self._ex().conn, cutoff)
        return retention.delete_prunable(self._write_ex().conn, cutoff)

    # --- query log --------------------------------------------------------------------

    def log_canonical_query(
        self, raw_query: str, canonical_query: str, *, turn_id: str | None = None
    ) -> CanonicalQuery:
        """Append to the canonical query log (touches no mnest), as
        :meth:`CanonicalQueryRepository.log` does, in this repository's transaction.

        Returns:
            The log's new entry.

        Raises:
            InvalidInput: an empty or too long text, or a turn id that is refused.
            ConflictError: no write lock within the lock timeout, or rows kept changing.
            StoreError: the database failed or was unreachable.
        """
        return CanonicalQueryRepository(
            self._session, settings=self.settings, before_write=self._before_write
        ).log(raw_query, canonical_query, turn_id=turn_id)


def _cutoff(before: Any) -> datetime:
    """A prune's cutoff: an aware instant the store can hold, else InvalidInput."""
    return ensure_instant(before, "before")


def _reinforced_mnest(row: Row, values: Row) -> Mnest:
    """The snapshot of a reinforced row (see :func:`_reinforced`)."""
    return snap.mnest(_reinforced(row, values))


class _AfterCommit:
    """A result to be built once its unit of work has committed (see
    :meth:`MnestRepository._build_results_after_commit`)."""

    __slots__ = ("build",)

    def __init__(self, build: Callable[[], Any]) -> None:
        self.build = build


def built(result: T) -> T:
    """``result`` as the caller gets it: a result left for after the commit, built now."""
    if isinstance(result, _AfterCommit):
        return cast(T, result.build())
    return result


def _reinforced(row: Row, values: Row) -> Row:
    """The row as :data:`~mnestoma.schema.sql.record.UPDATE_REINFORCE` leaves it, given that
    statement's values (:data:`~.record.REINFORCE_ROW` order)."""
    _, weight, ts_last, ts_weight, tags, sig, ok, error, count = values
    return _with(
        row,
        {
            _WEIGHT: weight,
            _TS_LAST: ts_last,
            _TS_WEIGHT: ts_weight,
            _TAGS: tags,
            _SIG: sig,
            _USES: row[_USES] + 1,
            _OK: row[_OK] + ok,
            _ERROR: row[_ERROR] + error,
            _DECAYED_USES: count,
        },
    )


def _check_session(session: Any, owner: str) -> Session | Connection:
    """A Session (or scoped_session) or Connection, else InvalidInput naming what was given."""
    if not isinstance(session, Session | Connection | scoped_session):
        raise InvalidInput(
            f"{owner} needs a SQLAlchemy Session or Connection, got {type(session).__name__}"
        )
    return cast(Session | Connection, session)


def _connection_of(session: Session | Connection) -> Connection:
    """The connection of the current transaction, after flushing pending ORM changes."""
    if isinstance(session, Connection):
        return session
    with translate_errors():
        session.flush()  # returns at once when nothing is pending (no scan of the session)
        return session.connection()


def _write_runner(
    session: Session | Connection,
    before_write: Callable[[], None] | None,
    plans: Plans | None = None,
) -> StatementRunner:
    """A statement runner on the connection, in a transaction that holds the write lock
    (SQLite) before the first statement of a write: see :mod:`mnestoma.engines.locking`. What the
    runner's first statement would do (look whether anybody observes the statements, begin
    SQLAlchemy's transaction) and finding the compiled statements of ``plans`` (per
    dialect) are done before the lock is taken: other writers queue for as long as it is
    held."""
    upkeep_before_write(session)  # PostgreSQL: the months' partitions, before any lock (§12)
    if before_write is not None:
        before_write()
    conn = _connection_of(session)
    ex = runner_for(conn)
    ex.ready()
    if plans is not None:
        for stmt, columns in plans.get(ex.dialect, ()):
            ex.plan(stmt, columns)
    with translate_errors():
        take_write_lock(conn)
    ex.lock_held()
    return ex


def _sort_key(ident: tuple[bool, Key]) -> tuple[str, str, str, str, bool]:
    exists_, (s, sv, d, dv) = ident
    return (s, sv, d, dv or "", exists_)


# --- the canonical query log ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueryFrequency:
    """How often one canonical form was logged, and when last."""

    canonical_query: str
    canonical_hash: str
    count: int
    last_ts: datetime


class CanonicalQueryRepository:
    """The request-normalisation log; it never touches ``mnests`` or ``events``.

    Raises:
        InvalidInput: a ``session`` that is not a Session or a Connection; refused settings.
    """

    def __init__(
        self,
        session: Session | Connection,
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
        before_write: Callable[[], None] | None = None,
    ) -> None:
        self._session = _check_session(session, type(self).__name__)
        self.settings = settings_of(settings, clock=clock)
        self._before_write = before_write

    def log(
        self, raw_query: str, canonical_query: str, *, turn_id: str | None = None
    ) -> CanonicalQuery:
        """Append one normalised request; the hash is SHA-256 of the canonical form.

        Returns:
            The new entry of the log.

        Raises:
            InvalidInput: an empty or over-long text, or a ``turn_id`` the contract refuses.
            ConflictError: the write lock was not had within the lock timeout
                (:class:`WriteLockTimeout`), or other writers kept changing the rows it needed.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        raw = check_text(raw_query, "raw_query")
        canonical = check_text(canonical_query, "canonical_query")
        turn = check_optional_name(turn_id, "turn_id")
        ts = self.settings.now()
        digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
        values = {
            "ts": ts,
            "turn_id": turn,
            "raw_query": raw,
            "canonical_query": canonical,
            "canonical_hash": digest,
        }
        ex = _write_runner(self._session, self._before_write)
        new_id = ex.execute(rec.INSERT_QUERY, values).scalar_one()
        return snap.query_from({"id": new_id, **values})

    def recent(self, *, limit: int = 20) -> list[CanonicalQuery]:
        """The latest entries, newest first.

        Returns:
            At most ``limit`` entries, newest first.

        Raises:
            InvalidInput: ``limit`` is not a positive integer up to 100,000.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        n = check_positive_int(limit, "limit", maximum=100_000)
        rows = runner_for(_connection_of(self._session)).rows(rd.QUERY_RECENT, {"limit": n})
        return [snap.query(r) for r in rows]

    def top(self, *, limit: int = 10) -> list[QueryFrequency]:
        """The most frequent canonical forms, most frequent first.

        Returns:
            At most ``limit`` :class:`QueryFrequency` items, most frequent first.

        Raises:
            InvalidInput: ``limit`` is not a positive integer up to 100,000.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        n = check_positive_int(limit, "limit", maximum=100_000)
        rows = runner_for(_connection_of(self._session)).rows(rd.QUERY_TOP, {"limit": n})
        return [QueryFrequency(r[0], r[1], int(r[2]), r[3]) for r in rows]
