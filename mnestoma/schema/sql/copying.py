"""The statements of a store copy (:mod:`mnestoma.maintenance.copying`), built once at import.

Per table: its count, its rows (all, in id order, or above an id), its insert and its
largest id (a table without an integer id, ``mnest_chains``: its rows in key order). For
merging: a temporary table of lookup keys joined to the target's edges, events and chains,
the id lookups and the merge updates. For a PostgreSQL target: the table lock, the identity
sequences moved past the copied ids, and ``ANALYZE``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, cast

from sqlalchemy import (
    BindParameter,
    Column,
    CompoundSelect,
    Delete,
    Insert,
    Integer,
    MetaData,
    Select,
    String,
    Table,
    TextClause,
    Update,
    and_,
    bindparam,
    delete,
    func,
    insert,
    select,
    text,
    union,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql.base import PGDialect

from mnestoma.core.rules import PASSING, SUMMED_ON_MERGE
from mnestoma.schema.models import CopiedStore, StoreIdentity
from mnestoma.schema.sql.chains import CHAIN_KEY
from mnestoma.schema.sql.tables import AGER_RUNS, CHAINS, EVENTS, MNESTS, QUERIES

__all__ = [
    "CHAIN_MERGED_COLUMNS",
    "COPIED_STORES",
    "IDENTITY",
    "KEY",
    "KEYS",
    "KNOWN_MNEST_IDS",
    "MERGED_COLUMNS",
    "MERGE_CHAIN_INTO_TARGET",
    "MERGE_INTO_TARGET",
    "MNESTS_BY_ID",
    "POSTGRESQL_ANALYZE",
    "POSTGRESQL_LOCK",
    "POSTGRESQL_RESET_IDS",
    "PROTO_KEY",
    "STORES",
    "TABLES",
    "StoreStatements",
    "TableStatements",
    "statements",
]

# (table, has an integer id the copy keeps, or shifts past the target's ids when appending),
# in the order the copy fills them. The planner's chains, keyed by executor names, come
# last: appended, a chain both stores hold is merged (:data:`MERGE_CHAIN_INTO_TARGET`).
TABLES: Final[tuple[tuple[Table, bool], ...]] = (
    (MNESTS, False),
    (EVENTS, True),
    (QUERIES, True),
    (AGER_RUNS, True),
    (CHAINS, False),
)
KEY: Final = ("src_executor", "src_version", "dst_executor", "dst_version", "state")
PROTO_KEY: Final = ("src_executor", "src_version", "dst_executor", "state")  # dst_version NULL
# What a merge changes in the target's row.
MERGED_COLUMNS: Final = (
    *SUMMED_ON_MERGE,
    "decayed_uses",
    "ts_first",
    "ts_last",
    "weight",
    "ts_weight",
    "tags",
    "desired_sig",
)


@dataclass(frozen=True, slots=True)
class TableStatements:
    """What the copy runs on one table."""

    table: Table
    count: Select[int]
    rows: Select[Any]  # every row, in no order (the checksum needs none)
    rows_above: Select[Any] | None  # the rows with ``id > :id_above`` (None: no id column)
    in_id_order: Select[Any]  # every row, by id or else by key (the source, in chunks)
    insert: Insert
    max_id: Select[int] | None  # the largest integer id, 0 when empty (None: no id column)

    @classmethod
    def of(cls, table: Table) -> TableStatements:
        if "id" not in table.c:  # the chains: by their key
            return cls(
                table=table,
                count=select(func.count()).select_from(table),
                rows=select(table),
                rows_above=None,
                in_id_order=select(table).order_by(*table.primary_key.columns),
                insert=insert(table),
                max_id=None,
            )
        return cls(
            table=table,
            count=select(func.count()).select_from(table),
            rows=select(table),
            rows_above=select(table).where(table.c.id > bindparam("id_above")),
            in_id_order=select(table).order_by(table.c.id),
            insert=insert(table),
            max_id=select(func.coalesce(func.max(table.c.id), 0)),
        )


_BY_TABLE: Final[dict[str, TableStatements]] = {t.name: TableStatements.of(t) for t, _ in TABLES}


def statements(table: Table) -> TableStatements:
    """The statements of a table: built at import for :data:`TABLES`, else now."""
    known = _BY_TABLE.get(table.name)
    return known if known is not None and known.table is table else TableStatements.of(table)


# --- merging -------------------------------------------------------------------------------

_ids: Final[BindParameter[str]] = bindparam("ids", expanding=True)
# The mnest ids a store knows: its rows', and those its events name (a row merged into
# another, by the ager or by an appending copy, or pruned, keeps its events and their id).
KNOWN_MNEST_IDS: Final[CompoundSelect[Any]] = union(
    select(MNESTS.c.id), select(EVENTS.c.mnest_id.label("id"))
)
MNESTS_BY_ID: Final[Select[Any]] = select(MNESTS).where(MNESTS.c.id.in_(_ids))

# The target's row absorbs the source's: ``:b_id`` and ``:b_<column>`` per merged column.
MERGE_INTO_TARGET: Final[Update] = (
    update(MNESTS)
    .where(MNESTS.c.id == bindparam("b_id", type_=MNESTS.c.id.type))
    .values({c: bindparam(f"b_{c}", type_=MNESTS.c[c].type) for c in MERGED_COLUMNS})
)


# What a merge changes in the target's chain: the two counts decayed to the later ts_last
# and summed (rules.merged_count, CHAIN_DECAY_LAMBDA), uses summed, the earlier ts_first.
CHAIN_MERGED_COLUMNS: Final = ("decayed_uses", "uses", "ts_first", "ts_last")
# The target's chain absorbs the source's: ``:b_<key column>`` and ``:b_<column>`` per merged
# column.
MERGE_CHAIN_INTO_TARGET: Final[Update] = (
    update(CHAINS)
    .where(*(CHAINS.c[k] == bindparam(f"b_{k}", type_=CHAINS.c[k].type) for k in CHAIN_KEY))
    .values({c: bindparam(f"b_{c}", type_=CHAINS.c[c].type) for c in CHAIN_MERGED_COLUMNS})
)


@dataclass(frozen=True, slots=True)
class _KeyTable:
    """A temporary table of lookup keys (``k0``, ``k1``, ...), joined to the target one
    batch at a time.

    A join probes the target's indexes once per key; a row-value ``IN (...)`` list did not
    (PostgreSQL planned it as one OR per key, each re-reading a whole partial index), and a
    VALUES list would be compiled anew for every batch.
    """

    table: Table
    clear: Delete
    fill: Insert
    twins: Select[Any]  # (target id, *KEY) of versioned edges whose key is in the table
    proto_twins: Select[Any]  # (target id, *PROTO_KEY) of protos whose key is in the table
    # (turn_id, mnest_id, occurrence) of passings already counted on the target
    turns: Select[Any]
    shared_rows: Select[Any]  # a mnest id (k0) the target holds as a row
    shared_events: Select[Any]  # a mnest id (k0) the target's events name
    chains: Select[Any]  # the target's chains whose key (k0, k1, k2) is in the table

    @classmethod
    def build(cls) -> _KeyTable:
        table = Table(
            "mnestoma_copy_keys",
            MetaData(),
            *(Column(f"k{i}", String) for i in range(len(KEY))),
            prefixes=["TEMPORARY"],
        )
        k = table.c
        twin_cols = [MNESTS.c[n] for n in KEY]
        proto_cols = [MNESTS.c[n] for n in PROTO_KEY]
        return cls(
            table=table,
            clear=delete(table),
            fill=insert(table),
            twins=select(MNESTS.c.id, *twin_cols)
            .join_from(table, MNESTS, and_(*(c == k[f"k{i}"] for i, c in enumerate(twin_cols))))
            .where(MNESTS.c.dst_version.is_not(None)),
            proto_twins=select(MNESTS.c.id, *proto_cols)
            .join_from(table, MNESTS, and_(*(c == k[f"k{i}"] for i, c in enumerate(proto_cols))))
            .where(MNESTS.c.dst_version.is_(None)),
            turns=select(EVENTS.c.turn_id, EVENTS.c.mnest_id, EVENTS.c.occurrence)
            .join_from(
                table,
                EVENTS,
                and_(
                    EVENTS.c.turn_id == k.k0,
                    EVENTS.c.mnest_id == k.k1,
                    EVENTS.c.occurrence == sql_cast(k.k2, Integer),
                ),
            )
            .where(EVENTS.c.kind.in_(PASSING)),
            shared_rows=select(MNESTS.c.id).join_from(table, MNESTS, MNESTS.c.id == k.k0).limit(1),
            shared_events=select(EVENTS.c.mnest_id)
            .join_from(table, EVENTS, EVENTS.c.mnest_id == k.k0)
            .limit(1),
            chains=select(CHAINS).join_from(
                table,
                CHAINS,
                and_(*(CHAINS.c[c] == k[f"k{i}"] for i, c in enumerate(CHAIN_KEY))),
            ),
        )


KEYS: Final[_KeyTable] = _KeyTable.build()


# --- the stores' identities and the record of copies --------------------------------------

IDENTITY: Final = cast(Table, StoreIdentity.__table__)
COPIED_STORES: Final = cast(Table, CopiedStore.__table__)
# The one row of mnestoma_store.
STORE_ROW: Final = 1


@dataclass(frozen=True, slots=True)
class StoreStatements:
    """What a copy reads and writes of the stores' identities (``mnestoma_store``) and of the
    stores whose rows each holds (``mnestoma_copied_stores``)."""

    identity: Select[Any]  # the store's own identity, if it has one
    give_identity: Insert  # ``:store_id`` as the store's identity (when it has none)
    records: Select[Any]  # every store whose rows it took, with how and when
    record: Insert  # one row of mnestoma_copied_stores per store (executemany)
    forget: Delete  # every record: a store that holds no row holds no other store's

    @classmethod
    def build(cls) -> StoreStatements:
        ids = IDENTITY.c
        return cls(
            identity=select(ids.store_id).where(ids.id == STORE_ROW),
            give_identity=insert(IDENTITY).values(id=STORE_ROW, store_id=bindparam("store_id")),
            records=select(COPIED_STORES).order_by(COPIED_STORES.c.copied_at),
            record=insert(COPIED_STORES),
            forget=delete(COPIED_STORES),
        )


STORES: Final[StoreStatements] = StoreStatements.build()


# --- a PostgreSQL target ------------------------------------------------------------------

_pg = PGDialect().identifier_preparer  # type: ignore[no-untyped-call]
_NAMES: Final = {t.name: _pg.format_table(t) for t, _ in TABLES}

# Writers wait until the copy commits (its reads of the target hold until then).
POSTGRESQL_LOCK: Final[TextClause] = text(
    f"LOCK TABLE {', '.join(_NAMES.values())} IN EXCLUSIVE MODE"
)
# The identity sequences past every copied id.
POSTGRESQL_RESET_IDS: Final[tuple[TextClause, ...]] = tuple(
    text(
        f"SELECT setval(pg_get_serial_sequence(:name, 'id'), "
        f"COALESCE((SELECT MAX(id) FROM {_NAMES[t.name]}), 0) + 1, false)"
    ).bindparams(name=_NAMES[t.name])
    for t, int_id in TABLES
    if int_id
)
# Statistics, so that the first ager after a copy plans well.
POSTGRESQL_ANALYZE: Final[TextClause] = text("ANALYZE " + ", ".join(_NAMES.values()))
