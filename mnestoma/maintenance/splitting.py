"""``mnestoma split-history`` (PostgreSQL, contract §12): every event in its month.

A partition of ``events`` in the old layout is a plain table: one month (``events_YYYYMM``,
made before revision 0015), or every event before a month (``events_to_YYYYMM``: the one
revision 0011 made, the table as it was and what was written before that month since, or
what retention kept before 0015). Revision 0015 converts those that hold no row and copies
none; those that hold rows (a store made at 0015 or later has none) are rebuilt, one at a
time and oldest first, into months of the new layout (each partitioned by kind, made by the
store's ``mnestoma_events_month``), online:

1. **The start** (one transaction, its locks waited for
   :data:`~mnestoma.rules.SPLIT_LOCK_TIMEOUT_S` at most and the whole tried again up to
   :data:`~mnestoma.rules.SPLIT_TRIES` times): the staging table ``events_split``,
   partitioned by range of ``ts``, with the old partition's columns in their order and
   events' indexes; under it a month for each month the old partition's rows span (a
   catch-all's from the month of its oldest event, found in one scan before this
   transaction, up to its bound), each ``_rest`` leaf with a CHECK of its bounds (the
   ``_created`` leaf has its own), and a default leaf for a row dated in no month staged
   (a write into the far past while the split runs). Then, last, the old partition is
   locked against writers (``SHARE ROW EXCLUSIVE``), the highest id it holds is read (the
   *watermark*), and triggers on it mirror every insert, delete, update and TRUNCATE into
   the staging table, in the writer's own transaction. The staging table's comment records
   the old partition, its lowest id, the watermark and how far the copy went.
2. **The copy**, in batches of the next :data:`~mnestoma.rules.SPLIT_BATCH_ROWS` ids the old
   partition holds, from the lowest to the watermark (read from its primary key, so that the
   sparse ids of what retention kept make no empty batches), each its own short
   transaction: its rows of those ids not in the staging table yet copied there, each row
   locked ``FOR SHARE`` as it is read (a delete or update of it waits for the batch; the
   writers' inserts are not held up; lock timeout and tries as above), the comment moved
   on in the same transaction; a pause of
   :data:`~mnestoma.rules.SPLIT_PAUSE_S` after each.
3. **The swap** (one short transaction, same lock timeout and tries): ``events`` locked;
   rows the staging default caught given months of their own; the old partition detached
   (renamed ``<name>_dropped``), each staged month detached from the staging table, renamed
   where the old partition held its name, attached to ``events`` (the leaves' CHECKs imply
   its range: no row is read, but ``events_default``'s, normally none) and its ``_rest``
   CHECK dropped, so that it is the month a store partitioned from the start has; the
   staging table dropped. Then the old table is dropped, in a transaction of its own.

**Nothing is missed nor doubled.** The triggers are made under a lock that conflicts with
the ``ROW EXCLUSIVE`` lock every insert, update and delete holds on the old partition until
its transaction ends. So each write to it either committed before the triggers existed (its
rows are in the old partition, with ids up to the watermark, read once that lock was had),
or takes its lock after they were committed and sees them (a lock taken reads the
catalogue's changes): its change is mirrored in its own transaction, committed or rolled
back with it. Every batch locks each row it copies ``FOR SHARE`` until it commits: a delete
or update of a row that committed before the lock was taken is seen by it (the row is
skipped, or its newest version copied), and one that comes after waits for the batch's
commit, then is mirrored into the staging table, where the row now is. A row copied is
the old partition's row as it is. A row a write mirrored (whatever its id) is never copied again
(``ON CONFLICT DO NOTHING`` on the leaves' primary keys), and a row deleted before its batch
is not there to copy. When the last batch commits, the staging table holds exactly the old
partition's rows, and keeps doing so until the swap, which locks both out of reach.

**A kill at any point** leaves what the database says: before the start's commit, nothing;
after it, the staging table and its comment, from which the next run goes on with the next
batch (a batch is committed with the comment that counts it); after the swap, an old table
detached with the mirror trigger on it, which the next run drops. One split runs at a time
(an advisory lock around each change of step, the staging table's lock around each batch).

**The default partition** ``events_default`` catches the rows of a month no partition covers
(a clock in the future or the past, a raw INSERT, the months the writers' upkeep does not
make while it is larger than :data:`~mnestoma.rules.PARTITION_DEFAULT_MAX_MIB`). When it
holds rows it is split the same way, after the old layout's partitions: it has no range, so
the months staged are those of its rows, found in one scan before the start
(``oldest_month``'s cost); a row written meanwhile into a month not staged lands in the
staging default leaf and gets a month of its own at the swap. A month of those the writers'
upkeep makes between the scan and the start moves its rows out of the default partition; the
start, holding the default partition against writers, drops a staged month that a partition
of events now covers (it holds no row: the staging table holds nothing yet). Once started, a
staged month holds its final name, so the upkeep's ``CREATE`` of that month fails with
``duplicate_table``, which it catches (rolling back what it did for that month, the
default's rows it would have moved included): the month stays the split's. A prune meanwhile
may attach its partition of everything before over staged months: the rows it deleted from
the default partition were deleted from them too (the mirror), and the swap drops those
months, found empty. The swap detaches the default partition (renamed
``events_default_dropped``), attaches the months, and makes a new empty ``events_default``
as a new store has it, whose indexes events' partitioned indexes give. Where pg_partman
makes the months, the default partition is its own and is not split.

The turn-edge triggers of ``events`` never fire for the copy: the staging table is no
partition of ``events``, ``event_turn_edges`` keeps its rows, and no row's ``ts`` changes.
The operation is :func:`split_steps`, driven by both doors (``split_history``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from mnestoma.core.errors import SchemaError, translate_errors
from mnestoma.core.rules import (
    SPLIT_BATCH_ROWS,
    SPLIT_LOCK_TIMEOUT_S,
    SPLIT_PAUSE_S,
    SPLIT_TRIES,
)
from mnestoma.core.validation import check_dry_run, check_positive_int, check_progress
from mnestoma.engines.backend import backend_of
from mnestoma.engines.partitions import under_short_locks
from mnestoma.engines.partman import look
from mnestoma.maintenance.steps import Pause, Read, Steps, Write, for_write
from mnestoma.schema.runner import connection_of
from mnestoma.schema.sql import splitting as sq
from mnestoma.schema.sql.partitions import HAS_PARTITIONS
from mnestoma.schema.sql.splitting import Month

__all__ = [
    "OldPartition",
    "SplitProgress",
    "SplitReport",
    "begin_split",
    "copy_next_batch",
    "drop_split_leftover",
    "months_to_stage",
    "old_partitions",
    "split_steps",
    "swap_split",
    "waiting_history",
]

Bind = Session | Connection
T = TypeVar("T")

# Called as a split goes: (the old partition, batches done, batches in all, rows copied).
SplitProgress = Callable[[str, int, int, int], object]


@dataclass(frozen=True, slots=True)
class OldPartition:
    """A partition of ``events`` that holds rows waiting to be split into months: one in the
    old layout, or the default partition (``events_default``, no range: ``lower`` and
    ``upper`` None). Its name, its range's first month (None: MINVALUE, every event before
    ``upper``) and the month it ends at (excluded), and its rows as the planner estimates
    them from the catalogue (None: no ANALYZE or VACUUM has counted any row of it yet)."""

    name: str
    lower: Month | None
    upper: Month | None
    rows: int | None

    @property
    def is_default(self) -> bool:
        """The default partition: the rows of months no partition covers."""
        return self.upper is None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the bounds as ``YYYY-MM`` (``lower`` None for MINVALUE, both None
        for the default partition)."""
        return {
            "name": self.name,
            "from": None if self.lower is None else _month_text(self.lower),
            "to": None if self.upper is None else _month_text(self.upper),
            "rows": self.rows,
        }


