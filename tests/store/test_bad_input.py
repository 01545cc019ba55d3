"""Bad input, swept over every public function of the facade and the command line.

Each invalid input raises the contract's error (``InvalidInput``, also a ``ValueError``;
``NotFound`` for an unknown id; ``InvalidTransition`` for a refused change) and leaves every
table exactly as it was. Names that look like SQL are valid: stored verbatim, harmless.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from conftest import (
    MovableClock,
)
from invariants import check_invariants, dump_tables, plain_engine
from sqlalchemy import text

import mnestoma
from mnestoma import InvalidInput, InvalidTransition, NotFound, Passing

Ids = dict[str, str]
Call = Callable[[mnestoma.Mnestoma, Ids], Any]


def _circular() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


def _deep(depth: int = 100_000) -> list[Any]:
    out: list[Any] = []
    for _ in range(depth):
        out = [out]
    return out


# A name, version, turn id or mnest id the contract refuses; None is tested where required.
BAD_NAMES: dict[str, Any] = {
    "empty": "",
    "blank": "   ",
    "tab": "\t",
    "over-long": "x" * 256,
    "nul": "a\x00b",
    "newline": "a\nb",
    "escape": "a\x1b[31m",
    "del": "a\x7f",
    "c1-control": "a\x85b",
    "lone-surrogate": "a\ud800",
    "int": 7,
    "float-nan": math.nan,
    "bytes": b"search",
    "list": ["search"],
}
BAD_JSON: dict[str, Any] = {
    "object-key": {1: object()},
    "object-value": {"a": object()},
    "int-key": {1: "x"},
    "nan": math.nan,
    "nan-inside": {"a": [1.0, math.nan]},
    "infinity": {"a": math.inf},
    "set": {"a", "b"},
    "bytes": b"raw",
    "circular": _circular(),
    "too-deep": _deep(),
}
BAD_COUNTS: dict[str, Any] = {
    "zero": 0,
    "negative": -1,
    "float": 2.5,
    "nan": math.nan,
    "string": "3",
    "bool": True,
    "none": None,
}
BAD_WEIGHTS: dict[str, Any] = {
    "negative": -0.1,
    "above-one": 1.5,
    "nan": math.nan,
    "infinity": math.inf,
    "string": "0.5",
    "none": None,
}
BAD_STATES: dict[str, Any] = {
    "unknown": "archived",
    "upper-case": "ACTIVE",
    "empty": "",
    "int": 1,
    "none": None,
}
EDGE = ("search", "1", "read", "2")


def _cases() -> list[tuple[str, Call, type[Exception]]]:
    c: list[tuple[str, Call, type[Exception]]] = []

    def add(name: str, call: Call, err: type[Exception] = InvalidInput) -> None:
        c.append((name, call, err))

    for label, bad in BAD_NAMES.items():
        for pos, arg in enumerate(("src_executor", "src_version", "dst_executor", "dst_version")):
            args = list(EDGE)
            args[pos] = bad
            add(f"record_passing-{arg}-{label}", lambda m, i, a=tuple(args): m.record_passing(*a))
        add(
            f"record_passing-turn_id-{label}",
            lambda m, i, b=bad: m.record_passing(*EDGE, turn_id=b),
        )
        add(f"record_turn-turn_id-{label}", lambda m, i, b=bad: m.record_turn(b, [EDGE]))
        add(
            f"record_turn-passing-src-{label}",
            lambda m, i, b=bad: m.record_turn("t", [EDGE, (b, "1", "read", "2")]),
        )
        add(f"find-src_executor-{label}", lambda m, i, b=bad: m.find(b, "1", "read", "2"))
        add(f"find-dst_version-{label}", lambda m, i, b=bad: m.find("search", "1", "read", b))
        add(f"edges-src_executor-{label}", lambda m, i, b=bad: m.edges(src_executor=b))
        add(f"edges-dst_executor-{label}", lambda m, i, b=bad: m.edges(dst_executor=b))
        add(f"events-turn_id-{label}", lambda m, i, b=bad: m.events(turn_id=b))
        add(f"walk-src_executor-{label}", lambda m, i, b=bad: m.walk(b))
        add(f"suggest_next-src_executor-{label}", lambda m, i, b=bad: m.suggest_next(b))
        add(f"suggest_next-src_version-{label}", lambda m, i, b=bad: m.suggest_next("search", b))
        add(
            f"promote-dst_version-{label}",
            lambda m, i, b=bad: m.promote_proto_to_active(i["proto"], b),
        )
        add(
            f"log_canonical_query-turn_id-{label}",
            lambda m, i, b=bad: m.log_canonical_query("q", "q", turn_id=b),
        )
        # free text (queries, reasons) may be long and hold newlines and tabs; other
        # control characters (C0, DEL, C1) it refuses as names do
        if label not in ("over-long", "newline", "tab"):
            add(
                f"log_canonical_query-raw-{label}",
                lambda m, i, b=bad: m.log_canonical_query(b, "q"),
            )
            add(
                f"log_canonical_query-canonical-{label}",
                lambda m, i, b=bad: m.log_canonical_query("q", b),
            )
            add(
                f"transition_state-reason-{label}",
                lambda m, i, b=bad: m.transition_state(i["active"], "superseded", reason=b),
            )
    for what in ("src_executor", "src_version", "dst_executor"):
        kwargs = dict(zip(("src_executor", "src_version", "dst_executor"), EDGE, strict=False))
        kwargs[what] = None
        add(f"record_passing-{what}-none", lambda m, i, k=kwargs: m.record_passing(**k))
    add("record_passing-active-without-version", lambda m, i: m.record_passing(*EDGE[:3]))
    add(
        "record_passing-proto-with-version",
        lambda m, i: m.record_passing(*EDGE, dst_exists=False),
    )
    add(
        "record_passing-desired_sig-on-active",
        lambda m, i: m.record_passing(*EDGE, desired_sig={"summary": "s"}),
    )
    for label, bad in {"string": "yes", "int": 1, "none": None}.items():
        add(
            f"record_passing-dst_exists-{label}",
            lambda m, i, b=bad: m.record_passing(*EDGE, dst_exists=b),
        )
    for label, bad in BAD_JSON.items():
        add(f"record_passing-tags-{label}", lambda m, i, b=bad: m.record_passing(*EDGE, tags=b))
        add(
            f"record_passing-desired_sig-{label}",
            lambda m, i, b=bad: m.record_passing(*EDGE[:3], dst_exists=False, desired_sig=b),
        )
        add(
            f"record_turn-tags-{label}",
            lambda m, i, b=bad: m.record_turn("t", [EDGE, Passing(*EDGE, tags=b)]),
        )
    for label, bad in {
        "none": None,
        "int": 5,
        "string": "search,1,read,2",
        "none-item": [None],
        "short-tuple": [("search", "1")],
        "long-tuple": [(*EDGE, True, None, None, "extra")],
        "dict-item": [{"src_executor": "search"}],
        "valid-then-invalid": [EDGE, ("search", "1", "", "2")],
    }.items():
        add(f"record_turn-passings-{label}", lambda m, i, b=bad: m.record_turn("t", b))
    add("get-id-int", lambda m, i: m.get(123))
    add("get-id-bytes", lambda m, i: m.get(b"mn_x"))
    add("events-mnest_id-int", lambda m, i: m.events(mnest_id=5))
    for label, bad in BAD_STATES.items():
        add(f"find-state-{label}", lambda m, i, b=bad: m.find(*EDGE, state=b))
        if label != "none":  # None means every state
            add(f"edges-states-{label}", lambda m, i, b=bad: m.edges(states=b))
            add(f"edges-states-list-{label}", lambda m, i, b=bad: m.edges(states=["active", b]))
        add(
            f"transition_state-state-{label}",
            lambda m, i, b=bad: m.transition_state(i["active"], b),
        )
    add("edges-states-not-iterable", lambda m, i: m.edges(states=5))
    for label, bad in BAD_COUNTS.items():
        add(f"walk-max_depth-{label}", lambda m, i, b=bad: m.walk("search", max_depth=b))
        add(f"suggest_next-k-{label}", lambda m, i, b=bad: m.suggest_next("search", k=b))
        add(
            f"recurring_protos-min_uses-{label}", lambda m, i, b=bad: m.recurring_protos(min_uses=b)
        )
    add("walk-max_depth-huge", lambda m, i: m.walk("search", max_depth=10**9))
    for label, bad in BAD_WEIGHTS.items():
        add(f"walk-min_weight-{label}", lambda m, i, b=bad: m.walk("search", min_weight=b))
        add(
            f"recurring_protos-min_weight-{label}",
            lambda m, i, b=bad: m.recurring_protos(min_weight=b),
        )
    for label, bad in {"empty": "", "int": 5, "none": None}.items():
        add(f"transition_state-id-{label}", lambda m, i, b=bad: m.transition_state(b, "active"))
        add(f"promote-id-{label}", lambda m, i, b=bad: m.promote_proto_to_active(b, "1"))
    add(
        "transition_state-unknown-id",
        lambda m, i: m.transition_state("mn_doesnotexist0000", "superseded"),
        NotFound,
    )
    add(
        "promote-unknown-id",
        lambda m, i: m.promote_proto_to_active("mn_doesnotexist0000", "1"),
        NotFound,
    )
    add(
        "transition_state-proto-to-active",
        lambda m, i: m.transition_state(i["proto"], "active"),
        InvalidTransition,
    )
    add(
        "transition_state-active-to-proto",
        lambda m, i: m.transition_state(i["active"], "proto"),
        InvalidTransition,
    )
    add(
        "promote-an-active-row",
        lambda m, i: m.promote_proto_to_active(i["active"], "9"),
        InvalidTransition,
    )
    add(
        "transition_state-reason-over-2000",
        lambda m, i: m.transition_state(i["active"], "superseded", reason="r" * 2001),
    )
    add("log_canonical_query-raw-too-long", lambda m, i: m.log_canonical_query("q" * 100_001, "q"))
    for label, bad in {"string": "yes", "int": 1, "none": None}.items():
        add(f"apply_ager-dry_run-{label}", lambda m, i, b=bad: m.apply_ager(dry_run=b))
    return c


CASES = _cases()

# Every call that reads "now" from the clock, to be run with a clock that lies.
CLOCKED: dict[str, Call] = {
    "record_passing": lambda m, i: m.record_passing(*EDGE),
    "record_passing-proto": lambda m, i: m.record_passing(*EDGE[:3], dst_exists=False),
    "record_turn": lambda m, i: m.record_turn("t", [EDGE, ("a", "1", "b", "1")]),
    "transition_state": lambda m, i: m.transition_state(i["active"], "superseded"),
    "promote_proto_to_active": lambda m, i: m.promote_proto_to_active(i["proto"], "7"),
    "apply_ager": lambda m, i: m.apply_ager(),
    "apply_ager-dry-run": lambda m, i: m.apply_ager(dry_run=True),
    "log_canonical_query": lambda m, i: m.log_canonical_query("q", "q"),
    "walk": lambda m, i: m.walk("search"),
    "suggest_next": lambda m, i: m.suggest_next("search"),
    "recurring_protos": lambda m, i: m.recurring_protos(),
}
LYING_CLOCKS: dict[str, Any] = {
    "naive": lambda: datetime(2026, 3, 1, 12, 0),
    "string": lambda: "2026-03-01T12:00:00Z",
    "none": lambda: None,
    "timestamp": lambda: 1_772_366_400.0,
}


def seed(store: mnestoma.Mnestoma, clock: MovableClock) -> Ids:
    """A small store with a row in every state, a turn and a query-log entry."""
    active = store.record_passing(*EDGE, turn_id="turn-0", tags={"k": "v"})
    store.record_passing("read", "2", "write", "1")
    proto = store.record_passing("search", "1", "summarise", dst_exists=False)
    gone = store.record_passing("search", "1", "old", "1")
    store.transition_state(gone.id, "decaying")
    sup = store.record_passing("search", "1", "older", "1")
    store.transition_state(sup.id, "superseded")
    store.log_canonical_query("Find X", "find x", turn_id="turn-0")
    clock.advance(days=1)
    return {"active": active.id, "proto": proto.id, "decaying": gone.id, "superseded": sup.id}


class Shared:
    """One seeded store per engine for the whole sweep: invalid input must not change it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.clock = MovableClock()
        self.store = mnestoma.Mnestoma(url, clock=self.clock)
        self.ids = seed(self.store, self.clock)

    def reseed(self) -> None:
        """Start again from a clean seed after a call that wrongly changed something."""
        engine = plain_engine(self.url)
        with engine.begin() as conn:
            for table in ("events", "canonical_query_log", "mnests"):
                conn.execute(text(f"DELETE FROM {table}"))
        engine.dispose()
        self.clock = MovableClock()
        self.store.close()
        self.store = mnestoma.Mnestoma(self.url, clock=self.clock)
        self.ids.update(seed(self.store, self.clock))


