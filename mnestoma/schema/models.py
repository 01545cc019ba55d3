"""Typed declarative models of the store: ``mnests``, ``events``, ``canonical_query_log``,
the ager's and the copies' tables, and the read-only view ``v_mnestoma``.

Alembic revisions are the source of schema truth; these models describe the head revision
(a test checks that both agree).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    CreateView,
    Float,
    Identity,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    event,
    select,
    text,
)
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, Mapper, ORMExecuteState, mapped_column
from sqlalchemy.sql.compiler import SQLCompiler

from mnestoma.core._sqla_compat import compiling_dml_target, retype, visit_table
from mnestoma.core.errors import ReadOnlyError
from mnestoma.core.rules import (
    DEFAULT_DECAY_LAMBDA,
    LIVE,
    MAX_NAME_LENGTH,
    PASSING_KINDS,
    VERSIONED_STATES,
    EventKind,
    MnestState,
    Outcome,
    Recorder,
    decayed_count,
    decayed_weight,
    sql_list,
    sql_literal,
)
from mnestoma.core.types import JSONDocument, UTCDateTime

__all__ = [
    "NAMING_CONVENTION",
    "AgerRun",
    "Base",
    "CanonicalQuery",
    "CopiedStore",
    "Event",
    "Mnest",
    "MnestChain",
    "MnestState",
    "MnestomaView",
    "ReadOnlyError",
    "StoreIdentity",
]

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

STATES_SQL = sql_list(MnestState)
EVENT_KINDS_SQL = sql_list(EventKind)
RECORDERS_SQL = sql_list(Recorder)
OUTCOMES_SQL = sql_list(Outcome)
# The rows looked up by source (the walk, suggest_next, ranking): ix_mnests_active_src.
ACTIVE_WHERE = f"state = {sql_literal(MnestState.ACTIVE)}"
# PostgreSQL: mnests pages are filled to 70 %, leaving room for updates that stay on their
# page (every row is rewritten by each ager run; each passing rewrites one).
MNESTS_FILLFACTOR = 70
# The passings a turn counts once per edge (ux_events_turn_edge).
_TURN_EDGE_WHERE = f"turn_id IS NOT NULL AND kind IN ({sql_list(PASSING_KINDS)})"

# Integer primary keys: BIGINT identity on PostgreSQL, the rowid alias on SQLite.
EventId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    """One declarative base whose metadata names every constraint by one convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONDocument()}


def _name_check(column: str) -> str:
    return f"length(trim({column})) > 0 AND length({column}) <= {MAX_NAME_LENGTH}"


# The columns every edge key starts with.
_SRC_DST = ("src_executor", "src_version", "dst_executor")


def _partial_index(name: str, *columns: str, where: str, unique: bool = False) -> Index:
    """An index over the rows that match ``where``, the same predicate on both engines."""
    predicate = text(where)
    return Index(name, *columns, unique=unique, sqlite_where=predicate, postgresql_where=predicate)


