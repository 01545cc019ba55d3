"""Writers' latency while the store maintains itself, measured open loop.

``python -m benchmarks.writer_latency [--engines sqlite,postgresql] [--sizes N,N]
[--quick] [--writers W] [--period-ms MS] [--phases idle,ager,disk,retention,upgrade]
[--from-revision REV] [--postgresql URL] [--json FILE] [...]``

``W`` writer threads (4 by default) each have a call due every ``period`` (10 ms); a call
records a passing through the public API (``Mnestoma.record_passing``) on an active edge of
the store, one the maintenance touches. A call's latency counts from when it was *due*, not
from when it started: a writer stalled behind a lock runs the calls it missed as soon as it
can, and each of them counts its whole wait (no coordinated omission). For each phase, the
calls due while the maintenance ran (or during the idle window) give p50 / p99 / max and
the errors by type:

- ``idle``: the writers alone;
- ``ager``: during ``Mnestoma.apply_ager()``, at a clock ``--ager-days`` past the data's
  anchors, so that the ager decays, demotes and merges a good share of the rows;
- ``disk`` (only when asked for, with ``idle`` and ``ager``): during a plain file writer
  that writes, in the work folder, as many bytes as the ager made its disk write (beyond
  the writers' own, measured in ``idle``) at the ager's pace: what the disk alone does to
  the writers' commits, with no lock and no database work. Linux only (it reads
  ``/proc/diskstats``); it means something only when the work folder is on the database's
  disk (``--workdir``);
- ``retention``: during ``Mnestoma.prune_events(before)``, which deletes the events loaded
  with the store (about 9 in 10 of them; each live row keeps its ``created`` event);
- ``drop`` (PostgreSQL only, when asked for): ``Mnestoma.prune_events(before)`` on a store
  whose events are spread evenly over twelve monthly partitions (each row's ``created``
  event in the first), ``before`` in the middle: the older half goes as whole partitions
  dropped, each live row's ``created`` event kept; the writers' clock is past the twelve
  months. The database's size before and after is reported;
- ``upgrade`` (PostgreSQL only): ``mnestoma.upgrade(url)`` from revision 0002 (or
  ``--from-revision``) to head on a
  store of N mnests and ``--events-per-row`` × N events, while writers "of the previous
  version" run raw SQL valid on both schemas (``UPDATE mnests`` + ``INSERT INTO events`` in
  one transaction).

The maintenance runs in a process of its own (``--maintenance-in process``, the default), as
a cron job or an operator would run it beside the service; ``thread`` runs it in this
process (quicker to start; the writers then share the GIL with it).

Each (engine, size) builds one store and reuses it for idle, ager and retention, in that
order; the upgrade gets a store of its own at 0002. SQLite files go in a temporary folder
(``--workdir``); PostgreSQL databases are created on the server of ``--postgresql`` and
dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from .data import NOW, PostgresServer, SqliteFiles
from .run import AGER_SHAPES, _fmt, _machine, _table

__all__ = [
    "DEFAULT_POSTGRESQL",
    "OPTIONAL_PHASES",
    "PHASES",
    "QUICK",
    "Call",
    "Maintenance",
    "OpenLoop",
    "Outcome",
    "PhaseResult",
    "RunningClock",
    "Settings",
    "Window",
    "disk_written",
    "error_name",
    "format_table",
    "main",
    "measure",
    "percentile",
    "run",
    "run_engine",
    "summarize",
    "timeline",
    "writer_loop",
]

PHASES = ("idle", "ager", "retention", "upgrade")  # what a run measures unless told
OPTIONAL_PHASES = ("disk", "drop")  # measured only when asked for
ENGINES = ("sqlite", "postgresql")
SIZES = (300_000, 1_000_000)
QUICK_SIZES = (5_000,)
DEFAULT_POSTGRESQL = os.environ.get(
    "MNESTOMA_TEST_PG_ADMIN_URL", "postgresql+psycopg://root@127.0.0.1:5432/test"
)
OLD_REVISION = "0002"  # the upgrade phase's starting point


@dataclass(frozen=True)
class Settings:
    """How the writers write and how long each phase lasts."""

    writers: int = 4
    period_s: float = 0.010
    idle_s: float = 5.0  # the idle phase's window
    lead_s: float = 1.0  # writers alone before the window (warm pool, steady pace)
    tail_s: float = 0.5  # writers go on after the maintenance ends (they catch up)
    shape: str = "mixed"
    ager_days: float = 30.0
    events_per_row: int = 10
    event_turns: bool = False  # the loaded reinforced events carry a turn id each
    edges_per_writer: int = 500
    lock_timeout: float | None = None  # upgrade's; None: the package's default
    from_revision: str = OLD_REVISION  # where the upgrade phase starts
    maintenance_in: str = "process"
    phases: tuple[str, ...] = PHASES


QUICK = Settings(idle_s=1.0, lead_s=0.3, tail_s=0.2, edges_per_writer=100)


# --- the open loop --------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One writer call: when it was due, how long after that it ended, its error if any."""

    writer: int
    due: float  # clock seconds (time.monotonic by default)
    latency: float  # seconds from ``due`` to the end of the call
    error: str | None = None


