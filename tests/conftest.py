"""Shared fixtures: every test that takes ``store_url`` runs on SQLite and on PostgreSQL.

PostgreSQL comes from ``MNESTOMA_TEST_PG_ADMIN_URL`` (default: root on 127.0.0.1:5432,
database ``test``), used only to create and drop throwaway databases. A server that answers
without that database gets it (created through the ``postgres`` maintenance database, when
the role may). When PostgreSQL cannot be used its tests are skipped with the reason (the
server does not answer, refuses the login, or lacks the database), unless
``MNESTOMA_REQUIRE_POSTGRESQL=1`` (set by ``.ci/run``), which turns the skip into a failure.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import queue
import re
import secrets
import shutil
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("mnestoma.testing")  # the plugin below is imported early

from invariants import END_OTHER_SESSIONS, other_sessions_after  # noqa: E402
from sqlalchemy import Connection, Engine, NullPool, create_engine, text  # noqa: E402
from sqlalchemy.engine import URL, make_url  # noqa: E402

import mnestoma  # noqa: E402
from mnestoma.core.rules import DEFAULT_DECAY_LAMBDA, new_mnest_id  # noqa: E402
from mnestoma.engines import make_engine  # noqa: E402
from mnestoma.testing.clock import MovableClock  # noqa: E402

pytest_plugins = ["mnestoma.testing"]

REPO = Path(__file__).resolve().parent.parent  # the checkout: README.md, docs/, tests/

PG_ADMIN_URL = os.environ.get(
    "MNESTOMA_TEST_PG_ADMIN_URL", "postgresql+psycopg://root@127.0.0.1:5432/test"
)
REQUIRE_PG = os.environ.get("MNESTOMA_REQUIRE_POSTGRESQL", "") not in ("", "0", "false")
ENGINES = ["sqlite", "postgresql"]
TABLES = (
    "events",
    "canonical_query_log",
    "mnests",
    "ager_runs",
    "mnestoma_copied_stores",
    "mnest_chains",
)


# PostgreSQL's own database, there on every server: where a missing one is created from.
PG_MAINTENANCE_DATABASE = "postgres"
# Words of libpq's and the server's messages that say why a connection failed.
_PG_DOWN = re.compile(
    r"connection refused|timeout expired|could not translate host name|no route to host|"
    r"network is unreachable|no such file or directory|server closed the connection",
    re.I,
)
_PG_LOGIN = re.compile(
    r"password authentication failed|authentication failed|no pg_hba\.conf entry|"
    r'role "[^"]*" does not exist|password|permission denied to connect',
    re.I,
)

_pg_problem: list[str | None] = []  # the answer for PG_ADMIN_URL, once found


def _connect_error(url: URL | str) -> str | None:
    """Why a connection to ``url`` fails (the driver's first line), None when it works."""
    eng = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 3})
    try:
        with eng.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as err:  # any failure is a reason to skip, said in its own words
        first = str(getattr(err, "orig", None) or err).strip().splitlines()
        return first[0] if first else type(err).__name__
    finally:
        eng.dispose()
    return None


