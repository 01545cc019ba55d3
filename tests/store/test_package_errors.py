"""Bad input through every door: no raw exception escapes, and a refused call writes nothing.

A door is anything a caller can hand a value to: the URL and engine functions, the facade,
the unit of work and repositories, the migration functions, ``copy_store`` and every
subcommand. Each table row names a door and a value the contract refuses; the expected
error is ``InvalidInput`` (exit status 2 on the command line, one line on stderr) or
another clear ``MnestomaError`` (exit 1). Where a store is involved the rows run on both
engines and ``dump_tables`` proves the database unchanged; where a URL is refused, the
working directory proves nothing was created.
"""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_kit import run
from click.testing import Result
from conftest import (
    PG_ADMIN_URL,
    REPO,
    require_postgresql,
)
from helpers_proc import run_python
from invariants import dump_tables, plain_engine
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

import mnestoma
from mnestoma import (
    CanonicalQueryRepository,
    InvalidInput,
    Mnestoma,
    MnestomaError,
    MnestRepository,
    NotFound,
    SchemaError,
    StoreError,
    UnitOfWork,
    make_engine,
    resolve_database_url,
)
from mnestoma.maintenance.copying import copy_store
from mnestoma.testing.clock import MovableClock

TOO_BIG = 2**63  # one past the largest integer both engines hold
DEEP_SIG = '{"a": ' + "[" * 10_000 + "]" * 10_000 + "}"

# Ids that cannot exist (ids are ``mn_`` and url-safe characters): refused on both engines.
IMPOSSIBLE_IDS: dict[str, str] = {
    "nul": "mn_a\x00b",
    "lone-surrogate": "mn_a\ud800",
    "invalid-utf8-from-argv": "mn_\udcff\udcfe",  # how Python decodes such bytes in argv
    "escape": "mn_a\x1b[31m",
    "c1-control": "mn_a\x85",
}


@pytest.fixture
def clean_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory and no store in the environment: a wrong fallback to the
    default store would create ``./.mnestoma/mnest.sqlite`` here."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for var in ("MNESTOMA_DATABASE_URL", "MNESTOMA_DB_PATH", "METNOS_WORKSPACE"):
        monkeypatch.delenv(var, raising=False)
    return cwd


