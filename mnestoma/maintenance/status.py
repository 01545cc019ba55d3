"""``mnestoma status``: what a store holds, who feeds it and whether the ager runs, from facts.

Reading the status never migrates or creates anything: a missing SQLite file stays missing,
a database behind head is reported as such (with the command that upgrades it). Every
sentence about recording is chosen by the rows: the status never claims a feed that the
``events`` table does not show.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.engine import URL

from mnestoma.core.clock import Clock, read_clock, utc_now
from mnestoma.core.display import recorder_name
from mnestoma.core.errors import MnestomaError, translate_errors
from mnestoma.core.records import fields_record
from mnestoma.core.rules import (
    AUTOMATIC_RECORDERS,
    PASSING,
    RECURRING_MIN_USES,
    RECURRING_MIN_WEIGHT,
    STATUS_ESTIMATE_FROM,
    STATUS_RECENT_EVENTS,
    STATUS_SAMPLED_IDS,
    AgerReport,
    EventKind,
    MnestState,
    Recorder,
)
from mnestoma.core.settings import Settings
from mnestoma.core.timefmt import ago, iso_utc, short_utc
from mnestoma.core.types import parse_sqlite_timestamp
from mnestoma.engines import backend_of, make_engine, redact_url, resolve_database_url
from mnestoma.engines.replicas import (
    bind_to_deadlines,
    identity_difference,
    lsn_of,
    measure_replica,
    read_deadline,
    replica_connect_args,
    replica_urls,
    server_identity,
)
from mnestoma.maintenance.ager import ager_running
from mnestoma.maintenance.migration import (
    head_revision,
    known_revisions,
    read_revision,
    sqlite_store_missing,
)
from mnestoma.maintenance.splitting import OldPartition, waiting_history
from mnestoma.schema import snapshots
from mnestoma.schema.models import Mnest
from mnestoma.schema.runner import runner_for
from mnestoma.schema.sql import read
from mnestoma.schema.sql import status as sql
from mnestoma.schema.sql.replication import REPLICA_PROBE, REPLICA_STATUS, SERVER_POSITION
from mnestoma.schema.sql.tables import AGER_PROGRESS, AGER_RUNS, CHAINS, EVENTS, MNESTS, QUERIES

__all__ = [
    "AGER_WINDOW",
    "FEEDING_STATEMENT",
    "READING_STATEMENT",
    "AgerRunFacts",
    "RecorderFacts",
    "ReplicaFacts",
    "StoreStatus",
    "collect_status",
    "render_status",
]

# The sentence when no tracer or processor ever wrote here (what the package offers, and
# that this store shows no sign of it).
FEEDING_STATEMENT = (
    "not fed automatically here: the in-process tracer (mnestoma.tracing) and the "
    "OpenTelemetry processor (mnestoma.otel) are available, but no passing recorded by "
    "them is in this store."
)
# Reads leave no row behind, so the status can only say how a planner would read.
READING_STATEMENT = (
    "read by: reads leave no trace in the store, so this cannot say who reads it; a planner "
    "reads it only where it calls suggest_next, predict_next, walk or rank."
)
# The counters of an ager run, as ``AgerReport`` names and orders them.
AGER_COUNTERS: tuple[str, ...] = tuple(f.name for f in fields(AgerReport))
# "The last 30 days" of the ager's runs, counted back from the status's now.
AGER_WINDOW = timedelta(days=30)


@dataclass(frozen=True)
class RecorderFacts:
    """How many passings (created/reinforced events) one recorder wrote, and the last one;
    how many of them carry the outcome ``ok`` or ``error`` (None where the store has no
    ``events.outcome``, before revision 0008: not known, not zero)."""

    passings: int = 0
    last: datetime | None = None
    ok: int | None = None
    error: int | None = None

    @property
    def with_outcome(self) -> int:
        """The passings that carry an outcome (0 where outcomes are not known)."""
        return (self.ok or 0) + (self.error or 0)


@dataclass(frozen=True)
class AgerRunFacts:
    """One row of ``ager_runs``: when the ager ran (the clock's instant), how long, and what
    it did (its counters, one column each, read back as the run's :class:`AgerReport`)."""

    ts: datetime
    duration_s: float
    report: AgerReport

    def counters(self) -> dict[str, int]:
        """The run's ``AgerReport`` counters, by name, in the report's order."""
        return asdict(self.report)


@dataclass(frozen=True)
class AgerProgressFacts:
    """A run of the ager that began and has not completed (a row of ``ager_progress``): its
    now, when it began and last committed a batch (wall clock), how many batches it did,
    and whether it is still running (it holds the ager lock) or was interrupted."""

    ts: datetime
    started: datetime
    updated: datetime
    batches: int
    running: bool

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (times as ISO-8601 UTC)."""
        return fields_record(self, json=True)


@dataclass(frozen=True)
class ReplicaFacts:
    """What a read replica says of itself, measured against the primary: whether it is a
    standby (None: it did not answer, ``error`` says why); ``behind_bytes``, the bytes of WAL
    the primary had written and it had not replayed at the last look; ``lag_s``, at most
    how far behind it is: 0 when it had replayed the primary's position at once, else the
    time it took to (see :func:`~mnestoma.replicas.measure_replica`), else the time since
    the last commit it replayed; ``receiving``, whether a WAL receiver streams to it from its
    primary (False: cut off, it falls behind with the primary's next write); ``refused``, why
    reads would not use it (its cluster or database is not the primary's)."""

    database: str
    standby: bool | None
    lag_s: float | None = None
    error: str | None = None
    behind_bytes: int | None = None
    receiving: bool | None = None
    refused: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: its fields."""
        return asdict(self)

    def line(self) -> str:
        """The ``replica`` line of the status."""
        if self.standby is None:
            return f"replica    {self.database}: does not answer ({self.error})"
        if self.refused is not None:
            return (
                f"replica    {self.database}: not a replica of this store ({self.refused}): "
                "not used for reads"
            )
        if not self.standby:
            return f"replica    {self.database}: not a standby (promoted?): not used for reads"
        behind = f" ({self.behind_bytes} bytes of WAL behind the primary)"
        if self.receiving is False:
            where = (
                "it has replayed all the primary wrote so far"
                if self.behind_bytes == 0
                else f"lag {_fmt_lag(self.lag_s)}{behind if self.behind_bytes else ''}"
            )
            return (
                f"replica    {self.database}: standby CUT OFF from its primary (no WAL "
                f"receiver streams to it): {where}"
            )
        if self.behind_bytes:
            return f"replica    {self.database}: standby, lag {_fmt_lag(self.lag_s)}{behind}"
        return f"replica    {self.database}: standby, lag {_fmt_lag(self.lag_s)}"


def _fmt_lag(lag: float | None) -> str:
    return "not known" if lag is None else f"{lag:.1f} s"


@dataclass
class StoreStatus:
    """The facts ``mnestoma status`` reports.

    ``schema``: ``missing`` (no SQLite file), ``none`` (no mnestoma schema), ``head``,
    ``behind`` (an older revision), ``unknown`` (a revision this release does not know).
    ``passings_by_recorder`` is None where the store has no ``events.recorder`` column
    (before revision 0003), ``ager_runs`` None where it has no ``ager_runs`` table.
    ``outcomes_recorded``: the store has ``events.outcome`` (revision 0008 on), so that
    each recorder's passings with an outcome are counted.
    ``ager_unfinished``: the runs of the ager begun and not completed, oldest first (one
    running, or interrupted ones that the next run completes; None before revision 0007).
    ``events_kept_from``: every event since this instant is kept (the oldest event other
    than a ``created`` one: ``prune_events`` deletes those before its cutoff and keeps the
    created event of each live row); ``oldest_event``: the oldest of all.
    ``estimated`` (PostgreSQL, unless ``exact``): the counts of ``events`` and of the query
    log are the catalogue's estimates, the recorders' shares and the latest passings those of
    the newest events, ``oldest_event`` the first by id and ``events_kept_from`` not known;
    ``query_log_estimated``: the query log's count is an estimate (else it was counted: a
    log the catalogue puts below ``STATUS_ESTIMATE_FROM`` rows, an empty one included).
    ``chains``: the planner's chains (``mnest_chains``; None where the store has no such
    table, before revision 0014), ``chains_estimated``: that number is the catalogue's
    estimate (PostgreSQL, from ``STATUS_ESTIMATE_FROM`` of them, unless ``exact``; else
    counted).
    ``history_to_split`` (PostgreSQL, events partitioned): the partitions of ``events`` in
    the old layout that hold rows, then the default partition if it holds rows, which
    ``mnestoma split-history`` rebuilds into months, each with its rows: as the planner
    estimates them from the catalogue where the events' counts are estimates
    (``estimated``), else counted; None elsewhere.
    ``scanned``: the counts were asked exact, and every row was read.
    ``standby``: this database is a hot standby (a read replica), ``standby_lag_s`` its
    lag (None when not known: ``standby_cut_off``, no WAL receiver streams to it from a
    primary); ``replicas``: what each read replica given says of itself, against the primary.
    """

    database: str
    dialect: str
    schema: str
    revision: str | None
    head: str
    at: datetime
    mnests_by_state: dict[str, int] = field(default_factory=dict)
    events: int = 0
    events_by_kind: dict[str, int] = field(default_factory=dict)
    passings: int = 0
    passings_with_turn: int = 0
    last_passing: datetime | None = None
    last_turn_passing: datetime | None = None
    events_kept_from: datetime | None = None
    oldest_event: datetime | None = None
    query_log: int = 0
    chains: int | None = None
    recurring_protos: list[Mnest] = field(default_factory=list)
    passings_by_recorder: dict[str, RecorderFacts] | None = None
    ager_runs: int | None = None
    ager_runs_recent: int = 0
    last_ager_run: AgerRunFacts | None = None
    ager_unfinished: list[AgerProgressFacts] | None = None
    outcomes_recorded: bool = False
    estimated: bool = False
    mnests_estimated: bool = False
    query_log_estimated: bool = False
    chains_estimated: bool = False
    scanned: bool = False
    standby: bool = False
    standby_lag_s: float | None = None
    standby_cut_off: bool = False
    replicas: list[ReplicaFacts] | None = None
    history_to_split: list[OldPartition] | None = None

    def count(self, n: int) -> str:
        """A count as the status shows it: "about N" when it is an estimate."""
        return f"about {n}" if self.estimated else str(n)

    def mnest_count(self, n: int) -> str:
        """A count of mnests as the status shows it: "about N" when it is an estimate."""
        return f"about {n}" if self.mnests_estimated else str(n)

    @property
    def ager_interrupted(self) -> list[AgerProgressFacts]:
        """The runs of the ager that were interrupted and not yet completed by another."""
        return [r for r in self.ager_unfinished or [] if not r.running]

    @property
    def mnests(self) -> int:
        """Rows of ``mnests`` in every state."""
        return sum(self.mnests_by_state.values())

    @property
    def empty(self) -> bool:
        """True when the store holds no mnest, no event and no logged query."""
        return self.mnests == 0 and self.events == 0 and self.query_log == 0

    @property
    def automatic(self) -> dict[str, RecorderFacts]:
        """The automatic recorders (tracer, otel) that wrote at least one passing here."""
        by = self.passings_by_recorder or {}
        return {
            r.value: by[r.value] for r in AUTOMATIC_RECORDERS if by.get(r.value, _NONE).passings
        }

    @property
    def fed_automatically(self) -> bool | None:
        """True when a tracer or processor recorded a passing here; None when the rows
        cannot tell (passings exist but the store predates ``events.recorder``)."""
        if self.passings_by_recorder is None and self.passings:
            return None
        return bool(self.automatic)

    @property
    def reporting_outcomes(self) -> dict[str, RecorderFacts]:
        """The recorders that wrote at least one passing with an outcome (ok or error)."""
        by = self.passings_by_recorder or {}
        return {name: f for name, f in by.items() if f.with_outcome}

    @property
    def outcomes_reported(self) -> bool | None:
        """True when some recorder wrote a passing with an outcome here; None when the rows
        cannot tell (passings exist but the store has no ``events.outcome``)."""
        if not self.outcomes_recorded or self.passings_by_recorder is None:
            return None if self.passings else False
        return bool(self.reporting_outcomes)

    def outcomes(self) -> str | None:
        """The sentence about outcomes, chosen by the facts; None when there is no passing."""
        if not self.passings:
            return None
        reported = self.outcomes_reported
        if reported is None:
            return (
                f"not known: revision {self.revision} has no events.outcome, so no passing "
                "here can say whether what followed it succeeded"
            )
        if not reported:
            return (
                "none reported: no passing here says whether what followed it succeeded "
                "(ok) or failed (error)"
            )
        return "reported by " + "; ".join(
            f"{recorder_name(name)}: {self.count(f.with_outcome)} of {self.count(f.passings)} "
            f"passing{'s' if f.passings != 1 else ''} ({f.ok} ok, {f.error} error)"
            for name, f in self.reporting_outcomes.items()
        )

    def feeding(self) -> str:
        """The sentence about automatic recording, chosen by the facts."""
        fed = self.fed_automatically
        if fed is None:
            return (
                f"who recorded these passings is not known: revision {self.revision} has no "
                "events.recorder; after `mnestoma db upgrade` they read as calls of the API."
            )
        if not fed:
            others = [
                f"{recorder_name(name)} ({self.count(f.passings)})"
                for name, f in (self.passings_by_recorder or {}).items()
                if f.passings
            ]
            if not others:
                return FEEDING_STATEMENT
            return f"{FEEDING_STATEMENT} The passings here were recorded by {', '.join(others)}."
        parts = []
        for r in AUTOMATIC_RECORDERS:
            facts = (self.passings_by_recorder or {}).get(r.value, _NONE)
            name = recorder_name(r.value)
            if facts.passings:
                n = facts.passings
                parts.append(
                    f"{self.count(n)} passing{'s' if n != 1 else ''} by {name}, "
                    f"last at {_fmt_time(facts.last)} ({ago(facts.last, self.at)})"
                )
            else:
                parts.append(f"none by {name}")
        return "fed automatically: " + "; ".join(parts) + "."

    def advice(self) -> str | None:
        """What to run when the schema is not at head, else None."""
        if self.schema == "missing":
            return (
                "no database file yet: it is created on first use (e.g. `mnestoma record`) "
                "or by `mnestoma db upgrade`"
            )
        if self.schema == "none":
            return "no mnestoma schema here yet: run `mnestoma db upgrade`"
        if self.schema == "behind":
            return (
                f"revision {self.revision}, head {self.head}: run `mnestoma db upgrade` "
                "before using this store"
            )
        if self.schema == "unknown":
            return (
                f"revision {self.revision} is unknown to this release (head {self.head}): "
                "upgrade the mnestoma package"
            )
        return None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping with stable keys (times as ISO-8601 UTC)."""
        by_recorder = None
        if self.passings_by_recorder is not None:
            by_recorder = {
                name: {
                    "passings": f.passings,
                    "last": iso_utc(f.last),
                    "ok": f.ok,
                    "error": f.error,
                }
                for name, f in self.passings_by_recorder.items()
            }
        ager = None
        if self.ager_runs is not None:
            last = self.last_ager_run
            ager = {
                "total": self.ager_runs,
                "last_30_days": self.ager_runs_recent,
                "last": None
                if last is None
                else {"ts": iso_utc(last.ts), "duration_s": last.duration_s, **last.counters()},
                "unfinished": None
                if self.ager_unfinished is None
                else [r.as_dict() for r in self.ager_unfinished],
            }
        return {
            "database": self.database,
            "dialect": self.dialect,
            "schema": self.schema,
            "revision": self.revision,
            "head": self.head,
            "at_head": self.schema == "head",
            "advice": self.advice(),
            "at": iso_utc(self.at),
            "empty": self.empty,
            "mnests": self.mnests,
            "mnests_by_state": dict(self.mnests_by_state),
            "events": self.events,
            "events_by_kind": dict(self.events_by_kind),
            "events_kept_from": iso_utc(self.events_kept_from),
            "oldest_event": iso_utc(self.oldest_event),
            "passings": self.passings,
            "passings_with_turn": self.passings_with_turn,
            "last_passing": iso_utc(self.last_passing),
            "last_turn_passing": iso_utc(self.last_turn_passing),
            "query_log": self.query_log,
            "chains": self.chains,
            "recurring_protos": [
                {
                    "id": m.id,
                    "src_executor": m.src_executor,
                    "src_version": m.src_version,
                    "dst_executor": m.dst_executor,
                    "uses": m.uses,
                    "effective_weight": m.effective_weight(self.at),
                    "desired_sig": m.desired_sig,
                }
                for m in self.recurring_protos
            ],
            "passings_by_recorder": by_recorder,
            "fed_automatically": self.fed_automatically,
            "ager_runs": ager,
            "feeding": self.feeding(),
            "reading": READING_STATEMENT,
            "outcomes_reported": self.outcomes_reported,
            "outcomes": self.outcomes(),
            "estimated": self.estimated,
            "mnests_estimated": self.mnests_estimated,
            "chains_estimated": self.chains_estimated,
            "scanned": self.scanned,
            "standby": self.standby,
            "standby_lag_s": self.standby_lag_s,
            "standby_cut_off": self.standby_cut_off,
            "replicas": None if self.replicas is None else [r.as_dict() for r in self.replicas],
            "history_to_split": None
            if self.history_to_split is None
            else [p.as_dict() for p in self.history_to_split],
        }


_NONE = RecorderFacts()


def collect_status(
    url_or_engine: str | URL | Engine | None = None,
    *,
    clock: Clock | None = None,
    exact: bool = False,
    replicas: Sequence[str | URL] | None = None,
) -> StoreStatus:
    """Read the facts of a store without migrating or creating anything.

    ``clock`` is the status's now: the recurring protos' weights and the ager's "last 30
    days" are counted from it. On PostgreSQL the counts of ``events`` are the catalogue's
    estimates unless ``exact`` (which reads every event; contract §12). ``replicas``: read
    replicas of this database, each asked for its lag.
    """
    now = read_clock(clock or utc_now)
    # folded once: the status's reads take their now from it (the given clock, else now)
    settings = Settings(clock=clock or (lambda: now))
    head = head_revision()
    if isinstance(url_or_engine, Engine):
        status = _collect(url_or_engine, head, now, settings, exact)
    else:
        url = resolve_database_url(url_or_engine)
        where = redact_url(url)
        if sqlite_store_missing(url):
            return StoreStatus(where, backend_of(url).name, "missing", None, head, now)
        engine = make_engine(url)
        try:
            status = _collect(engine, head, now, settings, exact)
        finally:
            engine.dispose()
    status.scanned = exact
    if replicas:
        primary_url = (
            url_or_engine.url
            if isinstance(url_or_engine, Engine)
            else resolve_database_url(url_or_engine)
        )
        urls = replica_urls(primary_url, replicas)
        primary = _primary_facts(url_or_engine)
        status.replicas = [_replica_facts(u, primary, settings.replica_read_timeout) for u in urls]
    return status


def _primary_facts(url_or_engine: str | URL | Engine | None) -> tuple[tuple[str, str], int, float]:
    """The primary's identity and WAL position, and when it was read (time.monotonic()):
    read before its replicas' (contract §12: a replica's lag is measured against it)."""
    engine = url_or_engine if isinstance(url_or_engine, Engine) else make_engine(url_or_engine)
    try:
        with translate_errors(), engine.connect() as conn:
            identity = server_identity(conn)
            read_at = time.monotonic()
            return identity, lsn_of(conn.execute(SERVER_POSITION).scalar_one()), read_at
    finally:
        if engine is not url_or_engine:
            engine.dispose()


def _replica_facts(
    url: URL, primary: tuple[tuple[str, str], int, float], timeout: float
) -> ReplicaFacts:
    """What the replica at ``url`` says of itself, against the primary's identity and WAL
    position, within ``timeout`` seconds as a facade's read on it (it not answering is a
    fact, not an error)."""
    where = redact_url(url)
    engine = make_engine(url, connect_args=replica_connect_args(url))
    bind_to_deadlines(engine)
    try:
        with read_deadline(timeout), translate_errors(), engine.connect() as conn:
            measure = measure_replica(conn, primary[1], primary[2])
    except MnestomaError as err:
        return ReplicaFacts(where, None, error=str(err))
    finally:
        engine.dispose()
    return ReplicaFacts(
        where,
        measure.standby,
        measure.lag_s,
        behind_bytes=measure.behind_bytes if measure.standby else None,  # none replayed
        receiving=measure.receiving,
        refused=identity_difference(measure.identity, primary[0]),
    )


def _collect(
    engine: Engine, head: str, now: datetime, settings: Settings, exact: bool
) -> StoreStatus:
    status = StoreStatus(redact_url(engine.url), engine.dialect.name, "none", None, head, now)
    with translate_errors(), engine.connect() as conn:
        if backend_of(conn).replicas:  # a server that may be a standby
            standby, _replayed, _received, lag = conn.execute(REPLICA_PROBE).one()
            status.standby = bool(standby)
            status.standby_lag_s = None if lag is None or not standby else float(lag)
            if standby and not conn.execute(REPLICA_STATUS).one()[3]:
                status.standby_cut_off = True  # its "lag" would say 0: it receives nothing
                status.standby_lag_s = None
        status.revision = read_revision(conn)
        inspector = inspect(conn)
        tables = set(inspector.get_table_names())
        if status.revision == head:
            status.schema = "head"
        elif status.revision is None:
            status.schema = "none"
        elif status.revision in known_revisions():
            status.schema = "behind"
        else:
            status.schema = "unknown"
        event_columns = (
            {c["name"] for c in inspector.get_columns(EVENTS.name)}
            if EVENTS.name in tables
            else set()
        )
        status.outcomes_recorded = "outcome" in event_columns
        estimate = not exact
        _count(conn, tables, status, by_recorder="recorder" in event_columns, estimate=estimate)
        if EVENTS.name in tables:
            status.history_to_split = waiting_history(conn, counted=not status.estimated)
        if AGER_RUNS.name in tables:
            _count_ager_runs(conn, status)
        if AGER_PROGRESS.name in tables:
            _unfinished_ager_runs(conn, status)
        if status.schema == "head":
            stmt = read.recurring_protos_statement(conn.dialect.name)
            params = {"uses": RECURRING_MIN_USES, "floor": RECURRING_MIN_WEIGHT}
            rows = runner_for(conn).rows(stmt, {**params, "now": settings.now()})
            status.recurring_protos = [snapshots.mnest(r) for r in rows]
        conn.rollback()
    return status


def _count(
    conn: Connection, tables: set[str], status: StoreStatus, *, by_recorder: bool, estimate: bool
) -> None:
    """Rows per state and kind, the passings and the query log; the passings per recorder
    where the store has ``events.recorder`` (revision 0003 on). With ``estimate`` (and a
    store with recorders and outcomes), the counts of events and of the query log are the
    catalogue's estimates where it has any (:func:`_estimate_events`)."""
    has_estimates = backend_of(conn).server  # the catalogue's estimates
    if MNESTS.name in tables and not (
        estimate and has_estimates and _estimate_mnests(conn, status)
    ):
        by_state = dict.fromkeys((s.value for s in MnestState), 0)
        for state, n in conn.execute(sql.MNESTS_BY_STATE):
            by_state[state] = int(n)
        status.mnests_by_state = by_state
    estimated = (
        estimate
        and EVENTS.name in tables
        and by_recorder
        and status.outcomes_recorded
        and (_estimate_events(conn, status) if has_estimates else _sample_events(conn, status))
    )
    if EVENTS.name in tables and not estimated:
        by_kind = dict.fromkeys((k.value for k in EventKind), 0)
        for kind, n in conn.execute(sql.EVENTS_BY_KIND):
            by_kind[kind] = int(n)
        status.events_by_kind = by_kind
        status.events = sum(by_kind.values())
        kept_from, oldest = conn.execute(sql.EVENTS_KEPT_FROM).one()
        status.events_kept_from, status.oldest_event = _as_utc(kept_from), _as_utc(oldest)
        if by_recorder:
            _count_passings_by_recorder(conn, status)
        else:
            passings, last, with_turn, last_with_turn = conn.execute(sql.PASSINGS).one()
            status.passings, status.last_passing = int(passings), _as_utc(last)
            status.passings_with_turn = int(with_turn)
            status.last_turn_passing = _as_utc(last_with_turn)
    if QUERIES.name in tables:
        rows = _estimated_rows(conn, QUERIES.name) if estimated and has_estimates else None
        status.query_log_estimated = rows is not None and rows >= STATUS_ESTIMATE_FROM
        if not status.query_log_estimated:  # a small log is counted: never "about 0"
            rows = int(conn.execute(sql.QUERY_LOG_COUNT).scalar_one())
        status.query_log = int(rows or 0)
    if CHAINS.name in tables:
        _count_chains(conn, status, estimate=estimate and has_estimates)


def _count_chains(conn: Connection, status: StoreStatus, *, estimate: bool) -> None:
    """The planner's chains: with ``estimate`` (PostgreSQL), the catalogue's estimate from
    :data:`~mnestoma.rules.STATUS_ESTIMATE_FROM` of them; else (below it, or the table never
    analysed) counted. SQLite counts them, as it counts the edges per state."""
    known = list(_leaves(conn, CHAINS.name).values()) if estimate else []
    rows = sum(n or 0.0 for n in known)
    # a table never analysed (a young, small one) has no estimate: counted, not "about"
    status.chains_estimated = bool(known) and None not in known and rows >= STATUS_ESTIMATE_FROM
    if not status.chains_estimated:
        rows = int(conn.execute(sql.CHAIN_COUNT).scalar_one())
    status.chains = round(rows)


def _leaves(conn: Connection, name: str) -> dict[tuple[str, str], float | None]:
    """The relations holding table ``name``'s rows (itself, or its leaf partitions), each
    with the catalogue's estimate of its rows (None: never analysed since it was made or
    truncated)."""
    return {
        (schema, relname): None if tuples < 0 else float(tuples)
        for schema, relname, tuples in conn.execute(sql.TABLE_LEAVES, {"table": name})
    }


def _rows(
    conn: Connection, leaves: dict[tuple[str, str], float | None]
) -> dict[tuple[str, str], float]:
    """The rows of each leaf: the catalogue's estimate, or a count where it has none (a
    relation never analysed is a young one: autovacuum analyses a table after 50 rows
    and a tenth of it have changed)."""
    return {
        leaf: float(conn.execute(sql.leaf_count(*leaf)).scalar_one()) if n is None else n
        for leaf, n in leaves.items()
    }


def _estimated_rows(conn: Connection, name: str) -> int | None:
    """The rows of table ``name`` by the catalogue (summed over its partitions)."""
    leaves = _leaves(conn, name)
    return round(sum(_rows(conn, leaves).values())) if leaves else None


def _column_shares(
    conn: Connection, leaves: dict[tuple[str, str], float | None], column: str
) -> dict[tuple[str, str], dict[str, float]]:
    """Each analysed leaf's shares of the values of ``column`` (``pg_stats``' most common
    values and their frequencies)."""
    schemas = sorted({schema for schema, _ in leaves})
    names = sorted({name for _, name in leaves})
    shares: dict[tuple[str, str], dict[str, float]] = {}
    params = {"schemas": schemas, "tables": names, "columns": [column]}
    for schema, relname, _attname, _nulls, values, freqs in conn.execute(sql.COLUMN_SHARES, params):
        if leaves.get((schema, relname)) is not None and values is not None:
            shares[(schema, relname)] = dict(zip(values, freqs, strict=True))
    return shares


def _estimate_mnests(conn: Connection, status: StoreStatus) -> bool:
    """The rows of ``mnests`` per state from the catalogue (PostgreSQL): ``reltuples`` and
    ``pg_stats``' shares of ``state``, as :func:`_estimate_events` does for the kinds of
    events. Counting them reads every edge (0.5 s at 3M of them), which the status's fixed
    cost cannot afford. False (nothing set) when the catalogue has no statistics of
    ``mnests`` yet or estimates fewer than :data:`~mnestoma.rules.STATUS_ESTIMATE_FROM`
    rows: the caller counts them."""
    known = _leaves(conn, MNESTS.name)
    total = sum(n or 0.0 for n in known.values())
    if total < STATUS_ESTIMATE_FROM:
        return False
    shares = _column_shares(conn, known, "state")
    if not shares:
        return False
    by_state = dict.fromkeys((s.value for s in MnestState), 0)
    for leaf, freqs in shares.items():
        rows = known[leaf] or 0.0
        for state, freq in freqs.items():
            by_state[state] = by_state.get(state, 0) + round(rows * freq)
    status.mnests_by_state = by_state
    status.mnests_estimated = True
    return True


def _estimate_events(conn: Connection, status: StoreStatus) -> bool:
    """The status's facts about ``events`` without reading them all (PostgreSQL): the
    rows and their kinds from the catalogue (``reltuples``, each relation's ``pg_stats``
    shares of ``kind``, summed over the partitions), the recorders, outcomes and turns as
    their shares among the passings of the newest :data:`~mnestoma.rules.STATUS_RECENT_EVENTS`
    events. False (nothing set) when the catalogue has no statistics of ``events`` yet (a
    table autovacuum has never analysed is a small one) or estimates fewer than
    :data:`~mnestoma.rules.STATUS_ESTIMATE_FROM` events: the caller counts them."""
    known = _leaves(conn, EVENTS.name)
    if sum(n or 0.0 for n in known.values()) < STATUS_ESTIMATE_FROM:
        return False
    leaves = _rows(conn, known)
    shares = _column_shares(conn, known, "kind")
    analysed = sum(leaves[leaf] for leaf in shares)
    if analysed <= 0:
        return False
    total = sum(leaves.values())
    by_kind = dict.fromkeys((k.value for k in EventKind), 0.0)
    for leaf, freqs in shares.items():
        for kind, freq in freqs.items():
            by_kind[kind] = by_kind.get(kind, 0.0) + leaves[leaf] * freq
    estimated = {kind: round(n * total / analysed) for kind, n in by_kind.items()}
    return _estimated(conn, status, estimated, total)


def _sample_events(conn: Connection, status: StoreStatus) -> bool:
    """The status's facts about ``events`` without reading them all (SQLite, which keeps no
    estimates): the rows and their kinds from :data:`~mnestoma.rules.STATUS_SAMPLED_IDS`
    ids drawn at random between the lowest and the highest, the rest as on PostgreSQL
    (:func:`_recent_shares`). False (nothing set) below
    :data:`~mnestoma.rules.STATUS_ESTIMATE_FROM` events: the caller counts them."""
    lo, hi = conn.execute(sql.EVENT_ID_RANGE).one()
    if lo is None or hi is None or hi - lo + 1 < STATUS_ESTIMATE_FROM:
        return False
    span = int(hi) - int(lo) + 1
    n = STATUS_SAMPLED_IDS
    params = {"lo": int(lo), "span": span, "n": n}
    found: dict[str, int] = {str(k): int(c) for k, c in conn.execute(sql.SAMPLED_KINDS, params)}
    total = span * sum(found.values()) / n
    if total < STATUS_ESTIMATE_FROM:
        return False
    by_kind = dict.fromkeys((k.value for k in EventKind), 0)
    for kind, count in found.items():
        by_kind[str(kind)] = round(span * int(count) / n)
    return _estimated(conn, status, by_kind, total)


def _estimated(
    conn: Connection, status: StoreStatus, by_kind: dict[str, int], total: float
) -> bool:
    """Set the status's estimated facts about ``events`` (PostgreSQL's catalogue, SQLite's
    sample): ``total`` rows, ``by_kind``, the rest from the newest events. True."""
    status.events_by_kind = by_kind
    status.events = round(total)
    status.passings = sum(by_kind.get(kind, 0) for kind in PASSING)
    _recent_shares(conn, status)
    status.oldest_event = _as_utc(conn.execute(sql.OLDEST_EVENT).scalar())
    status.events_kept_from = None
    status.estimated = True
    return True


def _recent_shares(conn: Connection, status: StoreStatus) -> None:
    """Each recorder's share of the passings, with outcomes and turns, and the latest
    passings, from the newest events; applied to the estimated count of passings."""
    found = {r.value: RecorderFacts(ok=0, error=0) for r in Recorder}
    rows = conn.execute(sql.RECENT_PASSINGS_BY_RECORDER, {"n": STATUS_RECENT_EVENTS}).all()
    seen = sum(int(row[1]) for row in rows)
    scale = status.passings / seen if seen else 0.0
    lasts: list[datetime] = []
    turn_lasts: list[datetime] = []
    with_turn = 0
    for recorder, n, last, turns, last_turn, ok, error in rows:
        if not n:
            continue
        found[str(recorder)] = RecorderFacts(
            round(n * scale), _as_utc(last), round(ok * scale), round(error * scale)
        )
        with_turn += int(turns)
        if last is not None:
            lasts.append(parse_sqlite_timestamp(last))
        if last_turn is not None:
            turn_lasts.append(parse_sqlite_timestamp(last_turn))
    status.passings_with_turn = round(with_turn * scale)
    status.last_passing = max(lasts, default=None)
    status.last_turn_passing = max(turn_lasts, default=None)
    status.passings_by_recorder = found


def _count_passings_by_recorder(conn: Connection, status: StoreStatus) -> None:
    """Passings (created/reinforced events) per ``events.recorder`` with the last instant
    and, where the store has ``events.outcome``, how many carry each outcome; and their
    totals, from one scan of the passing events."""
    outcomes = status.outcomes_recorded
    found = {r.value: RecorderFacts(ok=0, error=0) if outcomes else _NONE for r in Recorder}
    lasts: list[datetime] = []
    turn_lasts: list[datetime] = []
    stmt = sql.PASSINGS_BY_RECORDER_WITH_OUTCOMES if outcomes else sql.PASSINGS_BY_RECORDER
    for row in conn.execute(stmt):
        recorder, n, last, with_turn, last_with_turn = row[:5]
        ok, error = (int(row[5]), int(row[6])) if outcomes else (None, None)
        facts = RecorderFacts(int(n), _as_utc(last), ok, error)
        found[str(recorder)] = facts
        status.passings += facts.passings
        status.passings_with_turn += int(with_turn)
        if facts.last is not None:
            lasts.append(facts.last)
        if last_with_turn is not None:
            turn_lasts.append(parse_sqlite_timestamp(last_with_turn))
    status.last_passing = max(lasts, default=None)
    status.last_turn_passing = max(turn_lasts, default=None)
    status.passings_by_recorder = found


def _count_ager_runs(conn: Connection, status: StoreStatus) -> None:
    """How often the ager ran (in all, and in the 30 days up to now) and its last run."""
    window = {"since": status.at - AGER_WINDOW, "at": status.at}
    total, recent = conn.execute(sql.AGER_RUN_COUNTS, window).one()
    status.ager_runs, status.ager_runs_recent = int(total), int(recent)
    last = conn.execute(sql.LAST_AGER_RUN).first()
    if last is not None:
        status.last_ager_run = AgerRunFacts(
            ts=parse_sqlite_timestamp(last.ts),
            duration_s=float(last.duration_s),
            report=AgerReport(**{name: int(getattr(last, name)) for name in AGER_COUNTERS}),
        )


def _unfinished_ager_runs(conn: Connection, status: StoreStatus) -> None:
    """The rows of ``ager_progress``: the newest is running while a run holds the lock."""
    rows = conn.execute(sql.AGER_PROGRESS_ROWS).all()
    running = bool(rows) and ager_running(conn)
    status.ager_unfinished = [
        AgerProgressFacts(
            ts=parse_sqlite_timestamp(r.ts),
            started=parse_sqlite_timestamp(r.started),
            updated=parse_sqlite_timestamp(r.updated),
            batches=int(r.batches),
            running=running and i == len(rows) - 1,
        )
        for i, r in enumerate(rows)
    ]


def _as_utc(value: Any) -> datetime | None:
    """An aggregate's timestamp as an aware UTC datetime, whatever the driver returned."""
    return None if value is None else parse_sqlite_timestamp(value)


def _fmt_time(value: datetime | None) -> str:
    return short_utc(value, "never")


def _render_retention(status: StoreStatus) -> str | None:
    """The ``kept`` line: from when every event is kept (see ``StoreStatus``)."""
    oldest, since = status.oldest_event, status.events_kept_from
    if oldest is None:
        return None
    if status.estimated:
        return (
            f"kept       events from {_fmt_time(oldest)} (the oldest by id); "
            "`--exact` says from when every event is kept"
        )
    if since is None:
        return f"kept       only created events, the oldest at {_fmt_time(oldest)}"
    line = f"kept       every event since {_fmt_time(since)}"
    if oldest < since:
        line += f"; before it only created events, from {_fmt_time(oldest)}"
    return line


def _render_history(status: StoreStatus) -> str | None:
    """The ``history`` line: how much of events waits to be split into months ("about N"
    where the events' counts are estimates); None when nothing waits."""
    waiting = status.history_to_split
    if not waiting:
        return None
    known = sum(p.rows or 0 for p in waiting)
    unknown = sum(p.rows is None for p in waiting)
    n = sum(not p.is_default for p in waiting)
    rows = f"{status.count(known)} events"
    if unknown:
        rows += f" (and {unknown} not analysed yet)"
    holders = [f"{n} partition{'s' if n != 1 else ''} of events in the old layout"] if n else []
    if any(p.is_default for p in waiting):
        holders.append("the default partition" if n else "the default partition of events")
    return (
        f"history    {' and '.join(holders)} hold{'s' if len(waiting) == 1 else ''} "
        f"{rows}: `mnestoma split-history` puts each event in its month"
    )


def _render_recorders(status: StoreStatus) -> str | None:
    """The ``recorders`` line: who wrote the passings, when last; None when nothing to say."""
    if status.passings_by_recorder is None:
        if status.passings:
            return "recorders  not known at this revision (no events.recorder column)"
        return None
    wrote = [(name, f) for name, f in status.passings_by_recorder.items() if f.passings]
    if not wrote:
        return None
    return "recorders  " + ", ".join(
        f"{name} {status.count(f.passings)} (last {_fmt_time(f.last)})" for name, f in wrote
    )


def _render_ager(status: StoreStatus) -> list[str]:
    """The ``ager`` lines from ``ager_runs``: how often, and what the last run did."""
    if status.ager_runs is None:
        return []
    last = status.last_ager_run
    unfinished = [
        f"           {'running' if r.running else 'INTERRUPTED'}: the run at "
        f"{_fmt_time(r.ts)}, begun {_fmt_time(r.started)}, "
        + (
            f"{r.batches} batch{'es' if r.batches != 1 else ''} so far"
            if r.running
            else f"stopped after {r.batches} batch{'es' if r.batches != 1 else ''} "
            f"(last at {_fmt_time(r.updated)}); the next run completes it"
        )
        for r in status.ager_unfinished or []
    ]
    if not status.ager_runs or last is None:
        return ["ager       the ager has never run here (no row in ager_runs)", *unfinished]
    n = status.ager_runs
    counters = ", ".join(f"{k} {v}" for k, v in last.counters().items())
    return [
        f"ager       {n} run{'s' if n != 1 else ''}, {status.ager_runs_recent} in the last "
        f"{AGER_WINDOW.days} days; last at {_fmt_time(last.ts)} ({ago(last.ts, status.at)}), "
        f"took {last.duration_s:.3f} s",
        f"           last run: {counters}",
        *unfinished,
    ]


def render_status(status: StoreStatus) -> str:
    """The status as a few readable lines."""
    lines = [f"database   {status.database}"]
    if status.standby:
        lag = (
            "CUT OFF from its primary (no WAL receiver streams to it): lag not known"
            if status.standby_cut_off
            else f"lag {_fmt_lag(status.standby_lag_s)}"
        )
        lines.append(
            f"role       this is a read replica (a hot standby of a primary, read-only), {lag}"
        )
    for replica in status.replicas or []:
        lines.append(replica.line())
    if status.schema == "head":
        lines.append(f"schema     revision {status.revision} (head)")
    elif status.schema == "missing":
        lines.append("schema     none: the database file does not exist")
    elif status.schema == "none":
        lines.append(f"schema     none (no mnestoma tables); head is {status.head}")
    else:
        rev = status.revision or "none"
        lines.append(f"schema     revision {rev}, head {status.head}: not at head")
    advice = status.advice()
    if advice:
        lines.append(f"           {advice}")
    if status.schema in ("head", "behind", "unknown") or status.mnests or status.events:
        if status.empty:
            lines.append("contents   the store is empty: no mnest, no event, no logged query")
        else:
            states = ", ".join(
                f"{k} {status.mnest_count(v)}" for k, v in status.mnests_by_state.items()
            )
            lines.append(f"mnests     {status.mnest_count(status.mnests)} ({states})")
            kinds = ", ".join(
                f"{k} {status.count(v)}" for k, v in status.events_by_kind.items() if v
            )
            lines.append(
                f"events     {status.count(status.events)}" + (f" ({kinds})" if kinds else "")
            )
            retention = _render_retention(status)
            if retention:
                lines.append(retention)
            history = _render_history(status)
            if history:
                lines.append(history)
            lines.append(
                f"passings   {status.count(status.passings)} (created/reinforced events), "
                f"{status.count(status.passings_with_turn)} with a turn_id"
            )
            if status.passings_with_turn:
                lines.append(
                    f"           last with a turn_id {_fmt_time(status.last_turn_passing)}, "
                    f"last of all {_fmt_time(status.last_passing)}"
                )
            elif status.passings:
                lines.append(
                    "           none carries a turn_id: no caller has recorded a turn here; "
                    f"last passing {_fmt_time(status.last_passing)}"
                )
            recorders = _render_recorders(status)
            if recorders:
                lines.append(recorders)
            outcomes = status.outcomes()
            if outcomes:
                lines.append(f"outcomes   {outcomes}")
            n = status.query_log
            shown = f"about {n}" if status.query_log_estimated else str(n)
            lines.append(f"query log  {shown} entr{'y' if n == 1 else 'ies'}")
            if status.chains is not None:
                c = status.chains
                lines.append(
                    f"chains     {f'about {c}' if status.chains_estimated else c} "
                    "(pairs of consecutive links of recorded turns, read by predict_next)"
                )
            if status.scanned:
                lines.append("counts     exact: every row read (--exact scans the tables)")
            if status.estimated or status.mnests_estimated or status.chains_estimated:
                lines.append(
                    "counts     about: the catalogue's estimates, and the shares of the newest "
                    f"{STATUS_RECENT_EVENTS} events; `mnestoma status --exact` reads every row"
                )
        lines.extend(_render_ager(status))
        if status.schema == "head":
            lines.append(
                f"recurring protos (uses >= {RECURRING_MIN_USES}, "
                f"weight >= {RECURRING_MIN_WEIGHT:.2f}): {len(status.recurring_protos)}"
            )
            for m in status.recurring_protos:
                summary = ""
                if isinstance(m.desired_sig, dict) and m.desired_sig.get("summary"):
                    summary = f"  wished: {m.desired_sig['summary']}"
                lines.append(
                    f"  {m.id}  {m.src_executor}@{m.src_version} -> {m.dst_executor}"
                    f"  uses {m.uses}  weight {m.effective_weight(status.at):.3f}{summary}"
                )
    lines.append("")
    lines.append(status.feeding())
    lines.append(READING_STATEMENT)
    return "\n".join(lines)