@pytest.fixture(scope="module")
def shared(module_store_url: str) -> Iterator[Shared]:
    box = Shared(module_store_url)
    yield box
    box.store.close()


def unchanged_or_reseed(shared: Shared, before: Any) -> bool:
    if dump_tables(shared.url) == before:
        return True
    shared.reseed()
    return False


@pytest.mark.parametrize(("case", "call", "error"), CASES, ids=[c[0] for c in CASES])
def test_an_invalid_input_raises_the_contract_error_and_changes_nothing(
    shared: Shared, case: str, call: Call, error: type[Exception]
) -> None:
    before = dump_tables(shared.url)
    try:
        with pytest.raises(error) as info:
            call(shared.store, shared.ids)
    finally:
        changed = not unchanged_or_reseed(shared, before)
    assert type(info.value).__module__.startswith("mnestoma")
    if error is InvalidInput:
        assert isinstance(info.value, ValueError)
    if error is NotFound:
        assert isinstance(info.value, LookupError)
    assert str(info.value)
    assert not changed, "the refused call changed the database"


@pytest.mark.parametrize("clock_kind", sorted(LYING_CLOCKS))
@pytest.mark.parametrize("call_name", sorted(CLOCKED))
def test_a_clock_that_lies_is_refused_with_invalid_input_and_changes_nothing(
    shared: Shared, call_name: str, clock_kind: str
) -> None:
    before = dump_tables(shared.url)
    try:
        with (
            mnestoma.Mnestoma(shared.url, clock=LYING_CLOCKS[clock_kind]) as bad,
            pytest.raises(InvalidInput),
        ):
            CLOCKED[call_name](bad, shared.ids)
    finally:
        changed = not unchanged_or_reseed(shared, before)
    assert not changed, "the refused call changed the database"