def postgresql_problem(admin_url: str = PG_ADMIN_URL, *, create: bool = True) -> str | None:
    """None when the tests can use ``admin_url``; else why not, in words: the server does not
    answer, it refuses the login, or the database is missing (with ``create``, it is first
    created through the ``postgres`` maintenance database, when the role may)."""
    url = make_url(admin_url)
    shown = url.render_as_string()  # the password hidden
    failure = _connect_error(url)
    if failure is None:
        return None
    maintenance = url.set(database=PG_MAINTENANCE_DATABASE)
    reached = _connect_error(maintenance)
    if reached is not None:
        if _PG_DOWN.search(reached):
            return f"PostgreSQL does not answer at {shown}: {reached}"
        if _PG_LOGIN.search(reached):
            return f"PostgreSQL refuses the login of {shown}: {reached}"
        return f"PostgreSQL cannot be used at {shown}: {failure}"
    # The server answers and takes the login: the database itself is missing (or closed).
    advice = (
        f'create it (createdb "{url.database}"), or set MNESTOMA_TEST_PG_ADMIN_URL to a '
        "database the tests may use"
    )
    if not create:
        return f"PostgreSQL answers, but not with the database of {shown}: {failure}; {advice}"
    eng = create_engine(maintenance, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with eng.connect() as conn:
            quoted = conn.dialect.identifier_preparer.quote(url.database or "")
            conn.execute(text(f"CREATE DATABASE {quoted}"))
    except Exception as err:  # a worker that created it first, or a role without CREATEDB
        created = str(getattr(err, "orig", None) or err).strip().splitlines()[:1]
    else:
        created = []
    finally:
        eng.dispose()
    failure = _connect_error(url)
    if failure is None:
        return None
    why = f" (creating it failed: {created[0]})" if created else ""
    return f"PostgreSQL answers, but not with the database of {shown}: {failure}{why}; {advice}"


def postgresql_available() -> bool:
    """True when the test server can be used (see :func:`postgresql_problem`); cached for
    the session."""
    if not _pg_problem:
        _pg_problem.append(postgresql_problem())
    return _pg_problem[0] is None


def require_postgresql() -> None:
    """Skip (or, in CI, fail) the calling test when PostgreSQL cannot be used, saying why."""
    if postgresql_available():
        return
    msg = f"{_pg_problem[0]}"
    if REQUIRE_PG:
        pytest.fail(msg + " (MNESTOMA_REQUIRE_POSTGRESQL is set)", pytrace=False)
    pytest.skip(msg)


def create_pg_database(prefix: str = "mnestoma_test") -> URL:
    """Create an empty throwaway database and return its URL."""
    require_postgresql()
    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(PG_ADMIN_URL).set(database=name)


def drop_pg_database(url: URL, *, later: bool = False) -> None:
    """Drop a throwaway database, ending any session still connected to it.

    ``later``: hand the drop to this process's dropper thread and return at once. Each DROP
    DATABASE waits for a checkpoint, which syncs every file the server created since the
    last one (the suite's other databases among them: 15,000 to 24,000 files, 20 to 27 s
    on this kind of disk while the suite runs); a fixture's teardown need not wait for it.
    The dropper is drained when the session ends (:func:`pytest_sessionfinish`)."""
    if later:
        _dropper().put(url)
        return
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        # FORCE: the server ends the sessions still connected to it first
        conn.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
    admin.dispose()


class _Dropper:
    """One thread that drops the databases handed to it, one after the other."""

    def __init__(self) -> None:
        self.queue: queue.Queue[URL | None] = queue.Queue()
        self.failures: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name="drop-databases", daemon=True)
        self.thread.start()

    def put(self, url: URL) -> None:
        self.queue.put(url)

    def _run(self) -> None:
        while (url := self.queue.get()) is not None:
            try:
                drop_pg_database(url)
            except Exception as err:  # reported when the session ends
                self.failures.append(err)

    def drain(self) -> None:
        """Drop what is left, and stop."""
        self.queue.put(None)
        self.thread.join()


_DROPPER: list[_Dropper] = []


