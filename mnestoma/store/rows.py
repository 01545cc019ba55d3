"""The rows a repository reads and writes: a mnest row by name (:class:`MnestRow`), edge
keys, and the pure computations of a write (a creation, a reinforcement, an event's values).

Parameter rows handed to the statement runner (an event in
:data:`~mnestoma.schema.sql.record.EVENT_ROW` order, a reinforcement in
:data:`~mnestoma.schema.sql.record.REINFORCE_ROW` order) stay plain tuples in their
statement's order: that is the shape the runner binds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from mnestoma.core.rules import (
    DEFAULT_DECAY_LAMBDA,
    INITIAL_WEIGHT,
    EventKind,
    MnestState,
    advance,
    chain_increments,
    new_mnest_id,
    outcome_counts,
    passing_values,
)
from mnestoma.core.validation import Passing
from mnestoma.schema import snapshots as snap
from mnestoma.schema.models import Mnest
from mnestoma.schema.sql.record import LATE_AT, LATE_COLUMNS
from mnestoma.schema.sql.tables import MNEST_COLUMNS, Key

__all__ = [
    "Ident",
    "MnestRow",
    "Row",
    "Stored",
    "chain_rows",
    "creation",
    "event_values",
    "key_of",
    "key_params",
    "late_mnest",
    "reinforced_mnest",
    "reinforced_row",
    "reinforcement",
    "row_key",
    "sort_key",
    "turn_snapshots",
]

Row = tuple[Any, ...]
# An edge of a turn: whether its destination exists (active) or not (proto), and its key.
Ident = tuple[bool, Key]
_REINFORCED = EventKind.REINFORCED.value


class MnestRow(NamedTuple):
    """A row of ``select(mnests)``: the table's columns, in order, by name."""

    id: str
    src_executor: str
    src_version: str
    dst_executor: str
    dst_version: str | None
    weight: float
    uses: int
    ts_first: datetime
    ts_last: datetime
    ts_weight: datetime
    decay_lambda: float
    state: str
    tags: Any
    desired_sig: Any
    ok_count: int
    error_count: int
    decayed_uses: float


if MnestRow._fields != MNEST_COLUMNS:  # pragma: no cover - a model change this must follow
    raise RuntimeError(f"MnestRow's fields are not the mnests columns {MNEST_COLUMNS}")

# How many values a MnestRow holds (a lookup may return more: a flag after the columns).
WIDTH = len(MNEST_COLUMNS)
# Where a row holds its late columns (see turn_snapshots): the documents side by side.
_TS_FIRST, _TAGS, _SIG = LATE_AT
if LATE_COLUMNS != ("ts_first", "tags", "desired_sig") or _SIG != _TAGS + 1 or _TAGS <= _TS_FIRST:
    raise RuntimeError(  # pragma: no cover - a model change to follow
        "turn_snapshots expects ts_first before tags, then desired_sig"
    )


def key_of(p: Passing) -> Key:
    """The edge key of a passing."""
    return (p.src_executor, p.src_version, p.dst_executor, p.dst_version)


def row_key(r: MnestRow) -> Key:
    """The edge key of a row."""
    return (r.src_executor, r.src_version, r.dst_executor, r.dst_version)


def key_params(key: Key) -> dict[str, Any]:
    """The parameters of :func:`~mnestoma.schema.sql.tables.key_is` for one key."""
    s, sv, d, dv = key
    params: dict[str, Any] = {"s": s, "sv": sv, "d": d}
    if dv is not None:
        params["dv"] = dv
    return params


def sort_key(ident: Ident) -> tuple[str, str, str, str, bool]:
    """The order a turn locks and creates its edges in."""
    exists_, (s, sv, d, dv) = ident
    return (s, sv, d, dv or "", exists_)