def test_a_clock_that_is_not_callable_is_refused(store_url: str) -> None:
    with pytest.raises(InvalidInput):
        mnestoma.Mnestoma(store_url, clock=datetime(2026, 1, 1))  # type: ignore[arg-type]


HOSTILE_NAMES = [
    "x'); DROP TABLE mnests;--",
    "Robert'); DROP TABLE events; --",
    "' OR '1'='1",
    '"; DELETE FROM mnests; --',
    "%",
    "_",
    "%(src)s",
    ":src",
    "$1",
    "?",
    "\\",
    "a\\'b",
    "名前",
    "🙂 executor",
    "x" * 255,
]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
def test_names_that_look_like_sql_are_stored_verbatim_and_harmless(
    store: mnestoma.Mnestoma, store_url: str, name: str
) -> None:
    dst = name[:250] + "-dst"
    m = store.record_passing(name, name, dst, name, turn_id=name, tags={name: name})
    proto = store.record_passing(name, name, "wish", dst_exists=False, desired_sig={"s": name})
    store.log_canonical_query(name, name, turn_id=name)
    got = store.get(m.id)
    assert got is not None
    assert (got.src_executor, got.src_version, got.dst_executor, got.dst_version) == (
        name,
        name,
        dst,
        name,
    )
    assert got.tags == {name: name}
    assert store.find(name, name, dst, name).id == m.id  # type: ignore[union-attr]
    assert {e.id for e in store.edges(src_executor=name)} == {m.id, proto.id}
    assert [e.turn_id for e in store.events(turn_id=name)] == [name]
    assert store.suggest_next(name)[0][0].id == m.id
    assert store.walk(name)[0][0].id == m.id
    assert store.recurring_protos(min_uses=1)[0].desired_sig == {"s": name}
    assert len(store.edges()) == 2  # no table was dropped, nothing else changed
    check_invariants(store_url)


