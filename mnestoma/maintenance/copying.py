"""Copy a whole store between databases (SQLite ↔ PostgreSQL), ids kept, verified.

The target is migrated to head and filled inside one transaction; before it commits, its
content is read back and compared with what it must now hold (row counts and a checksum).
Any difference rolls everything back, so a failed copy leaves the target as it was; a SQLite
target file that the copy itself created is removed (with its -wal and -shm). On PostgreSQL
the month of each event is made (``mnestoma_events_partitions``, in the copy's transaction:
a month of the new layout) before the event is inserted, so that none lands in the default
partition and a copy into a new store leaves nothing to split; only a store that still has
plain partitions of the old layout (a catch-all ``events_to_YYYYMM``, a month written to
before revision 0015) takes the events of their ranges there, for ``mnestoma split-history``
to rebuild.

With ``append`` the target may already hold rows. Integer ids (events, query log, ager runs)
are shifted past the target's largest; mnest ids, random tokens, are kept, and one known to
both stores is refused (the stores share rows: one was copied from the other). A store knows
the ids of its rows and those its events name: a row merged into another keeps its events
(the merged event at least), so a source appended once, all its rows merged away, is still
known to the target and refused the second time. Retention deletes those events, so each
store also has an identity (``mnestoma_store``) and a record of the stores whose rows it
holds (``mnestoma_copied_stores``: the source of each copy, and the stores its own record
named, through it), which retention never touches: an append is refused when the source is
the target, when either's record names the other, or when both name a third. An edge key
held by both stores (src_executor, src_version, dst_executor, dst_version, state; NULL-safe)
is merged into the target's row with the ager's rule (contract §4):

- uses summed, except that a passing both stores counted on this edge (same turn_id and
  occurrence) counts once; ts_first = the earlier, ts_last = the later; decayed_uses: each
  row's decayed to that ts_last and summed (``rules.merged_count``), less the share of the
  passings counted once;
- weight = the larger of the two effective weights at the copy's now, ts_weight = now (the
  target's, if later); decay_lambda, tags and desired_sig: the target's (tags and
  desired_sig: the source's where the target's is null);
- every event of both is kept; the source row's events move to the target row (so that a
  turn of either store repeated on the merged edge is a no-op), except a created/reinforced
  event of a (turn, occurrence) the target row already counted: it stays, unchanged, on the
  source row's id, and uses counts that passing once;
- two ``merged`` events at now, as the ager writes a demotion merge (weight_before: that
  row's effective weight, weight_after: the merged weight; state_after: the surviving row's
  state): on the target row, which absorbs (related_id = the source row's id, its state
  unchanged), and on the source row's id, which is absorbed (related_id = the target row's,
  state_before NULL: the row was not in this store before). The absorbed side is the one
  whose state changes, in the ager's merge (active to decaying) as in the copy's.

The planner's chains (``mnest_chains``, keyed by executor names) are copied as they are; a
chain both stores hold becomes the target's, with the rule of the edges' counts: its
``decayed_uses`` each decayed to the later ``ts_last`` and summed (``rules.merged_count``
with ``CHAIN_DECAY_LAMBDA``), ``uses`` summed, ``ts_first`` the earlier, ``ts_last`` the
later. A turn both stores counted adds to a chain twice: a turn's events keep no order
within it, so which chains a shared turn passed cannot be told from them. The record of
copies (``mnestoma_copied_stores``) names the rows of its four tables, not the chains; the
report's ``rows`` counts them (``mnest_chains``) and ``chains_merged`` the merged ones.

The checksum is order-independent (the sum of one SHA-256 per row, modulo 2**256): the two
engines sort text ids by different collations, and this way neither side has to sort.
Rows are canonicalised first: floats to 12 significant digits, times to ISO-8601 UTC, JSON
with sorted keys and its numbers as floats (PostgreSQL's JSONB gives 1e16 back as an
integer and -0.0 as 0.0), written without recursion so that any depth a driver returns can
be digested.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import Connection, Engine, RowMapping, Select, Table, inspect
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError

from mnestoma.core.clock import Clock
from mnestoma.core.errors import (
    ConflictError,
    CopyVerificationError,
    InvalidInput,
    SchemaError,
    StoreError,
    StoresShareRows,
    TargetNotEmpty,
    translate_errors,
)
from mnestoma.core.rules import (
    CHAIN_DECAY_LAMBDA,
    MAX_JSON_DEPTH,
    PASSING,
    SUMMED_ON_MERGE,
    EventKind,
    Recorder,
    advance,
    clamp_weight,
    decayed_count,
    decayed_weight,
    merged_count,
    new_store_id,
    outcome_counts,
)
from mnestoma.core.settings import Settings, settings_of
from mnestoma.core.timefmt import iso_utc
from mnestoma.core.types import INSTANTS_END, JSONDocument
from mnestoma.engines import (
    backend_of,
    is_memory_sqlite,
    make_engine,
    partman,
    redact_url,
    resolve_database_url,
)
from mnestoma.engines.partitions import month_start
from mnestoma.maintenance.migration import (
    current_revision,
    head_revision,
    known_revisions,
    missing_sqlite_file,
    upgrade,
)
from mnestoma.schema.sql.chains import CHAIN_KEY
from mnestoma.schema.sql.copying import (
    CHAIN_MERGED_COLUMNS,
    KEY,
    KEYS,
    KNOWN_MNEST_IDS,
    MERGE_CHAIN_INTO_TARGET,
    MERGE_INTO_TARGET,
    MERGED_COLUMNS,
    MNESTS_BY_ID,
    PROTO_KEY,
    STORES,
    TABLES,
    statements,
)
from mnestoma.schema.sql.partitions import ENSURE_PARTITIONS, HAS_PARTITIONS
from mnestoma.schema.sql.tables import AGER_RUNS, CHAINS, EVENTS, MNESTS, QUERIES, EventRow

__all__ = [
    "CHUNK_SIZE",
    "CopyReport",
    "CopyVerificationError",
    "StoresShareRows",
    "TargetNotEmpty",
    "copy_store",
    "table_checksum",
]

CHUNK_SIZE = 5_000
# Keys per ``IN (...)`` lookup in the target: far below every engine's parameter limit.
LOOKUP_BATCH = 500
MODULUS = 2**256

Progress = Callable[[int], AbstractContextManager[Callable[[int], Any]]]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CopyReport:
    """What was copied: source rows per table, the verified checksums, what was merged."""

    source: str
    target: str
    rows: dict[str, int]
    checksums: dict[str, str]
    appended: bool
    id_offsets: dict[str, int]
    merged: int = 0  # source mnests merged into a target row with the same edge key
    turns_counted_once: int = 0  # turns both stores counted on a merged edge
    source_store: str = ""  # the source's identity (mnestoma_store), now on the target's record
    target_store: str = ""  # the target's identity
    chains_merged: int = 0  # source chains merged into the target's chain with the same key

    @property
    def total(self) -> int:
        """Rows read from the source, all tables together."""
        return sum(self.rows.values())


class _Raw(str):
    """Text already in canonical JSON form (a bracket, a key, a separator)."""

    __slots__ = ()


def _json_number(value: int | float) -> str:
    try:
        return format(float(value) + 0.0, ".12g")  # + 0.0: JSONB has no negative zero
    except OverflowError:  # an integer beyond any float: both engines return it as an int
        return str(value)


def _json_text(value: Any) -> str:
    """Canonical text of a JSON value: sorted keys, numbers as floats to 12 digits.

    Iterative, so that a value nested deeper than Python's recursion limit digests too.
    """
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Raw):
            out.append(item)
        elif isinstance(item, str):
            out.append(json.dumps(item, ensure_ascii=False))
        elif item is None or isinstance(item, bool):
            out.append(json.dumps(item))
        elif isinstance(item, int | float):
            out.append(_json_number(item))
        elif isinstance(item, dict):
            parts: list[Any] = [_Raw("{")]
            for i, key in enumerate(sorted(item)):
                prefix = "," if i else ""
                parts += [_Raw(prefix + json.dumps(str(key), ensure_ascii=False) + ":"), item[key]]
            parts.append(_Raw("}"))
            stack.extend(reversed(parts))
        elif isinstance(item, list | tuple):
            parts = [_Raw("[")]
            for i, child in enumerate(item):
                parts += [_Raw(","), child] if i else [child]
            parts.append(_Raw("]"))
            stack.extend(reversed(parts))
        else:
            out.append(json.dumps(str(item), ensure_ascii=False))
    return "".join(out)


def _canonical(value: Any) -> Any:
    """A JSON-ready form of a plain column value that two engines agree on."""
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        return {"f": format(value, ".12g")}
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return {"t": aware.astimezone(UTC).isoformat()}
    return {"x": str(value)}


class _Digest:
    """An order-independent multiset hash of one table's rows: count and sum of SHA-256."""

    def __init__(self, table: Table) -> None:
        self.table = table.name
        self.columns = [c.key for c in table.columns]
        self.json_columns = frozenset(
            c.key for c in table.columns if isinstance(c.type, JSONDocument)
        )
        self.count = 0
        self.total = 0

    def _hash(self, row: Any) -> int:
        values = [
            {"j": _json_text(row[c])}
            if c in self.json_columns and row[c] is not None
            # a JSON column holding None reads back as SQL NULL on both engines
            else _canonical(row[c])
            for c in self.columns
        ]
        payload = json.dumps(
            [self.table, values], sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        return int(hashlib.sha256(payload.encode()).hexdigest(), 16)

    def add(self, row: Any) -> None:
        self.count += 1
        self.total = (self.total + self._hash(row)) % MODULUS

    def remove(self, row: Any) -> None:
        self.count -= 1
        self.total = (self.total - self._hash(row)) % MODULUS

    @property
    def hexdigest(self) -> str:
        return f"{self.total:064x}"


def table_checksum(conn: Connection, table: Table, *, id_above: int | None = None) -> str:
    """The checksum of a table's content (optionally only the rows with ``id > id_above``;
    InvalidInput for a table without an integer id)."""
    return _table_digest(conn, table, id_above=id_above).hexdigest


def _table_digest(conn: Connection, table: Table, *, id_above: int | None = None) -> _Digest:
    digest = _Digest(table)
    of = statements(table)
    stmt, params = of.rows, {}
    if id_above is not None:
        if of.rows_above is None:
            raise InvalidInput(f"{table.name} has no integer id to count rows above")
        stmt, params = of.rows_above, {"id_above": id_above}
    result = conn.execute(stmt, params, execution_options={"yield_per": CHUNK_SIZE})
    for part in result.mappings().partitions():
        for row in part:
            digest.add(row)
    return digest


def _batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@contextmanager
def _no_progress(total: int) -> Iterator[Callable[[int], None]]:
    yield lambda n: None


def _same_database(a: URL, b: URL) -> bool:
    backend = backend_of(a)
    return backend is backend_of(b) and backend.same_database(a, b)


@dataclass(frozen=True, slots=True)
class _NewFile:
    """A SQLite target the copy creates: the file and the folders above it made with it."""

    path: Path
    folders: tuple[Path, ...]  # deepest first

    @classmethod
    def of(cls, url: URL) -> _NewFile | None:
        missing = missing_sqlite_file(url)
        if missing is None:
            return None
        path = missing.absolute()
        folders: list[Path] = []
        parent = path.parent
        while not parent.exists() and parent != parent.parent:
            folders.append(parent)
            parent = parent.parent
        return cls(path, tuple(folders))

    def remove(self) -> None:
        """Remove what the copy created; never masks the error that made the copy fail."""
        for suffix in ("", "-wal", "-shm", "-journal"):
            with suppress(OSError):
                self.path.with_name(self.path.name + suffix).unlink(missing_ok=True)
        for folder in self.folders:
            try:
                folder.rmdir()
            except OSError:
                break


def _check_revision(role: str, url: URL, revision: str | None, *, at_head: bool) -> None:
    """A revision this release does not know is fixed by a newer package, not a migration."""
    if revision is not None and revision not in known_revisions():
        raise SchemaError(
            f"the {role} {redact_url(url)} is at revision {revision}, unknown to this version "
            "of mnestoma (written by a newer release?): upgrade the mnestoma package"
        )
    head = head_revision()
    if at_head and revision != head:
        raise SchemaError(
            f"the {role} {redact_url(url)} is at revision {revision or 'none'}, "
            f"not head {head}: run `mnestoma db upgrade` on it first"
        )


def copy_store(
    source: str | URL | None,
    target: str | URL,
    *,
    append: bool = False,
    chunk_size: int = CHUNK_SIZE,
    progress: Progress | None = None,
    clock: Clock | None = None,
    recorder: str = Recorder.CALL.value,
) -> CopyReport:
    """Copy every mnest, event, logged query and ager run from ``source`` to ``target``.

    The target is migrated to head first and must hold no rows unless ``append``; with
    ``append``, integer ids are shifted past the target's and an edge both stores hold is
    merged (module docstring; the merge events are at ``clock()`` and carry ``recorder``).
    Raises :class:`TargetNotEmpty`, :class:`StoresShareRows`, :class:`SchemaError` (source
    not at head, or either side at a revision newer than this package) or
    :class:`CopyVerificationError`; on any error the target is left as it was.
    """
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise InvalidInput("chunk_size must be a positive integer")
    settings = settings_of(clock=clock, recorder=recorder)  # checked before anything opens
    src_url = resolve_database_url(source)
    dst_url = resolve_database_url(target)
    if _same_database(src_url, dst_url):
        raise InvalidInput("the source and the target are the same database")
    for role, url in (("source", src_url), ("target", dst_url)):
        if is_memory_sqlite(url):  # however it is spelled: a copy there is gone at close
            raise InvalidInput(f"the {role} is an in-memory SQLite database: use a file")
    missing = missing_sqlite_file(src_url)
    if missing is not None:
        raise InvalidInput(f"no source database at {missing}")
    new_file = _NewFile.of(dst_url)
    src_engine = make_engine(src_url)
    dst_engine = make_engine(dst_url)
    try:
        _check_revision("source", src_url, current_revision(src_engine), at_head=True)
        if new_file is None:
            _check_revision("target", dst_url, current_revision(dst_engine), at_head=False)
        job = _Job(append, chunk_size, progress or _no_progress, settings)
        try:
            with translate_errors():
                job.source_store = _source_identity(src_engine)
                return job.run(src_engine, dst_engine)
        except ConflictError as err:
            if isinstance(err.__cause__, IntegrityError):
                raise ConflictError(f"{err}: nothing was copied") from err
            raise
        except RecursionError:
            raise StoreError(
                "a tags or desired_sig value is nested too deeply to read (stores written "
                f"by this release hold at most {MAX_JSON_DEPTH} levels): nothing was copied"
            ) from None
    except BaseException:
        src_engine.dispose()
        dst_engine.dispose()
        if new_file is not None:
            new_file.remove()
        raise
    finally:
        src_engine.dispose()
        dst_engine.dispose()


def _source_reader(engine: Engine) -> Engine:
    """One consistent snapshot of the source across its tables."""
    return backend_of(engine).snapshot_reader(engine)


def _find_keys(
    conn: Connection, query: Select[Any], keys: Sequence[tuple[Any, ...]]
) -> list[tuple[Any, ...]]:
    """The rows of ``query`` (one of :data:`KEYS`' joins) for these keys (one batch)."""
    conn.execute(KEYS.clear)
    conn.execute(KEYS.fill, [{f"k{i}": v for i, v in enumerate(k)} for k in keys])
    return [tuple(row) for row in conn.execute(query)]


@dataclass
class _Job:
    """One copy: its settings, and what the target must hold when it is done."""

    append: bool
    chunk_size: int
    progress: Progress
    settings: Settings
    expected: dict[str, _Digest] = field(default_factory=dict)
    offsets: dict[str, int] = field(default_factory=dict)
    pairs: dict[str, str] = field(default_factory=dict)  # source mnest id -> target mnest id
    # (target mnest id, counter of SUMMED_ON_MERGE) -> what the source's passings of turns
    # the target already counted added to that counter: those passings count once
    counted_once: Counter[tuple[str, str]] = field(default_factory=Counter)
    # target mnest id -> the instants of those passings (their share of decayed_uses)
    counted_once_at: dict[str, list[datetime]] = field(default_factory=dict)
    now: datetime = field(init=False)  # read once the target's write lock is held
    next_event_id: int = field(init=False)  # the merge events' ids, after the copied ones
    advance: Callable[[int], Any] = field(init=False)
    keys_created: bool = False  # the temporary key table, created when the copy merges
    source_store: str = ""  # the source's identity, read (or given) before the copy begins
    target_store: str = field(init=False)  # the target's, read in the copy's transaction
    chains_merged: int = 0  # source chains merged into a target chain of the same key
    months: bool = False  # PostgreSQL, events partitioned: each event's month made first
    months_made: set[datetime] = field(default_factory=set)

    def run(self, src_engine: Engine, dst_engine: Engine) -> CopyReport:
        with _source_reader(src_engine).connect() as sconn, dst_engine.connect() as tconn:
            with tconn.begin():
                # SQLite's write lock from the start: what the copy reads in the target
                # (emptiness, largest ids, the keys it merges into) holds until it commits.
                backend_of(tconn).take_write_lock(tconn)
                upgrade(tconn)  # inside the copy's transaction: a failed copy migrates nothing
                before = self._target_counts(tconn)
                if not self.append and any(before.values()):
                    held = ", ".join(f"{n} {name}" for name, n in before.items() if n)
                    raise TargetNotEmpty(
                        f"the target {redact_url(dst_engine.url)} is not empty ({held}): "
                        "use --append to add to it"
                    )
                backend_of(tconn).lock_copy_target(tconn)
                # the months are made here unless pg_partman makes them (contract §12)
                self.months = (
                    backend_of(tconn).partitioned
                    and bool(tconn.execute(HAS_PARTITIONS).scalar_one())
                    and not partman.look(tconn).months
                )
                self.target_store = _store_identity(tconn)
                taken = _records(sconn)  # the stores whose rows the source took
                if any(before.values()):
                    _refuse_known_stores(self.source_store, taken, self.target_store, tconn)
                else:  # a store that holds no row holds no other store's
                    tconn.execute(STORES.forget)
                if before[MNESTS.name] or before[EVENTS.name]:
                    self._create_keys(tconn)
                    _refuse_shared_rows(sconn, tconn)
                self.now = self.settings.now()
                counts = {
                    t.name: int(sconn.execute(statements(t).count).scalar_one()) for t, _ in TABLES
                }
                for table, int_id in TABLES:
                    name = table.name
                    filled = before[name] > 0
                    self.offsets[name] = _max_id(tconn, table) if (filled and int_id) else 0
                    self.expected[name] = _table_digest(tconn, table) if filled else _Digest(table)
                self.next_event_id = self.offsets[EVENTS.name] + _max_id(sconn, EVENTS) + 1
                with self.progress(sum(counts.values())) as advance:
                    self.advance = advance
                    self._copy_mnests(sconn, tconn, merging=before[MNESTS.name] > 0)
                    self._copy_events(sconn, tconn)
                    self._merge(sconn, tconn)
                    for table in (QUERIES, AGER_RUNS):
                        for rows in self._stream(sconn, table):
                            self._insert(tconn, table, rows)
                    self._copy_chains(sconn, tconn, merging=before[CHAINS.name] > 0)
                if self.keys_created:
                    KEYS.table.drop(tconn)
                backend_of(tconn).after_copy(tconn)
                self._verify(tconn)
                self._record(tconn, counts, taken)
            sconn.rollback()
        return CopyReport(
            source=redact_url(src_engine.url),
            target=redact_url(dst_engine.url),
            rows=counts,
            checksums={name: d.hexdigest for name, d in self.expected.items()},
            appended=self.append,
            id_offsets={k: v for k, v in self.offsets.items() if v},
            merged=len(self.pairs),
            turns_counted_once=sum(n for (_, c), n in self.counted_once.items() if c == "uses"),
            source_store=self.source_store,
            target_store=self.target_store,
            chains_merged=self.chains_merged,
        )

    # --- streaming ---------------------------------------------------------------------

    def _stream(self, sconn: Connection, table: Table) -> Iterator[list[dict[str, Any]]]:
        """The source table in chunks, integer ids shifted past the target's."""
        offset = self.offsets[table.name]
        result = sconn.execute(
            statements(table).in_id_order, execution_options={"yield_per": self.chunk_size}
        )
        for part in result.mappings().partitions():
            rows = [dict(r) for r in part]
            if offset:
                for row in rows:
                    row["id"] += offset
            yield rows

    def _insert(
        self,
        tconn: Connection,
        table: Table,
        rows: list[dict[str, Any]],
        *,
        source: bool = True,
    ) -> None:
        if not rows:
            return
        digest = self.expected[table.name]
        for row in rows:
            digest.add(row)
        if table is EVENTS and self.months:
            self._make_months(tconn, rows)
        tconn.execute(statements(table).insert, rows)
        if source:
            self.advance(len(rows))

    def _make_months(self, tconn: Connection, rows: list[dict[str, Any]]) -> None:
        """PostgreSQL: the month of each of these events made before they are inserted
        (``mnestoma_events_partitions``, in the copy's transaction), so that none lands in
        the default partition; a month a partition already covers is left as it is."""
        wanted = {month_start(row["ts"]) for row in rows} - self.months_made
        for month in sorted(wanted):
            tconn.execute(ENSURE_PARTITIONS, {"at": month, "ahead": 0, "cap": INSTANTS_END})
        self.months_made |= wanted

    # --- mnests, and the target rows they merge into -----------------------------------

    def _copy_mnests(self, sconn: Connection, tconn: Connection, *, merging: bool) -> None:
        for rows in self._stream(sconn, MNESTS):
            twins = self._twins(tconn, rows) if merging else {}
            self._insert(tconn, MNESTS, [r for r in rows if r["id"] not in twins])
            self.pairs.update(twins)

    def _twins(self, tconn: Connection, rows: list[dict[str, Any]]) -> dict[str, str]:
        """Source id -> id of the target row with the same edge key, for these rows."""
        found: dict[str, str] = {}
        for names, versioned in ((KEY, True), (PROTO_KEY, False)):
            wanted = {
                tuple(r[c] for c in names): r["id"]
                for r in rows
                if (r["dst_version"] is not None) is versioned
            }
            self._create_keys(tconn)
            query = KEYS.twins if versioned else KEYS.proto_twins
            for batch in _batches(list(wanted), LOOKUP_BATCH):
                for target_id, *key in _find_keys(tconn, query, batch):
                    found[wanted[tuple(key)]] = target_id
        return found

    def _create_keys(self, tconn: Connection) -> None:
        if not self.keys_created:
            KEYS.table.create(tconn)
            self.keys_created = True

    # --- events --------------------------------------------------------------------------

    def _copy_events(self, sconn: Connection, tconn: Connection) -> None:
        for rows in self._stream(sconn, EVENTS):
            if self.pairs:
                self._repoint(tconn, rows)
            self._insert(tconn, EVENTS, rows)

    def _repoint(self, tconn: Connection, rows: list[dict[str, Any]]) -> None:
        """Move merged rows' events to their target row, but for the passings (turn and
        occurrence) the target row already counted: those stay on the source row's id, and
        count once."""
        turns = [
            r
            for r in rows
            if r["mnest_id"] in self.pairs and r["turn_id"] is not None and r["kind"] in PASSING
        ]
        taken: set[tuple[str, str, int]] = set()
        if turns:
            self._create_keys(tconn)
            wanted = [
                (r["turn_id"], self.pairs[r["mnest_id"]], str(r["occurrence"])) for r in turns
            ]
            for batch in _batches(wanted, LOOKUP_BATCH):
                found = _find_keys(tconn, KEYS.turns, batch)
                taken.update((turn, mnest, int(nth)) for turn, mnest, nth in found)
        for row in rows:
            target_id = self.pairs.get(row["mnest_id"])
            if target_id is None:
                continue
            if row["kind"] in PASSING and (row["turn_id"], target_id, row["occurrence"]) in taken:
                # one use, and the outcome it carried (SUMMED_ON_MERGE: uses, ok_count, error_count)
                added = zip(SUMMED_ON_MERGE, (1, *outcome_counts(row["outcome"])), strict=True)
                self.counted_once.update({(target_id, c): n for c, n in added})
                self.counted_once_at.setdefault(target_id, []).append(row["ts"])
                continue
            row["mnest_id"] = target_id

    # --- merges --------------------------------------------------------------------------

    def _merge(self, sconn: Connection, tconn: Connection) -> None:
        if not self.pairs:
            return
        pairs = list(self.pairs.items())
        for batch in _batches(pairs, min(self.chunk_size, LOOKUP_BATCH)):
            sources = _rows_by_id(sconn, [s for s, _ in batch])
            targets = _rows_by_id(tconn, [t for _, t in batch])
            changes: list[dict[str, Any]] = []
            events: list[dict[str, Any]] = []
            for source_id, target_id in batch:
                src, dst = sources[source_id], targets[target_id]
                merged, eff_src, eff_dst = self._merged(dst, src)
                self.expected[MNESTS.name].remove(dst)
                self.expected[MNESTS.name].add(merged)
                changes.append({"b_id": target_id} | {f"b_{c}": merged[c] for c in MERGED_COLUMNS})
                weight = merged["weight"]
                events.append(self._merged_event(target_id, source_id, eff_dst, weight, dst))
                events.append(self._merged_event(source_id, target_id, eff_src, weight, src))
            tconn.execute(MERGE_INTO_TARGET, changes)
            self._insert(tconn, EVENTS, events, source=False)
            self.advance(len(batch))

    def _merged(self, dst: RowMapping, src: RowMapping) -> tuple[dict[str, Any], float, float]:
        """The target row after absorbing the source row, and the two effective weights."""
        now = self.now
        eff_dst = decayed_weight(dst["weight"], dst["decay_lambda"], dst["ts_weight"], now)
        eff_src = decayed_weight(src["weight"], src["decay_lambda"], src["ts_weight"], now)
        # Summed (rules.SUMMED_ON_MERGE), but for the passings of turns both stores counted:
        # those count once, with the target's outcome.
        once = self.counted_once
        sig = dst["desired_sig"] if dst["desired_sig"] is not None else src["desired_sig"]
        merged = dict(dst)
        merged.update({c: dst[c] + src[c] - once[(dst["id"], c)] for c in SUMMED_ON_MERGE})
        # a passing is never counted less often than either store counted it
        merged["uses"] = max(merged["uses"], dst["uses"], src["uses"])
        # the decayed counts summed at the later ts_last (rules.merged_count), less what the
        # passings counted once added to the source's, and never below either's
        dst_count = (dst["decayed_uses"], dst["decay_lambda"], dst["ts_last"])
        src_count = (src["decayed_uses"], src["decay_lambda"], src["ts_last"])
        count, last = merged_count(dst_count, src_count)
        for ts in self.counted_once_at.get(dst["id"], ()):
            count -= decayed_count(1.0, src["decay_lambda"], ts, last)
        both = (decayed_count(*c, last) for c in (dst_count, src_count))
        merged.update(
            decayed_uses=max(count, *both),
            ts_first=min(dst["ts_first"], src["ts_first"]),
            ts_last=last,
            weight=clamp_weight(max(eff_dst, eff_src)),
            ts_weight=advance(dst["ts_weight"], now),
            tags=dst["tags"] if dst["tags"] is not None else src["tags"],
            desired_sig=sig,
        )
        return merged, eff_src, eff_dst

    def _merged_event(
        self, mnest_id: str, related_id: str, before: float, after: float, row: RowMapping
    ) -> dict[str, Any]:
        """A ``merged`` event: the source row's says it was absorbed (it was not in this store
        before: no state before), the target row's that it absorbed (its state unchanged)."""
        event_id = self.next_event_id
        self.next_event_id += 1
        absorbed = mnest_id in self.pairs
        reason = (
            f"copy: merged into the target's row {related_id} (same edge key)"
            if absorbed
            else f"copy: absorbed the source's row {related_id} (same edge key)"
        )
        event = EventRow(
            mnest_id=mnest_id,
            kind=EventKind.MERGED.value,
            ts=self.now,
            weight_before=before,
            weight_after=after,
            state_before=None if absorbed else row["state"],
            state_after=row["state"],
            reason=reason,
            related_id=related_id,
            recorder=self.settings.recorder,
        )
        return {"id": event_id, **event.as_dict()}

    # --- the planner's chains ----------------------------------------------------------

    def _copy_chains(self, sconn: Connection, tconn: Connection, *, merging: bool) -> None:
        """The source's chains, in key order: inserted, or (``merging``, into a target that
        holds chains) merged into the target's chain of the same key (module docstring)."""
        for rows in self._stream(sconn, CHAINS):
            held = self._held_chains(tconn, rows) if merging else {}
            self._insert(tconn, CHAINS, [r for r in rows if _chain_key(r) not in held])
            merged = [(held[_chain_key(r)], r) for r in rows if _chain_key(r) in held]
            if not merged:
                continue
            digest = self.expected[CHAINS.name]
            changes: list[dict[str, Any]] = []
            for dst, src in merged:
                after = _merged_chain(dst, src)
                digest.remove(dst)
                digest.add(after)
                changes.append({f"b_{c}": after[c] for c in (*CHAIN_KEY, *CHAIN_MERGED_COLUMNS)})
            tconn.execute(MERGE_CHAIN_INTO_TARGET, changes)
            self.chains_merged += len(merged)
            self.advance(len(merged))

    def _held_chains(
        self, tconn: Connection, rows: list[dict[str, Any]]
    ) -> dict[tuple[str, str, str], RowMapping]:
        """The target's chains with the keys of these source chains, by key."""
        self._create_keys(tconn)
        found: dict[tuple[str, str, str], RowMapping] = {}
        for batch in _batches([_chain_key(r) for r in rows], LOOKUP_BATCH):
            tconn.execute(KEYS.clear)
            tconn.execute(KEYS.fill, [{f"k{i}": v for i, v in enumerate(k)} for k in batch])
            for row in tconn.execute(KEYS.chains).mappings():
                found[_chain_key(row)] = row
        return found

    # --- end ---------------------------------------------------------------------------

    def _record(self, tconn: Connection, counts: dict[str, int], taken: list[_Taken]) -> None:
        """The target's record of the stores whose rows it now holds: the source, with the
        rows this copy took, and each store the source had taken rows of, through it."""
        straight = _Taken(
            store_id=self.source_store,
            via_store_id=None,
            copied_at=self.now,
            mnests=counts[MNESTS.name],
            events=counts[EVENTS.name],
            queries=counts[QUERIES.name],
            ager_runs=counts[AGER_RUNS.name],
        )
        through = [
            t._replace(via_store_id=self.source_store, copied_at=self.now)
            for t in taken
            if t.store_id != self.target_store  # the target's own rows, copied back
        ]
        tconn.execute(STORES.record, [t._asdict() for t in [straight, *through]])

    def _target_counts(self, conn: Connection) -> dict[str, int]:
        tables = set(inspect(conn).get_table_names())
        return {
            t.name: int(conn.execute(statements(t).count).scalar_one()) if t.name in tables else 0
            for t, _ in TABLES
        }

    def _verify(self, tconn: Connection) -> None:
        """Read the target back; any difference raises (and rolls the transaction back)."""
        for table, _ in TABLES:
            name = table.name
            after = _table_digest(tconn, table)
            expected = self.expected[name]
            if after.count != expected.count or after.total != expected.total:
                raise CopyVerificationError(
                    f"verification failed on {name}: the target holds {after.count} rows, "
                    f"{expected.count} expected, or their content differs; nothing was copied"
                )


def _refuse_shared_rows(sconn: Connection, tconn: Connection) -> None:
    """Raise :class:`StoresShareRows` when a mnest id the source knows (a row, or an id its
    events name) is known to the target too: one store holds what was copied from the
    other, maybe merged away since (its merged event keeps its id), and appending would
    count those passings twice. Read before anything is written: every id the source knows
    goes into the temporary key table, then two joins look them up in the target."""
    tconn.execute(KEYS.clear)
    known = sconn.execute(KNOWN_MNEST_IDS, execution_options={"yield_per": CHUNK_SIZE})
    for part in known.scalars().partitions():
        tconn.execute(KEYS.fill, [{"k0": mnest_id} for mnest_id in part])
    for query in (KEYS.shared_rows, KEYS.shared_events):
        shared = tconn.execute(query).scalar()
        if shared is not None:
            raise StoresShareRows(
                f"mnest {shared} is in both stores, as a row or in the events of a row "
                "merged into another: they share rows (was one copied from the other?), "
                "and appending would count their passings twice; nothing was copied"
            )
    tconn.execute(KEYS.clear)


# --- the stores' identities, and the record of what each copy took ------------------------


class _Taken(NamedTuple):
    """One row of ``mnestoma_copied_stores``: a store whose rows a store holds."""

    store_id: str
    via_store_id: str | None
    copied_at: datetime
    mnests: int
    events: int
    queries: int
    ager_runs: int


def _records(conn: Connection) -> list[_Taken]:
    """The stores whose rows the store on ``conn`` holds, oldest copy first."""
    return [_Taken(**row) for row in conn.execute(STORES.records).mappings()]


def _store_identity(conn: Connection) -> str:
    """The identity of the store on ``conn``, in a write transaction that holds its lock;
    one made now when it has none (its row deleted, or its tables built otherwise than by
    the revisions), committed with that transaction."""
    found = conn.execute(STORES.identity).scalar()
    if found is not None:
        return str(found)
    made = new_store_id()
    conn.execute(STORES.give_identity, {"store_id": made})
    return made


def _source_identity(engine: Engine) -> str:
    """The source's identity, read before the copy's snapshot; a source without one (see
    :func:`_store_identity`) is given one first, in a short write of its own, so that a
    second copy of it is known for the same store."""
    with engine.connect() as conn:
        found = conn.execute(STORES.identity).scalar()
        conn.rollback()
        if found is not None:
            return str(found)
        with conn.begin():
            backend_of(conn).take_write_lock(conn)
            return _store_identity(conn)


def _refuse_known_stores(
    source_store: str, taken: list[_Taken], target_store: str, tconn: Connection
) -> None:
    """Raise :class:`StoresShareRows` when the target, which holds rows, already holds the
    source's (it is the same store, or a copy took them, straight or through another), the
    source holds the target's, or both hold a third store's: appending would count their
    passings twice. Read from the stores' identities and records, which retention never
    deletes."""
    held = {t.store_id: t for t in _records(tconn)}
    if source_store == target_store:
        why = (
            f"the source and the target are one store (identity {source_store}: one a file "
            "copy or a restored backup of the other?)"
        )
    elif source_store in held:
        why = f"the target already holds the source's rows ({_taken_words(held[source_store])})"
    elif any(t.store_id == target_store for t in taken):
        mine = next(t for t in taken if t.store_id == target_store)
        why = f"the source already holds the target's rows ({_taken_words(mine)})"
    else:
        third = next((t for t in taken if t.store_id in held), None)
        if third is None:
            return
        why = (
            f"both hold the rows of store {third.store_id} (the target's: "
            f"{_taken_words(held[third.store_id])}; the source's: {_taken_words(third)})"
        )
    raise StoresShareRows(
        f"{why}: they share rows (was one copied from the other?), and appending would "
        "count their passings twice; nothing was copied"
    )


def _taken_words(taken: _Taken) -> str:
    """How a store's rows came, for a message: when, and through which store."""
    through = "" if taken.via_store_id is None else f" through store {taken.via_store_id}"
    return f"store {taken.store_id}, copied on {iso_utc(taken.copied_at)}{through}"


def _max_id(conn: Connection, table: Table) -> int:
    """The table's largest integer id, 0 when empty (or without one: the chains)."""
    stmt = statements(table).max_id
    return 0 if stmt is None else int(conn.execute(stmt).scalar_one())


def _chain_key(row: Any) -> tuple[str, str, str]:
    """A chain's key, ``(prev, src, dst)`` executor names, from a row or a mapping."""
    return (row["prev_executor"], row["src_executor"], row["dst_executor"])


def _merged_chain(dst: RowMapping, src: Any) -> dict[str, Any]:
    """The target's chain after absorbing the source's of the same key: the decayed counts
    at the later ``ts_last``, summed (``rules.merged_count``), ``uses`` summed, the earlier
    ``ts_first``."""
    count, last = merged_count(
        (dst["decayed_uses"], CHAIN_DECAY_LAMBDA, dst["ts_last"]),
        (src["decayed_uses"], CHAIN_DECAY_LAMBDA, src["ts_last"]),
    )
    merged = dict(dst)
    merged.update(
        decayed_uses=count,
        uses=dst["uses"] + src["uses"],
        ts_first=min(dst["ts_first"], src["ts_first"]),
        ts_last=last,
    )
    return merged


def _rows_by_id(conn: Connection, ids: Sequence[str]) -> dict[str, RowMapping]:
    result = conn.execute(MNESTS_BY_ID, {"ids": list(ids)}).mappings()
    return {row["id"]: row for row in result}