def _month_text(month: Month) -> str:
    return f"{month[0]:04d}-{month[1]:02d}"


@dataclass(frozen=True, slots=True)
class SplitReport:
    """What a split did: the old partitions it rebuilt, the months made in their place,
    the rows its batches copied (those written meanwhile were mirrored by triggers, and
    are not counted); with ``dry_run``, ``waiting`` lists what a run would rebuild and
    nothing was changed. ``partitioned`` is False where events are one table (SQLite):
    there is nothing to split."""

    partitions: tuple[str, ...] = ()
    months: tuple[str, ...] = ()
    copied: int = 0
    batches: int = 0
    dry_run: bool = False
    waiting: tuple[OldPartition, ...] = ()
    partitioned: bool = True

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: every field, ``waiting`` as mappings."""
        return {
            "partitioned": self.partitioned,
            "dry_run": self.dry_run,
            "partitions": list(self.partitions),
            "months": list(self.months),
            "copied": self.copied,
            "batches": self.batches,
            "waiting": [p.as_dict() for p in self.waiting],
        }


@dataclass(frozen=True, slots=True)
class _Staging:
    """The staging table's comment: the old partition, its lowest id, the watermark, and
    the highest id the batches copied so far."""

    old: str
    first: int
    watermark: int
    copied: int

    @property
    def done(self) -> bool:
        return self.copied >= self.watermark

    def batches(self, size: int, rows: int | None) -> tuple[int, int]:
        """About how many batches of ``size`` rows are done and how many there are in all,
        from the partition's ``rows`` as estimated (else its span of ids), in the share of
        its ids copied (a progress line's numbers, not a count)."""
        span = self.watermark - self.first + 1
        total = max(1, math.ceil((rows if rows else span) / size))
        return min(total, total * max(0, self.copied - self.first + 1) // span), total


# --- reads ---------------------------------------------------------------------------------


def old_partitions(bind: Bind, *, exact: bool = True) -> list[OldPartition]:
    """The partitions of ``events`` that wait to be split: those in the old layout that
    hold rows, oldest first, then the default partition if it holds rows (unless pg_partman
    makes the months: its default partition is then pg_partman's). With ``exact``, each one
    asked (one row read at most); else as the catalogue has them (a table with pages; rows
    it has lost since are not known without reading it), but the default partition, asked
    in both cases when it has pages. Empty where events are not partitioned."""
    conn = connection_of(bind)
    if not backend_of(conn).partitioned or not conn.execute(HAS_PARTITIONS).scalar_one():
        return []
    found: list[OldPartition] = []
    for name, lo_y, lo_m, up_y, up_m, aligned, tuples, pages in conn.execute(sq.LEGACY_PARTITIONS):
        name = str(name)
        if not aligned or not sq.is_old_name(name):
            continue  # not a partition the package made: left as it is
        if not (conn.execute(sq.holds_rows(name)).scalar_one() if exact else pages):
            continue
        lower = None if lo_y is None else (int(lo_y), int(lo_m))
        rows = round(tuples) if tuples else None
        found.append(OldPartition(name, lower, (int(up_y), int(up_m)), rows))
    default = _waiting_default(conn)
    if default is not None:
        found.append(default)
    return found


def _waiting_default(conn: Connection) -> OldPartition | None:
    """The default partition of events if it holds rows and is the package's (pg_partman
    does not make the months), else None; its rows estimated from the catalogue. Asked
    whenever it has pages (one row read at most), even for the catalogue's list: rows
    routinely pass through it (the writers' upkeep moves them out), and the pages they
    leave behind, which the catalogue counts until a VACUUM, say nothing of what it holds."""
    facts = conn.execute(sq.DEFAULT_FACTS).first()
    if facts is None or not facts[1]:
        return None
    if not conn.execute(sq.holds_rows(sq.DEFAULT_NAME)).scalar_one() or look(conn).months:
        return None
    return OldPartition(sq.DEFAULT_NAME, None, None, round(facts[0]) if facts[0] else None)


def waiting_history(conn: Connection, *, counted: bool = False) -> list[OldPartition] | None:
    """The partitions of ``events`` that wait to be split (``mnestoma status``; see
    :func:`old_partitions`): from the catalogue, their rows estimated (the default
    partition asked whether it holds a row); with
    ``counted``, each one's rows counted (a status that counts every event: a small store,
    or ``--exact``), those that hold none left out. None where events are not
    partitioned."""
    if not backend_of(conn).partitioned or not conn.execute(HAS_PARTITIONS).scalar_one():
        return None
    found = old_partitions(conn, exact=False)
    if not counted:
        return found
    rows = [(p, int(conn.execute(sq.count_rows(p.name)).scalar_one())) for p in found]
    return [OldPartition(p.name, p.lower, p.upper, n) for p, n in rows if n]


def _staging(conn: Connection) -> _Staging | None:
    """What the staging table stages (None: there is none)."""
    exists, note = conn.execute(sq.STAGING).one()
    if not exists:
        return None
    match = sq.COMMENT.match(note or "")
    if match is None:
        raise SchemaError(
            f"a table {sq.STAGING_NAME} is here but not as split-history leaves it "
            "(no comment of its own): drop it or rename it, then run split-history again"
        )
    return _Staging(
        match["old"], int(match["first"]), int(match["watermark"]), int(match["copied"])
    )


def staging_state(bind: Bind) -> _Staging | None:
    """The split under way, as the staging table's comment says (a read)."""
    return _staging(connection_of(bind))


def _ready(bind: Bind) -> None:
    """The store can split (its month function is there), else SchemaError. A store before
    0015 is refused sooner, as behind head: this guards a function dropped by hand."""
    conn = connection_of(bind)
    if not conn.execute(sq.HAS_MONTH_FUNCTION).scalar_one():
        raise SchemaError(
            "this store has no mnestoma_events_month (revision 0015): run `mnestoma db "
            "upgrade`, then split-history"
        )


def oldest_month(bind: Bind, name: str) -> Month | None:
    """The month of a partition's oldest event (one scan of it: ``ts`` has no index)."""
    year, month = connection_of(bind).execute(sq.oldest_month(name)).one()
    return None if year is None else (int(year), int(month))


def months_to_stage(bind: Bind, old: OldPartition) -> list[Month]:
    """The months to stage for ``old``'s split, oldest first: those its range spans (a
    catch-all's from the month of its oldest event: one scan of it), or for the default
    partition the months of its rows (one scan of it). A row of another month is caught by
    the staging default leaf and given its month at the swap."""
    conn = connection_of(bind)
    if old.upper is None:
        return [(int(y), int(m)) for y, m in conn.execute(sq.DEFAULT_MONTHS)]
    first = old.lower if old.lower is not None else oldest_month(conn, old.name)
    return sq.months_between(first or old.upper, old.upper)


def rows_estimate(bind: Bind, name: str) -> int | None:
    """A partition's rows as the planner estimates them from the catalogue (None: not
    counted yet)."""
    found = connection_of(bind).execute(sq.ROWS_ESTIMATE, {"name": name}).scalar()
    return round(found) if found else None


def leftovers(bind: Bind) -> list[str]:
    """Old partitions a swap detached that are not dropped yet."""
    return [str(n) for n in connection_of(bind).execute(sq.LEFTOVERS).scalars()]


# --- writes ---------------------------------------------------------------------------------


def _retried(conn: Connection, work: Callable[[], T]) -> T:
    """``work`` under :data:`~mnestoma.rules.SPLIT_LOCK_TIMEOUT_S`, tried again while a lock
    it waits for is busy, up to :data:`~mnestoma.rules.SPLIT_TRIES` times (retention's
    :func:`~mnestoma.engines.partitions.under_short_locks`): writers queue behind it for one
    try at most."""
    return under_short_locks(
        conn, work, "split-history", timeout_s=SPLIT_LOCK_TIMEOUT_S, tries=SPLIT_TRIES
    )


def _attached(conn: Connection, name: str) -> bool:
    return bool(conn.execute(sq.IS_ATTACHED, {"name": name}).scalar_one())


def _staged_name(conn: Connection, month: Month) -> str:
    """A staged month's name: its final one, unless a table holds it (the old partition is
    that month): then ``events_split_YYYYMM``, renamed by the swap."""
    final = sq.month_name(month)
    taken = conn.execute(sq.TAKEN, {"names": [final, f"{final}_created", f"{final}_rest"]})
    return sq.month_name(month, sq.TEMP_PREFIX) if taken.scalar_one() else final


def _make_month(conn: Connection, month: Month) -> None:
    """A month of the new layout under the staging table, with the CHECK of its ``_rest``
    leaf."""
    name = _staged_name(conn, month)
    lo, hi = sq.month_start(month), sq.month_start(sq.next_month(month))
    conn.execute(sq.MAKE_MONTH, {"part": name, "lo": lo, "hi": hi})
    conn.execute(sq.rest_bound(name, month))


def _drop_covered(conn: Connection, old: str) -> None:
    """The staged months that a partition of events other than ``old`` covers, dropped
    (module docstring, the default partition): they hold no row, since the staging table
    holds the rows of ``old``, and PostgreSQL keeps none of a partition's range in the
    default partition; SchemaError, nothing dropped, if one does."""
    covered = [str(n) for n in conn.execute(sq.covered_months(old)).scalars()]
    full = [n for n in covered if conn.execute(sq.staged_holds_rows(n)).scalar_one()]
    if full:
        raise SchemaError(
            f"the months {', '.join(full)} staged by split-history hold rows that a partition"
            " of events now covers: not swapped; look at them before running split-history"
            " again"
        )
    for name in covered:
        conn.execute(sq.drop_staged(name))


def begin_split(bind: Bind, old: OldPartition, months: list[Month]) -> _Staging | None:
    """The start of ``old``'s split (module docstring, 1) with ``months`` staged
    (:func:`months_to_stage`), in the caller's transaction; its staging state (a split
    already begun: that one's), or None when ``old`` is no longer a partition of events
    holding rows."""
    conn = for_write(bind)
    with translate_errors():
        conn.execute(sq.SPLIT_LOCK)
        begun = _staging(conn)
        if begun is not None:
            return begun
        if not _attached(conn, old.name):
            return None

        # All of it in one try (a savepoint): a try whose lock was busy gives back every lock
        # it took, the read of the old partition's columns and the staged months' names
        # included, so that a writer's upkeep making a month meanwhile (it locks events and
        # the default partition, and creates a month's tables) never waits on this one.
        def start() -> tuple[int, int] | None:
            conn.execute(sq.create_staging(old.name))
            for definition in conn.execute(sq.EVENTS_INDEXES).scalars():
                conn.execute(sq.staging_index(str(definition)))
            conn.execute(sq.CREATE_STAGING_DEFAULT)
            for month in months:
                _make_month(conn, month)
            conn.execute(sq.MIRROR_FUNCTION)
            conn.execute(sq.lock_old(old.name, "SHARE ROW EXCLUSIVE"))
            lowest, watermark = conn.execute(sq.id_range(old.name)).one()
            if lowest is None:
                return None
            _drop_covered(conn, old.name)  # a month of the default's made since its scan
            for statement in sq.mirror_triggers(old.name):
                conn.execute(statement)
            conn.execute(sq.comment(old.name, lowest, watermark, int(lowest) - 1))
            return int(lowest), int(watermark)

        ids = _retried(conn, start)
        if ids is None:  # emptied meanwhile: nothing to split, nothing kept
            conn.execute(sq.DROP_STAGING)
            return None
        return _Staging(old.name, ids[0], ids[1], ids[0] - 1)


def copy_next_batch(bind: Bind, size: int) -> tuple[_Staging, int] | None:
    """The next batch of the split under way (module docstring, 2), in the caller's
    transaction: the staging state after it and how many rows it copied; None when there
    is no split under way. A split whose copy is done copies nothing."""
    conn = for_write(bind)
    with translate_errors():
        conn.execute(sq.LOCK_STAGING)
        state = _staging(conn)
        if state is None or state.done:
            return None if state is None else (state, 0)

        def batch() -> tuple[int, int]:
            bounds = {"after": state.copied, "watermark": state.watermark, "n": size}
            end, found = conn.execute(sq.batch_end(state.old), bounds).one()
            last = state.watermark if found < size else int(end)
            params = {"first": state.copied + 1, "last": last}
            copied = conn.execute(sq.copy_batch(state.old), params).rowcount
            conn.execute(sq.comment(state.old, state.first, state.watermark, last))
            return last, int(copied)

        last, copied = _retried(conn, batch)
        return _Staging(state.old, state.first, state.watermark, last), copied


def _settle_strays(conn: Connection) -> None:
    """Rows the staging default caught (dated in no month staged) given months of their own
    under the staging table; ``events`` and the old partition are locked."""
    if not conn.execute(sq.STRAYS_LEFT).scalar_one():
        return
    months = [(int(y), int(m)) for y, m in conn.execute(sq.STRAY_MONTHS)]
    for statement in sq.DETACH_STAGING_DEFAULT:
        conn.execute(statement)
    for month in months:
        _make_month(conn, month)
    for statement in sq.MOVE_STRAYS:
        conn.execute(statement)


def _rename_staged(conn: Connection, name: str) -> str:
    """A month staged under ``events_split_YYYYMM`` renamed to its final name, its leaves,
    indexes and CHECKs with it; its final name."""
    if not name.startswith(sq.TEMP_PREFIX):
        return name
    final = "events_" + name.removeprefix(sq.TEMP_PREFIX)
    objects = conn.execute(sq.month_objects(name)).all()

    def renamed(old: str) -> str:
        return "events_" + old.removeprefix(sq.TEMP_PREFIX)

    for kind, _table, obj in objects:
        if kind == "index" and obj.startswith(sq.TEMP_PREFIX):
            conn.execute(sq.rename_index(obj, renamed(obj)))
    for kind, table, obj in objects:
        if kind == "check" and obj.startswith(sq.TEMP_PREFIX):
            conn.execute(sq.rename_check(table, obj, renamed(obj)))
    for kind, _table, obj in objects:
        if kind == "table" and obj != name:
            conn.execute(sq.rename_table(obj, renamed(obj)))
    conn.execute(sq.rename_table(name, final))
    return final


def _detach_old(conn: Connection, old: str) -> None:
    """The old partition detached and renamed ``<name>_dropped``, its indexes with it (so
    that the month that takes its name can have theirs)."""
    gone = sq.dropped_name(old)
    conn.execute(sq.detach_old(old))
    conn.execute(sq.rename_table(old, gone))
    for index in conn.execute(sq.table_indexes(gone)).scalars():
        if index.startswith(f"{old}_"):
            conn.execute(sq.rename_index(index, f"{gone}_{index.removeprefix(f'{old}_')}"))


def swap_split(bind: Bind) -> tuple[str, tuple[str, ...]] | None:
    """The swap (module docstring, 3) of the split under way once its copy is done, in the
    caller's transaction: the old partition and the months attached in its place (for the
    default partition, a new empty one made after). None when there is no split under
    way; a split whose old partition is no longer one of events (retention dropped it
    meanwhile) is given up: its staging table dropped."""
    conn = for_write(bind)
    with translate_errors():
        conn.execute(sq.SPLIT_LOCK)
        state = _staging(conn)
        if state is None:
            return None
        if not _attached(conn, state.old):
            conn.execute(sq.DROP_STAGING)
            return state.old, ()
        if not state.done:
            raise SchemaError(f"the copy of {state.old} is not done: no swap yet")

        def swap() -> tuple[str, ...]:
            conn.execute(sq.LOCK_EVENTS)
            _drop_covered(conn, state.old)  # under retention's partition of everything before
            _settle_strays(conn)
            _detach_old(conn, state.old)
            made: list[str] = []
            for name, lo_y, lo_m, _up_y, _up_m in conn.execute(sq.STAGING_MONTHS).all():
                conn.execute(sq.detach_staged(str(name)))
                final = _rename_staged(conn, str(name))
                conn.execute(sq.attach_month(final, (int(lo_y), int(lo_m))))
                conn.execute(sq.drop_rest_bound(final))
                made.append(final)
            if state.old == sq.DEFAULT_NAME:
                conn.execute(sq.CREATE_DEFAULT)
            conn.execute(sq.DROP_STAGING)
            return tuple(made)

        return state.old, _retried(conn, swap)


def drop_mirror_function(bind: Bind) -> None:
    """The mirror function dropped once no split is under way and no table carries its
    trigger (an old partition retention detached meanwhile carries it until dropped)."""
    conn = for_write(bind)
    with translate_errors():
        conn.execute(sq.SPLIT_LOCK)
        if _staging(conn) is None and not conn.execute(sq.MIRRORS_LEFT).scalar_one():
            conn.execute(sq.DROP_MIRROR_FUNCTION)


def drop_split_leftover(bind: Bind, name: str) -> None:
    """Drop an old partition a swap detached (its space goes back to the system), and the
    mirror function once no table carries its trigger; in the caller's transaction."""
    conn = for_write(bind)
    with translate_errors():
        conn.execute(sq.SPLIT_LOCK)
        conn.execute(sq.drop_leftover(name))
        if not conn.execute(sq.MIRRORS_LEFT).scalar_one():
            conn.execute(sq.DROP_MIRROR_FUNCTION)


# --- the operation, both doors' -------------------------------------------------------------


def split_steps(
    *, batch_rows: object = None, dry_run: object = False, progress: object = None, dialect: str
) -> Steps[SplitReport]:
    """A facade's ``split_history``: its arguments checked now, before anything is read,
    and its steps. ``progress(partition, done, total, copied)`` once a partition's batches
    are known (done 0), then after each."""
    dry = check_dry_run(dry_run)
    report = check_progress(progress, "partition, done, total, copied")
    size = SPLIT_BATCH_ROWS if batch_rows is None else check_positive_int(batch_rows, "batch_rows")
    if not backend_of(dialect).partitioned:
        return _nothing()
    if dry:
        return _waiting()
    return _split(size, report)


def _nothing() -> Steps[SplitReport]:
    return SplitReport(partitioned=False)
    yield  # pragma: no cover - a generator with no step


def _waiting() -> Steps[SplitReport]:
    waiting: list[OldPartition] = yield Read(old_partitions)
    partitioned: bool = yield Read(_partitioned)
    return SplitReport(
        partitions=tuple(p.name for p in waiting),
        dry_run=True,
        waiting=tuple(waiting),
        partitioned=partitioned,
    )


def _partitioned(bind: Bind) -> bool:
    return bool(connection_of(bind).execute(HAS_PARTITIONS).scalar_one())


def _split(size: int, report: SplitProgress | None) -> Steps[SplitReport]:
    if not (yield Read(_partitioned)):
        return SplitReport(partitioned=False)
    yield Read(_ready)
    for name in (yield Read(leftovers)):
        yield Write(functools.partial(drop_split_leftover, name=name))
    seen: list[str] = []  # looked at by this run: rebuilt, or found empty or gone
    rebuilt: list[str] = []
    months: list[str] = []
    copied = batches = 0
    while True:
        state: _Staging | None = yield Read(staging_state)
        if state is None:
            waiting: list[OldPartition] = yield Read(old_partitions)
            todo = [p for p in waiting if p.name not in seen]
            if not todo:
                break
            old = todo[0]
            staged = yield Read(functools.partial(months_to_stage, old=old))
            state = yield Write(functools.partial(begin_split, old=old, months=staged))
            if state is None:
                seen.append(old.name)
                continue
        rows = yield Read(functools.partial(rows_estimate, name=state.old))
        done, total = state.batches(size, rows)
        if report is not None:
            report(state.old, done, total, 0)
        moved = 0
        while not state.done:
            if moved or done:
                yield Pause(SPLIT_PAUSE_S)
            step: tuple[_Staging, int] | None = yield Write(
                functools.partial(copy_next_batch, size=size)
            )
            if step is None:
                break
            state, n = step
            moved += n
            batches += 1
            done += 1
            total = done if state.done else max(total, done + 1)
            if report is not None:
                report(state.old, done, total, moved)
        copied += moved
        swapped: tuple[str, tuple[str, ...]] | None = yield Write(swap_split)
        if swapped is None:
            continue
        old_name, made = swapped
        seen.append(old_name)
        if made:
            rebuilt.append(old_name)
            months.extend(made)
        for name in (yield Read(leftovers)):
            yield Write(functools.partial(drop_split_leftover, name=name))
    if seen:
        yield Write(drop_mirror_function)
    return SplitReport(
        partitions=tuple(rebuilt), months=tuple(months), copied=copied, batches=batches
    )