def _dropper() -> _Dropper:
    if not _DROPPER:
        _DROPPER.append(_Dropper())
    return _DROPPER[0]


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers a core. The suite mostly waits (on the databases' commits,
    on the processes and servers its tests start, on timeouts by design), not on the CPU:
    two workers on two cores kept them 38 % busy, and four take seven eighths of the time."""
    return 2 * (os.cpu_count() or 1)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Drop the databases whose drop was left to the dropper (see :func:`drop_pg_database`)."""
    if _DROPPER:
        dropper = _DROPPER.pop()
        dropper.drain()
        if dropper.failures:
            raise RuntimeError(f"throwaway databases left behind: {dropper.failures!r}")


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once; tests get copies of it."""
    path = tmp_path_factory.mktemp("template") / "head.sqlite"
    engine = make_engine(f"sqlite:///{path}")
    mnestoma.upgrade(engine)
    engine.dispose()  # the last connection to close checkpoints the WAL into the file
    assert not path.with_name(path.name + "-wal").exists()
    return path


@pytest.fixture(scope="session")
def _pg_head_database() -> Iterator[URL | None]:
    """One PostgreSQL database migrated to head for the session (tables emptied per test)."""
    if not postgresql_available():
        yield None
        return
    url = create_pg_database()
    mnestoma.upgrade(url.render_as_string(hide_password=False))
    yield url
    drop_pg_database(url, later=True)


# Sequences owned by the store's tables, each set back to its first value: a table with no
# page kept its sequence's place all the same when an insert failed before writing its row.
_RESTART_SEQUENCES = text(
    "SELECT setval(s.seqrelid, s.seqstart, false) FROM pg_depend d"
    " JOIN pg_sequence s ON s.seqrelid = d.objid"
    " WHERE d.classid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')"
    " AND d.refobjid = ANY(CAST(:tables AS regclass[]))"
)
# The tables with pages; of a partitioned table (events), which holds no page itself, the
# leaves with pages: truncating the partitioned table would give each of its leaves (a dozen
# on a new store, each with its indexes) a new file, where a test writes to one or two.
# (No foreign key refers to a table of the store: a table truncates on its own.)
_WRITTEN_TABLES = text(
    "SELECT t FROM unnest(CAST(:tables AS text[])) AS t WHERE pg_relation_size(t) > 0"
    " UNION ALL SELECT p.relid::regclass::text"
    " FROM unnest(CAST(:tables AS text[])) AS t, pg_partition_tree(CAST(t AS regclass)) AS p"
    " WHERE p.isleaf AND p.level > 0 AND pg_relation_size(p.relid) > 0"
)


@functools.cache
def _reset_engine(url: URL) -> Engine:
    """One engine per database for the resets; no connection is kept between them (tests
    wait for every other session of their database to end)."""
    return create_engine(url, poolclass=NullPool)


def _reset_pg(url: URL) -> None:
    """Empty the shared PostgreSQL store and put its schema stamp back at head.

    As a ``TRUNCATE ... RESTART IDENTITY`` of every table, but a table (or partition) that
    has no page (no test wrote to it since its last truncation) is left out: most tests
    write to one or two tables, and each truncation costs a new file and its commit (20 ms
    against 105 ms for a passing's two tables, ``events`` truncated whole).
    """
    # event_turn_edges too (PostgreSQL's, kept by triggers on events): truncating events'
    # leaves one by one does not fire the trigger that truncating events whole would.
    tables = {"tables": [*TABLES, "event_turn_edges"]}
    with _reset_engine(url).begin() as conn:
        left = _sessions_left(conn)
        written = list(conn.execute(_WRITTEN_TABLES, tables).scalars())
        if written:
            conn.execute(text("TRUNCATE " + ", ".join(written) + " RESTART IDENTITY"))
        conn.execute(_RESTART_SEQUENCES, tables)
        conn.execute(
            text(
                "UPDATE mnestoma_alembic_version SET version_num = :head WHERE version_num <> :head"
            ),
            {"head": mnestoma.head_revision()},
        )
    if left:
        pytest.fail(
            f"{left} PostgreSQL session(s) of the worker's store outlived the test before this"
            f" one ({_last_test[0]}): dispose the engines a test makes (plain_engine has no"
            " pool), close the facades and proxies it starts",
            pytrace=False,
        )


# Seconds the reset waits for the sessions of the test before to end by themselves: a
# client's server process leaves pg_stat_activity shortly after the client has gone.
LEFT_SESSION_GRACE_S = 5.0
# The test that ended last in this worker (for the reset that follows to name it).
_last_test = [""]


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """Note which test ended last, for :func:`_sessions_left` to name."""
    _last_test[0] = nodeid


def _sessions_left(conn: Connection) -> int:
    """How many other sessions of the store outlived the test before by
    :data:`LEFT_SESSION_GRACE_S` (they are ended: they would hold locks, and hold every test
    that waits for the other sessions of its database to end). Every leak found so far was a
    test's engine never disposed, a proxy's socket left open, or the package's own (a kept
    connection of a disposed pool, closed now); the reset fails the next test, naming the
    test before, so that a new one is found at once."""
    others = other_sessions_after(conn, LEFT_SESSION_GRACE_S)
    if others:
        conn.execute(END_OTHER_SESSIONS)
    return others


@pytest.fixture(scope="module", params=ENGINES)
def module_store_url(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    _sqlite_template: Path,
) -> Iterator[str]:
    """A store at head that one test module shares, on each engine (dropped after it)."""
    prefix = "mnestoma_" + request.module.__name__.rpartition(".")[2].removeprefix("test_")
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp(prefix) / "store.sqlite"
        shutil.copy(_sqlite_template, path)
        yield f"sqlite:///{path}"
        return
    pg = create_pg_database(prefix[:30])
    try:
        url = pg.render_as_string(hide_password=False)
        mnestoma.upgrade(url)
        yield url
    finally:
        drop_pg_database(pg, later=True)


@pytest.fixture(params=ENGINES)
def engine_name(request: pytest.FixtureRequest) -> str:
    """The engine a parametrised test runs on."""
    if request.param == "postgresql":
        require_postgresql()
    return request.param


@pytest.fixture
def store_url(
    engine_name: str,
    tmp_path: Path,
    _sqlite_template: Path,
    request: pytest.FixtureRequest,
) -> Iterator[str]:
    """The URL of an empty store at head, on each engine."""
    if engine_name == "sqlite":
        path = tmp_path / "store.sqlite"
        shutil.copy(_sqlite_template, path)
        yield f"sqlite:///{path}"
        return
    url: URL | None = request.getfixturevalue("_pg_head_database")
    assert url is not None
    _reset_pg(url)
    yield url.render_as_string(hide_password=False)


@pytest.fixture
def empty_db_url(engine_name: str, tmp_path: Path) -> Iterator[str]:
    """The URL of a brand-new empty database (no schema), on each engine."""
    if engine_name == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.sqlite'}"
        return
    url = create_pg_database("mnestoma_empty")
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        drop_pg_database(url, later=True)


@pytest.fixture
def clock() -> MovableClock:
    """A movable clock starting at 2026-01-01 12:00 UTC."""
    return MovableClock()


@pytest.fixture
def store(store_url: str, clock: MovableClock) -> Iterator[mnestoma.Mnestoma]:
    """The facade on an empty store at head, driven by ``clock``."""
    m = mnestoma.Mnestoma(store_url, clock=clock)
    yield m
    m.close()


@pytest.fixture
def pg_store_url(request: pytest.FixtureRequest) -> str:
    """An empty store at head on PostgreSQL only (for rules that only PostgreSQL has)."""
    require_postgresql()
    url: URL | None = request.getfixturevalue("_pg_head_database")
    assert url is not None
    _reset_pg(url)
    return url.render_as_string(hide_password=False)


@pytest.fixture
def pg_empty_db_url() -> Iterator[str]:
    """A brand-new empty PostgreSQL database (no schema)."""
    url = create_pg_database("mnestoma_empty")
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        drop_pg_database(url, later=True)


def mnest_row(when: datetime, **values: Any) -> dict[str, Any]:
    """A ``mnests`` row as plain values: an active edge a@1 -> b@1 of weight 0.5, used once,
    every timestamp ``when``, the default decay; ``values`` replace any of them."""
    row: dict[str, Any] = {
        "id": new_mnest_id(),
        "src_executor": "a",
        "src_version": "1",
        "dst_executor": "b",
        "dst_version": "1",
        "weight": 0.5,
        "uses": 1,
        "ts_first": when,
        "ts_last": when,
        "ts_weight": when,
        "decay_lambda": DEFAULT_DECAY_LAMBDA,
        "state": "active",
    }
    return row | values


@contextlib.contextmanager
def package_engine(url: str | URL) -> Iterator[Engine]:
    """The package's engine for ``url`` (``make_engine``), disposed when the block ends."""
    engine = make_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


