"""The ``Mnestoma`` facade: one transaction per call, safe to share between threads."""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL

from .ager import AgerSession, BatchedRun, BatchGrowth, ager_writers
from .config import (
    is_sqlite,
    make_engine,
    make_session_factory,
    own_pool_after_fork,
    redact_url,
    refuse_memory_sqlite,
    resolve_database_url,
)
from .errors import (
    MnestomaError,
    SchemaError,
    StoreError,
    is_lock_not_available,
    is_unique_violation,
    translate_errors,
)
from .locking import LOCK_TIMEOUT_OPTION, ager_run_lock, pause_on
from .migration import ensure_at_head, sqlite_store_missing
from .models import CanonicalQuery
from .partitions import FIRST_TURN_EDGE
from .replicas import NOT_READY, ReplicaSet, replica_connect_args, replica_urls
from .repository import MnestRepository, QueryFrequency
from .rules import (
    AGER_BATCH_ROWS,
    AGER_STOP_POLL_S,
    AGER_WAIT_WARN_S,
    AGER_WRITERS_SEEN_S,
    EVENT_PRUNE_BATCH,
    AgerReport,
    ager_batch_grows,
    ager_batch_retry_pause,
    ager_batch_target,
    ager_next_step,
    ager_regrown_step,
    ager_shrunk_end,
    ager_writers_about,
    batch_pause,
    event_batches,
)
from .settings import Settings, settings_of
from .uow import ConnectionUnitOfWork, UnitOfWork, repository_call, written
from .validation import Clock, check_batch_rows, check_dry_run, check_progress

__all__ = ["Mnestoma"]

logger = logging.getLogger("mnestoma.ager")

T = TypeVar("T")
P = ParamSpec("P")


def _in_one_transaction(
    op: Callable[Concatenate[MnestRepository, P], T], *, write: bool = False
) -> Callable[Concatenate[Mnestoma, P], T]:
    """The repository's operation ``op`` as a method of the facade: the same signature,
    checks, errors and result (it is the same code), run in a transaction of its own: a
    write retried when it failed transiently (a generator of items, such as a turn's
    passings, read once before the first attempt), a read in a read transaction."""

    bind = repository_call(op, write=write)

    def method(self: Mnestoma, /, *args: P.args, **kwargs: P.kwargs) -> T:
        call = bind(args, kwargs)  # bound once: a retry replays what the first attempt read
        run = self._write if write else self._read
        return run(lambda unit: call(unit.mnests))

    functools.update_wrapper(method, op, assigned=("__name__", "__doc__"))
    method.__qualname__ = f"Mnestoma.{op.__name__}"
    return method


