"""The repair a seed-era store needs before it can leave revision 0001.

Revision 0001 allowed two things that 0002's unique indexes forbid: two rows of one key
without a destination version (two protos of ``src@version → dst``; NULL is distinct from
NULL in its five-column unique constraint), and one (turn_id, mnest_id) holding both a
``created`` and a ``reinforced`` event. 0002 cannot build ``ux_mnests_proto_key`` nor
``ux_events_turn_edge`` over such rows, and the landed revisions are not edited: this
module merges them first, under the migration lock and in the migration's transaction, so a
failed upgrade still leaves the store exactly as it was.

- Rows of one key merge with the ager's rule (contract §4): the row first seen (earliest
  ``ts_first``, then id) keeps its id; ``uses`` summed, ``ts_first`` the earliest,
  ``ts_last`` the latest; the weight is the larger of the rows' effective weights at that
  ``ts_last`` (at 0001 a weight refers to its row's ``ts_last``, and 0002 anchors it
  there); ``tags`` and ``desired_sig`` those of the most recently used row that has them
  (a later passing's ``desired_sig`` replaces an older one); ``decay_lambda`` the kept
  row's. Every event of the absorbed rows moves to the kept row, and each absorbed row gets
  a ``merged`` event under its own id (so that its id still says what became of it), the
  kept row one per absorbed row.
- Of the ``created`` / ``reinforced`` events of one (turn_id, mnest_id) the first (by ts,
  then id) stays the turn's; the others keep their kind and weights but lose their
  ``turn_id`` (a turn counts an edge once). ``uses`` is left as it was: those passings did
  happen.
- ``events`` has no ``related_id`` nor ``reason`` at 0001. When the upgrade runs through
  Alembic, they are filled in as soon as revision 0002 has added them, in the same
  transaction: ``related_id`` of each ``merged`` event names the other row, and ``reason``
  says why (for a cleared turn, which turn it was).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

# Frozen history: this module repairs stores as revision 0001 left them, so it carries the
# 0001-era names and numbers it needs and imports nothing that a later revision may change
# (not the rules, the models nor the event row of today). Only the timestamp type, which
# reads and writes an instant the same way at every revision, is shared.
from mnestoma.core.types import UTCDateTime

__all__ = ["SEED_REVISION", "SeedRepair", "repair_before_upgrade", "repair_seed_store"]

logger = logging.getLogger("mnestoma.seed_repair")  # the logger's public name

SEED_REVISION = "0001"
# Duplicate groups handled per round trip: memory stays bounded whatever the store holds.
GROUPS_PER_BATCH = 500

# The two tables as revision 0001 has them (only the columns the repair reads or writes):
# the repair runs before any later revision, on a store whose ``events`` lacks the columns
# added since (``reason``, ``related_id``, ``recorder``, ``outcome``), so the models' tables,
# which name them, cannot be used here; its events are written in the columns 0001 has.
_md = sa.MetaData()
_mnests = sa.Table(
    "mnests",
    _md,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("src_executor", sa.String(255)),
    sa.Column("src_version", sa.String(255)),
    sa.Column("dst_executor", sa.String(255)),
    sa.Column("dst_version", sa.String(255)),
    sa.Column("weight", sa.Float),
    sa.Column("uses", sa.Integer),
    sa.Column("ts_first", UTCDateTime()),
    sa.Column("ts_last", UTCDateTime()),
    sa.Column("decay_lambda", sa.Float),
    sa.Column("state", sa.String(16)),
)
_events = sa.Table(
    "events",
    _md,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("mnest_id", sa.String(64)),
    sa.Column("kind", sa.String(16)),
    sa.Column("ts", UTCDateTime()),
    sa.Column("turn_id", sa.String(255)),
    sa.Column("weight_before", sa.Float),
    sa.Column("weight_after", sa.Float),
    sa.Column("state_before", sa.String(16)),
    sa.Column("state_after", sa.String(16)),
)
_M, _E = _mnests.c, _events.c
# The event kinds of revision 0001 that the repair reads or writes.
_PASSING = ("created", "reinforced")
_MERGED = "merged"
_SECONDS_PER_DAY = 86400.0


def _decayed_weight(weight: float, decay_lambda: float, since: datetime, now: datetime) -> float:
    """0001's effective weight: ``weight × exp(−decay_lambda × days)``, days never negative."""
    days = max(0.0, (now - since).total_seconds() / _SECONDS_PER_DAY)
    return weight * math.exp(-decay_lambda * days)


_KEY = (_M.src_executor, _M.src_version, _M.dst_executor, _M.state)


@dataclass
class SeedRepair:
    """What the repair did, and what it leaves for revision 0002's new columns."""

    rows_merged: int = 0
    turn_events_cleared: int = 0
    # (event id, related_id, reason) to write once events.related_id and .reason exist
    notes: list[tuple[int, str | None, str]] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """True when the store held anything to repair."""
        return bool(self.rows_merged or self.turn_events_cleared)


