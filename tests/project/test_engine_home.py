"""One home per database engine: what SQLite and PostgreSQL do differently is asked of their
:class:`~mnestoma.engines.backend.Backend` (``backend_of(x)``), never decided by comparing
the dialect's name, except in the engines' own homes under ``mnestoma/engines/``.

The detector below finds code that branches on a dialect's name: comparisons with the name
(``dialect.name == "postgresql"``, ``dialect == "sqlite"``, ``name in ("sqlite", ...)``),
any comparison of a ``dialect.name``, dicts keyed by the names, ``startswith("sqlite")``
and ``match`` cases. Keyword names (``sqlite_where=``), arguments (``with_variant(T,
"sqlite")``, ``execute_if(dialect="postgresql")``), URLs written out and docstrings are not
branches.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import URL, create_engine, make_url, select
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect

import mnestoma
from mnestoma.core import errors, rules, sqlrules
from mnestoma.core.errors import ConflictError, DatabaseUnavailable, InvalidInput
from mnestoma.engines import backend_of, make_engine
from mnestoma.engines.backend import Backend, backends
from mnestoma.engines.locking import STORE_FILE_SUFFIXES, driver_in_transaction
from mnestoma.engines.postgresql import POSTGRESQL
from mnestoma.engines.sqlite import SQLITE
from mnestoma.schema.sql import read
from mnestoma.schema.sql.spelling import spelling_of

PACKAGE = Path(mnestoma.__file__).resolve().parent
ENGINES_HOME = PACKAGE / "engines"
# At most this many modules may branch on a dialect's name, all of them under engines/.
MAX_HOME_MODULES = 4
_NAMES = frozenset({"sqlite", "postgresql", "postgres"})


def _is_name(node: ast.AST) -> bool:
    """A string constant naming an engine (``"sqlite"``, ``"postgresql+psycopg"``...)."""
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.partition("+")[0] in _NAMES
    )


def _names_any(node: ast.AST) -> bool:
    """An engine's name, or a tuple, list or set holding one."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_name(e) for e in node.elts)
    return _is_name(node)


def _dialect_name(node: ast.AST) -> bool:
    """``<something dialect>.name``: a dialect's name read for a comparison."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "name"
        and "dialect" in ast.unparse(node.value).lower()
    )


def dialect_branches(source: str) -> list[int]:
    """The lines of ``source`` where code branches on a dialect's name."""
    found: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_names_any(o) or _dialect_name(o) for o in operands):
                found.append(node.lineno)
        elif isinstance(node, ast.Dict):
            if any(k is not None and _is_name(k) for k in node.keys):
                found.append(node.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr in ("startswith", "endswith")
                and any(_names_any(a) for a in node.args)
            ):
                found.append(node.lineno)
        elif isinstance(node, ast.match_case):
            pattern = node.pattern
            if isinstance(pattern, ast.MatchValue) and _is_name(pattern.value):
                found.append(pattern.lineno)
    return sorted(found)


def _branching_modules() -> dict[str, list[int]]:
    """Each module of the package that branches on a dialect's name, with its lines."""
    out: dict[str, list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = dialect_branches(path.read_text(encoding="utf-8"))
        if lines:
            out[path.relative_to(PACKAGE).as_posix()] = lines
    return out


# --- the detector ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        'if conn.dialect.name == "postgresql":\n    pass',
        'on_pg = conn.dialect.name == "postgresql"',
        'ok = engine.dialect.name != "sqlite"',
        'pause = 1.0 if dialect == "sqlite" else 0.0',
        'ok = url.get_backend_name() in ("sqlite", "postgresql")',
        'ok = url.drivername == "postgresql+psycopg"',
        "same = a.dialect.name == b.dialect.name",
        'drivers = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+psycopg"}',
        'ok = url.drivername.startswith("sqlite")',
        'ok = url.drivername.startswith(("postgresql", "postgres"))',
        'match dialect:\n    case "sqlite":\n        pass',
    ],
)
def test_the_detector_catches_each_form_of_branch(code: str) -> None:
    assert dialect_branches(code)


