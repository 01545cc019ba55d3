"""SQLite: the ager reads the WAL's size from its index (the ``-shm`` file) without ever
dropping the POSIX locks that SQLite's connections of the same process hold on it.

Closing any descriptor of a file drops every POSIX lock its process holds on that file. A
connection that lost its lock on the index lets the next process to connect take itself for
the first and reset the index under it: the process then dies of SIGBUS on a commit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sqlalchemy import text

import mnestoma
from mnestoma.engines import make_engine

# SQLite's "dead man switch" byte of the WAL index (unix VFS): each connection holds a
# shared lock on it; a process that can take it exclusively believes no one else is there.
_DMS_OFFSET = 128

_PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, int(sys.argv[2]))
except OSError:
    print("held")
else:
    print("free")
"""


def _index_lock_seen_from_another_process(shm: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(shm), str(_DMS_OFFSET)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_an_ager_run_keeps_the_processs_sqlite_locks_on_the_wal_index(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    mnestoma.upgrade(url)
    engine = make_engine(url)
    try:
        with engine.connect() as reader:  # a connection of this process, open throughout
            reader.execute(text("SELECT count(*) FROM mnests")).scalar_one()
            shm = tmp_path / "store.sqlite-shm"
            assert shm.exists()
            assert _index_lock_seen_from_another_process(shm) == "held"
            with mnestoma.Mnestoma(url) as store:
                store.record_passing("a", "1", "b", "1")
                store.apply_ager()
                store.apply_ager()
            assert _index_lock_seen_from_another_process(shm) == "held", (
                "the ager's run dropped this process's locks on the WAL index"
            )
    finally:
        engine.dispose()