def repair_before_upgrade(conn: sa.Connection, current: str | None) -> SeedRepair | None:
    """Called under the migration lock before Alembic runs: on a store at 0001 that is being
    upgraded, repair it, and have the notes written once 0002 has added their columns."""
    if current != SEED_REVISION:
        return None
    migration = _alembic_run()
    if migration is not None and not migration[0]:
        return None
    report = repair_seed_store(conn)
    callbacks = getattr(migration[1], "on_version_apply_callbacks", None) if migration else None
    if migration is not None and callbacks is not None and report.notes:
        # Alembic calls these after each revision, in the migration's transaction
        migration[1].on_version_apply_callbacks = (*callbacks, notes_writer(report))
    return report


def _alembic_run() -> tuple[bool, Any] | None:
    """Inside an Alembic run: (whether it takes the store past 0001, its MigrationContext);
    None outside one (a caller that repairs before migrating by other means)."""
    from alembic import context

    try:
        ctx = context.get_context()
    except NameError:  # the proxy exists only while env.py runs
        return None
    try:
        destination = context.get_revision_argument()
    except KeyError:  # a command that moves no revision (current, history)
        return False, ctx
    targets = destination if isinstance(destination, tuple | list) else (destination,)
    onward = any(
        t is not None and t not in ("base", SEED_REVISION) and not str(t).startswith("-")
        for t in targets
    )
    return onward, ctx


def repair_seed_store(conn: sa.Connection, *, now: datetime | None = None) -> SeedRepair:
    """Merge what revision 0001 allowed and 0002 forbids, on a store at 0001 (see the module
    docstring); ``now`` (default: the current UTC time) stamps the ``merged`` events."""
    at = now or datetime.now(UTC)
    report = SeedRepair()
    for groups in _batches(_duplicate_keys(conn)):
        _merge_groups(conn, groups, at, report)
    for pairs in _batches(_duplicate_turn_edges(conn)):
        _clear_turns(conn, pairs, report)
    if report.changed:
        logger.info(
            "seed store repaired before revision 0002: %d rows merged into the row of their "
            "key, %d repeated passings of a turn no longer carry its turn_id",
            report.rows_merged,
            report.turn_events_cleared,
        )
    return report


def write_notes(conn: sa.Connection, report: SeedRepair) -> None:
    """Fill in ``related_id`` and ``reason`` of the repair's events, once revision 0002 has
    added those columns (same transaction)."""
    if not report.notes:
        return
    events = sa.Table(
        "events",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("related_id", sa.String(64)),
        sa.Column("reason", sa.String),
    )
    stmt = (
        sa.update(events)
        .where(events.c.id == sa.bindparam("event_id"))
        .values(related_id=sa.bindparam("related"), reason=sa.bindparam("why"))
    )
    conn.execute(
        stmt, [{"event_id": e, "related": related, "why": why} for e, related, why in report.notes]
    )


# --- rows of one key --------------------------------------------------------------------------


def _duplicate_keys(conn: sa.Connection) -> list[tuple[Any, ...]]:
    """(src, src_version, dst, state) of every key held by more than one row without a
    destination version."""
    stmt = (
        sa.select(*_KEY)
        .where(_M.dst_version.is_(None))
        .group_by(*_KEY)
        .having(sa.func.count() > 1)
        .order_by(*_KEY)
    )
    return [tuple(r) for r in conn.execute(stmt)]


def _batches(items: Sequence[tuple[Any, ...]]) -> Iterator[Sequence[tuple[Any, ...]]]:
    for i in range(0, len(items), GROUPS_PER_BATCH):
        yield items[i : i + GROUPS_PER_BATCH]


def _merge_groups(
    conn: sa.Connection, keys: Sequence[tuple[Any, ...]], at: datetime, report: SeedRepair
) -> None:
    stmt = (
        sa.select(_mnests)
        .where(_M.dst_version.is_(None), sa.tuple_(*_KEY).in_(keys))
        .order_by(*_KEY, _M.ts_first, _M.id)
    )
    rows = conn.execute(stmt).mappings().all()
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for r in rows:
        groups.setdefault(tuple(r[c.key] for c in _KEY), []).append(r)
    for group in groups.values():
        _merge_group(conn, group, at, report)


