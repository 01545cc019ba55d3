"""A PostgreSQL primary and a streaming replica of its own, for the tests of read replicas
and the scale benchmark (``benchmarks.scale``).

Built from the server's binaries (``initdb``, ``pg_ctl``, ``pg_basebackup -R``) on free
ports, with data directories in a temporary folder, run as the ``postgres`` user when the
suite runs as root (the server refuses to run as root). :func:`binaries_missing` says why
such a pair cannot be started here, for the tests to skip with that reason.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import create_engine, text

import mnestoma

TABLES = ("events", "canonical_query_log", "mnests", "ager_runs")
SERVER_USER = "postgres"


NEEDED = ("initdb", "pg_ctl", "pg_basebackup", "postgres")


def _bin_dir() -> Path | None:
    """The newest PostgreSQL server's binaries (/usr/lib/postgresql/*/bin), else the folder
    of pg_ctl on PATH."""
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]))
    for folder in reversed(dirs):
        if all((Path(folder) / name).exists() for name in NEEDED):
            return Path(folder)
    found = shutil.which("pg_ctl")
    return Path(found).parent if found else None


def binaries_missing() -> str | None:
    """Why a primary and replica cannot be started here; None when they can."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        return "no PostgreSQL server binaries (pg_ctl) on PATH or in /usr/lib/postgresql/*/bin"
    for name in NEEDED:
        if not (bin_dir / name).exists():
            return f"{name} is missing from {bin_dir}"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root and there is no {SERVER_USER!r} user to run the server as"
        if shutil.which("runuser") is None:
            return "running as root and runuser is missing"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """A primary and one streaming replica (hot standby), each on a free port."""

    def __init__(self) -> None:
        bin_dir = _bin_dir()
        assert bin_dir is not None
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="mnestoma-replication-"))
        self.primary_dir = self.root / "primary"
        self.replica_dir = self.root / "replica"
        self.primary_port = _free_port()
        self.replica_port = _free_port()
        self.as_root = os.geteuid() == 0
        self._frozen = False
        self._conninfo: str | None = None  # the replica's own, while it is cut off
        if self.as_root:
            entry = pwd.getpwnam(SERVER_USER)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.root.chmod(0o700)

    def url(self, port: int, database: str = "mnestoma") -> str:
        return f"postgresql+psycopg://{SERVER_USER}@127.0.0.1:{port}/{database}"

    @property
    def primary_url(self) -> str:
        return self.url(self.primary_port)

    @property
    def replica_url(self) -> str:
        return self.url(self.replica_port)

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if self.as_root:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def _options(self, port: int) -> str:
        return (
            f"-p {port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
            " -c full_page_writes=off -c shared_buffers=16MB -c max_connections=40"
            " -c hot_standby_feedback=on -c wal_level=replica -c max_wal_senders=4"
            " -c wal_retrieve_retry_interval=200ms"
        )

    def _start(self, data: Path, port: int) -> None:
        log = self.root / f"{data.name}.log"
        self._run(
            "pg_ctl", "-D", str(data), "-l", str(log), "-o", self._options(port), "-w", "start"
        )

    def start(self) -> None:
        """initdb, start the primary, create the store at head, base-backup and start the
        replica, and wait until it has replayed everything."""
        self._run(
            "initdb",
            "-D",
            str(self.primary_dir),
            "-U",
            SERVER_USER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        self._start(self.primary_dir, self.primary_port)
        admin = create_engine(self.url(self.primary_port, "postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("CREATE DATABASE mnestoma"))
        admin.dispose()
        mnestoma.upgrade(self.primary_url)
        self._run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary_port),
            "-U",
            SERVER_USER,
            "-D",
            str(self.replica_dir),
            "-R",
            "-X",
            "stream",
            "--no-sync",
            "-c",
            "fast",
        )
        self.start_replica()

    def start_replica(self) -> None:
        self._start(self.replica_dir, self.replica_port)
        self.wait_caught_up()

    def stop_replica(self) -> None:
        """Stop the replica at once (as a crash would)."""
        self._run("pg_ctl", "-D", str(self.replica_dir), "-m", "immediate", "-w", "stop")

    def replica_running(self) -> bool:
        return (self.replica_dir / "postmaster.pid").exists()

    def _replica_processes(self) -> list[int]:
        """The replica's postmaster and its children (each runs in a session of its own,
        so that no one process group holds them all)."""
        postmaster = int((self.replica_dir / "postmaster.pid").read_text().split()[0])
        children = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = (Path("/proc") / entry / "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                children.append(int(entry))
        return [postmaster, *children]

    def freeze_replica(self) -> None:
        """Stop every process of the replica (SIGSTOP), the postmaster first so that it
        starts no other: a server that hangs. Its kernel still accepts connections and
        acknowledges what its clients send, so only their own deadlines end their reads."""
        for pid in self._replica_processes():
            os.kill(pid, signal.SIGSTOP)
        self._frozen = True

    def thaw_replica(self) -> None:
        """Let the frozen replica run again (SIGCONT)."""
        for pid in reversed(self._replica_processes()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._frozen = False

    @contextlib.contextmanager
    def frozen_replica(self) -> Iterator[None]:
        """The replica frozen for the block, and running again after it."""
        self.freeze_replica()
        try:
            yield
        finally:
            self.thaw_replica()

    def cut_off_replica(self) -> None:
        """Cut the replica off from its primary: its WAL receiver connects to a port where
        nothing listens (it keeps trying, and failing). It still answers reads, and says it
        has replayed all it received."""
        engine = create_engine(self.replica_url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                if self._conninfo is None:
                    self._conninfo = conn.execute(text("SHOW primary_conninfo")).scalar_one()
                bad = f"host=127.0.0.1 port={_free_port()} user={SERVER_USER} connect_timeout=1"
                conn.execute(text(f"ALTER SYSTEM SET primary_conninfo = '{bad}'"))
                conn.execute(text("SELECT pg_reload_conf()"))
                deadline = time.monotonic() + 30
                while conn.execute(
                    text("SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'")
                ).scalar_one():
                    if time.monotonic() > deadline:
                        raise TimeoutError("the replica's WAL receiver still streams")
                    time.sleep(0.05)
        finally:
            engine.dispose()

    def reconnect_replica(self) -> None:
        """Undo :meth:`cut_off_replica`: the replica streams from its primary again (within
        wal_retrieve_retry_interval) and catches up."""
        if self._conninfo is None:
            return
        conninfo = self._conninfo.replace("'", "''")
        engine = create_engine(self.replica_url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(text(f"ALTER SYSTEM SET primary_conninfo = '{conninfo}'"))
                conn.execute(text("SELECT pg_reload_conf()"))
        finally:
            engine.dispose()
        self._conninfo = None
        self.wait_caught_up()

    def create_database(self, name: str) -> str:
        """A second database on the primary, with the store at head (the replica replays it
        too); its primary URL. Made once."""
        admin = create_engine(self.url(self.primary_port, "postgres"), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                exists = conn.execute(
                    text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}
                ).scalar()
                if not exists:
                    conn.execute(text(f'CREATE DATABASE "{name}"'))
        finally:
            admin.dispose()
        mnestoma.upgrade(self.url(self.primary_port, name))
        self.wait_caught_up()
        return self.url(self.primary_port, name)

    def _replica(self, sql: str) -> object:
        engine = create_engine(self.replica_url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                return conn.execute(text(sql)).scalar()
        finally:
            engine.dispose()

    def pause_replay(self) -> None:
        self._replica("SELECT pg_wal_replay_pause()")

    def resume_replay(self) -> None:
        self._replica("SELECT pg_wal_replay_resume()")

    def wait_caught_up(self, timeout: float = 30.0) -> None:
        """Wait until the replica has replayed the primary's WAL up to now."""
        engine = create_engine(self.primary_url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            target = conn.execute(text("SELECT pg_current_wal_lsn()::text")).scalar_one()
        engine.dispose()
        replica = create_engine(self.replica_url, isolation_level="AUTOCOMMIT")
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    with replica.connect() as conn:
                        behind = conn.execute(
                            text("SELECT pg_wal_lsn_diff(:t, pg_last_wal_replay_lsn()) > 0"),
                            {"t": target},
                        ).scalar_one()
                    if not behind:
                        return
                except Exception:  # still starting
                    if time.monotonic() > deadline:
                        raise
                if time.monotonic() > deadline:
                    raise TimeoutError("the replica did not catch up")
                time.sleep(0.05)
        finally:
            replica.dispose()

    def reset(self) -> None:
        """Empty the store (on the primary) and wait for the replica to have replayed it."""
        engine = create_engine(self.primary_url)
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE " + ", ".join(TABLES) + " RESTART IDENTITY"))
        engine.dispose()
        self.wait_caught_up()

    def stop(self) -> None:
        """Stop both servers and remove their data."""
        if self._frozen:
            self.thaw_replica()
        for data in (self.replica_dir, self.primary_dir):
            if (data / "postmaster.pid").exists():
                with contextlib.suppress(subprocess.CalledProcessError):
                    self._run("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