# Valid JSON that the contract accepts: stored on both engines alike, or refused alike.
AWKWARD_JSON: dict[str, Any] = {
    "nul-in-string": {"note": "a\x00b"},
    "lone-surrogate": {"note": "a\ud800"},
    "big-int": {"n": 10**30},
    "unicode": {"名": "🙂"},
}


@pytest.mark.parametrize("label", sorted(AWKWARD_JSON))
def test_json_the_contract_accepts_is_stored_or_refused_as_invalid_input(
    store: mnestoma.Mnestoma, store_url: str, label: str
) -> None:
    value = AWKWARD_JSON[label]
    before = dump_tables(store_url)
    try:
        m = store.record_passing(*EDGE, tags=value)
    except InvalidInput:
        assert dump_tables(store_url) == before
        return
    got = store.get(m.id)
    assert got is not None and got.tags == value
    check_invariants(store_url)


def test_unknown_ids_read_as_nothing_rather_than_an_error(store: mnestoma.Mnestoma) -> None:
    assert store.get("mn_doesnotexist0000") is None
    assert store.get("") is None
    assert store.events(mnest_id="mn_doesnotexist0000") == []
    assert store.find("a", "1", "b", "1") is None


# --- the command line ---------------------------------------------------------------------


def _cli() -> Any:
    return pytest.importorskip("mnestoma.cli")


