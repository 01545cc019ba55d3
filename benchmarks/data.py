"""Synthetic data, bulk loaders and throwaway databases for the benchmarks.

Big tables are loaded with plain ``executemany`` (``COPY`` on PostgreSQL), never through
the package's API; every database is created by ``mnestoma.upgrade`` so the package and
the baseline work on identical tables and indexes.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from .baseline import COLUMNS, format_ts

__all__ = [
    "NOW",
    "FixedClock",
    "PostgresServer",
    "SqliteFiles",
    "ager_rows",
    "demoting_rows",
    "graph_rows",
    "graph_sources",
]

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
_TS_POOL = 20_000  # distinct timestamps to draw from (formatting is the slow part of loading)

Row = tuple[Any, ...]
RowFactory = Callable[[], Iterator[Row]]


class FixedClock:
    """A clock stopped at one instant: both implementations see the same "now"."""

    def __init__(self, now: datetime = NOW) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def _ts_pool(rng: random.Random, lo_days: float, hi_days: float) -> list[datetime]:
    return [NOW - timedelta(days=rng.uniform(lo_days, hi_days)) for _ in range(_TS_POOL)]


def ager_rows(n: int, seed: int = 7) -> Iterator[Row]:
    """``n`` rows for the ager, ten at a time: 7 active, 1 decaying twin of the first
    active (a merge when it demotes), 1 old decaying (archive candidates), 1 proto."""
    rng = random.Random(seed)
    recent = _ts_pool(rng, 0, 90)
    old = _ts_pool(rng, 60, 400)
    for i in range(n):
        r = i % 10
        mid = f"mn_{i:013d}"
        if r < 7 or r == 8:
            key = (f"x{i}", "1", f"y{i}", "1")
        elif r == 7:
            key = (f"x{i - 7}", "1", f"y{i - 7}", "1")
        else:
            key = (f"x{i}", "1", f"y{i}", None)
        if r < 7:
            state, weight, ts = "active", rng.uniform(0.2, 1.0), rng.choice(recent)
        elif r in (7, 8):
            state, weight, ts = "decaying", rng.uniform(0.01, 0.3), rng.choice(old)
        else:
            state, weight, ts = "proto", rng.uniform(0.05, 0.6), rng.choice(recent)
        first = ts - timedelta(days=rng.randint(0, 30))
        uses = rng.randint(1, 40)
        yield (mid, *key, weight, uses, first, ts, ts, 0.018, state, None, None)


def demoting_rows(n: int, seed: int = 29) -> Iterator[Row]:
    """``n`` rows for a store the ager mostly demotes: 90 % active, 10 % proto, weights
    uniform in [0, 1], last anchored 30 to 430 days ago; about 93 % change state in one run
    (actives fall below 0.20, protos below 0.05), none merges."""
    rng = random.Random(seed)
    anchors = _ts_pool(rng, 30, 430)
    for i in range(n):
        mid = f"mn_{i:013d}"
        ts = rng.choice(anchors)
        first = ts - timedelta(days=rng.randint(0, 30))
        uses = rng.randint(1, 40)
        weight = rng.random()
        if i % 10 == 9:
            key: tuple[str, str, str, str | None] = (f"x{i}", "1", f"w{i}", None)
            state = "proto"
        else:
            key, state = (f"x{i}", "1", f"y{i}", "1"), "active"
        yield (mid, *key, weight, uses, first, ts, ts, 0.018, state, None, None)


def graph_rows(executors: int, degree: int = 10, seed: int = 11) -> Iterator[Row]:
    """``executors × degree`` active edges ``e<i>@1 → e<j>@1`` (no self-loops)."""
    rng = random.Random(seed)
    times = _ts_pool(rng, 0, 60)
    n = 0
    for e in range(executors):
        targets = [t for t in rng.sample(range(executors), degree + 1) if t != e][:degree]
        for t in targets:
            ts = rng.choice(times)
            first = ts - timedelta(days=rng.randint(0, 30))
            yield (
                f"mn_g{n:012d}",
                f"e{e}",
                "1",
                f"e{t}",
                "1",
                rng.uniform(0.3, 1.0),
                rng.randint(1, 50),
                first,
                ts,
                ts,
                0.018,
                "active",
                None,
                None,
            )
            n += 1


def graph_sources(executors: int, count: int, seed: int = 13) -> list[str]:
    """``count`` distinct source executors of the graph, each of out-degree ``degree``."""
    rng = random.Random(seed)
    return [f"e{i}" for i in rng.sample(range(executors), min(count, executors))]


def _sqlite_rows(rows: Iterable[Row]) -> Iterator[Row]:
    cache: dict[datetime, str] = {}

    def fmt(ts: datetime) -> str:
        text = cache.get(ts)
        if text is None:
            text = cache[ts] = format_ts(ts)
        return text

    for r in rows:
        yield (*r[:7], fmt(r[7]), fmt(r[8]), fmt(r[9]), *r[10:])


def load_sqlite(path: str, rows: Iterable[Row]) -> int:
    """Insert ``rows`` into ``mnests`` with ``executemany``; returns how many."""
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode = WAL")
        con.execute("PRAGMA synchronous = OFF")
        con.execute("BEGIN")
        sql = f"INSERT INTO mnests ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * 14)})"
        before = con.total_changes
        con.executemany(sql, _sqlite_rows(rows))
        con.execute("COMMIT")
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return con.total_changes - before
    finally:
        con.close()


@dataclass
class SqliteFiles:
    """SQLite database files in one work folder: migrated templates and their copies."""

    folder: Path
    _templates: dict[str, Path] = field(default_factory=dict)

    def url(self, path: str | Path) -> str:
        """The SQLAlchemy URL of a file."""
        return f"sqlite:///{Path(path).absolute()}"

    def template(self, name: str, rows: RowFactory | None = None, revision: str = "head") -> Path:
        """A database migrated to ``revision`` (built once), loaded with ``rows()`` when
        given."""
        if name in self._templates:
            return self._templates[name]
        import mnestoma

        path = self.folder / f"template-{name}.sqlite"
        _remove_sqlite(path)
        mnestoma.upgrade(self.url(path), revision)
        if rows is not None:
            load_sqlite(str(path), rows())
        self._templates[name] = path
        return path

    def clone(self, name: str, rows: RowFactory | None = None) -> Path:
        """A fresh copy of a template, to be written to and thrown away."""
        src = self.template(name, rows)
        dst = self.folder / f"{name}-{secrets.token_hex(4)}.sqlite"
        shutil.copyfile(src, dst)
        return dst

    def discard(self, path: str | Path) -> None:
        """Delete a copy (and its WAL files)."""
        _remove_sqlite(Path(path))

    def close(self) -> None:
        """Delete every template."""
        for path in self._templates.values():
            _remove_sqlite(path)
        self._templates.clear()


def _remove_sqlite(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        with suppress(FileNotFoundError):
            os.remove(f"{path}{suffix}")


class PostgresServer:
    """Throwaway databases on one PostgreSQL server; templates are cloned server-side."""

    def __init__(self, url: str) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        if parsed.drivername in ("postgresql", "postgres"):
            parsed = parsed.set(drivername="postgresql+psycopg")
        self._base = parsed
        self._admin = create_engine(parsed, isolation_level="AUTOCOMMIT", poolclass=_null_pool())
        self._prefix = f"mnestoma_bench_{secrets.token_hex(3)}"
        self._templates: dict[str, str] = {}
        self._databases: list[str] = []

    def version(self) -> str:
        """The server's version number."""
        from sqlalchemy import text

        with self._admin.connect() as conn:
            return str(conn.execute(text("SHOW server_version")).scalar_one()).split()[0]

    def url(self, database: str) -> str:
        """The URL of one database on this server (password kept, never printed)."""
        return self._base.set(database=database).render_as_string(hide_password=False)

    def _create(self, name: str, template: str | None = None) -> str:
        from sqlalchemy import text

        clause = f' TEMPLATE "{template}"' if template else ""
        with self._admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"{clause}'))
        self._databases.append(name)
        return name

    def template(self, name: str, rows: RowFactory | None = None, revision: str = "head") -> str:
        """A database migrated to ``revision`` (built once), loaded with ``rows()`` by COPY
        when given."""
        if name in self._templates:
            return self._templates[name]
        import mnestoma

        db = self._create(f"{self._prefix}_tpl_{name}")
        mnestoma.upgrade(self.url(db), revision)
        if rows is not None:
            load_postgresql(self.url(db), rows())
        self._templates[name] = db
        return db

    def clone(self, name: str, rows: RowFactory | None = None) -> str:
        """A fresh database copied from a template."""
        tpl = self.template(name, rows)
        return self._create(f"{self._prefix}_{name}_{secrets.token_hex(3)}", tpl)

    def discard(self, database: str) -> None:
        """Drop one database."""
        from sqlalchemy import text

        with self._admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        with suppress(ValueError):
            self._databases.remove(database)

    def close(self) -> None:
        """Drop every database this object created."""
        for db in list(reversed(self._databases)):
            self.discard(db)
        self._templates.clear()
        self._admin.dispose()


def _null_pool() -> Any:
    from sqlalchemy.pool import NullPool

    return NullPool


def load_postgresql(url: str, rows: Iterable[Row]) -> int:
    """Insert ``rows`` into ``mnests`` with ``COPY``; returns how many."""
    import psycopg
    from sqlalchemy.engine import make_url

    u = make_url(url)
    conninfo = {
        "host": u.host or "",
        "port": u.port or 5432,
        "user": u.username or "",
        "dbname": u.database or "",
    }
    if u.password:
        conninfo["password"] = u.password
    n = 0
    with psycopg.connect(**conninfo) as con, con.cursor() as cur:
        with cur.copy(f"COPY mnests ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
                n += 1
        cur.execute("ANALYZE mnests")
    return n
