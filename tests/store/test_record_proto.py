"""``record_proto``: the proto case reads naturally, with every check of contract §4 kept."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO
from helpers_proc import run_python

import mnestoma
from mnestoma import InvalidInput, UnitOfWork, make_engine, make_session_factory
from mnestoma.testing.clock import MovableClock

SIG = {"summary": "extract the text of a PDF", "inputs": {"body": "bytes"}}


def test_record_proto_creates_a_proto_at_0_30(store: mnestoma.Mnestoma) -> None:
    m = store.record_proto("http.fetch", "1.4", "pdf.to_text", desired_sig=SIG)
    assert (m.state, m.dst_version, m.weight, m.uses) == ("proto", None, pytest.approx(0.30), 1)
    assert m.desired_sig == SIG
    found = store.find("http.fetch", "1.4", "pdf.to_text", None, "proto")
    assert found is not None and found.as_dict() == m.as_dict()
    assert [e.kind for e in store.events(mnest_id=m.id)] == ["created"]


def test_record_proto_is_record_passing_with_no_destination(
    store: mnestoma.Mnestoma, clock: MovableClock
) -> None:
    first = store.record_proto("a", "1", "b")
    clock.advance(days=1)
    again = store.record_passing("a", "1", "b", None, dst_exists=False, desired_sig=SIG)
    clock.advance(days=1)
    third = store.record_proto("a", "1", "b", tags={"k": "v"})
    assert first.id == again.id == third.id
    assert third.uses == 3 and third.desired_sig == SIG and third.tags == {"k": "v"}
    assert [e.kind for e in store.events(mnest_id=first.id)] == [
        "created",
        "reinforced",
        "reinforced",
    ]


def test_record_proto_beside_an_active_edge_of_the_same_pair(store: mnestoma.Mnestoma) -> None:
    active = store.record_passing("a", "1", "b", "2")
    proto = store.record_proto("a", "1", "b")
    assert active.id != proto.id and {active.state, proto.state} == {"active", "proto"}


def test_record_proto_with_a_turn_counts_the_turn_once(store: mnestoma.Mnestoma) -> None:
    store.record_proto("a", "1", "b", turn_id="t-1")
    retried = store.record_proto("a", "1", "b", turn_id="t-1")
    assert retried.uses == 1
    assert len(store.events(turn_id="t-1")) == 1


def test_a_missing_version_on_an_existing_executor_is_still_invalid_input(
    store: mnestoma.Mnestoma,
) -> None:
    with pytest.raises(InvalidInput):
        store.record_passing("a", "1", "b")  # dst_exists=True needs a dst_version
    with pytest.raises(InvalidInput):
        store.record_passing("a", "1", "b", None)
    assert store.edges() == [] and store.events() == []


def test_record_proto_takes_no_destination_version(store: mnestoma.Mnestoma) -> None:
    with pytest.raises(TypeError):
        store.record_proto("a", "1", "b", "2")  # type: ignore[misc]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("", "1", "b"), {}),
        (("a", " ", "b"), {}),
        (("a", "1", "\x00b"), {}),
        (("a", "1", "b"), {"turn_id": ""}),
        (("a", "1", "b"), {"desired_sig": object()}),
        (("a", "1", "b"), {"tags": {"k": float("nan")}}),
    ],
    ids=["empty-src", "blank-version", "control-char", "empty-turn", "sig-not-json", "nan-tag"],
)
def test_record_proto_refuses_bad_input_and_writes_nothing(
    store: mnestoma.Mnestoma, args: tuple[str, str, str], kwargs: dict[str, object]
) -> None:
    with pytest.raises(InvalidInput):
        store.record_proto(*args, **kwargs)  # type: ignore[arg-type]
    assert store.edges() == [] and store.events() == []


def test_the_repository_has_the_same_door(store_url: str, clock: MovableClock) -> None:
    engine = make_engine(store_url)
    try:
        with UnitOfWork(make_session_factory(engine), clock=clock) as uow:
            m = uow.mnests.record_proto("a", "1", "b", desired_sig=SIG, turn_id="t")
            uow.commit()
    finally:
        engine.dispose()
    with mnestoma.Mnestoma(store_url) as store:
        stored = store.get(m.id)
    assert stored is not None and stored.as_dict() == m.as_dict()
    assert (m.state, m.dst_version, m.desired_sig) == ("proto", None, SIG)


def test_the_services_guide_example_prints_what_its_comments_say(tmp_path: Path) -> None:
    guide = REPO / "docs" / "services.md"
    blocks = re.findall(r"```python\n(.*?)```", guide.read_text(encoding="utf-8"), re.S)
    [block] = [b for b in blocks if "record_proto(" in b]
    done = run_python(block, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "proto None 2",
        "AgerReport(decayed=1, to_decaying=2, merged=0, protos_pruned=0, archive_candidates=0)",
    ]
    assert "# proto None 2" in block and "# AgerReport(decayed=1, to_decaying=2" in block
