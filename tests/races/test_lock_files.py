"""The files the package keeps beside a SQLite store (``<file>-writers.lock``,
``<file>-ager.lock``): opened without following a link, never waiting on a FIFO, used only
when they are regular files.

What is in their place otherwise decides what happens. The writers' file only lets waiting
writes say so to the ager: a write is never refused for it (it is said once in the log, and
the ager pauses between batches instead). The ager's file keeps runs one at a time: a run
refuses to start with a ``StoreError`` naming the file and what is wrong (exit 1).

Every run goes through a process of its own with a timeout, so that a test of a FIFO fails
instead of hanging. PostgreSQL keeps no file: the ager's lock is an advisory lock there.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from sqlalchemy import make_url
from warm_python import run_cli_warm

import mnestoma
from mnestoma import StoreError
from mnestoma.engines.locking import ENV_LOCK_TIMEOUT, open_beside_store, waiting_file

# A run that should end in a second or two; a FIFO that blocks it would block for ever.
RUN_TIMEOUT_S = 60
NOBODY = 65534


def cli(
    url: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``mnestoma --database-url url args`` in a process of its own, bounded in time (forked
    from an interpreter that has imported the package: ``warm_python``)."""
    return run_cli_warm(
        *args,
        "--database-url",
        url,
        cwd=tempfile.gettempdir(),
        timeout=RUN_TIMEOUT_S,
        env={**os.environ, **(env or {})},
    )


def sqlite_path(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///"))


def edges(url: str) -> list[tuple[Any, ...]]:
    """The store's rows of ``mnests`` and ``ager_runs``, read without the package."""
    return query(url, "SELECT * FROM mnests ORDER BY 1") + query(url, "SELECT * FROM ager_runs")


def uses(url: str) -> list[int]:
    return [row[0] for row in query(url, "SELECT uses FROM mnests")]


def ager_runs(url: str) -> int:
    return int(query(url, "SELECT count(*) FROM ager_runs")[0][0])


def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    raw = sqlite3.connect(sqlite_path(url))
    try:
        return raw.execute(sql).fetchall()
    finally:
        raw.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite store at head with one passing recorded."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with mnestoma.Mnestoma(url) as store:
        store.record_passing("plan", "1", "search", "1")
    for name in ("store.sqlite-writers.lock", "store.sqlite-ager.lock"):
        (tmp_path / name).unlink(missing_ok=True)
    return url


@pytest.fixture
def held_lock(sqlite_url: str) -> Iterator[str]:
    """The store's URL while another connection holds its write lock."""
    holder = sqlite3.connect(sqlite_path(sqlite_url), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield sqlite_url
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def plant(kind: str, at: Path, outside: Path) -> None:
    """Put something that is not a regular file at ``at``."""
    if kind == "fifo":
        os.mkfifo(at)
    elif kind == "symlink":
        os.symlink(outside, at)
    else:
        at.mkdir()


PLANTED = {"fifo": "FIFO", "symlink": "symbolic link", "directory": "directory"}


# --- <file>-writers.lock --------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_a_write_behind_a_held_lock_gives_up_on_time_whatever_is_in_place_of_the_writers_lock(
    held_lock: str, tmp_path: Path, kind: str
) -> None:
    """A FIFO there blocked such a write for ever in ``open()``, past its lock timeout."""
    outside = tmp_path / "outside" / "planted"
    outside.parent.mkdir()
    plant(kind, tmp_path / "store.sqlite-writers.lock", outside)
    proc = cli(held_lock, "record", "plan@1", "search@1", env={ENV_LOCK_TIMEOUT: "1"})
    assert proc.returncode == 1, proc.stderr
    assert "WriteLockTimeout" in proc.stderr or "write lock" in proc.stderr
    assert PLANTED[kind] in proc.stderr  # said once, in the log
    assert not outside.exists()  # a link is never followed, nothing is created through it


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_a_write_that_waited_is_done_whatever_is_in_place_of_the_writers_lock(
    sqlite_url: str, tmp_path: Path, kind: str
) -> None:
    """Once the lock is free the write that waited for it is done: the file is a courtesy."""
    plant(kind, tmp_path / "store.sqlite-writers.lock", tmp_path / "nowhere")
    holder = sqlite3.connect(sqlite_path(sqlite_url), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mnestoma",
                "record",
                "plan@1",
                "search@1",
                *("--database-url", sqlite_url),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO), ENV_LOCK_TIMEOUT: "30"},
        )
        time.sleep(1.5)  # the write is behind the lock by now
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    try:
        _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert uses(sqlite_url) == [2]
    assert not (tmp_path / "nowhere").exists()


