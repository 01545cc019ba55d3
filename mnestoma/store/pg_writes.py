"""PostgreSQL's recording steps: a passing, and a turn, each one statement
(``pg_passing`` and ``pg_turn`` in :mod:`mnestoma.schema.sql.record`), with "now" read once
before it (contract §4) and the race rounds a statement that lost a race runs again.

SQLite's steps of a passing are in :mod:`mnestoma.store.sqlite_writes`, its turn's in
:mod:`mnestoma.store.commands`: there the write lock keeps other writers out, and no race is
run again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from mnestoma.core.errors import ConflictError, RaceLost, translate_errors
from mnestoma.core.errors import is_unique_violation as counted_meanwhile
from mnestoma.core.rules import new_mnest_id, outcome_counts
from mnestoma.core.validation import Passing
from mnestoma.schema import snapshots as snap
from mnestoma.schema.models import Mnest
from mnestoma.schema.runner import StatementRunner
from mnestoma.schema.sql import record as rec
from mnestoma.store.rows import Ident, sort_key

__all__ = ["RACE_ROUNDS", "record_one", "record_turn"]

# A passing whose INSERT finds its key created by another transaction meanwhile reads that
# row again and reinforces it: a race round, not a retry of a failed transaction (those are
# the unit of work's, see mnestoma.store.uow.with_retries). The second round finds the committed
# row; a third covers the ager demoting it in between. Past that: RaceLost, which the
# retry policy runs again in a new transaction.
RACE_ROUNDS = 3


def record_one(
    ex: StatementRunner,
    p: Passing,
    params: dict[str, Any],
    now: datetime,
    turn_id: str | None,
    recorder: str,
    occurrence: int,
    *,
    commit: bool = False,
) -> Callable[[], Mnest]:
    """One passing (``params``: its key's) as one statement that locks the key's row,
    computes and writes the passing and its event, or creates the row; what builds its
    snapshot. ``commit``: the transaction is the passing's own, and the statement commits
    it in the same round trip (a passing with a turn does not: a statement that must run
    again does so with the row's lock held)."""
    stmt = rec.pg_passing(not p.dst_exists, turn_id is not None)
    ok, error = outcome_counts(p.outcome)
    params.update(
        now=now,
        new_id=new_mnest_id(),
        tags=p.tags,
        desired_sig=p.desired_sig,
        ok=ok,
        error=error,
        turn_id=turn_id,
        recorder=recorder,
        outcome=p.outcome,
        occ=occurrence,
    )
    run = ex.first_committing if commit and turn_id is None else ex.first
    for _ in range(RACE_ROUNDS):
        found = run(stmt, params)
        # Nothing: another transaction created the key meanwhile; "again": another
        # committed a change to the row after this statement's snapshot, so whether the
        # turn counted it is asked again, the row's lock held by now.
        if found is not None and found[0] != rec.PASSED_AGAIN:
            return functools.partial(snap.mnest, found[1:])
    raise RaceLost("could not record the passing: the edge kept changing under us")


def record_turn(
    ex: StatementRunner,
    unique: dict[Ident, list[Passing]],
    idents: list[Ident],
    now: datetime,
    turn_id: str,
    recorder: str,
) -> dict[Ident, Sequence[Any]]:
    """A turn of several passings (``unique``: each edge's passings in order; ``idents``:
    each passing's edge, as given) as one statement that locks the turn's rows, computes
    and writes every passing, its event and the turn's chains; each edge's row after it
    (the columns of ``mnests``), for the snapshots built once the turn has committed."""
    new_rows_order = sorted(unique, key=sort_key)
    params = rec.pg_turn_params(unique, idents, new_rows_order, now, turn_id, recorder)
    conn = ex.conn
    for attempt in range(RACE_ROUNDS + len(unique)):
        # A savepoint per attempt: when another transaction creates one of our keys
        # first, rolling back to it undoes the attempt and releases every row lock it
        # took, so the next attempt locks all the turn's rows again in one (id) order.
        # Continuing instead would lock the new row after the others and could deadlock.
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
            found = _turn_once(ex, params, list(unique))
        except BaseException as err:
            if savepoint.is_active:
                savepoint.rollback()
            if isinstance(err, ConflictError) and counted_meanwhile(err):
                # the same turn, recorded by another transaction after this statement's
                # snapshot: the database refused its events again; the next one sees them
                continue
            raise
        if found is not None:
            with translate_errors():
                savepoint.commit()
            return found
        savepoint.rollback()
    raise RaceLost("could not record the turn: its edges kept changing under us")


def _turn_once(
    ex: StatementRunner, params: dict[str, Any], edges: list[Ident]
) -> dict[Ident, Sequence[Any]] | None:
    """One attempt at a turn: each edge's row after the turn; None when another
    transaction created one of its keys meanwhile (the attempt is then to be undone)."""
    rows = ex.rows(rec.pg_turn(), params)
    if len(rows) < len(edges):
        return None
    return {edges[r[1] - 1]: r[2:] for r in rows}