class Mnestoma:
    """The store, ready to use: ``Mnestoma()`` opens the default SQLite file.

    A new or empty SQLite database is migrated to head on first use; any other database
    must already be at head (``mnestoma db upgrade``), else :class:`SchemaError`. With
    ``create=False`` (reading tools) a SQLite file that does not exist is not created:
    :class:`SchemaError` says there is no store there.

    ``replicas`` (PostgreSQL): URLs of hot standbys of this database, to which its reads
    may go (contract §12): never a stale read after this facade's own write; a replica that
    fails or lags is skipped and the primary serves the read. ``store.primary`` reads on
    the primary only; ``replica_stats()`` counts what went where.
    """

    def __init__(
        self,
        url_or_engine: str | URL | Engine | None = None,
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
        recorder: str | None = None,
        create: bool = True,
        replicas: Sequence[str | URL] | None = None,
    ):
        # checked before anything is opened: bad settings open no engine
        self.settings = settings_of(settings, clock=clock, recorder=recorder)
        self._replicas: ReplicaSet | None = None
        self._owns_replicas = True
        self._on_primary = False
        if isinstance(url_or_engine, Engine):
            self.engine = url_or_engine
            self._owns_engine = False
            own_pool_after_fork(self.engine)  # a caller's own create_engine engine too
        else:
            url = resolve_database_url(url_or_engine)
            refuse_memory_sqlite(url)
            if not create and sqlite_store_missing(url):
                raise SchemaError(f"there is no mnestoma store at {redact_url(url)}")
            self.engine = make_engine(url)
            self._owns_engine = True
        refuse_memory_sqlite(self.engine.url)
        self._bind = with_lock_timeout(self.engine, self.settings.lock_timeout)
        try:
            urls = replica_urls(self.engine.url, replicas)
            ensure_schema(self.engine)
            if urls:
                engines = [make_engine(u, connect_args=replica_connect_args(u)) for u in urls]
                self._replicas = ReplicaSet(engines, urls, self.settings)
        except BaseException:
            self.close()
            raise
        self._writes = make_session_factory(self._bind)

    @property
    def clock(self) -> Clock:
        """The clock of this store's settings: its only source of "now"."""
        return self.settings.clock

    @property
    def recorder(self) -> str:
        """Who this store's events say recorded them, unless a call says otherwise."""
        return self.settings.recorder

    # --- transaction helpers --------------------------------------------------------------

    def _unit(self) -> ConnectionUnitOfWork:
        return ConnectionUnitOfWork(self._bind, settings=self.settings)

    def _write(self, work: Callable[[ConnectionUnitOfWork], T]) -> T:
        """Run ``work`` in one write transaction; retry transient conflicts, bounded. With
        replicas, the WAL position the commit reached is noted (read-your-writes)."""
        after = None if self._replicas is None else self._replicas.note_write
        return written(self._bind, work, settings=self.settings, after_commit=after)

    def _read(self, work: Callable[[ConnectionUnitOfWork], T], *, primary: bool = False) -> T:
        """Run ``work`` in a read transaction (SQLite: a plain BEGIN, no write lock): on a
        replica that can serve it (contract §12), else on the primary."""
        replicas = self._replicas
        if replicas is not None and not (primary or self._on_primary):
            for i in replicas.order():
                try:
                    with translate_errors(), replicas.engines[i].connect() as conn:
                        result = replicas.attempt(conn, i, functools.partial(self._in_read, work))
                except StoreError as err:  # could not connect, or lost the connection
                    replicas.connection_failed(i, err)
                    continue
                if result is not NOT_READY:
                    return result  # type: ignore[return-value]
            replicas.primary_read()
        with self._unit() as unit:
            return work(unit)

    def _in_read(self, work: Callable[[ConnectionUnitOfWork], T], conn: Connection) -> T:
        with ConnectionUnitOfWork(conn, settings=self.settings) as unit:
            return work(unit)

    @property
    def primary(self) -> Mnestoma:
        """This facade with every read on the primary (for a read that must see another
        process's latest write). Its writes are this facade's, and close() leaves the
        engines to it."""
        view = copy.copy(self)
        view._on_primary = True
        view._owns_engine = False
        view._owns_replicas = False
        return view

    def replica_stats(self) -> dict[str, Any]:
        """How this facade's reads were routed (contract §12): each replica's reads, skips,
        last lag and whether it is skipped now; the reads the primary served, how many
        because no replica had replayed this facade's writes, how many after a replica
        failed. Empty without replicas."""
        return {} if self._replicas is None else self._replicas.stats()

    # --- the contract's operations, each the repository's in one transaction -------------

    record_passing = _in_one_transaction(MnestRepository.record_passing, write=True)
    record_proto = _in_one_transaction(MnestRepository.record_proto, write=True)
    record_turn = _in_one_transaction(MnestRepository.record_turn, write=True)
    get = _in_one_transaction(MnestRepository.get)
    find = _in_one_transaction(MnestRepository.find)
    edges = _in_one_transaction(MnestRepository.edges)
    events = _in_one_transaction(MnestRepository.events)
    walk = _in_one_transaction(MnestRepository.walk)
    suggest_next = _in_one_transaction(MnestRepository.suggest_next)
    rank = _in_one_transaction(MnestRepository.rank)
    vet = _in_one_transaction(MnestRepository.vet)
    graph = _in_one_transaction(MnestRepository.graph)
    to_networkx = _in_one_transaction(MnestRepository.to_networkx)
    transition_state = _in_one_transaction(MnestRepository.transition_state, write=True)
    recurring_protos = _in_one_transaction(MnestRepository.recurring_protos)
    promote_proto_to_active = _in_one_transaction(
        MnestRepository.promote_proto_to_active, write=True
    )

    # Operations that are more than one repository call, each in transactions of its own.

    def apply_ager(
        self,
        *,
        dry_run: bool = False,
        batch_rows: int | None = None,
        progress: BatchProgress | None = None,
    ) -> AgerReport:
        """Run the ager at the clock's now; ``dry_run`` reports and rolls everything back.

        Online: the run commits in batches, each its own transaction, so a writer waits for
        one batch, not the run. By default each batch is sized to hold its locks
        :data:`~mnestoma.rules.AGER_BATCH_TARGET_S` (15 ms) while writers are about; once
        none has been seen for a second a batch grows, in steps of
        :data:`~mnestoma.rules.AGER_BATCH_QUIET_TARGET_S` (75 ms), until a writer waits for
        it (at most :data:`~mnestoma.rules.AGER_BATCH_GROWN_MAX_S`): a writer that comes
        waits for one step. ``batch_rows`` fixes about how many rows each batch covers
        instead. ``progress(done, total)`` is called after each batch's commit. A second run
        at once waits for the first. A dry run is one transaction, rolled back.
        """
        # every argument checked before the first batch: a bad one refused writes nothing
        rows, dry, progress = check_ager_call(dry_run, batch_rows, progress)
        if dry:
            with self._unit() as unit:
                return unit.mnests.apply_ager()  # left without commit: rolled back
        with translate_errors(), self._bind.connect() as conn:
            report = age_in_batches(
                conn, settings=self.settings, batch_rows=rows, progress=progress
            )
            if self._replicas is not None:
                self._replicas.note_write(conn)
                conn.rollback()
            return report

    def prune_events(
        self, before: datetime, *, dry_run: bool = False, progress: PruneProgress | None = None
    ) -> int:
        """Delete the events older than ``before`` (each row still in ``mnests`` keeps its
        ``created`` event); how many were, or with ``dry_run`` would be, deleted.

        Online: the events present when it starts go in batches of ids, each its own short
        write transaction committed before the next (on SQLite with a pause between them in
        which waiting writers take the lock), so a writer waits for one batch at most.
        ``progress(done, total, deleted)`` is called once the batches are known (done 0),
        then after each. A dry run counts them in one read transaction, which takes no lock.
        """
        dry, report = check_prune_call(dry_run, progress)
        if dry:
            return self._read(lambda u: u.mnests.prune_events(before, dry_run=True), primary=True)
        deleted = self._drop_partitions(before)
        found = self._read(lambda u: u.mnests.prunable_event_ids(before), primary=True)
        batches = list(event_batches(found))
        if report is not None and (batches or deleted):
            report(0, len(batches), deleted)
        for i, (first, last) in enumerate(batches):
            if i:
                time.sleep(batch_pause(self.engine.dialect.name))
            deleted += self._prune_batch(before, first, last)
            if report is not None:
                report(i + 1, len(batches), deleted)
        return deleted

    def _prune_batch(self, before: datetime, first: int, last: int) -> int:
        """One batch of a prune (the events with ids in [first, last]), one transaction."""
        return self._write(lambda u: u.mnests.prune_event_batch(before, first, last))

    def _drop_partitions(self, before: datetime) -> int:
        """PostgreSQL, events partitioned: the whole months before ``before`` dropped (the
        swap one transaction, each drop another), then the rows of ``event_turn_edges``
        their passings had, in batches; how many events went. Nothing elsewhere."""
        if self.engine.dialect.name != "postgresql":
            return 0
        dropped = self._write(lambda u: u.mnests.drop_event_partitions(before))
        for name in dropped.detached:
            self._write(lambda u, name=name: u.mnests.drop_detached_partition(name))  # type: ignore[misc]
        end, after = dropped.end, FIRST_TURN_EDGE
        while end is not None:
            _, last = self._write(
                lambda u, a=after: u.mnests.prune_turn_edges(end, a, EVENT_PRUNE_BATCH)  # type: ignore[misc]
            )
            if last is None:
                break
            after = last
        return dropped.deleted

    def log_canonical_query(
        self, raw_query: str, canonical_query: str, *, turn_id: str | None = None
    ) -> CanonicalQuery:
        """Append one normalised request to the query log."""
        return self._write(lambda u: u.queries.log(raw_query, canonical_query, turn_id=turn_id))

    def top_queries(self, *, limit: int = 10) -> list[QueryFrequency]:
        """The most frequent canonical forms."""
        return self._read(lambda u: u.queries.top(limit=limit))

    def recent_queries(self, *, limit: int = 20) -> list[CanonicalQuery]:
        """The latest query-log entries, newest first."""
        return self._read(lambda u: u.queries.recent(limit=limit))

    def unit_of_work(self) -> UnitOfWork:
        """A unit of work on this store's engine and settings, for several operations; on
        the primary only, reads included (contract §12)."""
        unit = UnitOfWork(self._writes, settings=self.settings)
        if self._replicas is not None:
            unit._after_commit = self._replicas.note_write
        return unit

    def close(self) -> None:
        """Release the connections (the engine too, when this facade created it, and the
        replicas' engines)."""
        if self._owns_engine:
            self.engine.dispose()
        if self._replicas is not None and self._owns_replicas:
            for engine in self._replicas.engines:
                engine.dispose()

    def __repr__(self) -> str:
        return f"Mnestoma({redact_url(self.engine.url)!r})"

    def __enter__(self) -> Mnestoma:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- shared with the async door (mnestoma.aio) ----------------------------------------------


