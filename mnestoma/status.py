"""``mnestoma status``: what a store holds and who feeds it, from facts only.

Reading the status never migrates or creates anything: a missing SQLite file stays missing,
a database behind head is reported as such (with the command that upgrades it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, func, inspect, select
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from .config import (
    READ_ONLY_OPTION,
    is_memory_sqlite,
    is_sqlite,
    make_engine,
    redact_url,
    resolve_database_url,
)
from .errors import translate_errors
from .migration import head_revision, known_revisions
from .models import CanonicalQuery, Event, Mnest
from .repository import MnestRepository
from .rules import RECURRING_MIN_USES, RECURRING_MIN_WEIGHT, EventKind, MnestState
from .types import parse_sqlite_timestamp
from .validation import Clock, read_clock, utc_now

__all__ = [
    "FEEDING_STATEMENT",
    "StoreStatus",
    "collect_status",
    "missing_sqlite_file",
    "render_status",
]

FEEDING_STATEMENT = (
    "Nothing in mnestoma records turns by itself: only code that calls record_passing / "
    "record_turn feeds this store, and no planner reads it unless it calls suggest_next / walk."
)
PASSING_KINDS = (EventKind.CREATED.value, EventKind.REINFORCED.value)

M = Mnest.__table__
E = Event.__table__
Q = CanonicalQuery.__table__


@dataclass
class StoreStatus:
    """The facts ``mnestoma status`` reports; ``schema`` is one of the ``SCHEMA_*`` words.

    ``schema``: ``missing`` (no SQLite file), ``none`` (no mnestoma schema), ``head``,
    ``behind`` (an older revision), ``unknown`` (a revision this release does not know).
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
    query_log: int = 0
    recurring_protos: list[Mnest] = field(default_factory=list)

    @property
    def mnests(self) -> int:
        """Rows of ``mnests`` in every state."""
        return sum(self.mnests_by_state.values())

    @property
    def empty(self) -> bool:
        """True when the store holds no mnest, no event and no logged query."""
        return self.mnests == 0 and self.events == 0 and self.query_log == 0

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
            "passings": self.passings,
            "passings_with_turn": self.passings_with_turn,
            "last_passing": iso_utc(self.last_passing),
            "last_turn_passing": iso_utc(self.last_turn_passing),
            "query_log": self.query_log,
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
            "feeding": FEEDING_STATEMENT,
        }


def iso_utc(value: datetime | None) -> str | None:
    """ISO-8601 in UTC with a ``Z``, or None."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def missing_sqlite_file(url: URL) -> Path | None:
    """The path of a SQLite database file that does not exist yet, else None."""
    if not is_sqlite(url) or is_memory_sqlite(url):
        return None
    database = url.database or ""
    if database.startswith("file:"):
        return None
    path = Path(database).expanduser()
    return None if path.exists() else path


def collect_status(
    url_or_engine: str | URL | Engine | None = None, *, clock: Clock | None = None
) -> StoreStatus:
    """Read the facts of a store without migrating or creating anything."""
    now = read_clock(clock or utc_now)
    head = head_revision()
    if isinstance(url_or_engine, Engine):
        return _collect(url_or_engine, head, now, clock)
    url = resolve_database_url(url_or_engine)
    where = redact_url(url)
    if missing_sqlite_file(url) is not None:
        return StoreStatus(where, "sqlite", "missing", None, head, now)
    engine = make_engine(url)
    try:
        return _collect(engine, head, now, clock)
    finally:
        engine.dispose()


def _collect(engine: Engine, head: str, now: datetime, clock: Clock | None) -> StoreStatus:
    status = StoreStatus(redact_url(engine.url), engine.dialect.name, "none", None, head, now)
    reader = engine.execution_options(**{READ_ONLY_OPTION: True})
    with translate_errors(), reader.connect() as conn:
        status.revision = MigrationContext.configure(conn).get_current_revision()
        tables = set(inspect(conn).get_table_names())
        if status.revision == head:
            status.schema = "head"
        elif status.revision is None:
            status.schema = "none"
        elif status.revision in known_revisions():
            status.schema = "behind"
        else:
            status.schema = "unknown"
        _count(conn, tables, status)
        if status.schema == "head":
            with Session(bind=conn) as session:
                repo = MnestRepository(session, clock=clock or (lambda: now))
                status.recurring_protos = repo.recurring_protos(
                    min_uses=RECURRING_MIN_USES, min_weight=RECURRING_MIN_WEIGHT
                )
        conn.rollback()
    return status


def _count(conn: Connection, tables: set[str], status: StoreStatus) -> None:
    """Counts that only use columns every known revision has (a store behind head too)."""
    if "mnests" in tables:
        by_state = dict.fromkeys((s.value for s in MnestState), 0)
        for state, n in conn.execute(select(M.c.state, func.count()).group_by(M.c.state)):
            by_state[state] = int(n)
        status.mnests_by_state = by_state
    if "events" in tables:
        by_kind = dict.fromkeys((k.value for k in EventKind), 0)
        for kind, n in conn.execute(select(E.c.kind, func.count()).group_by(E.c.kind)):
            by_kind[kind] = int(n)
        status.events_by_kind = by_kind
        status.events = sum(by_kind.values())
        passing = E.c.kind.in_(PASSING_KINDS)
        row = conn.execute(
            select(func.count(), func.max(E.c.ts)).select_from(E).where(passing)
        ).one()
        status.passings, status.last_passing = int(row[0]), _as_utc(row[1])
        row = conn.execute(
            select(func.count(), func.max(E.c.ts))
            .select_from(E)
            .where(passing, E.c.turn_id.is_not(None))
        ).one()
        status.passings_with_turn, status.last_turn_passing = int(row[0]), _as_utc(row[1])
    if "canonical_query_log" in tables:
        status.query_log = int(conn.execute(select(func.count()).select_from(Q)).scalar_one())


def _as_utc(value: Any) -> datetime | None:
    """An aggregate's timestamp as an aware UTC datetime, whatever the driver returned."""
    return None if value is None else parse_sqlite_timestamp(value)


def _fmt_time(value: datetime | None) -> str:
    return "never" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def render_status(status: StoreStatus) -> str:
    """The status as a few readable lines."""
    lines = [f"database   {status.database}"]
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
            states = ", ".join(f"{k} {v}" for k, v in status.mnests_by_state.items())
            lines.append(f"mnests     {status.mnests} ({states})")
            kinds = ", ".join(f"{k} {v}" for k, v in status.events_by_kind.items() if v)
            lines.append(f"events     {status.events}" + (f" ({kinds})" if kinds else ""))
            lines.append(
                f"passings   {status.passings} (created/reinforced events), "
                f"{status.passings_with_turn} with a turn_id"
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
            lines.append(f"query log  {status.query_log} entries")
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
    lines.append(FEEDING_STATEMENT)
    return "\n".join(lines)