def _merge_group(conn: sa.Connection, rows: list[Any], at: datetime, report: SeedRepair) -> None:
    """Merge ``rows`` (one key, oldest first) into the first."""
    kept, absorbed = rows[0], rows[1:]
    ts_last = max(r["ts_last"] for r in rows)

    def weight_at_end(r: Any) -> float:
        return _decayed_weight(r["weight"], r["decay_lambda"], r["ts_last"], ts_last)

    _copy_json(conn, rows)
    weight = weight_at_end(kept)
    for r in absorbed:
        before, weight = weight, max(weight, weight_at_end(r))
        # the absorbed row's history becomes the kept row's; a merged event on each id
        conn.execute(sa.update(_events).where(_E.mnest_id == r["id"]).values(mnest_id=kept["id"]))
        conn.execute(sa.delete(_mnests).where(_M.id == r["id"]))
        for own, other, w_before in ((r, kept, weight_at_end(r)), (kept, r, before)):
            why = (
                f"merged into {kept['id']} when the store left revision 0001, which let two "
                "rows share this key"
                if own is r
                else f"{r['id']} merged into this row when the store left revision 0001"
            )
            # the columns 0001 has now; the others once 0002 has added them (write_notes)
            seed_row = {
                "mnest_id": own["id"],
                "kind": _MERGED,
                "ts": at,
                "turn_id": None,
                "weight_before": w_before,
                "weight_after": weight,
                "state_before": own["state"],
                "state_after": kept["state"],
            }
            event_id = conn.execute(sa.insert(_events).returning(_E.id), seed_row).scalar_one()
            report.notes.append((event_id, other["id"], why))
        report.rows_merged += 1
    values: dict[str, Any] = {
        "uses": sum(r["uses"] for r in rows),
        "ts_first": min(r["ts_first"] for r in rows),
        "ts_last": ts_last,
        "weight": min(1.0, weight),
    }
    conn.execute(sa.update(_mnests).where(_M.id == kept["id"]).values(**values))


def _copy_json(conn: sa.Connection, rows: list[Any]) -> None:
    """Give the first row, for ``tags`` and for ``desired_sig``, the value of the most
    recently used row of the group that has one (in SQL: the values are not read into
    Python, nor re-encoded). Runs before the other rows are deleted."""
    raw = sa.Table(
        "mnests",
        sa.MetaData(),
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("ts_last", UTCDateTime()),
        sa.Column("tags"),
        sa.Column("desired_sig"),
    )
    src = raw.alias("latest")
    ids = [r["id"] for r in rows]
    values = {
        name: sa.select(src.c[name])
        .where(src.c.id.in_(ids), src.c[name].is_not(None))
        .order_by(src.c.ts_last.desc(), src.c.id.desc())
        .limit(1)
        .scalar_subquery()
        for name in ("tags", "desired_sig")
    }
    conn.execute(sa.update(raw).where(raw.c.id == rows[0]["id"]).values(**values))


# --- passings of one turn ---------------------------------------------------------------------


def _duplicate_turn_edges(conn: sa.Connection) -> list[tuple[Any, ...]]:
    """(turn_id, mnest_id) of every pair with more than one created / reinforced event."""
    stmt = (
        sa.select(_E.turn_id, _E.mnest_id)
        .where(_E.turn_id.is_not(None), _E.kind.in_(_PASSING))
        .group_by(_E.turn_id, _E.mnest_id)
        .having(sa.func.count() > 1)
        .order_by(_E.turn_id, _E.mnest_id)
    )
    return [tuple(r) for r in conn.execute(stmt)]


def _clear_turns(conn: sa.Connection, pairs: Sequence[tuple[Any, ...]], report: SeedRepair) -> None:
    stmt = (
        sa.select(_E.id, _E.turn_id, _E.mnest_id)
        .where(
            _E.kind.in_(_PASSING),
            sa.and_(_E.turn_id.is_not(None), sa.tuple_(_E.turn_id, _E.mnest_id).in_(pairs)),
        )
        .order_by(_E.turn_id, _E.mnest_id, _E.ts, _E.id)
    )
    seen: set[tuple[str, str]] = set()
    cleared: list[dict[str, Any]] = []
    for event_id, turn_id, mnest_id in conn.execute(stmt):
        if (turn_id, mnest_id) in seen:
            cleared.append({"event_id": event_id})
            why = (
                f"turn {turn_id} had already counted this row; its turn_id was cleared when "
                "the store left revision 0001 (a turn counts an edge once)"
            )
            report.notes.append((event_id, None, why))
        seen.add((turn_id, mnest_id))
    if cleared:
        conn.execute(
            sa.update(_events).where(_E.id == sa.bindparam("event_id")).values(turn_id=None),
            cleared,
        )
    report.turn_events_cleared += len(cleared)


def notes_writer(report: SeedRepair) -> Callable[..., None]:
    """An Alembic ``on_version_apply`` callback that writes the repair's notes right after
    revision 0002 (which adds ``related_id`` and ``reason``) is applied."""

    def after_step(*, ctx: Any, step: Any, heads: Any, run_args: Any) -> None:
        if (
            getattr(step, "is_upgrade", False)
            and not getattr(step, "is_stamp", False)  # a stamp adds no column
            and getattr(step, "up_revision_id", None) == "0002"
        ):
            write_notes(ctx.connection, report)

    return after_step