# Called after each batch of a run of the ager: (batches done, batches in the run).
BatchProgress = Callable[[int, int], object]


# Called as a prune of events goes: (batches done, batches in all, events deleted so far).
PruneProgress = Callable[[int, int, int], object]


def check_prune_call(dry_run: object, progress: object) -> tuple[bool, PruneProgress | None]:
    """The arguments of ``prune_events`` (both doors), checked before its first batch."""
    return check_dry_run(dry_run), check_progress(progress, "done, total, deleted")


def check_ager_call(
    dry_run: object, batch_rows: object, progress: object
) -> tuple[int | None, bool, BatchProgress | None]:
    """The arguments of ``apply_ager`` (both doors), each checked before the run writes
    anything: a bad one found after the first batch would leave an interrupted run."""
    return check_batch_rows(batch_rows), check_dry_run(dry_run), check_progress(progress)


class RunStopped(Exception):
    """A run of the ager stopped before its next batch because its caller asked it to (an
    async caller cancelled): an interrupted run, which the next completes."""


# Asked before each batch, and while a batch waits to be tried again: False stops the run.
GoOn = Callable[[], bool]


def age_in_batches(
    conn: Connection,
    *,
    settings: Settings,
    batch_rows: int | None = None,
    progress: BatchProgress | None = None,
    go_on: GoOn | None = None,
) -> AgerReport:
    """One run of the ager on ``conn``, each batch a unit of work of its own (retried when
    transient), under the database's ager lock; the report of the whole run. Batches of
    ``batch_rows`` rows (None: the settings' ``ager_batch_rows``; None there too: batches
    sized as the run goes to take about :func:`~mnestoma.rules.ager_batch_target` each while
    writers are about, and growing until a writer waits once none has been seen for a while,
    :class:`~mnestoma.ager.BatchGrowth`). ``progress(done, total)`` after each batch (the
    total an estimate while the batches are being sized). ``go_on()`` false stops the run
    before its next batch, and a growing batch at its next step (:class:`RunStopped`).
    What the run keeps on its connection meanwhile: :class:`~mnestoma.ager.AgerSession`.

    Before each batch the writers get in first: on SQLite the writes that wait for the lock
    (:class:`~mnestoma.locking.WaitingWriters`), on PostgreSQL, where a batch locks only its
    rows, the writers in a transaction on ``mnests`` (:class:`~mnestoma.ager.TableWriters`);
    there a batch that gave up waiting for a row a writer held is tried again, smaller,
    until it gets its rows (:func:`_age_batch_waiting`). The bounds of the run are read
    before its first write, so that no lock is held meanwhile.
    """
    started = time.perf_counter()
    if batch_rows is None:
        batch_rows = settings.ager_batch_rows
    write = functools.partial(written, conn, settings=settings)
    waits = _Waits(conn, go_on)
    with ager_run_lock(conn), AgerSession(conn) as session, ager_writers(conn) as writers:
        waits.go_on()
        with ConnectionUnitOfWork(conn, settings=settings) as unit:
            bounds = unit.mnests.ager_bounds()
        run = write(lambda u: u.mnests.begin_ager_run(batch_rows or AGER_BATCH_ROWS, bounds))
        report = AgerReport()
        lo, step, number = run.first, run.step, 0
        # none seen yet: the first batch grows unless a writer is about when it begins (a
        # writer that comes meanwhile waits for one step of it)
        writers_seen = time.monotonic() - AGER_WRITERS_SEEN_S
        target = ager_batch_target(0.0)
        while lo < run.end:
            waits.go_on()
            hi = min(lo + step, run.end)
            if writers.let_in():
                writers_seen = time.monotonic()
            since = time.monotonic() - writers_seen
            grows = batch_rows is None and ager_batch_grows(since)
            growth = BatchGrowth(writers, run.end, step, waits.asked) if grows else None
            try:
                batch, hi, took = _age_batch_waiting(
                    write,
                    waits,
                    run=run,
                    lo=lo,
                    hi=hi,
                    number=number + 1,
                    writers_about=ager_writers_about(since),
                    session=session,
                    growth=growth,
                )
            except MnestomaError as err:
                if run.merges or not is_unique_violation(err):
                    raise
                # A twin made since the run began (an operator's transition): this batch,
                # and every one after it, looks for merge pairs again.
                run = replace(run, merges=True)
                continue
            number += 1
            report += batch
            width = hi - lo
            if growth is not None:
                if growth.writers_came:
                    writers_seen = time.monotonic()
                target = ager_batch_target(time.monotonic() - writers_seen)
                step = growth.step
            elif batch_rows is None:
                last = target
                target = ager_batch_target(time.monotonic() - writers_seen)
                step = ager_next_step(width, took, target, last)
                width = step
            else:  # back to the planned batches, at twice a shrunk one at a time
                step = width = ager_regrown_step(width, run.step)
            lo = hi
            if progress is not None:
                progress(number, number + -(-(run.end - lo) // max(1, width)))
        with ConnectionUnitOfWork(conn, settings=settings) as unit:
            archive = unit.mnests.archive_candidates(run.now)
        report = replace(report, archive_candidates=archive)
        session.release()  # the last commit checkpoints the WAL
        write(lambda u: u.mnests.end_ager_run(run, report, time.perf_counter() - started))
    waits.log_run(run, number)
    return report


class _Waits:
    """What a run of the ager waited for writers' rows (PostgreSQL): the batches it tried
    again, the longest a batch waited, its smallest batch; said in the log at the run's
    end, and at once by a batch that has waited :data:`~mnestoma.rules.AGER_WAIT_WARN_S`.
    Also where the run asks whether to go on (:meth:`go_on`), before each batch and while it
    waits."""

    def __init__(self, conn: Connection, go_on: GoOn | None) -> None:
        self._conn = conn
        self._go_on = go_on
        self.retries = 0  # attempts that gave up, each tried again
        self.longest_s = 0.0
        self.smallest: int | None = None

    def go_on(self) -> None:
        """Raise :class:`RunStopped` when the run's caller asked it to stop."""
        if not self.asked():
            raise RunStopped("the run of the ager was stopped before its next batch")

    def asked(self) -> bool:
        """False once the run's caller asked it to stop."""
        return self._go_on is None or bool(self._go_on())

    def pause(self, seconds: float) -> None:
        """Wait ``seconds`` before a batch is tried again, asking now and then whether to go
        on (a run stopped while it waits stops within :data:`~mnestoma.rules.AGER_STOP_POLL_S`)."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            pause_on(self._conn, min(left, AGER_STOP_POLL_S))
            self.go_on()

    def gave_up(self, lo: int, hi: int, waited_s: float, attempts: int) -> None:
        """A batch ``[lo, hi)`` gave up waiting for a row, ``waited_s`` after its first try."""
        self.retries += 1
        self.smallest = hi - lo if self.smallest is None else min(self.smallest, hi - lo)
        if self.longest_s < AGER_WAIT_WARN_S <= waited_s:
            logger.warning(
                "the ager has waited %.1f s for rows that writers hold (positions %d-%d, "
                "%d attempts); it goes on waiting",
                waited_s,
                lo,
                hi,
                attempts,
            )
        self.longest_s = max(self.longest_s, waited_s)

    def got_in(self, waited_s: float) -> None:
        """A batch that had to wait got its rows, ``waited_s`` after its first try."""
        self.longest_s = max(self.longest_s, waited_s)

    def log_run(self, run: BatchedRun, batches: int) -> None:
        """The run's waits, in the log: a warning when a batch waited long, else info."""
        if not self.retries:
            return
        logger.log(
            logging.WARNING if self.longest_s >= AGER_WAIT_WARN_S else logging.INFO,
            "the ager's run at %s waited for rows that writers held: %d times a batch gave "
            "up and was tried again (%d batches in all), a batch waited %.2f s at most, "
            "positions in the smallest batch: %d",
            run.now.isoformat(),
            self.retries,
            batches,
            self.longest_s,
            self.smallest or 0,
        )


def _age_batch(
    unit: ConnectionUnitOfWork,
    *,
    run: BatchedRun,
    lo: int,
    hi: int,
    number: int,
    writers_about: bool,
    session: AgerSession | None = None,
    growth: BatchGrowth | None = None,
) -> AgerReport:
    return unit.mnests.age_batch(
        run, lo, hi, number, writers_about=writers_about, session=session, growth=growth
    )


def _age_batch_waiting(
    write: Callable[[Callable[[ConnectionUnitOfWork], AgerReport]], AgerReport],
    waits: _Waits,
    *,
    lo: int,
    hi: int,
    **batch: Any,
) -> tuple[AgerReport, int, float]:
    """One batch (its own transaction, through ``write``), the end of the positions it
    covered and the seconds its last attempt took. A batch that gave up waiting for a row
    lock (PostgreSQL: a writer held a row it wanted, while waiting for one of the batch's, or
    writers queued on it for longer than the batch's lock timeout) rolled back and let the
    writers go on; it is tried again on half its positions (down to one,
    :func:`~mnestoma.rules.ager_shrunk_end`), no longer growing (writers are about), after
    :func:`~mnestoma.rules.ager_batch_retry_pause`, for as long as it takes: a run never
    fails because writers are busy. Other transient failures (a key another transaction
    made a twin of meanwhile) are retried by ``write`` itself."""
    attempt = 0
    first = time.perf_counter()
    while True:
        took = time.perf_counter()
        try:
            report = write(functools.partial(_age_batch, lo=lo, hi=hi, **batch))
        except MnestomaError as err:
            if not is_lock_not_available(err):
                raise
            waits.gave_up(lo, hi, time.perf_counter() - first, attempt + 1)
            waits.pause(ager_batch_retry_pause(attempt))
            hi = ager_shrunk_end(lo, hi)
            batch["growth"] = None
            batch["writers_about"] = True
            attempt += 1
            continue
        done = time.perf_counter()
        if attempt:
            waits.got_in(done - first)
        growth = batch.get("growth")
        return report, hi if growth is None else growth.end, done - took


def with_lock_timeout(engine: Engine, seconds: float | None) -> Engine:
    """``engine``, or (a lock timeout given) a view of it whose connections wait that long
    for a lock: the same pool, its own execution option (see :mod:`mnestoma.locking`)."""
    if seconds is None:
        return engine
    return engine.execution_options(**{LOCK_TIMEOUT_OPTION: seconds})


def ensure_schema(engine: Engine) -> None:
    """A new or empty SQLite store is migrated to head; any other must already be there."""
    ensure_at_head(engine, auto_migrate=is_sqlite(engine) and _is_empty(engine))


def _is_empty(engine: Engine) -> bool:
    from sqlalchemy import inspect

    with translate_errors():
        return not inspect(engine).get_table_names()