def test_the_ager_runs_with_a_fifo_in_place_of_the_writers_lock(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Every ager run blocked for ever on such a FIFO; now it pauses between batches."""
    os.mkfifo(tmp_path / "store.sqlite-writers.lock")
    proc = cli(sqlite_url, "age")
    assert proc.returncode == 0, proc.stderr
    assert "FIFO" in proc.stderr


def test_a_link_in_place_of_the_writers_lock_is_not_followed(
    held_lock: str, tmp_path: Path
) -> None:
    """The link points at a file that exists: it is neither opened nor changed."""
    target = tmp_path / "outside.txt"
    target.write_text("theirs\n")
    target.chmod(0o600)
    os.symlink(target, tmp_path / "store.sqlite-writers.lock")
    with pytest.raises(StoreError, match="symbolic link"):
        os.close(open_beside_store(str(tmp_path / "store.sqlite-writers.lock"), "the file"))
    proc = cli(held_lock, "record", "plan@1", "search@1", env={ENV_LOCK_TIMEOUT: "0.5"})
    assert proc.returncode == 1
    assert target.read_text() == "theirs\n" and stat.S_IMODE(target.stat().st_mode) == 0o600


# --- <file>-ager.lock -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_the_ager_refuses_to_run_with_something_else_in_place_of_its_lock_file(
    sqlite_url: str, tmp_path: Path, kind: str
) -> None:
    """A clear error and exit 1, never a hang, a raw ``IsADirectoryError``, or a file
    created through a link; the store is left as it was, and writes still work."""
    outside = tmp_path / "outside" / "planted"
    outside.parent.mkdir()
    plant(kind, tmp_path / "store.sqlite-ager.lock", outside)
    before = edges(sqlite_url)
    proc = cli(sqlite_url, "age")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "store.sqlite-ager.lock" in proc.stderr and PLANTED[kind] in proc.stderr
    assert not any(raw in proc.stderr for raw in ("IsADirectoryError", "OSError", "Traceback"))
    assert not outside.exists()
    assert edges(sqlite_url) == before
    assert cli(sqlite_url, "record", "plan@1", "search@1").returncode == 0


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_apply_ager_raises_a_store_error_for_something_else_in_place_of_its_lock_file(
    sqlite_url: str, tmp_path: Path, kind: str
) -> None:
    if kind == "fifo":  # in this process: the FIFO must not block the test either
        os.mkfifo(tmp_path / "store.sqlite-ager.lock")
    else:
        plant(kind, tmp_path / "store.sqlite-ager.lock", tmp_path / "nowhere")
    with mnestoma.Mnestoma(sqlite_url) as store, pytest.raises(StoreError, match=PLANTED[kind]):
        store.apply_ager()
    assert ager_runs(sqlite_url) == 0  # refused before the run began
    assert not (tmp_path / "nowhere").exists()


def test_status_does_not_wait_on_a_fifo_in_place_of_the_ager_lock(
    sqlite_url: str, tmp_path: Path
) -> None:
    """With a run left unfinished, ``status`` looks whether a run holds the lock (it blocked
    for ever opening such a FIFO); it must not block to find out, and none can hold it."""

    def stop(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with mnestoma.Mnestoma(sqlite_url) as store, pytest.raises(KeyboardInterrupt):
        store.apply_ager(progress=stop)
    (tmp_path / "store.sqlite-ager.lock").unlink()
    os.mkfifo(tmp_path / "store.sqlite-ager.lock")
    proc = cli(sqlite_url, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    [unfinished] = json.loads(proc.stdout)["ager_runs"]["unfinished"]
    assert unfinished["running"] is False


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A folder every user can reach and write in, holding a store every user can write:
    a store two users' runs share. The ager ran once (as this user) and left its lock."""
    folder = Path(tempfile.mkdtemp(prefix="mnestoma-shared-"))
    folder.chmod(0o777)
    try:
        url = f"sqlite:///{folder / 'store.sqlite'}"
        with mnestoma.Mnestoma(url) as store:
            store.record_passing("plan", "1", "search", "1")
            store.apply_ager()  # every module a run needs is loaded before a fork below
        for path in folder.iterdir():
            path.chmod(0o666)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def as_another_user(work: Callable[[], object]) -> str:
    """``work()`` run as a user other than the owner of the files it meets, its outcome in
    words ("ok" or the error's type and text). Root reads any file whatever its mode, so as
    root it runs in a forked child that became ``nobody`` (the package is loaded already:
    that user cannot read the interpreter's own files here)."""
    if os.geteuid() != 0:
        return outcome(work)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(write, outcome(work).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, said
    return said


def outcome(work: Callable[[], object]) -> str:
    try:
        work()
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return "ok"


def run_ager(url: str) -> Callable[[], object]:
    def run() -> None:
        with mnestoma.Mnestoma(url) as store:
            store.apply_ager()

    return run


def record(url: str) -> Callable[[], object]:
    def run() -> None:
        with mnestoma.Mnestoma(url) as store:
            store.record_passing("plan", "1", "search", "1")

    return run


def test_an_ager_lock_this_user_cannot_open_is_a_store_error(shared_folder: Path) -> None:
    """Left unreadable by another user's run: a StoreError naming the file (exit 1 from
    ``mnestoma age``, see above), where a raw PermissionError came out; the store is left
    as it was and writes go on."""
    url = f"sqlite:///{shared_folder / 'store.sqlite'}"
    (shared_folder / "store.sqlite-ager.lock").chmod(0o000 if os.geteuid() != 0 else 0o600)
    before = edges(url)
    said = as_another_user(run_ager(url))
    assert said.startswith("StoreError: "), said
    assert "store.sqlite-ager.lock" in said and "Permission denied" in said
    assert edges(url) == before
    assert as_another_user(record(url)) == "ok"
    assert uses(url) == [2]


def test_an_ager_lock_another_users_run_left_readable_serves(shared_folder: Path) -> None:
    """Read-only is all ``flock`` needs: the 0644 lock file root's cron left does not stop a
    service user's run (it did: the file was opened for writing, PermissionError)."""
    if os.geteuid() != 0:
        pytest.skip("only root can leave a file that belongs to another user")
    url = f"sqlite:///{shared_folder / 'store.sqlite'}"
    (shared_folder / "store.sqlite-ager.lock").chmod(0o644)
    assert as_another_user(run_ager(url)) == "ok"
    assert ager_runs(url) == 2


def test_a_lock_file_that_cannot_be_created_is_a_store_error_saying_why(tmp_path: Path) -> None:
    """Where the file cannot be made (here under a regular file, which no user can)."""
    (tmp_path / "store.sqlite").touch()
    with pytest.raises(StoreError, match=r"cannot create it \(Not a directory\)"):
        open_beside_store(str(tmp_path / "store.sqlite" / "x-ager.lock"), "the ager's lock file")


# --- PostgreSQL ------------------------------------------------------------------------------


def test_postgresql_keeps_no_file_beside_the_store(
    pg_store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ager's lock is an advisory lock and waiting writes are seen in ``pg_stat_activity``:
    nothing here opens a file, so there is nothing to plant."""
    monkeypatch.chdir(tmp_path)
    assert waiting_file(make_url(pg_store_url)) is None
    with mnestoma.Mnestoma(pg_store_url) as store:
        store.record_passing("plan", "1", "search", "1")
        store.apply_ager()
    assert list(tmp_path.iterdir()) == []
