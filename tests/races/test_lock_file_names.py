"""The lock files beside a SQLite store are named after the file SQLite really opens: its
path with every link followed, and ``file:`` read as a URI only with ``uri=true`` (as
SQLAlchemy's drivers and SQLite read it). However a URL spells the store, its ager runs
wait for each other and its writers say they wait on one file."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import package_engine
from sqlalchemy import make_url

import mnestoma
from mnestoma.engines.locking import beside_store, store_files, waiting_file
from mnestoma.maintenance.ager import ager_run_lock

# How long a run that should wait is watched before the lock it waits for is released.
WATCH_S = 1.0
# How long a run that should not wait (or no longer waits) may take at most.
RUN_S = 30.0


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store at ``real/store.sqlite`` under ``tmp_path``, the working directory, beside a
    link to it (``link.sqlite``) and a link to its folder (``folder``)."""
    monkeypatch.chdir(tmp_path)
    real = tmp_path / "real" / "store.sqlite"
    real.parent.mkdir()
    mnestoma.upgrade(f"sqlite:///{real}")
    (tmp_path / "link.sqlite").symlink_to(real)
    (tmp_path / "folder").symlink_to(real.parent, target_is_directory=True)
    return real


def spellings(tmp: Path) -> dict[str, str]:
    """Other URLs of the store at ``real/store.sqlite`` (the working directory ``tmp``)."""
    return {
        "link-to-the-file": f"sqlite:///{tmp / 'link.sqlite'}",
        "link-to-its-folder": f"sqlite:///{tmp / 'folder' / 'store.sqlite'}",
        "dots": f"sqlite:///{tmp / 'real' / '..' / 'real' / '.' / 'store.sqlite'}",
        "relative": "sqlite:///real/store.sqlite",
        "relative-through-the-link": "sqlite:///link.sqlite",
        "uri": "sqlite:///file:real/store.sqlite?uri=true",
        "uri-absolute": f"sqlite:///file://{tmp / 'link.sqlite'}?uri=true&mode=rw",
        "uri-localhost": f"sqlite:///file://localhost{tmp / 'folder' / 'store.sqlite'}?uri=1",
    }


SPELLINGS = list(spellings(Path("/")))


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_spelling_of_a_store_names_the_lock_files_of_its_real_file(
    store: Path, spelling: str
) -> None:
    url = make_url(spellings(store.parent.parent)[spelling])
    real = str(store)
    assert beside_store(url, "-ager.lock") == real + "-ager.lock"
    assert waiting_file(url) == real + "-writers.lock"
    assert real + "-ager.lock" in store_files(url)


@contextmanager
def ager_lock_held(url: str) -> Iterator[None]:
    """The store's ager lock, held through ``url`` as a run holds it."""
    with package_engine(url) as engine, engine.connect() as conn, ager_run_lock(conn):
        yield


class AgerRun(threading.Thread):
    """One run of the ager through ``url``, in a thread."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with mnestoma.Mnestoma(self.url) as store:
                store.apply_ager()
        except BaseException as err:  # the test says it
            self.error = err


def ager_runs(url: str) -> int:
    """The runs of the ager the store at ``url`` (any spelling) has recorded."""
    with package_engine(url) as engine, engine.connect() as conn:
        return int(conn.exec_driver_sql("SELECT count(*) FROM ager_runs").scalar_one())


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_an_ager_run_under_another_name_waits_for_the_run_under_way(
    store: Path, spelling: str
) -> None:
    real = f"sqlite:///{store}"
    other = spellings(store.parent.parent)[spelling]
    with ager_lock_held(real):
        run = AgerRun(other)
        run.start()
        run.join(WATCH_S)
        assert run.is_alive(), f"the run through {other} did not wait for the one under way"
        assert ager_runs(real) == 0
    run.join(RUN_S)
    assert not run.is_alive() and run.error is None, run.error
    assert ager_runs(real) == 1


def test_a_file_name_without_uri_true_is_the_file_of_that_name(store: Path) -> None:
    """``sqlite:///file:store.sqlite`` opens the file named ``file:store.sqlite`` in the
    working directory: its lock files are beside that file, and the run under way on
    ``store.sqlite`` there does not hold it back; with ``uri=true`` it is ``store.sqlite``."""
    tmp = store.parent.parent
    plain = tmp / "store.sqlite"
    mnestoma.upgrade(f"sqlite:///{plain}")
    literal = "sqlite:///file:store.sqlite"
    mnestoma.upgrade(literal)
    assert (tmp / "file:store.sqlite").is_file()
    assert beside_store(make_url(literal), "-ager.lock") == str(tmp / "file:store.sqlite-ager.lock")
    with ager_lock_held(f"sqlite:///{plain}"):
        run = AgerRun(literal)
        run.start()
        run.join(RUN_S)
        assert not run.is_alive() and run.error is None, run.error
        assert (tmp / "file:store.sqlite-ager.lock").is_file()
        assert ager_runs(literal) == 1
        as_uri = AgerRun("sqlite:///file:store.sqlite?uri=true")
        as_uri.start()
        as_uri.join(WATCH_S)
        assert as_uri.is_alive(), "uri=true names store.sqlite: its run waits"
    as_uri.join(RUN_S)
    assert not as_uri.is_alive() and as_uri.error is None, as_uri.error
    assert ager_runs(f"sqlite:///{plain}") == 1
    assert ager_runs(literal) == 1
    held = {name for name in os.listdir(tmp) if name.endswith("-ager.lock")}
    assert held == {"file:store.sqlite-ager.lock", "store.sqlite-ager.lock"}