class Mnest(Base):
    """A directed, versioned edge ``src@version → dst@version`` with a weight that decays."""

    __tablename__ = "mnests"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    src_executor: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH))
    src_version: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH))
    dst_executor: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH))
    dst_version: Mapped[str | None] = mapped_column(String(MAX_NAME_LENGTH))
    weight: Mapped[float] = mapped_column(Float)
    uses: Mapped[int] = mapped_column(Integer)
    ts_first: Mapped[datetime]
    ts_last: Mapped[datetime]
    ts_weight: Mapped[datetime]
    decay_lambda: Mapped[float] = mapped_column(
        Float, default=DEFAULT_DECAY_LAMBDA, server_default=text(repr(DEFAULT_DECAY_LAMBDA))
    )
    state: Mapped[str] = mapped_column(String(16))
    tags: Mapped[Any | None] = mapped_column(JSONDocument())
    desired_sig: Mapped[Any | None] = mapped_column(JSONDocument())
    # How many passings were followed by success or failure of the destination (those
    # without a known outcome count in neither); never part of the weight.
    ok_count: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    error_count: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    # The decayed count of passings at ts_last (contract §12, rules.decayed_count): +1 a
    # passing, decayed with decay_lambda, never clamped; what order_by="decayed_uses" reads.
    decayed_uses: Mapped[float] = mapped_column(Float, default=1.0, server_default=text("1.0"))

    __table_args__ = (
        CheckConstraint("substr(id, 1, 3) = 'mn_' AND length(id) >= 15", name="id_format"),
        CheckConstraint(_name_check("src_executor"), name="src_executor_nonempty"),
        CheckConstraint(_name_check("src_version"), name="src_version_nonempty"),
        CheckConstraint(_name_check("dst_executor"), name="dst_executor_nonempty"),
        CheckConstraint(
            "dst_version IS NULL OR (" + _name_check("dst_version") + ")",
            name="dst_version_nonempty",
        ),
        CheckConstraint("weight >= 0 AND weight <= 1", name="weight_range"),
        CheckConstraint("uses >= 1", name="uses_positive"),
        CheckConstraint("ts_last >= ts_first", name="ts_order"),
        # finite too: a bare ">= 0" let +inf in on both engines and NaN on PostgreSQL
        CheckConstraint("decay_lambda >= 0 AND decay_lambda <= 1e300", name="decay_lambda_nonneg"),
        CheckConstraint(f"state IN ({STATES_SQL})", name="state_known"),
        CheckConstraint("ok_count >= 0 AND error_count >= 0", name="outcome_counts_nonneg"),
        CheckConstraint("decayed_uses >= 0", name="decayed_uses_nonneg"),
        CheckConstraint(
            f"(state = {sql_literal(MnestState.PROTO)} AND dst_version IS NULL)"
            f" OR (state IN ({sql_list(VERSIONED_STATES)}) AND dst_version IS NOT NULL)"
            f" OR state = {sql_literal(MnestState.SUPERSEDED)}",
            name="proto_has_no_version",
        ),
        # The edge key, NULL-safe: one index for versioned rows, one for rows without a
        # destination version. Both can be the target of ON CONFLICT ... WHERE.
        _partial_index(
            "ux_mnests_edge_key",
            *_SRC_DST,
            "dst_version",
            "state",
            where="dst_version IS NOT NULL",
            unique=True,
        ),
        _partial_index(
            "ux_mnests_proto_key", *_SRC_DST, "state", where="dst_version IS NULL", unique=True
        ),
        # walk() joins edges on (src_executor, src_version) among active rows; the other
        # states are never looked up by source, and a demoted row leaves this index.
        _partial_index("ix_mnests_active_src", "src_executor", "src_version", where=ACTIVE_WHERE),
        Index("ix_mnests_dst_executor", "dst_executor"),
        {"postgresql_with": {"fillfactor": MNESTS_FILLFACTOR}},
    )

    def effective_weight(self, at: datetime) -> float:
        """The weight at instant ``at``: ``weight × exp(−decay_lambda × days(at − ts_weight))``."""
        from mnestoma.core.types import ensure_aware_utc

        return decayed_weight(
            self.weight, self.decay_lambda, self.ts_weight, ensure_aware_utc(at, "at")
        )

    def decayed_uses_at(self, at: datetime) -> float:
        """The decayed count of passings at instant ``at``: ``decayed_uses × exp(−decay_lambda
        × days(at − ts_last))`` (:func:`mnestoma.rules.decayed_count`)."""
        from mnestoma.core.types import ensure_aware_utc

        return decayed_count(
            self.decayed_uses, self.decay_lambda, self.ts_last, ensure_aware_utc(at, "at")
        )

    @property
    def is_proto(self) -> bool:
        """True for a row that points to an executor that does not exist yet."""
        return self.state == MnestState.PROTO

    def as_dict(self) -> dict[str, Any]:
        """Every column, keyed by column name."""
        return {c.key: getattr(self, c.key) for c in self.__table__.columns}

    def __repr__(self) -> str:
        dst = self.dst_executor + (f"@{self.dst_version}" if self.dst_version else "")
        return (
            f"<Mnest {self.id} {self.src_executor}@{self.src_version} -> {dst}"
            f" {self.state} w={self.weight:.3f} uses={self.uses}>"
        )