# --- markers: `-m "not postgresql"` and `-m "not slow"` select what they say ----------------

PG_FIXTURES = frozenset({"pg_store_url", "pg_empty_db_url", "_pg_head_database"})
PG_CALLS = re.compile(r"\b(require_postgresql|create_pg_database)\(")
SPAWNS = re.compile(
    r"\bsubprocess\.|\bPopen\(|\.Process\(|\bProcessPoolExecutor\b|\brunpytest_subprocess\("
)
_SEARCH_DEPTH = 3  # test -> helper -> helper's helper


@functools.cache
def _source(obj: object) -> str:
    try:
        return inspect.getsource(obj)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return ""


def _names(code: object) -> set[str]:
    """Global names a code object and the functions nested in it refer to."""
    names = set(getattr(code, "co_names", ()))
    for const in getattr(code, "co_consts", ()):
        if inspect.iscode(const):
            names |= _names(const)
    return names


@functools.cache
def _reaches(func: object, pattern: re.Pattern[str], depth: int = _SEARCH_DEPTH) -> bool:
    """True when ``func``, or a function of the suite it calls (to ``depth``), matches."""
    func = inspect.unwrap(func)  # type: ignore[arg-type]
    if pattern.search(_source(func)):
        return True
    code, scope = getattr(func, "__code__", None), getattr(func, "__globals__", {})
    if depth == 0 or code is None:
        return False
    for name in _names(code):
        helper = scope.get(name)
        if (
            inspect.isfunction(helper)
            and helper is not func
            and not helper.__module__.startswith(("mnestoma", "pytest", "_pytest"))
            and _reaches(helper, pattern, depth - 1)
        ):
            return True
    return False


