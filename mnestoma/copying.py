"""Copy a whole store between databases (SQLite ↔ PostgreSQL), ids kept, verified.

The target is migrated to head and filled inside one transaction; before it commits, its
content is read back and compared with the source (row counts and a checksum). Any
difference rolls everything back, so a failed copy leaves the target as it was.

The checksum is order-independent (the sum of one SHA-256 per row, modulo 2**256): the two
engines sort text ids by different collations, and this way neither side has to sort.
Rows are canonicalised first: floats to 12 significant digits, times to ISO-8601 UTC, JSON
with sorted keys.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, Table, func, insert, inspect, select, text
from sqlalchemy.engine import URL

from .config import READ_ONLY_OPTION, make_engine, redact_url, resolve_database_url
from .errors import ConflictError, InvalidInput, MnestomaError, SchemaError, translate_errors
from .migration import current_revision, head_revision, upgrade
from .models import CanonicalQuery, Event, Mnest
from .status import missing_sqlite_file

__all__ = [
    "CHUNK_SIZE",
    "CopyReport",
    "CopyVerificationError",
    "TargetNotEmpty",
    "copy_store",
    "table_checksum",
]

CHUNK_SIZE = 5_000
MODULUS = 2**256
# (table, has an integer id the copy keeps, or shifts past the target's ids when appending)
TABLES: tuple[tuple[Table, bool], ...] = (
    (Mnest.__table__, False),  # type: ignore[has-type]
    (Event.__table__, True),  # type: ignore[has-type]
    (CanonicalQuery.__table__, True),  # type: ignore[has-type]
)

Progress = Callable[[int], AbstractContextManager[Callable[[int], Any]]]


class TargetNotEmpty(InvalidInput):
    """The target already holds rows and ``append`` was not asked for."""


class CopyVerificationError(MnestomaError):
    """The target's content read back differs from the source's: the copy was rolled back."""


@dataclass(frozen=True, slots=True)
class CopyReport:
    """What was copied: rows per table and the checksum both sides agreed on."""

    source: str
    target: str
    rows: dict[str, int]
    checksums: dict[str, str]
    appended: bool
    id_offsets: dict[str, int]

    @property
    def total(self) -> int:
        """Rows copied, all tables together."""
        return sum(self.rows.values())


class _Digest:
    """An order-independent multiset hash: count and sum of per-row SHA-256."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0

    def add(self, table: str, columns: list[str], row: Any) -> None:
        payload = json.dumps(
            [table, [_canonical(row[c]) for c in columns]],
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )
        self.count += 1
        self.total = (self.total + int(hashlib.sha256(payload.encode()).hexdigest(), 16)) % MODULUS

    @property
    def hexdigest(self) -> str:
        return f"{self.total:064x}"


def _canonical(value: Any) -> Any:
    """A JSON-ready form two engines agree on for the same content."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return {"f": format(value, ".12g")}
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return {"t": aware.astimezone(UTC).isoformat()}
    if isinstance(value, dict):
        return {"d": {str(k): _canonical(v) for k, v in value.items()}}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return {"x": str(value)}


def table_checksum(conn: Connection, table: Table, *, id_above: int | None = None) -> str:
    """The checksum of a table's content (optionally only the rows with ``id > id_above``)."""
    return _table_digest(conn, table, id_above=id_above, offset=0).hexdigest


def _table_digest(conn: Connection, table: Table, *, id_above: int | None, offset: int) -> _Digest:
    columns = [c.key for c in table.columns]
    digest = _Digest()
    stmt = select(table)
    if id_above is not None:
        stmt = stmt.where(table.c.id > id_above)
    result = conn.execute(stmt, execution_options={"yield_per": CHUNK_SIZE})
    for part in result.mappings().partitions():
        for row in part:
            digest.add(table.name, columns, _shifted(row, offset))
    return digest


def _shifted(row: Any, offset: int) -> Any:
    if not offset:
        return row
    out = dict(row)
    out["id"] = row["id"] + offset
    return out


@contextmanager
def _no_progress(total: int) -> Iterator[Callable[[int], None]]:
    yield lambda n: None


def _same_database(a: URL, b: URL) -> bool:
    if a.get_backend_name() != b.get_backend_name():
        return False
    if a.get_backend_name() == "sqlite":
        from pathlib import Path

        return (
            Path(a.database or "").expanduser().resolve()
            == Path(b.database or "").expanduser().resolve()
        )
    keys = ("host", "port", "database")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def copy_store(
    source: str | URL | None,
    target: str | URL,
    *,
    append: bool = False,
    chunk_size: int = CHUNK_SIZE,
    progress: Progress | None = None,
) -> CopyReport:
    """Copy every mnest, event and logged query from ``source`` to ``target``.

    The target is migrated to head first and must hold no rows unless ``append``; with
    ``append``, event and query-log ids are shifted past the target's largest id (mnest ids,
    random tokens, are kept as they are). Raises :class:`TargetNotEmpty`,
    :class:`SchemaError` (source not at head) or :class:`CopyVerificationError`.
    """
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise InvalidInput("chunk_size must be a positive integer")
    src_url = resolve_database_url(source)
    dst_url = resolve_database_url(target)
    if _same_database(src_url, dst_url):
        raise InvalidInput("the source and the target are the same database")
    missing = missing_sqlite_file(src_url)
    if missing is not None:
        raise InvalidInput(f"no source database at {missing}")
    src_engine = make_engine(src_url)
    dst_engine = make_engine(dst_url)
    try:
        head = head_revision()
        src_rev = current_revision(src_engine)
        if src_rev != head:
            raise SchemaError(
                f"the source {redact_url(src_url)} is at revision {src_rev or 'none'}, "
                f"not head {head}: run `mnestoma db upgrade` on it first"
            )
        try:
            with translate_errors():
                return _copy(src_engine, dst_engine, append, chunk_size, progress or _no_progress)
        except ConflictError as err:
            raise ConflictError(
                "the target already holds a mnest with the same id or edge key as one of the "
                f"source's ({err}): nothing was copied"
            ) from err
    finally:
        src_engine.dispose()
        dst_engine.dispose()


