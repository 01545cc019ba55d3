"""transition_state, promote_proto_to_active and recurring_protos (both engines)."""

from __future__ import annotations

from typing import Any

import pytest

from mnestoma import ConflictError, InvalidInput, InvalidTransition, Mnestoma, NotFound


def _dump(store: Mnestoma) -> tuple[list[dict], list[dict]]:
    return [r.as_dict() for r in store.edges()], [e.as_dict() for e in store.events()]


def test_a_transition_changes_the_state_and_records_an_event(store: Mnestoma) -> None:
    a = store.record_passing("a", "1", "b", "1")
    moved = store.transition_state(a.id, "superseded", reason="b@2 replaces it")
    assert moved.state == "superseded" and store.get(a.id).state == "superseded"
    ev = store.events(mnest_id=a.id)[-1]
    assert (ev.kind, ev.state_before, ev.state_after, ev.reason) == (
        "transition",
        "active",
        "superseded",
        "b@2 replaces it",
    )


def assert_refused(store: Mnestoma, error: type[Exception], call: Any, *args: Any) -> None:
    """``call(*args)`` raises ``error`` and leaves every row as it was."""
    before = _dump(store)
    with pytest.raises(error):
        call(*args)
    assert _dump(store) == before


def test_the_same_state_again_changes_nothing_and_records_nothing(store: Mnestoma) -> None:
    a = store.record_passing("a", "1", "b", "1")
    before = _dump(store)
    assert store.transition_state(a.id, "active").state == "active"
    assert _dump(store) == before


def test_an_unknown_state_is_invalid_input(store: Mnestoma) -> None:
    a = store.record_passing("a", "1", "b", "1")
    assert_refused(store, InvalidInput, store.transition_state, a.id, "retired")


def test_an_unknown_id_is_not_found(store: Mnestoma) -> None:
    with pytest.raises(NotFound):
        store.transition_state("mn_nosuchrow00000", "decaying")
    with pytest.raises(LookupError):
        store.promote_proto_to_active("mn_nosuchrow00000", "1")


@pytest.mark.parametrize("target", ["active", "decaying"])
def test_a_proto_cannot_become_active_or_decaying(store: Mnestoma, target: str) -> None:
    p = store.record_passing("a", "1", "w", dst_exists=False)
    assert_refused(store, InvalidTransition, store.transition_state, p.id, target)


def test_a_proto_can_be_superseded(store: Mnestoma) -> None:
    p = store.record_passing("a", "1", "w", dst_exists=False)
    assert store.transition_state(p.id, "superseded").state == "superseded"


@pytest.mark.parametrize("start", ["active", "decaying", "superseded"])
def test_a_versioned_row_cannot_become_a_proto(store: Mnestoma, start: str) -> None:
    a = store.record_passing("a", "1", "b", "1")
    if start != "active":
        store.transition_state(a.id, start)
    assert_refused(store, InvalidTransition, store.transition_state, a.id, "proto")


def test_a_transition_onto_a_taken_key_is_a_conflict(store: Mnestoma) -> None:
    a = store.record_passing("a", "1", "b", "1")
    store.transition_state(a.id, "decaying")
    b = store.record_passing("a", "1", "b", "1")  # new active beside the decaying one
    before = _dump(store)
    with pytest.raises(ConflictError):
        store.transition_state(b.id, "decaying")
    with pytest.raises(ConflictError):
        store.transition_state(a.id, "active")
    assert _dump(store) == before


def test_promotion_sets_the_version_and_clears_the_signature(store: Mnestoma) -> None:
    p = store.record_passing("a", "1", "pdf", dst_exists=False, desired_sig={"summary": "x"})
    store.record_passing("a", "1", "pdf", dst_exists=False)
    active = store.promote_proto_to_active(p.id, "0.1.0")
    assert (active.id, active.state, active.dst_version, active.desired_sig, active.uses) == (
        p.id,
        "active",
        "0.1.0",
        None,
        2,
    )
    assert store.find("a", "1", "pdf", "0.1.0").id == p.id
    ev = store.events(mnest_id=p.id)[-1]
    assert (ev.kind, ev.state_before, ev.state_after) == ("promoted", "proto", "active")
    # the next passing reinforces the promoted row
    assert store.record_passing("a", "1", "pdf", "0.1.0").id == p.id


def test_promoting_what_is_not_a_proto_is_an_invalid_transition(store: Mnestoma) -> None:
    a = store.record_passing("a", "1", "b", "1")
    assert_refused(store, InvalidTransition, store.promote_proto_to_active, a.id, "2")


def test_promoting_onto_an_existing_active_edge_is_a_conflict(store: Mnestoma) -> None:
    store.record_passing("a", "1", "pdf", "0.1.0")
    p = store.record_passing("a", "1", "pdf", dst_exists=False)
    assert_refused(store, ConflictError, store.promote_proto_to_active, p.id, "0.1.0")


@pytest.mark.parametrize("version", ["", "  ", "x" * 256, "a\x00b", None, 3])
def test_promotion_needs_a_valid_version(store: Mnestoma, version: object) -> None:
    p = store.record_passing("a", "1", "pdf", dst_exists=False)
    with pytest.raises(InvalidInput):
        store.promote_proto_to_active(p.id, version)  # type: ignore[arg-type]


def test_recurring_protos_need_three_uses_and_weight_030(store: Mnestoma, clock) -> None:
    for _ in range(3):
        store.record_passing("a", "1", "pdf", dst_exists=False)
    for _ in range(2):
        store.record_passing("a", "1", "ocr", dst_exists=False)
    for _ in range(4):
        store.record_passing("b", "1", "pdf", dst_exists=False)
    found = store.recurring_protos()
    assert [(p.src_executor, p.uses) for p in found] == [("b", 4), ("a", 3)]
    # weight of a 3-use proto: 0.60; after enough days it falls below 0.30
    clock.advance(days=38.6)  # 0.60·e^(−0.018·38.6) ≈ 0.2996
    assert [p.src_executor for p in store.recurring_protos()] == ["b"]
    assert [p.dst_executor for p in store.recurring_protos(min_uses=2, min_weight=0.0)] == [
        "pdf",
        "pdf",
        "ocr",
    ]


def test_recurring_protos_ignore_active_rows(store: Mnestoma) -> None:
    for _ in range(5):
        store.record_passing("a", "1", "b", "1")
    assert store.recurring_protos() == []


def test_find_reads_each_state_of_one_key_apart(store: Mnestoma) -> None:
    """One key can hold an active, a decaying and superseded rows at once: find answers for
    the state asked (each state is its own statement, the state written in)."""
    old = store.record_passing("a", "1", "b", "1")
    store.transition_state(old.id, "decaying")
    new = store.record_passing("a", "1", "b", "1")  # a fresh active row beside it
    assert new.id != old.id
    found = {s: store.find("a", "1", "b", "1", state=s) for s in ("active", "decaying")}
    assert found["active"].id == new.id and found["active"].state == "active"
    assert found["decaying"].id == old.id and found["decaying"].state == "decaying"
    assert store.find("a", "1", "b", "1", state="superseded") is None
    store.transition_state(old.id, "superseded")
    assert store.find("a", "1", "b", "1", state="decaying") is None
    assert store.find("a", "1", "b", "1", state="superseded").id == old.id
    proto = store.record_proto("a", "1", "c")
    assert store.find("a", "1", "c", None, state="proto").id == proto.id
    assert store.find("a", "1", "c", None, state="active") is None
