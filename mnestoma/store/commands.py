"""The recording commands of a repository: ``record_passing``, ``record_proto`` and
``record_turn`` (contract §4, §13), and the steps they take under the write lock.

Hot paths: Core statements built once at import, executed with bound parameters on the
session's connection; the statements of a one-passing write are looked up before the lock.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Executable
from sqlalchemy.exc import UnboundExecutionError
from sqlalchemy.orm import Session

from mnestoma.core.errors import ConflictError, InvalidInput
from mnestoma.core.rules import MnestState
from mnestoma.core.validation import (
    Passing,
    check_name,
    check_occurrence,
    check_optional_name,
    normalise_passing,
)
from mnestoma.engines.backend import BY_NAME
from mnestoma.engines.postgresql import POSTGRESQL
from mnestoma.engines.sqlite import SQLITE
from mnestoma.schema.models import Mnest
from mnestoma.schema.runner import KeptRows, StatementRunner
from mnestoma.schema.sql import chains as chains_sql
from mnestoma.schema.sql import record as rec
from mnestoma.schema.sql.tables import MNEST_COLUMNS
from mnestoma.store import pg_writes as pg
from mnestoma.store import sqlite_writes as sq
from mnestoma.store.pg_writes import RACE_ROUNDS
from mnestoma.store.plumbing import Plans, StoreBase, lock_for_write
from mnestoma.store.rows import (
    Ident,
    MnestRow,
    Row,
    Stored,
    chain_rows,
    creation,
    key_of,
    key_params,
    reinforced_row,
    reinforcement,
    row_key,
    sort_key,
    turn_snapshots,
)

__all__ = ["RACE_ROUNDS", "RecordCommands"]


def _one_passing_plans(proto: bool, turn: bool) -> Plans:
    """What :meth:`RecordCommands._record_one` runs, on each engine, for a passing with a
    turn or without one."""
    sel: Executable = rec.SELECT_ONE_PROTO if proto else rec.SELECT_ONE_ACTIVE
    event = (rec.INSERT_EVENT, rec.EVENT_ROW)
    return {
        SQLITE.name: (
            (rec.select_one_counted(proto) if turn else sel, ()),
            (rec.UPDATE_REINFORCE, rec.REINFORCE_ROW),
            event,
            (rec.INSERT_MNEST_LOCKED, MNEST_COLUMNS),
        ),
        POSTGRESQL.name: ((rec.pg_passing(proto, turn), ()),),
    }


_ONE_PASSING_PLANS = {
    (proto, turn): _one_passing_plans(proto, turn)
    for proto in (False, True)
    for turn in (False, True)
}


# What :meth:`RecordCommands._record_many_once` runs on SQLite whatever the turn: looked up
# once before the lock, as a passing's are (the lookups of its keys take the turn's shape).
_TURN_PLANS: Plans = {
    SQLITE.name: (
        (rec.TURN_SEEN, ()),
        (rec.UPDATE_REINFORCE, rec.REINFORCE_ROW),
        (rec.INSERT_MNEST_LOCKED, MNEST_COLUMNS),
        (rec.INSERT_EVENT, rec.EVENT_ROW),
        (chains_sql.count_chains(SQLITE.name), chains_sql.CHAIN_ROW),
    ),
}


def _one_writer(session: Session | Connection) -> bool:
    """Whether the store ``session`` writes to takes one writer at a time (SQLite), asked
    before the write lock: a Connection's dialect, else that of the bind the Session gives
    its connection (a Session without one fails at its first statement, as before)."""
    if isinstance(session, Connection):
        bind: Any = session
    else:
        try:
            bind = session.get_bind()
        except UnboundExecutionError:
            return False
    backend = BY_NAME.get(bind.dialect.name)
    return backend is not None and backend.one_writer


class RecordCommands(StoreBase):
    """The recording commands of :class:`~mnestoma.MnestRepository` (contract §4, §13)."""

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
        params = key_params(key_of(p))
        # SQLite, one writer at a time: "now" is read once, before the write lock (contract
        # §4: timestamps never move back, the decay runs from the later instant), so that
        # the writers queued for the lock do not wait for the clock too (and no month's
        # partition to note: SQLite has none).
        now = self._now() if _one_writer(self._session) else None
        ex = self._write_ex(_ONE_PASSING_PLANS[(proto, turn_id is not None)], lock=False)
        if now is not None:
            # Made ready before the lock, which other writers queue for: the lookup's
            # parameters as the driver takes them, and "now" as the writes bind it.
            if turn_id is None:
                lookup = ex.bind(sel, params)
            else:  # the row, and whether the turn counted it
                counted = {**params, "turn_id": turn_id, "occ": occurrence}
                lookup = ex.bind(rec.select_one_counted(proto), counted)
            ex.convert_instant(now, rec.INSERT_EVENT, rec.EVENT_ROW)
            late = rec.late_converter(ex.conn.dialect)  # made at its first use, if need be
            commit = self._commits_itself  # the last statement commits (_last_write)
            guess = sq.guessed(ex, p, turn_id, recorder, occurrence, now, commit=commit)
            lock_for_write(ex)
            return sq.record_one_locked(
                ex, lookup, late, p, turn_id, recorder, occurrence, now, guess, commit=commit
            )
        lock_for_write(ex)  # nothing to take on PostgreSQL: the runner's own steps
        # PostgreSQL: one statement, "now" read once before it (contract §4).
        now = self._write_now(ex)
        commit = self._commits_itself
        return pg.record_one(ex, p, params, now, turn_id, recorder, occurrence, commit=commit)

    def _last_write(self, ex: StatementRunner) -> Callable[[Executable, Any, Any], None]:
        """How the last statement of a SQLite write runs: with its ``COMMIT`` right after it
        where the transaction is the call's own (:meth:`StoreBase._commit_with_last_statement`),
        so that no step after it holds the write lock; else as any statement."""
        return ex.many_committing if self._commits_itself else ex.many

    def _record_many(self, items: list[Passing], turn_id: str, recorder: str) -> list[Mnest]:
        ex = self._write_ex(_TURN_PLANS, lock=False)
        # Each edge's passings in the order given: the k-th is its occurrence k (each with
        # its own outcome; the last tags / desired_sig given win).
        idents = [(p.dst_exists, key_of(p)) for p in items]  # each passing's edge, in order
        unique: dict[Ident, list[Passing]] = {}
        for ident, p in zip(idents, items, strict=True):
            unique.setdefault(ident, []).append(p)
        if BY_NAME[ex.dialect].one_writer:
            # "now" read and converted before the lock, as a passing's (contract §4)
            now = self._now()
            ex.convert_instant(now, rec.INSERT_EVENT, rec.EVENT_ROW)
            late = rec.late_converter(ex.conn.dialect)
            # the rows this connection's last writes left, where the turn commits itself
            kept = ex.kept_rows() if self._commits_itself else None
            # BEGIN IMMEDIATE: no other writer can create one of our keys meanwhile
            lock_for_write(ex)
            once = self._record_many_once(ex, unique, turn_id, recorder, idents, now, kept)
            if once is None:
                raise ConflictError("another writer created a key of this turn meanwhile")
            rows, stored = once
        else:
            lock_for_write(ex)  # nothing to take on PostgreSQL: the runner's own steps
            # PostgreSQL: one statement for the whole turn, "now" read once before it (§4).
            rows = pg.record_turn(ex, unique, idents, self._write_now(ex), turn_id, recorder)
            stored, late = {}, None
        return self._result(functools.partial(turn_snapshots, rows, idents, stored, late))

    def _record_many_once(
        self,
        ex: StatementRunner,
        pending: dict[Ident, list[Passing]],
        turn_id: str,
        recorder: str,
        order: list[Ident],
        now: datetime,
        kept: KeptRows | None,
    ) -> tuple[dict[Ident, Sequence[Any]], dict[Ident, Stored]] | None:
        """A turn on SQLite, under the write lock, ``now`` read before it (``order``: each
        passing's edge, as given): each edge's row after it, for the snapshots built once
        the lock is let go, and for each edge that was in the store its row as read, late
        columns as stored (:data:`~mnestoma.schema.sql.record.LATE_COLUMNS`), with whether
        the turn gave its tags and its desired_sig; None when another writer created one of
        its keys (it cannot: the lock keeps them out). With ``kept`` (the connection's
        :class:`~mnestoma.schema.runner.KeptRows`), only the keys whose rows it does not
        keep are looked up, and the rows the turn wrote are kept once it has committed."""
        result: dict[Ident, Sequence[Any]] = {}
        stored: dict[Ident, Stored] = {}
        found: dict[Ident, MnestRow] = {}
        if kept is not None:
            found.update(cast(dict[Ident, MnestRow], kept.look_many(pending)))
        missing = [i for i in pending if i not in found] if found else list(pending)
        if missing:
            rows = _lock_keys(ex, missing)
            found.update(((r.state == MnestState.ACTIVE, row_key(r)), r) for r in rows)
        done: set[tuple[str, int]] = set()
        if found and ex.first(rec.TURN_SEEN, {"turn_id": turn_id}) is not None:
            # a retried (or continued) turn: which occurrences of its rows did it count?
            ids = [r.id for r in found.values()]
            counted = ex.rows(rec.TURN_COUNTED, {"turn_id": turn_id, "ids": ids})
            done = {(mid, int(occ)) for mid, occ in counted}
        updates: list[Row] = []
        creations: list[tuple[Ident, MnestRow, list[Row]]] = []
        events: list[Row] = []
        documented: list[Ident] = []  # the edges the turn gave a document
        for ident, passings in pending.items():
            row = found.get(ident)
            if row is None:
                new, ev = creation(passings[0], turn_id, now, recorder, 1)
                new_events = [ev]
                for k, p in enumerate(passings[1:], 2):
                    again, ev = reinforcement(new, p, turn_id, now, recorder, k)
                    new = reinforced_row(new, again)
                    new_events.append(ev)
                creations.append((ident, new, new_events))
                if any(map(sq.gives_documents, passings)):
                    documented.append(ident)
                continue
            as_read, tags, sig = row, False, False
            for k, p in enumerate(passings, 1):
                if (row.id, k) in done:
                    continue
                values, ev = reinforcement(row, p, turn_id, now, recorder, k)
                updates.append(values)  # run in order: one row's occurrences one after another
                events.append(ev)
                row = reinforced_row(row, values)
                tags, sig = tags or p.tags is not None, sig or p.desired_sig is not None
            result[ident] = row
            stored[ident] = (as_read, tags, sig)
            if tags or sig:
                documented.append(ident)
        ex.many(rec.UPDATE_REINFORCE, updates, rec.REINFORCE_ROW)
        if creations:
            # In key order, a plain batch: the write lock keeps other writers out.
            creations.sort(key=lambda c: sort_key(c[0]))
            params = [values for _, values, _ in creations]
            ex.many(rec.INSERT_MNEST_LOCKED, params, MNEST_COLUMNS)
            for ident, values, new_events in creations:
                events.extend(new_events)
                result[ident] = values
        chains = chain_rows(order, found, done, now)
        last = self._last_write(ex)
        if chains:
            ex.many(rec.INSERT_EVENT, events, rec.EVENT_ROW)
            last(chains_sql.count_chains(ex.dialect), chains, chains_sql.CHAIN_ROW)
        else:
            last(rec.INSERT_EVENT, events, rec.EVENT_ROW)
        if kept is not None:
            sq.keep_turn(ex, kept, result, [c[0] for c in creations], documented, now)
        return result, stored


def _lock_keys(ex: StatementRunner, idents: list[Ident]) -> list[MnestRow]:
    """Lock and read the rows of these keys, every chunk in id order."""
    idents = sorted(idents, key=sort_key)
    rows: list[MnestRow] = []
    for i in range(0, len(idents), rec.KEYS_PER_STATEMENT):
        chunk = idents[i : i + rec.KEYS_PER_STATEMENT]
        akeys = [k for (exists_, k) in chunk if exists_]
        pkeys = [k for (exists_, k) in chunk if not exists_]
        stmt = rec.select_keys(rec.shape_size(len(akeys)), rec.shape_size(len(pkeys)))
        rows.extend(map(MnestRow._make, ex.rows(stmt, rec.key_params(akeys, pkeys))))
    return rows