def event_values(
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


def reinforcement(
    row: MnestRow,
    p: Passing,
    turn_id: str | None,
    now: datetime,
    recorder: str,
    occurrence: int = 1,
) -> tuple[Row, Row]:
    """A reinforcement's UPDATE_REINFORCE values (:data:`~.record.REINFORCE_ROW`
    order) and its event (:func:`event_values`'s tuple, written out: this runs while the
    write lock is held)."""
    ts_last = advance(row.ts_last, now)
    ts_weight = advance(row.ts_weight, now)
    # decayed to now, not to the advanced instants: a gap of days never runs backwards, so
    # these are the same floats
    before, after, counted = passing_values(
        row.weight, row.decayed_uses, row.decay_lambda, row.ts_weight, row.ts_last, now
    )
    mnest_id, state, outcome = row.id, row.state, p.outcome
    values = (
        mnest_id,
        after,
        ts_last,
        ts_weight,
        p.tags,  # None: the row's stay (UPDATE_REINFORCE keeps them)
        p.desired_sig,
        *outcome_counts(outcome),
        counted,
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


def creation(
    p: Passing, turn_id: str | None, now: datetime, recorder: str, occurrence: int = 1
) -> tuple[MnestRow, Row]:
    """A new row (the table's columns in order, as :func:`~mnestoma.schema.snapshots.mnest`
    takes them) and its event."""
    state = MnestState.ACTIVE if p.dst_exists else MnestState.PROTO
    mnest_id = new_mnest_id()
    values = MnestRow(
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
    ev = event_values(
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


def reinforced_row(row: MnestRow, values: Row) -> MnestRow:
    """The row as :data:`~mnestoma.schema.sql.record.UPDATE_REINFORCE` leaves it, given that
    statement's values (:data:`~.record.REINFORCE_ROW` order; a document given as None is
    the row's)."""
    _, weight, ts_last, ts_weight, tags, sig, ok, error, count = values
    if tags is None:
        tags = row.tags
    if sig is None:
        sig = row.desired_sig
    return MnestRow(
        row.id,
        row.src_executor,
        row.src_version,
        row.dst_executor,
        row.dst_version,
        weight,
        row.uses + 1,
        row.ts_first,
        ts_last,
        ts_weight,
        row.decay_lambda,
        row.state,
        tags,
        sig,
        row.ok_count + ok,
        row.error_count + error,
        count,
    )


def late_mnest(row: Sequence[Any], late: Callable[[Sequence[Any]], tuple[Any, ...]]) -> Mnest:
    """The snapshot of a row read with its late columns as stored, which ``late`` converts
    (:func:`~mnestoma.schema.sql.record.late_converter`)."""
    return snap.mnest(late(row))


def reinforced_mnest(
    row: MnestRow, values: Row, late: Callable[[Sequence[Any]], tuple[Any, ...]]
) -> Mnest:
    """The snapshot of a reinforced row (see :func:`reinforced_row`), read with its late
    columns as stored, which ``late`` converts
    (:func:`~mnestoma.schema.sql.record.late_converter`)."""
    return snap.mnest(reinforced_row(MnestRow._make(late(row)), values))


# An edge of a SQLite turn that was in the store: its row as read (late columns as stored),
# and whether the turn gave its tags, its desired_sig.
Stored = tuple[MnestRow, bool, bool]


def turn_snapshots(
    rows: dict[Ident, Sequence[Any]],
    order: list[Ident],
    stored: dict[Ident, Stored],
    late: Callable[[Sequence[Any]], tuple[Any, ...]] | None,
) -> list[Mnest]:
    """A turn's result: each passing's edge as a snapshot, in the order given (an edge given
    twice is the same snapshot twice). The edges that were in the store get their late
    columns converted by ``late`` first: their first instant, and each document the turn
    did not give."""
    if late is not None and stored:
        rows = dict(rows)
        for ident, (as_read, tags, sig) in stored.items():
            was, row = late(as_read), rows[ident]
            # the row with the first instant read, and each document the turn did not
            # give, as stored: spelt by position (a NamedTuple's _replace took more than
            # half of a turn's snapshots)
            rows[ident] = (
                *row[:_TS_FIRST],
                was[_TS_FIRST],
                *row[_TS_FIRST + 1 : _TAGS],
                row[_TAGS] if tags else was[_TAGS],
                row[_SIG] if sig else was[_SIG],
                *row[_SIG + 1 : WIDTH],
            )
    built = dict(zip(rows, snap.mnests(rows.values()), strict=True))
    return [built[ident] for ident in order]


def chain_rows(
    order: list[Ident],
    found: dict[Ident, MnestRow],
    done: set[tuple[str, int]],
    now: datetime,
) -> list[Row]:
    """The chain counts to add for the passings this attempt counted (contract §13), in key
    order, written after every row lock of the turn is held. Links to protos are left out
    of chains."""
    seen: dict[Ident, int] = {}
    links: list[tuple[str, str]] = []
    counted: list[bool] = []
    for ident in order:
        exists, (src, _, dst, _) = ident
        if not exists:
            continue
        k = seen[ident] = seen.get(ident, 0) + 1
        row = found.get(ident)
        links.append((src, dst))
        counted.append(row is None or (row.id, k) not in done)
    added = chain_increments(links, counted)
    return [(*key, n, now) for key, n in sorted(added.items())]