CLI_CASES: dict[str, list[str]] = {
    "record-src-without-version": ["record", "search", "read@2"],
    "record-blank-src": ["record", "   @1", "read@2"],
    "record-over-long-dst": ["record", "search@1", "x" * 256 + "@2"],
    "record-control-char": ["record", "se\x01arch@1", "read@2"],
    "record-proto-with-version": ["record", "--proto", "search@1", "read@2"],
    "record-sig-not-json": ["record", "--proto", "--sig", "{nope", "search@1", "read"],
    "record-sig-nan": ["record", "--proto", "--sig", '{"a": NaN}', "search@1", "read"],
    "record-sig-without-proto": ["record", "--sig", "{}", "search@1", "read@2"],
    "record-bad-tag": ["record", "--tag", "novalue", "search@1", "read@2"],
    "record-blank-turn": ["record", "--turn", " ", "search@1", "read@2"],
    "edges-unknown-state": ["edges", "--state", "archived"],
    "edges-blank-src": ["edges", "--src", ""],
    "walk-zero-depth": ["walk", "search", "--depth", "0"],
    "walk-depth-not-int": ["walk", "search", "--depth", "three"],
    "walk-negative-weight": ["walk", "search", "--min-weight", "-1"],
    "walk-nan-weight": ["walk", "search", "--min-weight", "nan"],
    "suggest-negative-k": ["suggest", "search", "-k", "-1"],
    "protos-zero-uses": ["protos", "--min-uses", "0"],
    "protos-weight-above-one": ["protos", "--min-weight", "2"],
    "transition-unknown-state": ["transition", "ID", "archived"],
    "promote-blank-version": ["promote", "PROTO", " "],
    "promote-over-long-version": ["promote", "PROTO", "v" * 256],
    "unknown-option": ["edges", "--colour"],
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_bad_input_on_the_command_line_exits_2_with_one_line_and_writes_nothing(
    shared: Shared, case: str
) -> None:
    from click.testing import CliRunner

    cli = _cli()
    ids = shared.ids
    args = [
        ids["active"] if a == "ID" else ids["proto"] if a == "PROTO" else a for a in CLI_CASES[case]
    ]
    before = dump_tables(shared.url)
    try:
        result = CliRunner().invoke(cli.cli, [*args, "--database-url", shared.url])
    finally:
        changed = not unchanged_or_reseed(shared, before)
    assert result.exit_code == 2, (result.exit_code, result.output, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.output + result.stderr
    assert not changed, "the refused command changed the database"