class Event(Base):
    """One thing that happened to a mnest; kept after the mnest itself is gone."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(EventId, primary_key=True, autoincrement=True)
    mnest_id: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))
    ts: Mapped[datetime]
    turn_id: Mapped[str | None] = mapped_column(String(MAX_NAME_LENGTH))
    weight_before: Mapped[float | None] = mapped_column(Float)
    weight_after: Mapped[float | None] = mapped_column(Float)
    state_before: Mapped[str | None] = mapped_column(String(16))
    state_after: Mapped[str | None] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    related_id: Mapped[str | None] = mapped_column(String(64))
    recorder: Mapped[str] = mapped_column(
        String(16), default=Recorder.CALL.value, server_default=text("'call'")
    )
    # What followed the passing an event records: 'ok', 'error', or NULL (unknown, and every
    # event that is not a passing).
    outcome: Mapped[str | None] = mapped_column(Text)
    # Which passing of its edge in its turn this is: the k-th time an edge occurs in a turn
    # is its own passing (contract §13). 1 for every other event and every older row.
    occurrence: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))

    __table_args__ = (
        CheckConstraint(f"kind IN ({EVENT_KINDS_SQL})", name="kind_known"),
        CheckConstraint(f"outcome IN ({OUTCOMES_SQL})", name="outcome_known"),
        CheckConstraint(f"recorder IN ({RECORDERS_SQL})", name="recorder_known"),
        Index("ix_events_mnest_id", "mnest_id"),
        # Only events with a turn: lookups by turn imply it, and the ager's events have none.
        _partial_index("ix_events_turn_id", "turn_id", where="turn_id IS NOT NULL"),
        # A turn counts a given occurrence of a row's edge at most once: safe retries.
        # SQLite's index; on PostgreSQL, whose unique indexes on a partitioned table must
        # hold the partition key, event_turn_edges keeps the rule (see _partitioned_layout).
        _partial_index(
            "ux_events_turn_edge",
            "turn_id",
            "mnest_id",
            "occurrence",
            where=_TURN_EDGE_WHERE,
            unique=True,
        ).ddl_if(dialect="sqlite"),
        # PostgreSQL: a partition per month of ts (contract §12).
        {"postgresql_partition_by": "RANGE (ts)"},
    )

    def as_dict(self) -> dict[str, Any]:
        """Every column, keyed by column name."""
        return {c.key: getattr(self, c.key) for c in self.__table__.columns}

    def __repr__(self) -> str:
        return f"<Event {self.id} {self.kind} {self.mnest_id} turn={self.turn_id}>"


_events = cast(Table, Event.__table__)
# PostgreSQL: no table-wide primary key on the partitioned events (it would have to hold ts);
# each partition has its own on id, which the sequence keeps unique across them. The mapper
# still identifies an event by its id.
_events.primary_key.ddl_if(dialect="sqlite")
# What revision 0011 builds beside the table on PostgreSQL (partitions, event_turn_edges, its
# triggers and functions) is built after the table's CREATE by listeners that
# mnestoma.schema.sql.partitions puts on it.


class CanonicalQuery(Base):
    """One normalised request (request-normalisation telemetry); never touches mnests."""

    __tablename__ = "canonical_query_log"

    id: Mapped[int] = mapped_column(EventId, primary_key=True, autoincrement=True)
    ts: Mapped[datetime]
    turn_id: Mapped[str | None] = mapped_column(String(MAX_NAME_LENGTH))
    raw_query: Mapped[str] = mapped_column(Text)
    canonical_query: Mapped[str] = mapped_column(Text)
    canonical_hash: Mapped[str] = mapped_column(String(64))

    __table_args__ = (
        CheckConstraint("length(canonical_hash) = 64", name="canonical_hash_sha256"),
        Index("ix_canonical_query_log_canonical_hash", "canonical_hash"),
        Index("ix_canonical_query_log_ts", "ts"),
    )

    def as_dict(self) -> dict[str, Any]:
        """Every column, keyed by column name."""
        return {c.key: getattr(self, c.key) for c in self.__table__.columns}


class AgerRun(Base):
    """One committed run of the ager: when, how long, and what it did."""

    __tablename__ = "ager_runs"

    id: Mapped[int] = mapped_column(EventId, primary_key=True, autoincrement=True)
    ts: Mapped[datetime]
    duration_s: Mapped[float] = mapped_column(Float)
    decayed: Mapped[int] = mapped_column(Integer)
    to_decaying: Mapped[int] = mapped_column(Integer)
    merged: Mapped[int] = mapped_column(Integer)
    protos_pruned: Mapped[int] = mapped_column(Integer)
    archive_candidates: Mapped[int] = mapped_column(Integer)

    __table_args__ = (
        CheckConstraint("duration_s >= 0", name="duration_nonneg"),
        Index("ix_ager_runs_ts", "ts"),
    )


class AgerProgress(Base):
    """A run of the ager that has begun and not completed: its now, when it began, how far
    its committed batches reached. Deleted with the run's last transaction; a row left
    behind by a run that holds no lock any more is an interrupted run."""

    __tablename__ = "ager_progress"

    id: Mapped[int] = mapped_column(EventId, Identity(), primary_key=True)
    ts: Mapped[datetime]
    started: Mapped[datetime]
    updated: Mapped[datetime]
    batches: Mapped[int] = mapped_column(BigInteger)
    position: Mapped[int] = mapped_column(BigInteger)
    end_position: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (CheckConstraint("batches >= 0", name="batches_nonneg"),)


class StoreIdentity(Base):
    """This store's identity: one row (``id = 1``), ``store_id`` made at random when the
    store was migrated (revision 0012), by which a copy knows which stores' rows another
    holds (:mod:`mnestoma.maintenance.copying`)."""

    __tablename__ = "mnestoma_store"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    store_id: Mapped[str] = mapped_column(Text)

    __table_args__ = (
        CheckConstraint("id = 1", name="one_row"),
        CheckConstraint("length(store_id) > 0", name="store_id_given"),
    )


class CopiedStore(Base):
    """A store whose rows a copy brought into this one: straight from it (``via_store_id``
    NULL) or through the store it copied, which had them; when, and the rows that copy took
    of each table. Kept whatever retention deletes: ``copy --append`` refuses that store
    again."""

    __tablename__ = "mnestoma_copied_stores"

    store_id: Mapped[str] = mapped_column(Text, primary_key=True)
    via_store_id: Mapped[str | None] = mapped_column(Text)
    copied_at: Mapped[datetime]
    mnests: Mapped[int] = mapped_column(BigInteger)
    events: Mapped[int] = mapped_column(BigInteger)
    queries: Mapped[int] = mapped_column(BigInteger)
    ager_runs: Mapped[int] = mapped_column(BigInteger)


class MnestChain(Base):
    """A chain of two consecutive links of recorded turns, ``prev → src → dst`` by executor
    names (contract §13): the decayed count of its passings at ``ts_last`` (with
    :data:`~mnestoma.rules.CHAIN_DECAY_LAMBDA`), their raw count, first and last. The
    planner's context: what followed ``src`` when ``prev`` came before it."""

    __tablename__ = "mnest_chains"

    prev_executor: Mapped[str] = mapped_column(Text, primary_key=True)
    src_executor: Mapped[str] = mapped_column(Text, primary_key=True)
    dst_executor: Mapped[str] = mapped_column(Text, primary_key=True)
    decayed_uses: Mapped[float] = mapped_column(Float)
    uses: Mapped[int] = mapped_column(BigInteger)
    ts_first: Mapped[datetime]
    ts_last: Mapped[datetime]

    __table_args__ = (
        CheckConstraint("decayed_uses >= 0", name="decayed_uses_nonneg"),
        CheckConstraint("uses >= 1", name="uses_positive"),
        CheckConstraint("ts_last >= ts_first", name="ts_order"),
    )

    def decayed_uses_at(self, at: datetime) -> float:
        """The chain's decayed count of passings at instant ``at``."""
        from mnestoma.core.rules import CHAIN_DECAY_LAMBDA
        from mnestoma.core.types import ensure_aware_utc

        return decayed_count(
            self.decayed_uses, CHAIN_DECAY_LAMBDA, self.ts_last, ensure_aware_utc(at, "at")
        )


