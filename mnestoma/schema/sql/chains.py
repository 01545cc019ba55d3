"""The statements of the planner's chains (contract §13): counting a turn's chains, reading
what follows a context, the ager's forgetting of faded chains (a batch at a time, by key
range), and the chains a picture of the graph lists.

Built once per dialect (or shape); callers only bind parameters.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Delete,
    Float,
    Insert,
    Integer,
    Select,
    String,
    any_,
    bindparam,
    cast,
    delete,
    func,
    literal,
    literal_column,
    select,
    tuple_,
    union_all,
)

from mnestoma.core.rules import CHAIN_DECAY_LAMBDA, CHAIN_FORGET_BELOW, threshold_cut
from mnestoma.core.sqlrules import advanced, decayed_count, now_param
from mnestoma.schema.sql.read import out_of_source
from mnestoma.schema.sql.spelling import spelling_of
from mnestoma.schema.sql.tables import CHAINS as C
from mnestoma.schema.sql.tables import MNESTS as M

__all__ = [
    "AFTER_KEY",
    "CHAIN_KEY",
    "CHAIN_ROW",
    "UPTO_KEY",
    "chain_batch_end",
    "chain_count",
    "chains_from",
    "count_chains",
    "count_chains_from",
    "forget_chains",
    "next_counts",
]

CHAIN_KEY = ("prev_executor", "src_executor", "dst_executor")
# The parameters of count_chains, in the order of the tuples the repository builds: the key,
# the passings this turn adds, its instant.
CHAIN_ROW = ("c_prev", "c_src", "c_dst", "c_n", "c_now")
# The parameters that bound a batch of the ager's forgetting, by key: above ``AFTER_KEY``
# (the previous batch's last key), up to ``UPTO_KEY`` (this batch's last), each the key's
# three names in order.
AFTER_KEY = ("after_prev", "after_src", "after_dst")
UPTO_KEY = ("upto_prev", "upto_src", "upto_dst")
_CHAIN_VALUES = ("decayed_uses", "uses", "ts_first", "ts_last")
_LAMBDA = literal(CHAIN_DECAY_LAMBDA, Float)


def chain_count(dialect: str) -> ColumnElement[Any]:
    """A chain's decayed count of passings at ``:now`` (:func:`mnestoma.rules.decayed_count`
    with :data:`~mnestoma.rules.CHAIN_DECAY_LAMBDA`): every read of chains uses this one."""
    count: ColumnElement[Any] = decayed_count(C.c.decayed_uses, _LAMBDA, C.c.ts_last, now_param())
    return count


def _key() -> ColumnElement[Any]:
    """The chain's key as a row value ``(prev, src, dst)``, compared in key order."""
    return tuple_(*(C.c[k] for k in CHAIN_KEY))


def _bound(names: tuple[str, str, str]) -> ColumnElement[Any]:
    """A key bound as a row value of three parameters."""
    return tuple_(*(bindparam(n, type_=String()) for n in names))


@functools.cache
def count_chains(dialect: str) -> Insert:
    """Add ``:c_n`` passings at ``:c_now`` to a chain
    (executemany, in key order): a new chain starts at that count; an existing one is
    decayed to the later of its ``ts_last`` and ``:c_now`` and gets them added
    (:func:`mnestoma.rules.counted_passing`, ``c_n``
    times at one instant), its ``ts_last`` never moving back."""
    ins = spelling_of(dialect).insert(C)
    stmt = ins.values(
        prev_executor=bindparam("c_prev", type_=String()),
        src_executor=bindparam("c_src", type_=String()),
        dst_executor=bindparam("c_dst", type_=String()),
        decayed_uses=bindparam("c_n", type_=Float()),
        uses=cast(bindparam("c_n", type_=Float()), BigInteger),
        ts_first=now_param("c_now"),
        ts_last=now_param("c_now"),
    )
    return _adding(stmt)


def _adding(stmt: Any) -> Insert:
    """``stmt``, an INSERT of new chains, adding its counts to the chains that exist."""
    new = stmt.excluded
    upsert: Insert = stmt.on_conflict_do_update(
        index_elements=[C.c[k] for k in CHAIN_KEY],
        set_={
            "decayed_uses": decayed_count(C.c.decayed_uses, _LAMBDA, C.c.ts_last, new.ts_last)
            + new.decayed_uses,
            "uses": C.c.uses + new.uses,
            "ts_last": advanced(C.c.ts_last, new.ts_last),
        },
    )
    return upsert