def created_in(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# --- doors that take a URL: nothing may be created ---------------------------------------

UrlCall = Callable[[Path], Any]


def _valid(tmp: Path) -> str:
    return f"sqlite:///{tmp.parent / 'valid.sqlite'}"


URL_DOORS: dict[str, tuple[UrlCall, type[MnestomaError]]] = {
    "Mnestoma-int": (lambda t: Mnestoma(123), InvalidInput),  # type: ignore[arg-type]
    "Mnestoma-bytes": (lambda t: Mnestoma(b"sqlite:///x.sqlite"), InvalidInput),  # type: ignore[arg-type]
    "Mnestoma-empty": (lambda t: Mnestoma(""), InvalidInput),
    "Mnestoma-blank": (lambda t: Mnestoma("  \t"), InvalidInput),
    "Mnestoma-session": (lambda t: Mnestoma(Session()), InvalidInput),  # type: ignore[arg-type]
    "Mnestoma-unknown-driver": (
        lambda t: Mnestoma("postgresql+nosuchdriver://root@127.0.0.1/db"),
        InvalidInput,
    ),
    "Mnestoma-port-not-a-number": (lambda t: Mnestoma("postgresql://h:abc/db"), InvalidInput),
    "Mnestoma-mysql": (lambda t: Mnestoma("mysql://root@127.0.0.1/db"), InvalidInput),
    "Mnestoma-not-a-url": (lambda t: Mnestoma("just words"), InvalidInput),
    "Mnestoma-under-proc": (
        lambda t: Mnestoma("sqlite:////proc/mnestoma-no-such-dir/store.sqlite"),
        InvalidInput,
    ),
    "Mnestoma-proc-itself": (lambda t: Mnestoma("sqlite:////proc/store.sqlite"), StoreError),
    "make_engine-int": (lambda t: make_engine(123), InvalidInput),  # type: ignore[arg-type]
    "make_engine-empty": (lambda t: make_engine(""), InvalidInput),
    "make_engine-an-engine": (
        lambda t: make_engine(make_engine(_valid(t))),  # type: ignore[arg-type]
        InvalidInput,
    ),
    "make_engine-unknown-driver": (
        lambda t: make_engine("postgresql+nosuchdriver://root@127.0.0.1/db"),
        InvalidInput,
    ),
    "make_engine-unknown-option": (
        lambda t: make_engine(_valid(t), no_such_option=1),
        InvalidInput,
    ),
    "resolve_database_url-empty": (lambda t: resolve_database_url(""), InvalidInput),
    "resolve_database_url-list": (
        lambda t: resolve_database_url(["sqlite://"]),  # type: ignore[arg-type]
        InvalidInput,
    ),
    "upgrade-int": (lambda t: mnestoma.upgrade(123), InvalidInput),  # type: ignore[arg-type]
    "upgrade-empty": (lambda t: mnestoma.upgrade(""), InvalidInput),
    "current_revision-empty": (lambda t: mnestoma.current_revision(""), InvalidInput),
    "current_revision-unknown-driver": (
        lambda t: mnestoma.current_revision("sqlite+nosuchdriver:///x.sqlite"),
        InvalidInput,
    ),
    "copy_store-empty-target": (lambda t: copy_store(_valid(t), ""), InvalidInput),
    "copy_store-empty-source": (lambda t: copy_store("", _valid(t)), InvalidInput),
}


@pytest.mark.parametrize("door", sorted(URL_DOORS))
def test_a_url_door_refuses_bad_input_with_a_package_error_and_creates_nothing(
    clean_cwd: Path, door: str
) -> None:
    call, error = URL_DOORS[door]
    with pytest.raises(MnestomaError) as info:
        call(clean_cwd)
    assert isinstance(info.value, error), (type(info.value), info.value)
    assert str(info.value)
    assert created_in(clean_cwd) == []


def test_an_empty_url_is_refused_even_where_the_environment_names_a_store(
    clean_cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MNESTOMA_DATABASE_URL", f"sqlite:///{clean_cwd / 'env.sqlite'}")
    with pytest.raises(InvalidInput, match="empty"):
        Mnestoma("")
    assert resolve_database_url(None).database == str(clean_cwd / "env.sqlite")  # None: fallback
    assert created_in(clean_cwd) == []


# --- doors on a store: both engines, the database unchanged -------------------------------

Ids = dict[str, str]
StoreCall = Callable[[Mnestoma, Ids, str], Any]


def bound(call: Callable[[Mnestoma, str, Any], Any], value: Any) -> StoreCall:
    """A row's call with its bad value bound now (a lambda in a loop would see the last)."""
    return lambda m, i, u: call(m, u, value)


def _store_doors() -> list[tuple[str, StoreCall, type[MnestomaError]]]:
    rows: list[tuple[str, StoreCall, type[MnestomaError]]] = []

    def add(name: str, call: StoreCall, error: type[MnestomaError] = InvalidInput) -> None:
        rows.append((name, call, error))

    for label, bad in IMPOSSIBLE_IDS.items():
        add(f"get-{label}", bound(lambda m, u, b: m.get(b), bad))
        add(f"events-{label}", bound(lambda m, u, b: m.events(mnest_id=b), bad))
        add(
            f"transition_state-{label}", bound(lambda m, u, b: m.transition_state(b, "active"), bad)
        )
        add(f"promote-{label}", bound(lambda m, u, b: m.promote_proto_to_active(b, "2"), bad))
    for label, big in {"2**63": TOO_BIG, "10**30": 10**30, "10**5000": 10**5000}.items():
        add(
            f"recurring_protos-min_uses-{label}",
            bound(lambda m, u, b: m.recurring_protos(min_uses=b), big),
        )
        add(f"walk-max_depth-{label}", bound(lambda m, u, b: m.walk("a", max_depth=b), big))
        add(f"suggest_next-k-{label}", bound(lambda m, u, b: m.suggest_next("a", k=b), big))
        add(f"edges-limit-{label}", bound(lambda m, u, b: m.edges(limit=b), big))
        add(f"events-limit-{label}", bound(lambda m, u, b: m.events(limit=b), big))
        add(f"top_queries-limit-{label}", bound(lambda m, u, b: m.top_queries(limit=b), big))
        add(f"recent_queries-limit-{label}", bound(lambda m, u, b: m.recent_queries(limit=b), big))
    for label, rev in {"none": None, "empty": "", "int": 5, "nul": "00\x001"}.items():
        add(
            f"upgrade-revision-{label}", bound(lambda m, u, r: mnestoma.upgrade(u, revision=r), rev)
        )
        add(f"downgrade-revision-{label}", bound(lambda m, u, r: mnestoma.downgrade(u, r), rev))
    add("upgrade-unknown-revision", lambda m, i, u: mnestoma.upgrade(u, "nosuchrevision"))
    add("UnitOfWork-engine", lambda m, i, u: UnitOfWork(m.engine))  # type: ignore[arg-type]
    add("UnitOfWork-string", lambda m, i, u: UnitOfWork("x"))  # type: ignore[arg-type]
    add("UnitOfWork-session", lambda m, i, u: UnitOfWork(Session(m.engine)))  # type: ignore[arg-type]
    add("UnitOfWork-factory-of-junk", lambda m, i, u: UnitOfWork(lambda: "x").__enter__())  # type: ignore[arg-type,return-value]
    add("UnitOfWork.joining-none", lambda m, i, u: UnitOfWork.joining(None))  # type: ignore[arg-type]
    add("UnitOfWork.joining-engine", lambda m, i, u: UnitOfWork.joining(m.engine))  # type: ignore[arg-type]
    add("MnestRepository-string", lambda m, i, u: MnestRepository("x"))  # type: ignore[arg-type]
    add("MnestRepository-none", lambda m, i, u: MnestRepository(None))  # type: ignore[arg-type]
    add("MnestRepository-engine", lambda m, i, u: MnestRepository(m.engine))  # type: ignore[arg-type]
    add("CanonicalQueryRepository-string", lambda m, i, u: CanonicalQueryRepository("x"))  # type: ignore[arg-type]
    return rows


STORE_DOORS = _store_doors()


def _seed(store: Mnestoma) -> Ids:
    active = store.record_passing("a", "1", "b", "1", turn_id="t1")
    proto = store.record_passing("a", "1", "wish", dst_exists=False)
    store.log_canonical_query("Find X", "find x", turn_id="t1")
    return {"active": active.id, "proto": proto.id}


class Box:
    """One seeded store per engine for the whole table."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.store = Mnestoma(url, clock=MovableClock())
        self.ids = _seed(self.store)


@pytest.fixture(scope="module")
def box(module_store_url: str) -> Iterator[Box]:
    b = Box(module_store_url)
    yield b
    b.store.close()


@pytest.mark.parametrize(("door", "call", "error"), STORE_DOORS, ids=[r[0] for r in STORE_DOORS])
def test_a_store_door_refuses_bad_input_with_a_package_error_and_changes_nothing(
    box: Box, door: str, call: StoreCall, error: type[MnestomaError]
) -> None:
    before = dump_tables(box.url)
    with pytest.raises(MnestomaError) as info:
        call(box.store, box.ids, box.url)
    assert isinstance(info.value, error), (type(info.value), info.value)
    assert str(info.value)
    assert dump_tables(box.url) == before


@pytest.mark.parametrize("op", ["transition_state", "promote_proto_to_active"])
def test_a_not_found_message_shows_only_the_start_of_a_huge_id(box: Box, op: str) -> None:
    huge = "mn_" + "x" * 10_000_000
    with pytest.raises(NotFound) as info:
        getattr(box.store, op)(huge, "superseded" if op == "transition_state" else "2")
    assert len(str(info.value)) < 200
    assert "mn_xxx" in str(info.value) and "…" in str(info.value)


def test_an_unknown_ordinary_id_still_reads_as_nothing(box: Box) -> None:
    assert box.store.get("mn_doesnotexist0000") is None
    assert box.store.get("") is None
    assert box.store.events(mnest_id="mn_doesnotexist0000") == []


# --- the command line ----------------------------------------------------------------------


def assert_one_line_exit(result: Result, code: int) -> None:
    assert result.exit_code == code, (result.exit_code, result.output, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.output + result.stderr


CLI_STORE_DOORS: dict[str, list[str]] = {
    **{f"events-mnest-{k}": ["events", "--mnest", v] for k, v in IMPOSSIBLE_IDS.items()},
    **{f"transition-{k}": ["transition", v, "superseded"] for k, v in IMPOSSIBLE_IDS.items()},
    **{f"promote-{k}": ["promote", v, "2"] for k, v in IMPOSSIBLE_IDS.items()},
    "protos-min-uses-2**63": ["protos", "--min-uses", str(TOO_BIG)],
    "edges-limit-2**63": ["edges", "--limit", str(TOO_BIG)],
    "events-limit-2**63": ["events", "--limit", str(TOO_BIG)],
    "walk-depth-2**63": ["walk", "a", "--depth", str(TOO_BIG)],
    "suggest-k-2**63": ["suggest", "a", "-k", str(TOO_BIG)],
    "record-sig-nested-10000-deep": ["record", "--proto", "--sig", DEEP_SIG, "a@1", "wish"],
    "db-upgrade-empty-revision": ["db", "upgrade", ""],
    "db-upgrade-unknown-revision": ["db", "upgrade", "nosuchrevision"],
    "db-downgrade-empty-revision": ["db", "downgrade", ""],
    "copy-to-empty": ["copy", "--to", ""],
    "copy-to-blank": ["copy", "--to", "  "],
    "copy-from-empty": ["copy", "--from", "", "--to", "sqlite:///never.sqlite"],
}


@pytest.mark.parametrize("case", sorted(CLI_STORE_DOORS))
def test_bad_input_through_a_subcommand_exits_2_on_one_line_and_changes_nothing(
    box: Box, clean_cwd: Path, case: str
) -> None:
    before = dump_tables(box.url)
    result = run(*CLI_STORE_DOORS[case], "--database-url", box.url)
    assert_one_line_exit(result, 2)
    assert dump_tables(box.url) == before
    assert created_in(clean_cwd) == []


CLI_URL_DOORS: dict[str, list[str]] = {
    "empty-on-the-subcommand": ["record", "a@1", "b@1", "--database-url", ""],
    "empty-on-the-group": ["--database-url", "", "record", "a@1", "b@1"],
    "blank": ["edges", "--database-url", "   "],
    "empty-for-status": ["status", "--database-url", ""],
    "empty-for-db-upgrade": ["db", "upgrade", "--database-url", ""],
    "empty-for-demo": ["demo", "--database-url", ""],
    "unknown-driver": ["edges", "--database-url", "postgresql+nosuchdriver://root@h/db"],
    "port-not-a-number": ["record", "a@1", "b@1", "--database-url", "postgresql://h:abc/db"],
    "mysql": ["status", "--database-url", "mysql://root@h/db"],
    "under-proc": ["record", "a@1", "b@1", "--database-url", "sqlite:////proc/nope/s.sqlite"],
    "copy-to-empty-from-default": ["copy", "--to", ""],
}


@pytest.mark.parametrize("case", sorted(CLI_URL_DOORS))
def test_a_bad_url_on_the_command_line_exits_2_on_one_line_and_creates_nothing(
    clean_cwd: Path, case: str
) -> None:
    result = run(*CLI_URL_DOORS[case])
    assert_one_line_exit(result, 2)
    assert created_in(clean_cwd) == []


# --- a store written by a newer release ------------------------------------------------------

NEWER = "ffffffffffff"


def _stamp(url: str, revision: str) -> None:
    engine = plain_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE mnestoma_alembic_version SET version_num = :r"), {"r": revision})
    engine.dispose()


def test_upgrading_a_store_of_a_newer_release_says_upgrade_the_package(store_url: str) -> None:
    _stamp(store_url, NEWER)
    before = dump_tables(store_url)
    with pytest.raises(SchemaError, match="upgrade the mnestoma package") as info:
        mnestoma.upgrade(store_url)
    assert "Can't locate" not in str(info.value)
    for args in (["db", "upgrade"], ["db", "downgrade", "base"]):
        result = run(*args, "--database-url", store_url)
        assert_one_line_exit(result, 1)
        assert "upgrade the mnestoma package" in result.stderr
        assert "Can't locate" not in result.stderr
    assert dump_tables(store_url) == before


# --- missing extras ------------------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (a module blocked there stays blocked there)."""
    return run_python(textwrap.dedent(code), cwd=REPO)


def test_a_postgresql_url_without_psycopg_names_the_extra_to_install() -> None:
    done = _python(
        """
        import sys
        sys.modules["psycopg"] = None  # as if mnestoma[postgresql] were not installed
        import mnestoma
        from mnestoma.core.errors import MissingExtra
        try:
            mnestoma.Mnestoma("postgresql://root@127.0.0.1:5432/db")
        except MissingExtra as err:
            assert isinstance(err, ImportError) and isinstance(err, mnestoma.MnestomaError)
            print(err)
        """
    )
    assert done.returncode == 0, done.stderr
    assert 'pip install "mnestoma[postgresql]"' in done.stdout


def test_the_command_line_without_psycopg_names_the_extra_on_one_line() -> None:
    done = _python(
        """
        import sys
        sys.modules["psycopg"] = None
        from mnestoma.cli import main
        main(["edges", "--database-url", "postgresql://root@127.0.0.1:5432/db"])
        """
    )
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "mnestoma[postgresql]" in done.stderr


@pytest.mark.parametrize(
    ("blocked", "module", "error", "extra"),
    [
        (["factory"], "mnestoma.testing", "ImportError", "testing"),
        (
            ["opentelemetry", "opentelemetry.context"],
            "mnestoma.otel",
            "MissingExtra",
            "otel",
        ),
    ],
    ids=["the testing kit without factory_boy", "the otel processor without the SDK"],
)
def test_a_module_without_its_extras_package_names_the_extra(
    blocked: list[str], module: str, error: str, extra: str
) -> None:
    done = _python(
        f"""
        import sys
        for name in {blocked!r}:  # as if mnestoma[{extra}] were not installed
            sys.modules[name] = None
        from mnestoma.core.errors import MissingExtra
        try:
            import {module}
        except {error} as err:
            print(err)
        """
    )
    assert done.returncode == 0, done.stderr
    assert f"mnestoma[{extra}]" in done.stdout


def test_missing_extra_is_one_error_class_importable_from_errors_and_graph() -> None:
    from mnestoma.core.errors import MissingExtra
    from mnestoma.planner.graph import MissingExtra as FromGraph

    assert FromGraph is MissingExtra
    assert issubclass(MissingExtra, ImportError) and issubclass(MissingExtra, MnestomaError)


# --- the driver's second stderr line ---------------------------------------------------------


def test_a_failure_inside_a_psycopg_pipeline_prints_one_stderr_line(
    tmp_path: Path, _sqlite_template: Path
) -> None:
    """psycopg logs "error ignored terminating <psycopg.Pipeline ...>" when a block that
    holds a pipeline (an executemany) fails and the pipeline's own sync fails too: seen on
    PostgreSQL failures of ``copy`` and writes, depending on timing. Here the command's work
    fails inside a pipeline deterministically; stderr keeps the command's one line."""
    require_postgresql()
    store = tmp_path / "store.sqlite"
    shutil.copy(_sqlite_template, store)
    server = make_url(PG_ADMIN_URL).set(drivername="postgresql")
    done = _python(
        f"""
        import psycopg
        import mnestoma
        from mnestoma import cli

        def edges_failing_in_a_pipeline(self, **kwargs):
            with psycopg.connect({server.render_as_string(hide_password=False)!r}) as conn:
                with conn.pipeline():
                    conn.execute("SELECT 1/0")
                    raise mnestoma.StoreError("database error: division by zero")

        cli.Mnestoma.edges = edges_failing_in_a_pipeline
        cli.main(["edges", "--database-url", {f"sqlite:///{store}"!r}])
        """
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == ["Error: database error: division by zero"]
