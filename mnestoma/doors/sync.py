"""The ``Mnestoma`` facade: one transaction per call, safe to share between threads."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL

from mnestoma.core.errors import StoreError, translate_errors
from mnestoma.core.rules import AgerReport
from mnestoma.doors.shared import (
    Bind,
    FacadeBase,
    MnestOperations,
    Replicas,
    SyncDoor,
    ensure_schema,
    store_url,
    with_lock_timeout,
)
from mnestoma.engines import (
    make_engine,
    make_session_factory,
    own_pool_after_fork,
    redact_url,
    refuse_memory_sqlite,
    resolve_database_url,
)
from mnestoma.engines.locking import pauses_letting_writers_in
from mnestoma.engines.replicas import NOT_READY, replica_urls
from mnestoma.maintenance.ager import BatchProgress, ager_steps
from mnestoma.maintenance.retention import PruneProgress
from mnestoma.maintenance.splitting import SplitProgress, SplitReport
from mnestoma.maintenance.steps import Pause, Read, Step, Write, drive
from mnestoma.schema.models import CanonicalQuery
from mnestoma.store.repository import QueryFrequency
from mnestoma.store.uow import ConnectionUnitOfWork, KeptConnection, UnitOfWork, written

__all__ = ["Mnestoma"]

T = TypeVar("T")


class Mnestoma(FacadeBase[Engine], SyncDoor, MnestOperations):
    """The store, ready to use: ``Mnestoma()`` opens the default SQLite file.

    A new or empty SQLite database is migrated to head on first use; any other database
    must already be at head (``mnestoma db upgrade``), else :class:`SchemaError`. With
    ``create=False`` (reading tools) a SQLite file that does not exist is not created:
    :class:`SchemaError` says there is no store there.

    ``replicas`` (PostgreSQL): URLs of hot standbys of this database, to which its reads
    may go (contract §12): never a stale read after this facade's own write; a replica that
    fails or lags is skipped and the primary serves the read. ``store.primary`` reads on
    the primary only; ``replica_stats()`` counts what went where.

    Raises:
        InvalidInput: a URL, setting or replica the contract refuses, or an in-memory
            SQLite database (it cannot be shared).
        MissingExtra: the URL's driver is not installed (the message names the extra).
        SchemaError: the database is not at head (a new or empty SQLite store is migrated
            instead), or with ``create=False`` there is no SQLite store at its path.
        StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
            be reached).
    """

    # The connection its writes keep between calls (its own engine only, see _open).
    _kept: KeptConnection | None = None

    def _open(self, target: str | URL | Engine | None, create: bool, replicas: Replicas) -> None:
        if isinstance(target, Engine):
            self.engine = target
            self._owns_engine = False
            own_pool_after_fork(self.engine)  # a caller's own create_engine engine too
        else:
            self.engine = make_engine(store_url(resolve_database_url(target), create))
            self._owns_engine = True
        self._dialect = self.engine.dialect.name
        refuse_memory_sqlite(self.engine.url)
        self._bind = with_lock_timeout(self.engine, self.settings.lock_timeout)
        try:
            urls = replica_urls(self.engine.url, replicas)
            ensure_schema(self.engine)
            self._with_replicas(urls, make_engine)
        except BaseException:
            self.close()
            raise
        self._writes = make_session_factory(self._bind)
        # Its own engine's connection kept between writes; a service's engine is left to
        # check out and in as the service configured its pool.
        self._kept = KeptConnection(self._bind) if self._owns_engine else None

    # --- transaction helpers --------------------------------------------------------------

    def _unit(self) -> ConnectionUnitOfWork:
        return ConnectionUnitOfWork(self._bind, settings=self.settings)

    def _write(self, work: Callable[[ConnectionUnitOfWork], T]) -> T:
        """Run ``work`` in one write transaction; retry transient conflicts, bounded. With
        replicas, the WAL position the commit reached is noted (read-your-writes)."""
        after = None if self._replicas is None else self._replicas.note_write
        return written(
            self._bind, work, settings=self.settings, after_commit=after, kept=self._kept
        )

    def _read(self, work: Callable[[ConnectionUnitOfWork], T], *, primary: bool = False) -> T:
        """Run ``work`` in a read transaction (SQLite: a plain BEGIN, no write lock): on a
        replica that can serve it (contract §12), else on the primary."""
        replicas = self._replicas
        if replicas is not None and not (primary or self._on_primary):
            replicas.sample(self.engine)  # the primary's WAL position, when due
            for i in replicas.order():
                with replicas.bounded():  # a replica that does not answer in time is cut
                    try:
                        with translate_errors(), replicas.engines[i].connect() as conn:
                            result = replicas.attempt(
                                conn, i, functools.partial(self._in_read, work)
                            )
                    except StoreError as err:  # could not connect, lost the connection, cut
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

    # --- the contract's operations: the shared table (MnestOperations), each the repository's
    # in one transaction, and the ones below

    @staticmethod
    def _operation_method(bind: Bind, write: bool) -> Callable[..., Any]:
        """An operation of the table: ``bind(args, kwargs)`` run in a transaction of its own,
        a write retried when it failed transiently (a generator of items, such as a turn's
        passings, read once before the first attempt), a read in a read transaction."""

        def method(self: Mnestoma, /, *args: Any, **kwargs: Any) -> Any:
            call = bind(args, kwargs)  # bound once: a retry replays what the first attempt read
            run = self._write if write else self._read
            return run(lambda unit: call(unit.mnests))

        return method

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

        Returns:
            The :class:`~mnestoma.AgerReport` of the run (with ``dry_run``: of what it would do).

        Raises:
            InvalidInput: ``dry_run`` is not a bool, ``batch_rows`` not a positive integer,
                or ``progress`` not callable; nothing is then written.
            ConflictError: a batch could not have the write lock within the lock timeout
                (:class:`WriteLockTimeout`), retries spent; the batches before it stay committed
                and the next run completes the interrupted one.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        steps = ager_steps(self.settings, dry_run=dry_run, batch_rows=batch_rows, progress=progress)
        return drive(steps, self._step)

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
        On PostgreSQL the months wholly before ``before`` are dropped whole, never read:
        their events are counted from the catalogue (``reltuples``), so that the count is
        then an estimate (the command line says "about N").

        Returns:
            How many events were deleted (with ``dry_run``: would be, counted exactly); on
            PostgreSQL the months dropped whole count from the catalogue.

        Raises:
            InvalidInput: ``before`` is not an aware datetime the store can hold, ``dry_run``
                not a bool, or ``progress`` not callable; nothing is then deleted.
            ConflictError: a batch could not have the write lock within the lock timeout,
                retries spent; the batches before it stay deleted.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        return drive(self._prune_steps(before, dry_run, progress), self._step)

    def split_history(
        self,
        *,
        batch_rows: int | None = None,
        dry_run: bool = False,
        progress: SplitProgress | None = None,
    ) -> SplitReport:
        """PostgreSQL: rebuild each partition of ``events`` in the old layout that holds
        rows (a plain table revision 0015 kept: a month written to before it, or every event
        before a month) into months of the new layout, one at a time, oldest first, then the
        rows the default partition caught (months no partition covered) into their months,
        a new empty default partition in its place, while services write (contract §12).

        Online: the rows are copied into a staging table ``batch_rows`` ids at a time
        (:data:`~mnestoma.rules.SPLIT_BATCH_ROWS` by default), each batch its own short
        transaction during which writes into that partition wait; writes made meanwhile
        are mirrored by triggers; then one short transaction puts the new months in the old
        partition's place (catalogue changes only), and the old table is dropped. It needs
        the disk of the partition being rebuilt twice over. A run stopped at any point is
        completed by the next. ``progress(partition, done, total, copied)`` is called once
        a partition's batches are known (done 0), then after each. A dry run lists what
        waits, from the catalogue, and changes nothing. On SQLite there is nothing to split.

        Returns:
            The :class:`~mnestoma.maintenance.splitting.SplitReport`: the partitions
            rebuilt, the months made, the rows the batches copied (with ``dry_run``: the
            partitions that wait, with their rows as the catalogue estimates them).

        Raises:
            InvalidInput: ``batch_rows`` is not a positive integer, ``dry_run`` not a bool,
                or ``progress`` not callable; nothing is then changed.
            SchemaError: the store has no ``mnestoma_events_month`` (dropped by hand: a
                store before revision 0015 is refused as the facade opens it, behind
                head), or a table ``events_split`` that the split did not make.
            StoreError: the database failed, or a lock stayed busy through every try
                (:data:`~mnestoma.rules.SPLIT_TRIES`); the batches before stay copied and
                the next run goes on from there.
        """
        return drive(self._split_steps(batch_rows, dry_run, progress), self._step)

    def _step(self, step: Step) -> Any:
        """One step of an operation of several transactions (:mod:`mnestoma.maintenance.steps`):
        a read on the primary, a write (retried when transient), a pause, or a run on a
        connection of its own."""
        if isinstance(step, Read):
            return self._read(lambda unit: step.work(unit.connection), primary=True)
        if isinstance(step, Write):
            return self._write(lambda unit: step.work(unit.connection))
        if isinstance(step, Pause):
            for seconds in pauses_letting_writers_in(self.engine.url, step.seconds):
                time.sleep(seconds)
            return None
        with translate_errors(), self._bind.connect() as conn:
            return self._noted(conn, step.work(conn, None))

    def log_canonical_query(
        self, raw_query: str, canonical_query: str, *, turn_id: str | None = None
    ) -> CanonicalQuery:
        """Append one normalised request to the query log, in a transaction of its own.

        Returns:
            The entry written.

        Raises:
            InvalidInput: a text or turn id refused.
            ConflictError: the write lock not had in time.
            StoreError: the database failed.
        """
        return self._write(lambda u: u.queries.log(raw_query, canonical_query, turn_id=turn_id))

    def top_queries(self, *, limit: int = 10) -> list[QueryFrequency]:
        """The most frequent canonical forms.

        Returns:
            The ``limit`` most frequent forms at most, as :class:`~mnestoma.QueryFrequency`.

        Raises:
            InvalidInput: a bad ``limit``.
            StoreError: the database failed.
        """
        return self._read(lambda u: u.queries.top(limit=limit))

    def recent_queries(self, *, limit: int = 20) -> list[CanonicalQuery]:
        """The latest query-log entries, newest first.

        Returns:
            The ``limit`` newest entries at most.

        Raises:
            InvalidInput: a ``limit`` that is not a whole number from 1 to 100,000.
            StoreError: the store could not be read.
        """
        return self._read(lambda u: u.queries.recent(limit=limit))

    def unit_of_work(self) -> UnitOfWork:
        """A unit of work on this store's engine and settings, for several operations; on
        the primary only, reads included (contract §12).

        Returns:
            A new :class:`~mnestoma.UnitOfWork`, not yet entered.
        """
        unit = UnitOfWork(self._writes, settings=self.settings)
        if self._replicas is not None:
            unit._after_commit = self._replicas.note_write
        return unit

    def close(self) -> None:
        """Release the connections (the engine too, when this facade created it, and the
        replicas' engines).

        Returns:
            None.
        """
        if self._owns_engine:
            if self._kept is not None:
                self._kept.close()
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