def _source_reader(engine: Engine) -> Engine:
    """One consistent snapshot of the source across its three tables."""
    if engine.dialect.name == "postgresql":
        return engine.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
    return engine.execution_options(**{READ_ONLY_OPTION: True})


def _copy(
    src_engine: Engine, dst_engine: Engine, append: bool, chunk_size: int, progress: Progress
) -> CopyReport:
    with _source_reader(src_engine).connect() as sconn, dst_engine.connect() as tconn:
        counts = {
            t.name: int(sconn.execute(select(func.count()).select_from(t)).scalar_one())
            for t, _ in TABLES
        }
        with tconn.begin():
            before = _target_counts(tconn)
            if not append and any(before.values()):
                held = ", ".join(f"{n} {name}" for name, n in before.items() if n)
                raise TargetNotEmpty(
                    f"the target {redact_url(dst_engine.url)} is not empty ({held}): "
                    "use --append to add to it"
                )
            upgrade(tconn)  # inside the copy's transaction: a failed copy migrates nothing
            offsets: dict[str, int] = {}
            before_digest: dict[str, _Digest] = {}
            for table, int_id in TABLES:
                offsets[table.name] = _max_id(tconn, table) if (append and int_id) else 0
                if append:
                    before_digest[table.name] = _table_digest(tconn, table, id_above=None, offset=0)
            source_digest: dict[str, _Digest] = {}
            with progress(sum(counts.values())) as advance:
                for table, _ in TABLES:
                    source_digest[table.name] = _copy_table(
                        sconn, tconn, table, offsets[table.name], chunk_size, advance
                    )
            if dst_engine.dialect.name == "postgresql":
                for table, int_id in TABLES:
                    if int_id:
                        tconn.execute(
                            text(
                                f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), "
                                f"COALESCE((SELECT MAX(id) FROM {table.name}), 0) + 1, false)"
                            )
                        )
            _verify(tconn, counts, before, source_digest, before_digest)
        sconn.rollback()
    return CopyReport(
        source=redact_url(src_engine.url),
        target=redact_url(dst_engine.url),
        rows=counts,
        checksums={name: d.hexdigest for name, d in source_digest.items()},
        appended=append,
        id_offsets={k: v for k, v in offsets.items() if v},
    )


def _target_counts(conn: Connection) -> dict[str, int]:
    tables = set(inspect(conn).get_table_names())
    return {
        t.name: (
            int(conn.execute(select(func.count()).select_from(t)).scalar_one())
            if t.name in tables
            else 0
        )
        for t, _ in TABLES
    }


def _max_id(conn: Connection, table: Table) -> int:
    return int(conn.execute(select(func.coalesce(func.max(table.c.id), 0))).scalar_one())


def _copy_table(
    sconn: Connection,
    tconn: Connection,
    table: Table,
    offset: int,
    chunk_size: int,
    advance: Callable[[int], Any],
) -> _Digest:
    """Stream one table in chunks into the target; return the digest of what was sent."""
    columns = [c.key for c in table.columns]
    digest = _Digest()
    stmt = select(table).order_by(table.c.id)
    result = sconn.execute(stmt, execution_options={"yield_per": chunk_size})
    ins = insert(table)
    for part in result.mappings().partitions():
        rows = [dict(_shifted(r, offset)) for r in part]
        for row in rows:
            digest.add(table.name, columns, row)
        tconn.execute(ins, rows)
        advance(len(rows))
    return digest


def _verify(
    tconn: Connection,
    counts: dict[str, int],
    before: dict[str, int],
    source_digest: dict[str, _Digest],
    before_digest: dict[str, _Digest],
) -> None:
    """Read the target back; any difference raises (and rolls the transaction back)."""
    for table, _ in TABLES:
        name = table.name
        after = _table_digest(tconn, table, id_above=None, offset=0)
        expected_count = before.get(name, 0) + counts[name]
        expected_sum = source_digest[name].total
        if name in before_digest:
            expected_sum = (expected_sum + before_digest[name].total) % MODULUS
        if after.count != expected_count or after.total != expected_sum:
            raise CopyVerificationError(
                f"verification failed on {name}: the target holds {after.count} rows, "
                f"{expected_count} expected, or their content differs; nothing was copied"
            )
