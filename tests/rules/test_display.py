"""The table of looks (mnestoma.core.display): one StateStyle per state, read by the graph's
renderers and by the command line, so that a new state fails here until it has a look."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from mnestoma.cli import cli
from mnestoma.cli.render import render_edges, render_events
from mnestoma.core import display
from mnestoma.core.display import (
    FAILING_ARROW,
    FAILING_COLOUR,
    FAILING_DOT_STYLE,
    PICTURE_STATES,
    STATE_STYLES,
    StateStyle,
    state_word,
)
from mnestoma.core.rules import (
    DEFAULT_DECAY_LAMBDA,
    LIVE_STATES,
    MnestState,
    Recorder,
    check_transition,
)
from mnestoma.maintenance.status import RecorderFacts, StoreStatus, render_status
from mnestoma.planner.graph import GraphEdge, GraphNode, MnestGraph, to_dot, to_mermaid
from mnestoma.schema.models import Event, Mnest

AT = datetime(2026, 1, 1, 12, tzinfo=UTC)


def _mnest(state: MnestState, *, ok: int = 0, error: int = 0) -> Mnest:
    """One edge a@1 → b@1 (a proto: → b, wished) in ``state``, as a snapshot would hold it."""
    return Mnest(
        id="mn_0123456789abcdef",
        src_executor="a",
        src_version="1",
        dst_executor="b",
        dst_version=None if state == MnestState.PROTO else "1",
        weight=0.5,
        uses=3,
        ts_first=AT,
        ts_last=AT,
        ts_weight=AT,
        decay_lambda=DEFAULT_DECAY_LAMBDA,
        state=state.value,
        tags=None,
        desired_sig=None,
        ok_count=ok,
        error_count=error,
    )


def _picture(state: MnestState, *, failing: bool = False) -> MnestGraph:
    """A graph of that one edge (failing: more errors than successes)."""
    m = _mnest(state, ok=1 if failing else 0, error=2 if failing else 0)
    wished = m.dst_version is None
    target = GraphNode("b" if wished else "b@1", "b", m.dst_version, wished)
    source = GraphNode("a@1", "a", "1", False)
    return MnestGraph((source, target), (GraphEdge(source.id, target.id, m, 0.5),), AT)


def _dot_edge(graph: MnestGraph) -> str:
    [line] = [x for x in to_dot(graph).splitlines() if " -> " in x]
    return line


def _mermaid_edge(graph: MnestGraph) -> tuple[str, str]:
    """The link's arrow and its linkStyle."""
    lines = to_mermaid(graph).splitlines()
    [link] = [x for x in lines if "|" in x and x.strip().startswith("n")]
    [style] = [x for x in lines if x.strip().startswith("linkStyle 0 ")]
    arrow = re.match(r"\s*n\d+ (\S+?)\|", link).group(1)  # type: ignore[union-attr]
    return arrow, style


def _plain(text: str) -> str:
    """Help text with click's line wrapping undone."""
    return re.sub(r"\s+", " ", text)


# --- the table ------------------------------------------------------------------------------


def test_every_state_has_a_look() -> None:
    """Every state of MnestState has a StateStyle, its own or the one the rules give it."""
    missing = [s.value for s in MnestState if s not in STATE_STYLES]
    assert not missing, f"states without a look in mnestoma.core.display.STATE_STYLES: {missing}"
    assert set(STATE_STYLES) == set(MnestState)
    assert all(isinstance(style, StateStyle) for style in STATE_STYLES.values())
    words = [style.word for style in STATE_STYLES.values()]
    assert len(set(words)) == len(words)  # the command line tells every state apart


@pytest.mark.parametrize("state", [s for s in MnestState if s not in display._OWN_LOOKS], ids=str)
def test_a_state_without_a_look_of_its_own_takes_the_one_the_rules_give_it(
    state: MnestState,
) -> None:
    """A new state of the rules (say archived) is shown without an entry in the display: a
    live state plain, any other greyed, unlit and named on its edges."""
    look = STATE_STYLES[state]
    assert look.word == state.value
    if state in LIVE_STATES:
        assert look == StateStyle(word=state.value)
    else:
        assert (look.label, look.colour, look.lit) == (state.value, display.FADED_COLOUR, False)
        assert look.pictured and look.summary == f"{state.value} greyed"


def test_a_picture_shows_the_states_the_table_pictures() -> None:
    assert tuple(s.value for s in MnestState if STATE_STYLES[s].pictured) == PICTURE_STATES
    assert MnestState.SUPERSEDED.value not in PICTURE_STATES  # history, hidden unless asked


def test_state_words_are_the_table_s() -> None:
    for state, style in STATE_STYLES.items():
        assert state_word(state.value) == style.word
    assert state_word(None) is None