@pytest.mark.parametrize(
    "code",
    [
        '"""Compares dialect.name == "sqlite" in prose."""',
        'def f():\n    """On SQLite (``dialect == "sqlite"``) nothing."""',
        'Index("ix", col, sqlite_where=col > 0, postgresql_where=col > 0)',
        'impl = JSON().with_variant(JSONB(), "postgresql")',
        'ddl = DDL("x").execute_if(dialect="postgresql")',
        'url = URL.create("sqlite+pysqlite", database="x")',
        "backend = backend_of(conn)\nif backend.one_writer:\n    pass",
        'value = {"sqlite_where": 1}.get("sqlite_where")',
    ],
)
def test_the_detector_ignores_keywords_arguments_and_docstrings(code: str) -> None:
    assert dialect_branches(code) == []


# --- the target -----------------------------------------------------------------------------


def test_only_the_engines_homes_branch_on_the_dialects_name() -> None:
    found = _branching_modules()
    homes = set(found)
    assert all(m.startswith("engines/") for m in homes), {
        m: found[m] for m in homes if not m.startswith("engines/")
    }
    assert len(homes) <= MAX_HOME_MODULES, sorted(homes)


# --- the interface and its lookup ---------------------------------------------------------


def _members(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


@pytest.mark.parametrize("backend", [SQLITE, POSTGRESQL], ids=["sqlite", "postgresql"])
def test_each_backend_implements_the_whole_interface(backend: Backend) -> None:
    assert isinstance(backend, Backend)
    wanted = _members(Backend) | set(Backend.__annotations__)
    assert wanted <= _members(type(backend)), wanted - _members(type(backend))
    for name in _members(Backend):
        expected = inspect.signature(getattr(Backend, name))
        got = inspect.signature(getattr(type(backend), name))
        assert list(got.parameters) == list(expected.parameters), name
    for name, kind in Backend.__annotations__.items():
        if kind in ("str", "bool", "float"):
            assert type(getattr(backend, name)).__name__ == kind, name


def test_backend_of_answers_for_names_urls_dialects_engines_and_connections() -> None:
    engine = create_engine("sqlite://")
    with engine.connect() as conn:
        for x in ("sqlite", make_url("sqlite:///x.sqlite"), engine, conn, engine.dialect):
            assert backend_of(x) is SQLITE
    for x in ("postgresql", make_url("postgresql+psycopg://h/db"), pg_dialect.dialect()):
        assert backend_of(x) is POSTGRESQL
    assert {b.name for b in backends()} == {"sqlite", "postgresql"}
    with pytest.raises(InvalidInput, match="unsupported database 'mysql'"):
        backend_of(make_url("mysql://h/db"))


def test_each_home_fills_the_neutral_tables_below_engines() -> None:
    assert SQLITE.batch_pause_s == rules.BATCH_PAUSE_S and POSTGRESQL.batch_pause_s == 0.0
    for backend in (SQLITE, POSTGRESQL):
        assert spelling_of(backend.name) is backend.spelling
        assert backend.codes in errors._REGISTERED


# --- where the engines differ -----------------------------------------------------------------


def test_store_files_and_memory_urls(tmp_path: Path) -> None:
    url = make_url(f"sqlite:///{tmp_path / 'store.sqlite'}")
    files = SQLITE.store_files(url)
    assert files[0] == str(tmp_path / "store.sqlite")
    assert files[1:] == tuple(files[0] + s for s in STORE_FILE_SUFFIXES)
    assert SQLITE.store_files(make_url("sqlite://")) == ()
    assert SQLITE.is_memory(make_url("sqlite://"))
    assert SQLITE.is_memory(make_url("sqlite:///file::memory:?uri=true"))
    assert not SQLITE.is_memory(url)
    pg = make_url("postgresql+psycopg://h/db")
    assert POSTGRESQL.store_files(pg) == ()
    assert not POSTGRESQL.is_memory(pg)


def test_a_missing_store_is_a_sqlite_file_that_does_not_exist(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    url = make_url(f"sqlite:///{path}")
    assert SQLITE.store_missing(url)
    path.touch()
    assert not SQLITE.store_missing(url)
    assert not SQLITE.store_missing(make_url("sqlite://"))
    assert not POSTGRESQL.store_missing(make_url("postgresql+psycopg://h/missing"))


def test_same_database_is_the_same_file_or_the_same_server_database(tmp_path: Path) -> None:
    a = make_url(f"sqlite:///{tmp_path / 'a.sqlite'}")
    again = make_url(f"sqlite:///{tmp_path / 'x' / '..' / 'a.sqlite'}")
    assert SQLITE.same_database(a, again)
    assert not SQLITE.same_database(a, make_url(f"sqlite:///{tmp_path / 'b.sqlite'}"))
    one = make_url("postgresql+psycopg://u@h:5432/db")
    assert POSTGRESQL.same_database(one, make_url("postgresql+psycopg://v@h:5432/db"))
    assert not POSTGRESQL.same_database(one, make_url("postgresql+psycopg://u@h:5432/other"))


def test_the_write_lock_is_sqlites_alone(store_url: str) -> None:
    engine = make_engine(store_url)
    backend = backend_of(engine)
    try:
        with engine.connect() as conn:
            conn.begin()
            backend.take_write_lock(conn)
            dbapi = conn.connection.dbapi_connection
            if backend.one_writer:  # SQLite: BEGIN IMMEDIATE ran at once
                assert driver_in_transaction(dbapi)
            else:  # PostgreSQL: nothing was sent, the server sees an idle session
                assert dbapi.info.transaction_status.name == "IDLE"
            conn.rollback()
    finally:
        engine.dispose()


class _DriverError(Exception):
    def __init__(self, text: str, sqlstate: str | None = None) -> None:
        super().__init__(text)
        self.sqlstate = sqlstate


def _wrapped(text: str, sqlstate: str | None = None) -> sa_exc.DBAPIError:
    return sa_exc.OperationalError("SELECT 1", {}, _DriverError(text, sqlstate))


def test_each_engines_error_codes_are_read_from_its_home() -> None:
    busy = errors.translate(_wrapped("database is locked"))
    assert type(busy) is ConflictError and busy.args[0] == SQLITE.codes.busy_explanation
    for backend in (SQLITE, POSTGRESQL):
        for words in backend.codes.unreachable_messages:
            err = errors.translate(_wrapped(f"oops: {words} now"))
            assert isinstance(err, DatabaseUnavailable)
    for state in POSTGRESQL.codes.retryable_sqlstates:
        assert errors.is_retryable(_wrapped("conflict", state))
        # a deadlock or serialization failure (not an IntegrityError) is a ConflictError too
        conflict = errors.translate(_wrapped("conflict", state))
        assert type(conflict) is ConflictError
        assert conflict.args[0] == f"{errors.TRANSIENT_CONFLICT}: conflict"
    assert type(errors.translate(_wrapped("syntax error", "42601"))) is errors.StoreError
    assert errors.is_lock_not_available(_wrapped("timeout", errors.LOCK_NOT_AVAILABLE))
    assert not errors.is_retryable(_wrapped("syntax error", "42601"))


def _sql(stmt: Any, dialect: Any) -> str:
    return str(stmt.compile(dialect=dialect))


def test_the_statements_are_spelled_by_each_engines_home() -> None:
    lite, pg = sqlite_dialect.dialect(), pg_dialect.dialect()
    walk_lite = _sql(read.walk_statement("sqlite", with_floor=False), lite)
    walk_pg = _sql(read.walk_statement("postgresql", with_floor=False), pg)
    assert "rowid" in walk_lite and "instr(" in walk_lite and "row_number()" not in walk_lite
    assert "rowid" not in walk_pg and "strpos(" in walk_pg and "row_number()" in walk_pg
    assert 'COLLATE "C"' in walk_pg
    # SQLAlchemy's own per-dialect compilation below the engines: one expression, two words
    both = select(sqlrules.greatest(1.0, 2.0), sqlrules.least(1.0, 2.0))
    assert "max(" in _sql(both, lite) and "min(" in _sql(both, lite)
    assert "greatest(" in _sql(both, pg) and "least(" in _sql(both, pg)
    assert "julianday" in _sql(select(sqlrules.days_since(1, 2)), lite)


def test_urls_take_each_backends_drivers() -> None:
    from mnestoma.engines import async_database_url, resolve_database_url

    for backend in (SQLITE, POSTGRESQL):
        for scheme in backend.bare_schemes:
            url = resolve_database_url(
                f"{scheme}:///x" if scheme == "sqlite" else f"{scheme}://h/d"
            )
            assert url.drivername == backend.sync_driver
            assert async_database_url(url).drivername.startswith(backend.async_driver)
    assert isinstance(resolve_database_url("sqlite:///x"), URL)