def count_chains_from(counts: Select[Any]) -> Insert:
    """PostgreSQL: :func:`count_chains` for rows a select gives, ``(prev, src, dst,
    passings as a float, passings, now, now)``, added in the order it gives them (key order:
    the one order chains are locked in)."""
    columns = [*CHAIN_KEY, "decayed_uses", "uses", "ts_first", "ts_last"]
    return _adding(spelling_of("postgresql").insert(C).from_select(columns, counts))


@functools.cache
def next_counts(dialect: str, with_version: bool, with_chain: bool) -> Select[Any]:
    """What followed the context, in one statement: rows ``(level, dst_executor, decayed
    count now, uses)``, level 1 for the active edges out of ``:src`` (and ``:sv``) summed
    over their rows by destination, level 2 for the chains ``:prev → :src → dst``."""
    count = decayed_count(M.c.decayed_uses, M.c.decay_lambda, M.c.ts_last, now_param())
    edges = (
        select(
            literal(1).label("level"),
            M.c.dst_executor,
            func.sum(count).label("counted"),
            func.sum(M.c.uses).label("uses"),
        )
        .where(*out_of_source(M, with_version))
        .group_by(M.c.dst_executor)
    )
    if not with_chain:
        return edges
    chains = select(
        literal(2).label("level"),
        C.c.dst_executor,
        chain_count(dialect).label("counted"),
        C.c.uses,
    ).where(C.c.prev_executor == bindparam("prev"), C.c.src_executor == bindparam("src"))
    return select(union_all(edges, chains).subquery())


@functools.cache
def chain_batch_end(dialect: str, after: bool) -> Select[Any]:
    """The last key of the next batch of the ager's forgetting: the ``:skip + 1``-th chain in
    key order (above :data:`AFTER_KEY` with ``after``), read through the primary key; no row
    when fewer remain (the batch then runs to the end of the table)."""
    stmt = select(*(C.c[k] for k in CHAIN_KEY))
    if after:
        stmt = stmt.where(_key() > _bound(AFTER_KEY))
    return (
        stmt.order_by(*(C.c[k] for k in CHAIN_KEY))
        .offset(bindparam("skip", type_=Integer()))
        .limit(1)
    )


@functools.cache
def forget_chains(dialect: str, after: bool = False, upto: bool = False) -> Delete:
    """The ager's forgetting: every chain whose decayed count at ``:now`` has faded below
    :data:`~mnestoma.rules.CHAIN_FORGET_BELOW` (compared as the ager compares its
    thresholds); with ``after``, only keys above :data:`AFTER_KEY`, with ``upto``, only keys
    up to :data:`UPTO_KEY` (one batch of a run).

    On PostgreSQL the faded rows are locked ``FOR UPDATE SKIP LOCKED`` before they are
    deleted: the ager never waits for a chain a writer holds (a writer counting a chain
    holds its row until it commits, after locking its turn's edges: waiting for it could
    close a cycle of waits), and a chain a writer is counting has not faded anyway; the next
    run forgets it if it has. SQLite's writers wait for the write lock the ager holds."""
    count = chain_count(dialect)
    terms = [count < literal(threshold_cut(CHAIN_FORGET_BELOW), Float)]
    if after:
        terms.append(_key() > _bound(AFTER_KEY))
    if upto:
        terms.append(_key() <= _bound(UPTO_KEY))
    if not spelling_of(dialect).skips_locked_rows:
        return delete(C).where(*terms)
    # The rows locked, by address: a TID scan of those rows, whatever the plan (a join of the
    # table with its own keys was planned as a scan of the whole table per batch).
    ctid: ColumnElement[Any] = literal_column(f"{C.name}.ctid")
    faded = (
        select(ctid)
        .where(*terms)
        .with_for_update(skip_locked=True)
        .correlate(None)
        .scalar_subquery()
    )
    return delete(C).where(ctid == any_(func.array(faded)))


@functools.cache
def chains_from(dialect: str, among: bool) -> Select[Any]:
    """The chains a picture of the graph lists, in key order, as rows ``(prev, src, dst,
    decayed_uses, uses, ts_first, ts_last)``: every chain, or (``among``) those whose middle
    executor is one of ``:srcs`` (an expanding list of names)."""
    stmt = select(*(C.c[k] for k in (*CHAIN_KEY, *_CHAIN_VALUES)))
    if among:
        stmt = stmt.where(C.c.src_executor.in_(bindparam("srcs", expanding=True)))
    return stmt.order_by(*(C.c[k] for k in CHAIN_KEY))
