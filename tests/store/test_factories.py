"""The factories of ``mnestoma.testing``: every row they make passes every constraint (§2)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from mnestoma import CanonicalQuery, Event, Mnest
from mnestoma.core.rules import DEFAULT_DECAY_LAMBDA
from mnestoma.engines import make_engine
from mnestoma.schema.models import Base
from mnestoma.testing import (
    CanonicalQueryFactory,
    DecayingMnestFactory,
    EventFactory,
    MnestFactory,
    ProtoMnestFactory,
)


@pytest.fixture
def mnestoma_engine(store_url: str) -> Iterator[Engine]:
    """The plugin's engine, on each engine of this project's suite (an empty store at head)."""
    engine = make_engine(store_url)
    yield engine
    engine.dispose()


def _count(session: Session, model: type[Base]) -> int:
    return session.scalar(select(func.count()).select_from(model)) or 0


# Each factory's traits ("" for none); a batch draws (factory, traits) pairs from them.
TRAITS: dict[Any, list[str]] = {
    MnestFactory: ["", "strong", "weak", "old", "superseded"],
    ProtoMnestFactory: ["", "recurring", "old", "superseded"],
    DecayingMnestFactory: ["", "old"],
    EventFactory: ["", "reinforced", "transition", "promoted", "pruned"],
    CanonicalQueryFactory: [""],
}
RECIPES: list[tuple[Any, dict[str, bool]]] = [
    (factory, {trait: True} if trait else {})
    for factory, traits in TRAITS.items()
    for trait in traits
]

# PostgreSQL's JSONB cannot hold U+0000 (the store refuses it there with a StoreError).
json_text = st.text(st.characters(exclude_characters="\x00"), max_size=8)
json_leaves = st.none() | st.booleans() | st.integers(-(2**31), 2**31) | json_text
json_docs = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(json_text, inner),
    max_leaves=6,
)
# Values a caller may legitimately pass to the mnest factories on top of a trait.
mnest_overrides = st.fixed_dictionaries(
    {},
    optional={
        "weight": st.floats(0.0, 1.0),
        "uses": st.integers(1, 10**6),
        "tags": json_docs,
        "last_seen_days_ago": st.floats(0.0, 400.0),
    },
)
batches = st.lists(
    st.tuples(st.sampled_from(RECIPES), st.integers(1, 20), mnest_overrides),
    min_size=1,
    max_size=5,
)


def _make(recipe: tuple[Any, dict[str, bool]], n: int, overrides: dict[str, Any]) -> list[Any]:
    factory, traits = recipe
    extra = overrides if issubclass(factory, MnestFactory) else {}
    return factory.create_batch(n, **traits, **extra)


def _check_invariants(obj: Any) -> None:
    if isinstance(obj, Mnest):
        assert obj.id.startswith("mn_") and len(obj.id) >= 15
        assert obj.ts_first <= obj.ts_last
        for ts in (obj.ts_first, obj.ts_last, obj.ts_weight):
            assert ts.utcoffset() == timedelta(0)
        assert 0.0 <= obj.weight <= 1.0 and obj.uses >= 1
        assert obj.decay_lambda == DEFAULT_DECAY_LAMBDA
        if obj.state == "proto":
            assert obj.dst_version is None
        elif obj.state in ("active", "decaying"):
            assert obj.dst_version is not None
    elif isinstance(obj, CanonicalQuery):
        assert obj.canonical_hash == hashlib.sha256(obj.canonical_query.encode()).hexdigest()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=batches)
def test_factory_batches_pass_every_constraint_and_read_back_equal(
    mnestoma_session: Session, plan: list[tuple[Any, int, dict[str, Any]]]
) -> None:
    savepoint = mnestoma_session.begin_nested()  # one example never sees another's rows
    try:
        assert _count(mnestoma_session, Mnest) == 0
        made = [obj for recipe, n, overrides in plan for obj in _make(recipe, n, overrides)]
        mnestoma_session.flush()  # the database checks every constraint here
        expected = {(type(o), o.id): o.as_dict() for o in made}
        for obj in made:
            _check_invariants(obj)
        mnestoma_session.expunge_all()
        for (model, key), values in expected.items():
            assert mnestoma_session.get(model, key).as_dict() == values
    finally:
        savepoint.rollback()


def test_sequences_give_every_mnest_factory_a_distinct_edge_key(mnestoma_session: Session) -> None:
    rows = [
        *MnestFactory.create_batch(30),
        *ProtoMnestFactory.create_batch(30),
        *DecayingMnestFactory.create_batch(30),
    ]
    keys = {(r.src_executor, r.src_version, r.dst_executor, r.dst_version, r.state) for r in rows}
    assert len(keys) == 90
    assert _count(mnestoma_session, Mnest) == 90


def test_mnest_factory_makes_an_active_versioned_edge(mnestoma_session: Session) -> None:
    edge = MnestFactory()
    assert edge.state == "active" and edge.dst_version is not None
    assert edge.ts_weight == edge.ts_last > edge.ts_first
    assert mnestoma_session.get(Mnest, edge.id) is edge


def test_proto_factory_describes_the_missing_executor(mnestoma_session: Session) -> None:
    proto = ProtoMnestFactory(src_executor="search", dst_executor="summarise")
    assert (proto.state, proto.dst_version) == ("proto", None)
    assert set(proto.desired_sig) >= {"summary", "inputs", "outputs"}
    assert proto.desired_sig["outputs"] == ["summarise.result"]


def test_recurring_proto_trait_meets_the_recurring_thresholds(mnestoma_session: Session) -> None:
    proto = ProtoMnestFactory(recurring=True)
    assert proto.uses >= 3 and proto.weight >= 0.30
    assert proto.ts_weight == proto.ts_last


def test_old_trait_is_120_days_back_with_a_low_weight(mnestoma_session: Session) -> None:
    edge = MnestFactory(old=True)
    now = edge.ts_last + timedelta(days=120)
    assert edge.effective_weight(now) < 0.05


def test_event_factory_makes_a_mnest_only_when_given_none(mnestoma_session: Session) -> None:
    own = EventFactory()
    given_mnest = MnestFactory()
    by_object = EventFactory(mnest=given_mnest)
    by_id = EventFactory(mnest_id="mn_pruned_long_ago", pruned=True)
    assert mnestoma_session.get(Mnest, own.mnest_id) is not None
    assert by_object.mnest_id == given_mnest.id
    assert by_id.mnest_id == "mn_pruned_long_ago"
    assert _count(mnestoma_session, Mnest) == 2
    assert _count(mnestoma_session, Event) == 3


def test_canonical_query_factory_hashes_the_canonical_form(mnestoma_session: Session) -> None:
    row = CanonicalQueryFactory(raw_query="  Weather IN  Paris ")
    assert row.canonical_query == "weather in paris"
    assert row.canonical_hash == hashlib.sha256(b"weather in paris").hexdigest()
    assert row.id is not None


def test_build_strategy_touches_no_database(mnestoma_session: Session) -> None:
    MnestFactory.build_batch(3)
    EventFactory.build()
    assert _count(mnestoma_session, Mnest) == 0
    assert not mnestoma_session.new