# --- the renderers read it --------------------------------------------------------------------


@pytest.mark.parametrize("state", list(MnestState), ids=str)
def test_each_state_is_drawn_as_its_entry_says(state: MnestState) -> None:
    style = STATE_STYLES[state]
    graph = _picture(state)
    dot = _dot_edge(graph)
    arrow, link_style = _mermaid_edge(graph)
    assert arrow == style.mermaid_arrow
    label = re.search(r'label="([^"]*)"', dot).group(1)  # type: ignore[union-attr]
    assert label == "0.50 (3 uses)" + (f" {style.label}" if style.label else "")
    if style.colour is None:
        assert "color=" not in dot and ",stroke:" not in link_style
    else:
        assert f'color="{style.colour}"' in dot and f",stroke:{style.colour}" in link_style
    assert ("style=" in dot) == (style.dot_style is not None)
    if style.dot_style is not None:
        assert f'style="{style.dot_style}"' in dot


@pytest.mark.parametrize("state", list(MnestState), ids=str)
def test_a_failing_edge_is_red_over_its_state_s_look(state: MnestState) -> None:
    style = STATE_STYLES[state]
    graph = _picture(state, failing=True)
    dot = _dot_edge(graph)
    arrow, link_style = _mermaid_edge(graph)
    assert "(3 uses: 1 ok, 2 error)" in dot
    assert f'color="{FAILING_COLOUR}", fontcolor="{FAILING_COLOUR}"' in dot
    assert f'style="{style.dot_style or FAILING_DOT_STYLE}"' in dot
    assert arrow == FAILING_ARROW
    assert link_style.endswith(f",stroke:{FAILING_COLOUR},color:{FAILING_COLOUR};")  # it wins


def test_changing_an_entry_changes_the_pictures_and_the_listings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = MnestState.DECAYING
    before_dot, before_mermaid = to_dot(_picture(state)), to_mermaid(_picture(state))
    new = replace(
        STATE_STYLES[state],
        word="fading",
        label="on its way out",
        colour="#123456",
        dot_style="bold",
        mermaid_arrow="==>",
        lit=True,
    )
    monkeypatch.setitem(display.STATE_STYLES, state, new)  # type: ignore[arg-type]
    graph = _picture(state)
    dot = _dot_edge(graph)
    assert to_dot(graph) != before_dot and to_mermaid(graph) != before_mermaid
    assert 'style="bold", color="#123456"' in dot and "on its way out" in dot
    assert '"b@1" [label="b\\n1"];' in to_dot(graph)  # lit now: its node is no longer grey
    arrow, link_style = _mermaid_edge(graph)
    assert arrow == "==>" and ",stroke:#123456" in link_style

    render_edges([_mnest(state)], AT, False, "")
    event = Event(
        id=1,
        ts=AT,
        kind="x",
        mnest_id="mn_0123456789abcdef",
        state_before=MnestState.ACTIVE.value,
        state_after=state.value,
    )
    render_events([event], False)
    listing, events = capsys.readouterr().out.split("\nID ", 1)
    assert "fading" in listing.splitlines()[1]
    assert f"{MnestState.ACTIVE.value} -> fading" in events


# --- the help texts ---------------------------------------------------------------------------


def test_the_graph_help_says_how_each_state_is_drawn_from_the_table() -> None:
    text = _plain(CliRunner().invoke(cli, ["graph", "--help"]).output)
    for style in STATE_STYLES.values():
        assert style.summary in text
    assert f"[{','.join(PICTURE_STATES)}]" in text


def test_the_transition_help_names_the_states_the_rules_allow() -> None:
    text = _plain(CliRunner().invoke(cli, ["transition", "--help"]).output)
    allowed = [
        t
        for t in MnestState
        if any(check_transition(s, t, has_version=True) is None for s in MnestState if s != t)
    ]
    assert f"Move a mnest to STATE ({', '.join(allowed)})." in text
    assert MnestState.PROTO not in allowed


def test_every_recorder_of_the_rules_has_words_of_its_own() -> None:
    assert set(display.RECORDER_NAMES) == set(Recorder)
    for recorder in Recorder:
        assert display.recorder_name(recorder.value) == display.RECORDER_NAMES[recorder]


def test_status_names_a_recorder_it_does_not_know_by_its_value() -> None:
    status = StoreStatus(
        database="sqlite:///x",
        dialect="sqlite",
        schema="head",
        revision="x",
        head="x",
        at=AT,
        events=3,
        passings=3,
        passings_by_recorder={"scheduler": RecorderFacts(3, AT, 1, 0)},
        outcomes_recorded=True,
    )
    text = render_status(status)
    assert "the recorder 'scheduler' (3)" in text
    assert "the recorder 'scheduler': 1 of 3 passings" in text