VIEW_NAME = "v_mnestoma"

_mnests = Mnest.__table__
create_view = CreateView(
    select(*_mnests.c).where(_mnests.c.state.in_(LIVE)),
    VIEW_NAME,
    metadata=Base.metadata,
)


class _ReadOnlyView(Table):
    """The view's Table. PostgreSQL would let an UPDATE or DELETE through a simple view;
    this one refuses to be compiled as the target of either, whoever executes it (the ORM's
    bulk statements, a service's session, a plain Connection): no listener needed."""

    inherit_cache = True


def _is_the_write_target(compiler: SQLCompiler) -> bool:
    """True while the compiler renders the target of an UPDATE or DELETE that is the view
    or an alias of it (a SELECT inside the statement has a stack entry of its own)."""
    statement = compiling_dml_target(compiler)
    target = getattr(statement, "table", None) if getattr(statement, "is_dml", False) else None
    while target is not None and not isinstance(target, _ReadOnlyView):
        target = getattr(target, "element", None)
    return target is not None


@compiles(_ReadOnlyView)
def _compile_view(view: _ReadOnlyView, compiler: SQLCompiler, **kw: Any) -> str:
    if _is_the_write_target(compiler):
        raise ReadOnlyError(f"{VIEW_NAME} is read-only; write through Mnest instead")
    return visit_table(compiler, view, **kw)  # how any Table is compiled