def error_name(err: BaseException) -> str:
    """The type of an error, with the driver's error it wraps: ``OperationalError``
    around psycopg's ``DeadlockDetected`` is ``OperationalError(DeadlockDetected)``."""
    name = type(err).__name__
    inner = getattr(err, "orig", None) or err.__cause__
    if inner is not None and type(inner).__name__ != name:
        return f"{name}({type(inner).__name__})"
    return name


def writer_loop(
    writer: int,
    call: Callable[[int, int], object],
    *,
    start: float,
    period: float,
    until: Callable[[], float],
    record: Callable[[Call], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """One open-loop writer: call ``k`` is due at ``start + k × period`` and runs then, or
    at once when the writer is late (after a stalled call, every call it missed runs in a
    row, each counting from its own due time). Stops before the first call due at or after
    ``until()``, a limit that may move (it is read before each call)."""
    k = 0
    while True:
        due = start + k * period
        if due >= until():
            return
        wait = due - clock()
        if wait > 0:
            sleep(wait)
            if due >= until():
                return
        error = None
        try:
            call(writer, k)
        except Exception as err:  # every failure is a figure, whatever its kind
            error = error_name(err)
        record(Call(writer, due, clock() - due, error))
        k += 1


class OpenLoop:
    """``writers`` threads, each running :func:`writer_loop` on ``call(writer, k)``; their
    schedules staggered across one period."""

    def __init__(
        self,
        call: Callable[[int, int], object],
        writers: int,
        period: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if writers < 1 or period <= 0:
            raise ValueError("writers ≥ 1 and period > 0")
        self.call, self.writers, self.period, self.clock = call, writers, period, clock
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._until = math.inf
        self._threads: list[threading.Thread] = []

    def _record(self, c: Call) -> None:
        with self._lock:
            self.calls.append(c)

    def _limit(self) -> float:
        return self._until

    def start(self) -> float:
        """Start the writers; returns when the first call is due."""
        t0 = self.clock() + 0.01
        for i in range(self.writers):
            kwargs = {
                "start": t0 + i * self.period / self.writers,
                "period": self.period,
                "until": self._limit,
                "record": self._record,
                "clock": self.clock,
            }
            t = threading.Thread(
                target=writer_loop, args=(i, self.call), kwargs=kwargs, daemon=True
            )
            self._threads.append(t)
            t.start()
        return t0

    def stop(self, until: float, timeout: float = 900.0) -> list[Call]:
        """Let the writers run every call due before ``until``, then end; all calls made."""
        self._until = until
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            raise RuntimeError(f"a writer is still in a call {timeout:g} s after the stop")
        with self._lock:
            return list(self.calls)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q``-quantile (0 < q ≤ 1) of sorted ``values``; None when empty."""
    if not values:
        return None
    rank = max(1, math.ceil(q * len(values)))
    return values[min(rank, len(values)) - 1]


@dataclass
class Window:
    """The calls due in one window: their number, latencies (ms) and errors by type."""

    calls: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    errors: dict[str, int]
    lo: float | None = None  # the window, on the writers' clock (None: unbounded)
    hi: float | None = None

    @property
    def error_count(self) -> int:
        """All errors, whatever their type."""
        return sum(self.errors.values())


def summarize(calls: Sequence[Call], lo: float = -math.inf, hi: float = math.inf) -> Window:
    """The calls due in ``[lo, hi)``: p50 / p99 / max latency in ms, errors by type."""
    chosen = [c for c in calls if lo <= c.due < hi]
    lat = sorted(c.latency * 1e3 for c in chosen)
    errors = Counter(c.error for c in chosen if c.error is not None)
    return Window(
        len(chosen),
        percentile(lat, 0.50),
        percentile(lat, 0.99),
        lat[-1] if lat else None,
        dict(sorted(errors.items())),
        lo if math.isfinite(lo) else None,
        hi if math.isfinite(hi) else None,
    )


TIMELINE_STEP_S = 0.25


def timeline(
    calls: Sequence[Call], origin: float, step: float = TIMELINE_STEP_S
) -> list[tuple[float, int, float]]:
    """Per ``step`` of due times from ``origin`` (negative: before it): the step's start
    (s), the calls due in it, their longest latency (ms). Shows when in a run writers
    waited."""
    buckets: dict[int, list[float]] = {}
    for c in calls:
        buckets.setdefault(math.floor((c.due - origin) / step), []).append(c.latency)
    return [
        (round(b * step, 3), len(v), round(max(v) * 1e3, 2)) for b, v in sorted(buckets.items())
    ]


# --- maintenance, in a process of its own or in this thread ---------------------------------


@dataclass(frozen=True)
class RunningClock:
    """A clock that reads ``base`` at the monotonic instant ``mono0`` and runs in real time
    from there: the writers and the maintenance (even in another process: the monotonic
    clock is the system's) share it."""

    base: datetime
    mono0: float

    def __call__(self) -> datetime:
        return self.base + timedelta(seconds=time.monotonic() - self.mono0)


def _prepare_ager(url: str, clock: RunningClock) -> Callable[[], Any]:
    import mnestoma

    store = mnestoma.Mnestoma(url, clock=clock)
    store.suggest_next("warm-up")  # connection, pragmas and statements before the run

    def run() -> Any:
        try:
            return asdict(store.apply_ager())
        finally:
            store.close()

    return run


def _prepare_retention(url: str, before: datetime) -> Callable[[], Any]:
    import mnestoma

    store = mnestoma.Mnestoma(url)
    store.suggest_next("warm-up")

    def run() -> Any:
        try:
            return {"deleted": store.prune_events(before)}
        finally:
            store.close()

    return run


def _prepare_upgrade(url: str, lock_timeout: float | None) -> Callable[[], Any]:
    import mnestoma
    from mnestoma.maintenance.migration import current_revision

    before = current_revision(url)

    def run() -> Any:
        mnestoma.upgrade(url, lock_timeout=lock_timeout)
        return {"from": before, "to": current_revision(url)}

    return run


def _prepare_sleep(seconds: float) -> Callable[[], Any]:
    def run() -> Any:
        time.sleep(seconds)
        return {"slept": seconds}

    return run


DISK_CHUNK = 256 * 1024  # the plain writer's writes, as a backend hands its pages to the disk
DISK_SYNC_EVERY = 4  # chunks between two fdatasync calls


def _prepare_disk(folder: str, nbytes: int, seconds: float) -> Callable[[], Any]:
    """A plain file writer: ``nbytes`` into a new file in ``folder``, in chunks spread
    evenly over ``seconds``, synced every :data:`DISK_SYNC_EVERY` chunks; the file is removed
    at the end."""

    def run() -> Any:
        chunks = max(1, -(-nbytes // DISK_CHUNK))
        block = os.urandom(DISK_CHUNK)
        fd, path = tempfile.mkstemp(prefix="disk-", dir=folder)
        start = time.monotonic()
        try:
            for i in range(chunks):
                time.sleep(max(0.0, start + seconds * i / chunks - time.monotonic()))
                os.write(fd, block)
                if (i + 1) % DISK_SYNC_EVERY == 0 or i + 1 == chunks:
                    os.fdatasync(fd)
        finally:
            os.close(fd)
            os.unlink(path)
        return {"written_mb": round(chunks * DISK_CHUNK / 1e6, 1), "paced_s": round(seconds, 2)}

    return run


def disk_written(path: str | Path) -> int | None:
    """Bytes the disk holding ``path`` has written since the machine started, from
    ``/proc/diskstats`` (sectors of 512 bytes); None where there is no such file or line."""
    st = os.stat(path)
    key = (os.major(st.st_dev), os.minor(st.st_dev))
    try:
        lines = Path("/proc/diskstats").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        f = line.split()
        if len(f) > 9 and (int(f[0]), int(f[1])) == key:
            return int(f[9]) * 512
    return None


JOBS: dict[str, Callable[..., Callable[[], Any]]] = {
    "ager": _prepare_ager,
    "disk": _prepare_disk,
    "retention": _prepare_retention,
    "upgrade": _prepare_upgrade,
    "sleep": _prepare_sleep,
}


@dataclass
class Outcome:
    """When a maintenance job ran (monotonic seconds), what it returned or how it failed."""

    start: float
    end: float
    result: Any = None
    error: str | None = None

    @property
    def seconds(self) -> float:
        """How long it ran."""
        return self.end - self.start


def _timed(run: Callable[[], Any]) -> Outcome:
    start = time.monotonic()
    try:
        result, error = run(), None
    except Exception as err:  # the figure says the maintenance failed, and how
        result, error = None, f"{error_name(err)}: {err}"
    return Outcome(start, time.monotonic(), result, error)


def _child(conn: Any, job: str, kwargs: dict[str, Any]) -> None:
    """The maintenance process: prepare, say ready, wait for go, run, send the outcome."""
    try:
        run = JOBS[job](**kwargs)
    except Exception as err:
        conn.send(("failed", f"{error_name(err)}: {err}"))
        return
    conn.send(("ready", None))
    conn.recv()
    conn.send(("done", _timed(run)))


class Maintenance:
    """One maintenance job (:data:`JOBS`): :meth:`prepare` opens what it needs (and starts
    its process) before the writers start, :meth:`run` runs it and says when it ran."""

    def __init__(self, job: str, where: str = "process", **kwargs: Any) -> None:
        if job not in JOBS or where not in ("process", "thread"):
            raise ValueError(f"unknown job {job!r} or place {where!r}")
        self.job, self.where, self.kwargs = job, where, kwargs
        self._run: Callable[[], Any] | None = None
        self._proc: Any = None
        self._conn: Any = None

    def prepare(self) -> Maintenance:
        """Open the store (in its process when ``where`` is ``process``); returns self."""
        if self.where == "thread":
            self._run = JOBS[self.job](**self.kwargs)
            return self
        ctx = get_context("spawn")  # a clean process: no inherited connection, no fork hazard
        self._conn, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=_child, args=(theirs, self.job, self.kwargs))
        self._proc.start()
        theirs.close()
        kind, detail = self._conn.recv()
        if kind != "ready":
            self._proc.join()
            raise RuntimeError(f"the {self.job} process could not start: {detail}")
        return self

    def run(self) -> Outcome:
        """Run the job (prepared before) and wait for it."""
        if self.where == "thread":
            assert self._run is not None, "prepare() first"
            return _timed(self._run)
        assert self._conn is not None, "prepare() first"
        self._conn.send("go")
        kind, outcome = self._conn.recv()
        self._proc.join()
        self._conn.close()
        assert kind == "done"
        return outcome  # type: ignore[no-any-return]


def measure(
    call: Callable[[int, int], object],
    settings: Settings,
    maintenance: Maintenance | None = None,
) -> tuple[Window, Outcome | None, list[Call]]:
    """Run the writers; after ``lead_s``, the prepared maintenance (or, with none, an idle
    window of ``idle_s``); the writers go on ``tail_s`` after it. Returns the window of
    the calls due while it ran, its outcome, and every call made."""
    loop = OpenLoop(call, settings.writers, settings.period_s)
    t0 = loop.start()
    try:
        time.sleep(max(0.0, t0 + settings.lead_s - time.monotonic()))
        if maintenance is None:
            lo = time.monotonic()
            time.sleep(settings.idle_s)
            hi, outcome = time.monotonic(), None
        else:
            outcome = maintenance.run()
            lo, hi = outcome.start, outcome.end
    finally:
        calls = loop.stop(until=time.monotonic() + settings.tail_s)
    return summarize(calls, lo, hi), outcome, calls


def _disk_while(
    folder: Path, phase: Callable[[], tuple[Window, Outcome | None, list[Call]]]
) -> tuple[tuple[Window, Outcome | None, list[Call]], int | None, float]:
    """Run ``phase``; also what the disk holding ``folder`` wrote meanwhile (None where that
    cannot be read) and how long it took (s)."""
    before, start = disk_written(folder), time.monotonic()
    measured = phase()
    after, took = disk_written(folder), time.monotonic() - start
    written = None if before is None or after is None else after - before
    return measured, written, took


# --- stores and writers ---------------------------------------------------------------------


def _events_sql(per_row: int, dialect: str, turns: bool = False) -> list[str]:
    """Statements that give each row of ``mnests`` a ``created`` event at ``ts_first`` and
    ``per_row - 1`` ``reinforced`` events at ``ts_last`` (with ``turns``, each with a turn
    id of its own); columns of revision 0002 and head."""
    created = (
        "INSERT INTO events (mnest_id, kind, ts, weight_after, state_after)"
        " SELECT id, 'created', ts_first, weight, state FROM mnests"
    )
    cols = "mnest_id, kind, ts, weight_before, weight_after, state_before, state_after"
    pick = "m.id, 'reinforced', m.ts_last, m.weight, m.weight, m.state, m.state"
    if per_row <= 1:
        return [created]
    if dialect == "postgresql":
        series = f"generate_series(1, {per_row - 1})"
    else:
        series = (
            f"(WITH RECURSIVE s(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM s"
            f" WHERE k < {per_row - 1}) SELECT k FROM s)"
        )
    if turns:
        cols += ", turn_id"
        pick += (
            ", 'turn-' || s.k || '-' || m.id"
            if dialect == "sqlite"
            else ", 'turn-' || s || '-' || m.id"
        )
    reinforced = f"INSERT INTO events ({cols}) SELECT {pick} FROM mnests m CROSS JOIN {series} AS s"
    return [created, reinforced]


def add_events(url: str, per_row: int, turns: bool = False) -> int:
    """Load ``per_row`` events per row of ``mnests`` (see :func:`_events_sql`); how many
    events the store then holds. PostgreSQL: then VACUUM ANALYZE, as autovacuum would (so
    that it does not start in the middle of a measurement), and a CHECKPOINT; on both, the
    dirty pages of the load are flushed before the writers start."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import DBAPIError

    engine = create_engine(url)
    try:
        dialect = engine.dialect.name
        with engine.begin() as conn:
            if dialect == "sqlite":
                conn.exec_driver_sql("PRAGMA synchronous = OFF")
            for stmt in _events_sql(per_row, dialect, turns):
                conn.execute(text(stmt))
            count = int(conn.execute(text("SELECT count(*) FROM events")).scalar_one())
        with engine.connect() as conn:
            if dialect == "postgresql":
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                conn.execute(text("VACUUM ANALYZE mnests, events"))
                with suppress(DBAPIError):  # needs a superuser or pg_checkpoint
                    conn.execute(text("CHECKPOINT"))
            else:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        if hasattr(os, "sync"):
            os.sync()  # the load's dirty pages are written now, not during a measurement
        return count
    finally:
        engine.dispose()


def pick_edges(url: str, count: int) -> list[tuple[str, str, str, str, str]]:
    """Up to ``count`` random active rows: (id, src, src_version, dst, dst_version)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id, src_executor, src_version, dst_executor, dst_version"
                    " FROM mnests WHERE state = 'active' ORDER BY random() LIMIT :k"
                ),
                {"k": count},
            ).all()
    finally:
        engine.dispose()
    return [tuple(r) for r in rows]


def _per_writer(items: Sequence[Any], writers: int) -> list[list[Any]]:
    """``items`` dealt to ``writers`` (disjoint: writers never contend with each other)."""
    if len(items) < writers:
        raise ValueError(f"{len(items)} active edges for {writers} writers")
    return [list(items[i::writers]) for i in range(writers)]


def api_writer(
    store: Any, edges: Sequence[tuple[str, ...]], writers: int
) -> Callable[[int, int], None]:
    """A call that records a passing on writer ``i``'s ``k``-th edge through the facade."""
    mine = _per_writer(edges, writers)

    def call(i: int, k: int) -> None:
        e = mine[i][k % len(mine[i])]
        store.record_passing(e[1], e[2], e[3], e[4])

    return call


OLD_UPDATE = "UPDATE mnests SET uses = uses + 1, ts_last = :now, ts_weight = :now WHERE id = :id"
OLD_EVENT = (
    "INSERT INTO events (mnest_id, kind, ts, weight_before, weight_after, state_before,"
    " state_after) SELECT id, 'reinforced', :now, weight, weight, state, state"
    " FROM mnests WHERE id = :id"
)


def old_release_writer(
    engine: Any, clock: Callable[[], datetime], ids: Sequence[str], n: int
) -> Callable[[int, int], None]:
    """A writer of the previous version: raw SQL valid at 0002 and at head, in one
    transaction (the row of ``mnests``, then an ``events`` row)."""
    from sqlalchemy import text

    mine = _per_writer(ids, n)
    update, insert = text(OLD_UPDATE), text(OLD_EVENT)

    def call(i: int, k: int) -> None:
        params = {"id": mine[i][k % len(mine[i])], "now": clock()}
        with engine.begin() as conn:
            conn.execute(update, params)
            conn.execute(insert, params)

    return call


# --- one engine, one size -------------------------------------------------------------------


@dataclass
class PhaseResult:
    """One line of the table."""

    engine: str
    rows: int
    phase: str
    window: Window
    maintenance_s: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    all_calls: int = 0
    errors_outside_window: dict[str, int] = field(default_factory=dict)


def _result(
    engine: str,
    n: int,
    phase: str,
    measured: tuple[Window, Outcome | None, list[Call]],
    **detail: Any,
) -> PhaseResult:
    window, outcome, calls = measured
    every = summarize(calls)
    outside = Counter(every.errors)
    outside.subtract(window.errors)
    if outcome is not None:
        detail["result"] = outcome.result
        if outcome.error:
            detail["maintenance_error"] = outcome.error
    if window.lo is not None:
        detail["timeline"] = timeline(calls, window.lo)
    return PhaseResult(
        engine,
        n,
        phase,
        window,
        None if outcome is None else outcome.seconds,
        detail,
        every.calls,
        {k: v for k, v in outside.items() if v},
    )


@dataclass
class Sides:
    """Where stores are built: SQLite files in a folder, databases on a server."""

    files: SqliteFiles
    pg: PostgresServer | None = None

    def build(self, engine: str, name: str, rows: Any, revision: str = "head") -> str:
        """A store loaded with ``rows()``, at ``revision``; its URL."""
        if engine == "sqlite":
            return self.files.url(self.files.template(name, rows, revision))
        assert self.pg is not None, "PostgreSQL needs a server URL"
        return self.pg.url(self.pg.template(name, rows, revision))

    def discard(self, engine: str, url: str) -> None:
        """Drop a store built here."""
        if engine == "sqlite":
            self.files.discard(url.removeprefix("sqlite:///"))
        else:
            assert self.pg is not None
            self.pg.discard(url.rsplit("/", 1)[-1].split("?", 1)[0])


def run_engine(
    engine: str,
    n: int,
    settings: Settings,
    sides: Sides,
    echo: Callable[[str], None] | None = None,
) -> list[PhaseResult]:
    """Every chosen phase on one engine at ``n`` rows; one result per phase."""
    say = echo or (lambda _m: None)
    s = settings
    make = AGER_SHAPES[s.shape][1]

    def rows() -> Any:
        return make(n)

    clock = RunningClock(NOW + timedelta(days=s.ager_days), time.monotonic())
    out: list[PhaseResult] = []
    live = [p for p in ("idle", "ager", "disk", "retention") if p in s.phases]
    if live:
        say(f"{engine} {n:,}: building the store ({s.shape}, {s.events_per_row} events a row)")
        url = sides.build(engine, f"wl-{s.shape}-{n}", rows)
        try:
            events = add_events(url, s.events_per_row)
            out += _live_phases(engine, n, url, events, clock, s, live, say, sides.files.folder)
        finally:
            sides.discard(engine, url)
    if "drop" in s.phases and engine == "postgresql":
        say(f"{engine} {n:,}: building a store whose events fill twelve months")
        url = sides.build(engine, f"wl-drop-{s.shape}-{n}", rows)
        try:
            out.append(_drop_phase(engine, n, url, s, say))
        finally:
            sides.discard(engine, url)
    if "upgrade" in s.phases and engine == "postgresql":
        say(f"{engine} {n:,}: building a store at {s.from_revision}")
        url = sides.build(engine, f"wl-old-{s.shape}-{n}", rows, s.from_revision)
        try:
            events = add_events(url, s.events_per_row, s.event_turns)
            out.append(_upgrade_phase(engine, n, url, events, clock, s, say))
        finally:
            sides.discard(engine, url)
    return out


def _live_phases(
    engine: str,
    n: int,
    url: str,
    events: int,
    clock: RunningClock,
    s: Settings,
    phases: Sequence[str],
    say: Callable[[str], None],
    folder: Path,
) -> list[PhaseResult]:
    import mnestoma

    out = []
    edges = pick_edges(url, s.writers * s.edges_per_writer)
    store = mnestoma.Mnestoma(url, clock=clock)
    writers_rate = 0.0  # what the writers alone make the disk write, bytes a second
    ager_disk: tuple[int, float] | None = None  # what the ager made it write, and in how long
    try:
        call = api_writer(store, edges, s.writers)
        common = {"events": events, "edges": len(edges)}
        if "idle" in phases:
            say(f"{engine} {n:,}: idle")
            measured, written, took = _disk_while(folder, lambda: measure(call, s))
            result = _result(engine, n, "idle", measured, **common)
            if written is not None:
                writers_rate = written / took
                result.detail["disk_mb_per_s"] = round(writers_rate / 1e6, 2)
            out.append(result)
        if "ager" in phases:
            say(f"{engine} {n:,}: ager")
            job = Maintenance("ager", s.maintenance_in, url=url, clock=clock).prepare()
            measured, written, took = _disk_while(folder, lambda: measure(call, s, job))
            result = _result(engine, n, "ager", measured, **common)
            if written is not None and result.maintenance_s:
                ager_bytes = max(0, int(written - writers_rate * took))
                result.detail["disk_mb"] = round(ager_bytes / 1e6, 1)
                ager_disk = (ager_bytes, result.maintenance_s)
            out.append(result)
        if "disk" in phases:
            if ager_disk is None:
                say(f"{engine} {n:,}: disk skipped (no ager figures, or no /proc/diskstats)")
            else:
                say(f"{engine} {n:,}: disk ({ager_disk[0] / 1e6:.0f} MB in {ager_disk[1]:.1f} s)")
                nbytes, seconds = ager_disk
                job = Maintenance(
                    "disk", s.maintenance_in, folder=str(folder), nbytes=nbytes, seconds=seconds
                )
                out.append(_result(engine, n, "disk", measure(call, s, job.prepare()), **common))
        if "retention" in phases:
            say(f"{engine} {n:,}: retention")
            job = Maintenance("retention", s.maintenance_in, url=url, before=clock.base)
            out.append(_result(engine, n, "retention", measure(call, s, job.prepare()), **common))
    finally:
        store.close()
    return out


DROP_MONTHS = 12  # the drop phase's events fill this many monthly partitions


def database_mb(url: str) -> float:
    """PostgreSQL: the size of ``url``'s database, in MB (10^6 bytes)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            size = conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
            return round(int(size) / 1e6, 1)
    finally:
        engine.dispose()


def add_months_of_events(url: str, per_row: int) -> tuple[int, datetime]:
    """PostgreSQL, events partitioned: the partitions of :data:`DROP_MONTHS` months from the
    first month after the one of every earlier ts, each row's ``created`` event at that
    month's start and ``per_row - 1`` ``reinforced`` events spread evenly over the months;
    how many events, and the first month's start."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            first = make_months(conn, DROP_MONTHS)
            span = f"interval '{DROP_MONTHS * 30} days'"
            conn.execute(
                text(
                    "INSERT INTO events (mnest_id, kind, ts, weight_after, state_after)"
                    " SELECT id, 'created', :first, weight, state FROM mnests"
                ),
                {"first": first},
            )
            conn.execute(
                text(
                    "INSERT INTO events (mnest_id, kind, ts, weight_before, weight_after,"
                    " state_before, state_after) SELECT m.id, 'reinforced',"
                    f" :first + {span} * s / :per_row, m.weight, m.weight, m.state, m.state"
                    " FROM mnests m CROSS JOIN generate_series(1, :more) AS s"
                ),
                {"first": first, "per_row": per_row, "more": per_row - 1},
            )
            count = int(conn.execute(text("SELECT count(*) FROM events")).scalar_one())
        settle(engine)
        return count, first
    finally:
        engine.dispose()


def month_after(first: datetime, months: int) -> datetime:
    """The start of the month ``months`` after ``first``'s (``first`` a month's start)."""
    k = first.month - 1 + months
    return first.replace(year=first.year + k // 12, month=k % 12 + 1)


def make_months(conn: Any, months: int) -> datetime:
    """PostgreSQL, events partitioned: the partitions of ``months`` months from the first
    after every partition bounded below by MINVALUE (the history of a store from before
    revision 0015), else from next month's (a store made at 0015 or later has no such
    partition); its start."""
    from sqlalchemy import text

    first: datetime = conn.execute(
        text(
            "SELECT coalesce(max(upper) FILTER (WHERE lower = '-infinity'),"
            " (date_trunc('month', now() AT TIME ZONE 'UTC') + interval '1 month')"
            " AT TIME ZONE 'UTC') FROM mnestoma_events_bounds()"
        )
    ).scalar_one()
    conn.execute(
        text("SELECT mnestoma_events_partitions(:at, :ahead)"), {"at": first, "ahead": months - 1}
    )
    return first


def settle(engine: Any) -> None:
    """PostgreSQL, after a load: VACUUM ANALYZE (as autovacuum would, so that it does not
    start in a measurement), a CHECKPOINT, and the dirty pages written."""
    from sqlalchemy import text

    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.execute(text("VACUUM ANALYZE mnests, events"))
        conn.execute(text("CHECKPOINT"))
    if hasattr(os, "sync"):
        os.sync()


def _drop_phase(
    engine: str, n: int, url: str, s: Settings, say: Callable[[str], None]
) -> PhaseResult:
    import mnestoma

    events, first = add_months_of_events(url, s.events_per_row)
    before = month_after(first, DROP_MONTHS // 2)  # the older half: the first six months
    clock = RunningClock(first + timedelta(days=DROP_MONTHS * 31), time.monotonic())
    edges = pick_edges(url, s.writers * s.edges_per_writer)
    size_before = database_mb(url)
    say(f"{engine} {n:,}: drop (events before {before:%Y-%m-%d}, {events:,} events)")
    store = mnestoma.Mnestoma(url, clock=clock)
    try:
        call = api_writer(store, edges, s.writers)
        job = Maintenance("retention", s.maintenance_in, url=url, before=before)
        measured = measure(call, s, job.prepare())
    finally:
        store.close()
    return _result(
        engine,
        n,
        "drop",
        measured,
        events=events,
        edges=len(edges),
        database_mb_before=size_before,
        database_mb_after=database_mb(url),
    )


def _upgrade_phase(
    engine: str,
    n: int,
    url: str,
    events: int,
    clock: RunningClock,
    s: Settings,
    say: Callable[[str], None],
) -> PhaseResult:
    from sqlalchemy import create_engine

    ids = [e[0] for e in pick_edges(url, s.writers * s.edges_per_writer)]
    say(f"{engine} {n:,}: upgrade {s.from_revision} → head")
    job = Maintenance("upgrade", s.maintenance_in, url=url, lock_timeout=s.lock_timeout)
    job.prepare()
    eng = create_engine(url, pool_size=s.writers, max_overflow=0)
    try:
        call = old_release_writer(eng, clock, ids, s.writers)
        measured = measure(call, s, job)
    finally:
        eng.dispose()
    from mnestoma.maintenance.migration import migration_lock_timeout

    return _result(
        engine,
        n,
        "upgrade",
        measured,
        events=events,
        edges=len(ids),
        lock_timeout_s=migration_lock_timeout(s.lock_timeout),
    )


# --- the whole run --------------------------------------------------------------------------


def run(
    engines: Sequence[str] = ENGINES,
    sizes: Sequence[int] = SIZES,
    settings: Settings | None = None,
    *,
    postgresql: str | None = DEFAULT_POSTGRESQL,
    workdir: str | None = None,
    echo: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every engine at every size; the results and what the run ran on."""
    s = settings or Settings()
    known = PHASES + OPTIONAL_PHASES
    unknown = [e for e in engines if e not in ENGINES] + [p for p in s.phases if p not in known]
    if unknown or s.shape not in AGER_SHAPES:
        raise ValueError(f"unknown engine, phase or shape: {unknown or s.shape}")
    if "disk" in s.phases and not {"idle", "ager"} <= set(s.phases):
        raise ValueError("the disk phase replays what the ager wrote: ask for idle and ager too")
    started = time.perf_counter()
    load = {"start": os.getloadavg()}
    results: list[PhaseResult] = []
    with tempfile.TemporaryDirectory(prefix="mnestoma-writer-latency-", dir=workdir) as folder:
        pg = PostgresServer(postgresql) if "postgresql" in engines and postgresql else None
        sides = Sides(SqliteFiles(Path(folder)), pg)
        try:
            machine = _machine(pg)
            for engine in engines:
                for n in sizes:
                    results += run_engine(engine, n, s, sides, echo)
        finally:
            sides.files.close()
            if pg is not None:
                pg.close()
    load["end"] = os.getloadavg()
    return {
        "machine": machine,
        "settings": asdict(s),
        "results": results,
        "wall_seconds": time.perf_counter() - started,
        "load": load,
    }


def _errors_text(errors: dict[str, int]) -> str:
    total = sum(errors.values())
    if not total:
        return "0"
    return f"{total} (" + ", ".join(f"{k} × {v}" for k, v in errors.items()) + ")"


def format_table(results: Sequence[PhaseResult]) -> str:
    """The results as a Markdown table, one row per (engine, rows, phase)."""
    headers = [
        "engine",
        "rows",
        "phase",
        "calls",
        "p50 ms",
        "p99 ms",
        "max ms",
        "errors",
        "maintenance s",
    ]
    rows = []
    for r in results:
        w = r.window
        duration = _fmt(r.maintenance_s)
        if r.detail.get("maintenance_error"):
            duration += " (failed)"
        rows.append(
            [
                r.engine,
                f"{r.rows:,}",
                r.phase,
                str(w.calls),
                _fmt(w.p50_ms),
                _fmt(w.p99_ms),
                _fmt(w.max_ms),
                _errors_text(w.errors),
                duration,
            ]
        )
    return _table(headers, rows)


def format_notes(results: Sequence[PhaseResult]) -> list[str]:
    """What each maintenance did, one line each."""
    notes = []
    for r in results:
        if "result" not in r.detail and "maintenance_error" not in r.detail:
            continue
        what = r.detail.get("maintenance_error") or r.detail.get("result")
        line = f"- {r.engine} {r.rows:,} {r.phase}: {what}"
        if r.phase == "upgrade":
            line += f"; lock timeout {r.detail.get('lock_timeout_s')} s"
        if "database_mb_before" in r.detail:
            line += (
                f"; database {r.detail['database_mb_before']:,} MB before,"
                f" {r.detail['database_mb_after']:,} MB after"
            )
        if "disk_mb" in r.detail:
            line += f"; the disk wrote {r.detail['disk_mb']:,} MB for it"
        if r.errors_outside_window:
            line += f"; errors outside the window: {_errors_text(r.errors_outside_window)}"
        notes.append(line)
    return notes


def _to_json(report: dict[str, Any]) -> str:
    out = dict(report)
    out["results"] = [
        {**asdict(r), "window": {**asdict(r.window), "error_count": r.window.error_count}}
        for r in report["results"]
    ]
    return json.dumps(out, indent=2, default=str)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.writer_latency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = Settings()
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--sizes", help="rows, comma-separated (default 300000,1000000; quick 5000)")
    p.add_argument("--quick", action="store_true", help="5,000 rows and short windows")
    p.add_argument("--writers", type=int, help=f"writer threads (default {d.writers})")
    p.add_argument("--period-ms", type=float, help="each writer's period (default 10)")
    p.add_argument("--idle-s", type=float, help=f"the idle window (default {d.idle_s:g})")
    p.add_argument("--lead-s", type=float, help="writers alone before each window")
    p.add_argument("--tail-s", type=float, help="writers after each maintenance ends")
    p.add_argument(
        "--phases",
        help=f"comma-separated, of {','.join(PHASES + OPTIONAL_PHASES)} (default: all but disk)",
    )
    p.add_argument("--shape", choices=sorted(AGER_SHAPES), help="the store's data (mixed)")
    p.add_argument("--ager-days", type=float, help="the clock, days past the data (30)")
    p.add_argument("--events-per-row", type=int, help="events loaded per mnest (10)")
    p.add_argument("--lock-timeout", type=float, help="the upgrade's lock timeout (s)")
    p.add_argument(
        "--event-turns",
        action="store_true",
        default=None,
        help="give each loaded reinforced event a turn id (the upgrade phase)",
    )
    p.add_argument(
        "--from-revision", help=f"the revision the upgrade phase starts from ({OLD_REVISION})"
    )
    p.add_argument("--maintenance-in", choices=("process", "thread"))
    p.add_argument("--postgresql", default=DEFAULT_POSTGRESQL, metavar="URL")
    p.add_argument("--workdir", help="folder for the SQLite files (default: temp)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    a = p.parse_args(argv)
    s = QUICK if a.quick else Settings()
    given = {
        "writers": a.writers,
        "period_s": None if a.period_ms is None else a.period_ms / 1e3,
        "idle_s": a.idle_s,
        "lead_s": a.lead_s,
        "tail_s": a.tail_s,
        "shape": a.shape,
        "ager_days": a.ager_days,
        "events_per_row": a.events_per_row,
        "lock_timeout": a.lock_timeout,
        "from_revision": a.from_revision,
        "event_turns": a.event_turns,
        "maintenance_in": a.maintenance_in,
        "phases": tuple(x.strip() for x in a.phases.split(",") if x.strip()) if a.phases else None,
    }
    s = replace(s, **{k: v for k, v in given.items() if v is not None})
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    sizes = (
        [int(x) for x in a.sizes.split(",") if x.strip()]
        if a.sizes
        else list(QUICK_SIZES if a.quick else SIZES)
    )
    try:
        report = run(
            engines,
            sizes,
            s,
            postgresql=a.postgresql,
            workdir=a.workdir,
            echo=lambda m: print(m, file=sys.stderr, flush=True),
        )
    except ValueError as err:
        p.error(str(err))
    load = report["load"]
    print(
        f"writers' latency during maintenance ({'quick' if a.quick else 'full'}); "
        f"{report['machine']}; {s.writers} writers × 1 call / {s.period_s * 1e3:g} ms, "
        "open loop (latency from each call's due time)"
    )
    print()
    print(format_table(report["results"]))
    print()
    print("\n".join(format_notes(report["results"])))
    print(
        f"load average (1, 5, 15 min) start {' '.join(f'{x:.2f}' for x in load['start'])},"
        f" end {' '.join(f'{x:.2f}' for x in load['end'])}; wall time "
        f"{report['wall_seconds']:.0f} s"
    )
    if a.json:
        Path(a.json).write_text(_to_json(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
