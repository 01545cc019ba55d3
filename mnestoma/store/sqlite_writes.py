"""SQLite's steps of one passing (a facade's, a unit of work's, a turn of one passing): the
write lock keeps other writers out, so the row is looked up, reinforced and written under
it, with no race to run again; or, where the connection keeps the row its own last passing
of the edge wrote (:class:`~mnestoma.schema.runner.KeptRows`), the write is made ready
before the lock and only run under it. And the rows a turn keeps (:func:`keep_turn`).
PostgreSQL's steps are in :mod:`~.pg_writes`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NamedTuple, cast

from mnestoma.core.validation import Passing
from mnestoma.schema import snapshots as snap
from mnestoma.schema.models import Mnest
from mnestoma.schema.runner import Bound, KeptRows, ReadyWrites, StatementRunner
from mnestoma.schema.sql import record as rec
from mnestoma.schema.sql.tables import MNEST_COLUMNS
from mnestoma.store.rows import (
    WIDTH,
    Ident,
    MnestRow,
    Row,
    creation,
    key_of,
    late_mnest,
    reinforced_mnest,
    reinforced_row,
    reinforcement,
)

__all__ = ["Guess", "gives_documents", "guessed", "keep_turn", "record_one_locked"]


class Guess(NamedTuple):
    """A passing made ready before the write lock from the row its connection kept
    (:func:`guessed`): the row (None: none kept), its reinforcement's
    values, and its statements as the driver takes them (None: not at the driver)."""

    kept: KeptRows
    ident: Ident
    row: MnestRow | None
    values: Row
    ready: ReadyWrites | None


def gives_documents(p: Passing) -> bool:
    """Whether ``p`` gives tags or a signature: stored as the driver wrote them, so the row
    it leaves is not kept, and the edge's next write reads them as stored."""
    return p.tags is not None or p.desired_sig is not None


def _created_as_read(new: MnestRow, stored: Any) -> MnestRow | None:
    """A row just created, as its lookup would read it: its ``ts_first`` as the driver
    bound it (``stored``; None: not bound so, and the row is not kept)."""
    return None if stored is None else new._replace(ts_first=stored)


def _kept_reinforced(
    kept: KeptRows,
    ident: Ident,
    row: MnestRow,
    values: Row,
    p: Passing,
    late: Callable[[Sequence[Any]], tuple[Any, ...]],
) -> Callable[[], Mnest]:
    """After a reinforcement committed: its row kept for the connection's next passing of
    the edge (where it gave no document: one it gave is stored as the driver wrote it,
    which the next passing looks up), and what builds its snapshot."""
    if not gives_documents(p):
        after = reinforced_row(row, values)
        kept.wrote(ident, after)
        return functools.partial(late_mnest, after, late)
    kept.wrote(ident, None)
    return functools.partial(reinforced_mnest, row, values, late)


def guessed(
    ex: StatementRunner,
    p: Passing,
    turn_id: str | None,
    recorder: str,
    occurrence: int,
    now: datetime,
    *,
    commit: bool,
) -> Guess | None:
    """SQLite, before the write lock: where this connection keeps the row its last
    passing of the edge wrote (:class:`~mnestoma.schema.runner.KeptRows`; a call's own
    transaction, no turn), the reinforcement of that row and its statements made ready,
    which the lock's holder runs as they are if the row is still the store's; else None.
    Only the write is then left under the lock."""
    if turn_id is not None or not commit:
        return None
    kept = ex.kept_rows()
    if kept is None:
        return None
    ident: Ident = (p.dst_exists, key_of(p))
    row = kept.peek(ident)
    if row is None:
        return Guess(kept, ident, None, (), None)
    mnest = cast(MnestRow, row)
    values, ev = reinforcement(mnest, p, None, now, recorder, occurrence)
    ready = ex.ready_writes(
        (
            (rec.UPDATE_REINFORCE, values, rec.REINFORCE_ROW),
            (rec.INSERT_EVENT, ev, rec.EVENT_ROW),
        )
    )
    return Guess(kept, ident, mnest, values, ready)