view_table = retype(create_view.table, _ReadOnlyView)  # the same object, refusing writes


class MnestomaView(Base):
    """The ``active`` and ``proto`` rows of ``mnests``, read-only."""

    __table__ = view_table
    __mapper_args__ = {"primary_key": [view_table.c.id]}

    def effective_weight(self, at: datetime) -> float:
        """The weight at instant ``at`` (see :meth:`Mnest.effective_weight`)."""
        return Mnest.effective_weight(self, at)  # type: ignore[arg-type]


def _refuse_view_flush(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    """A flush that would insert, update or delete a ``MnestomaView`` is refused before its
    statement runs, in whatever session holds the object: a mapper event of the view's own
    class, so that no listener sits on SQLAlchemy's ``Session``."""
    raise ReadOnlyError(f"{VIEW_NAME} is read-only; write through Mnest instead")


for _flush_event in ("before_insert", "before_update", "before_delete"):
    event.listen(MnestomaView, _flush_event, _refuse_view_flush)


def refuse_view_inserts(state: ORMExecuteState) -> None:
    """``session.execute(insert(MnestomaView)...)`` would add a row to ``mnests`` through the
    view on PostgreSQL: refused in the sessions of the package's factories (registered on
    each by :func:`mnestoma.make_session_factory`, never on SQLAlchemy's ``Session``). An
    UPDATE or DELETE of the view is refused wherever it is compiled (``_ReadOnlyView``)."""
    if not state.is_insert:
        return
    target = getattr(state.statement, "table", None)
    while target is not None and not isinstance(target, _ReadOnlyView):
        target = getattr(target, "element", None)
    if target is not None:
        raise ReadOnlyError(f"{VIEW_NAME} is read-only; write through Mnest instead")


# The package's mappers configured now, at import, not by the first snapshot a call builds:
# an exception that lands inside SQLAlchemy's configuration (a KeyboardInterrupt, a signal
# handler's exception during a process's first passing) leaves the registry unusable for the
# rest of the process. Only this registry: a service's own mappers are left to SQLAlchemy.
Base.registry.configure()