def _names_postgresql(value: object) -> bool:
    if isinstance(value, str):
        return "postgresql" in re.findall(r"[a-z]+", value.lower())
    if isinstance(value, tuple | list):
        return any(_names_postgresql(v) for v in value)
    return False


def _direct_argnames(item: pytest.Item) -> set[str]:
    """Arguments parametrised on the test itself (not through a fixture's own params)."""
    names: set[str] = set()
    for mark in item.iter_markers("parametrize"):
        if mark.kwargs.get("indirect"):
            continue
        argnames = mark.args[0] if mark.args else mark.kwargs.get("argnames", ())
        if isinstance(argnames, str):
            argnames = argnames.split(",")
        names |= {n.strip() for n in argnames}
    return names


def _fixture_funcs(item: pytest.Item) -> list[object]:
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {}) if info is not None else {}
    return [d.func for name in item.fixturenames for d in defs.get(name, ())]


def _needs_postgresql(item: pytest.Item) -> bool:
    """The test runs against a PostgreSQL server (not merely renders PostgreSQL's SQL)."""
    if PG_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        direct = _direct_argnames(item)
        # engine_name, or a fixture of the suite parametrised over engines ("postgresql",
        # "sqlite->postgresql", ...); a test's own ``dialect`` parameter renders SQL only
        if any(_names_postgresql(v) for k, v in callspec.params.items() if k not in direct):
            return True
    func = getattr(item, "function", None)
    return func is not None and _reaches(func, PG_CALLS, depth=1)


def _spawns_processes(item: pytest.Item) -> bool:
    """The test (or a helper or fixture of the suite it uses) starts a process."""
    funcs = [getattr(item, "function", None), *_fixture_funcs(item)]
    return any(
        f is not None and getattr(f, "__module__", "").startswith(("test", "conftest"))
        and _reaches(f, SPAWNS)
        for f in funcs
    )  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every PostgreSQL test ``postgresql`` and every process-spawning test ``slow``.

    The marks follow from what a test uses (its parametrised engine, its fixtures, the
    helpers it calls), so a new test is marked without anybody remembering to.
    """
    for item in items:
        if _needs_postgresql(item):
            item.add_marker(pytest.mark.postgresql)
        if _spawns_processes(item):
            item.add_marker(pytest.mark.slow)
    # The longest tests first (those that start processes, then those on a server), so that
    # xdist's workers end together on short tests rather than one of them on a long one: with
    # --dist worksteal (addopts), an idle worker takes the later half of the longest queue.
    items.sort(key=_longest_first)


def _longest_first(item: pytest.Item) -> int:
    """0 for a test that starts processes, 1 for one on PostgreSQL, 2 for the rest."""
    if item.get_closest_marker("slow"):
        return 0
    return 1 if item.get_closest_marker("postgresql") else 2


@pytest.fixture(params=["sqlite->sqlite", "sqlite->postgresql", "postgresql->sqlite"])
def two_stores(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(source, target): empty stores at head on the engines the parameter names (for copies
    between stores, both ways across the engines)."""
    src_engine, dst_engine = request.param.split("->")
    pg = request.getfixturevalue("pg_store_url") if "postgresql" in request.param else None
    source = pg if src_engine == "postgresql" else f"sqlite:///{tmp_path / 'source.sqlite'}"
    target = pg if dst_engine == "postgresql" else f"sqlite:///{tmp_path / 'target.sqlite'}"
    assert source is not None and target is not None
    for url in (source, target):
        mnestoma.upgrade(url)
    return source, target