def record_one_locked(
    ex: StatementRunner,
    lookup: Bound,
    late: Callable[[Sequence[Any]], tuple[Any, ...]],
    p: Passing,
    turn_id: str | None,
    recorder: str,
    occurrence: int,
    now: datetime,
    guess: Guess | None,
    *,
    commit: bool,
) -> Callable[[], Mnest]:
    """SQLite, under the write lock (no other writer can create the key meanwhile), with
    ``now`` read before it: one lookup, which with a turn also says whether the turn
    counted this occurrence already, then the row's write and its event. A read and
    two plain writes: SQLite computing the reinforcement itself in two statements
    (the event's INSERT ... SELECT, then UPDATE ... RETURNING, with the exact SQL twins
    of the rules) spends more time under the lock than the lookup and the arithmetic
    it saves (see docs/performance.md). With ``guess`` (:func:`guessed`), the connection's
    kept row is checked first (:meth:`~mnestoma.schema.runner.KeptRows.look`): while it is
    still the store's, the write made ready before the lock runs alone; either way the row
    written is kept for the next passing. ``late``, found before the lock, converts the
    row's late columns for the snapshot once the lock is let go."""
    # The row this connection's last passing of the edge wrote, when nothing has
    # written to the store since (KeptRows): no lookup under the lock, and where it was
    # guessed so before the lock, its write made ready then.
    found = guess.kept.look(guess.ident) if guess is not None else None
    if guess is not None and guess.ready is not None and found is guess.row is not None:
        ex.run_ready(guess.ready, commit=commit)
        return _kept_reinforced(guess.kept, guess.ident, guess.row, guess.values, p, late)
    if found is None:
        found = ex.first_bound(lookup)  # its late columns as stored (rec.LATE_COLUMNS)
    if found is None:
        new, ev = creation(p, turn_id, now, recorder, occurrence)
        ex.writes(
            (
                (rec.INSERT_MNEST_LOCKED, new, MNEST_COLUMNS),
                (rec.INSERT_EVENT, ev, rec.EVENT_ROW),
            ),
            commit=commit,
        )
        if guess is not None:
            stored = None if gives_documents(p) else ex.stored_instant(now)
            guess.kept.wrote(guess.ident, _created_as_read(new, stored))
        return functools.partial(snap.mnest, new)
    if turn_id is not None:
        if found[WIDTH]:  # the flag after the columns: the turn counted it already
            return functools.partial(late_mnest, found, late)
        found = found[:WIDTH]
    row = MnestRow._make(found)
    values, ev = reinforcement(row, p, turn_id, now, recorder, occurrence)
    ex.writes(
        (
            (rec.UPDATE_REINFORCE, values, rec.REINFORCE_ROW),
            (rec.INSERT_EVENT, ev, rec.EVENT_ROW),
        ),
        commit=commit,
    )
    if guess is not None:
        return _kept_reinforced(guess.kept, guess.ident, row, values, p, late)
    return functools.partial(reinforced_mnest, row, values, late)


def keep_turn(
    ex: StatementRunner,
    kept: KeptRows,
    after: dict[Ident, Sequence[Any]],
    created: list[Ident],
    documented: list[Ident],
    now: datetime,
) -> None:
    """After a turn committed at the driver: each of its rows, as :func:`record_one_locked`
    keeps a passing's, for the connection's next write of the edge (``after``: each edge's
    row after the turn; ``created``: the edges it created, whose ``ts_first`` is kept as the
    driver bound it). The edges to which the turn gave a document (``documented``) keep
    nothing: their next write reads the documents as stored."""
    rows = cast(dict[Ident, tuple[Any, ...]], after)
    forgotten = list(documented)  # the caller's list left as it is
    if created or forgotten:
        rows = dict(rows)
        stored = ex.stored_instant(now)
        for ident in created:
            row = _created_as_read(cast(MnestRow, rows[ident]), stored)
            if row is None:
                forgotten.append(ident)
            else:
                rows[ident] = row
        for ident in forgotten:
            rows.pop(ident, None)
    kept.wrote_many(rows, forgotten)
