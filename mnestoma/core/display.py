"""How each state of a mnest is shown, in one table keyed by :class:`~mnestoma.rules.MnestState`,
how each recorder is named, in one keyed by :class:`~mnestoma.rules.Recorder`, and how
stored text is written for a terminal (its control characters escaped).

The graph's renderers (DOT, Mermaid) and the command line (its STATE columns, the help of
``graph``) read their per-state looks here. A state without a look of its own takes the one
its place in the rules gives it (live: plain; otherwise greyed), so that a new state of the
rules is shown without a change here; ``tests/test_display.py`` checks every state's. A
*failing* edge (more errors than successes, contract §11) is drawn over its state's look,
whatever the state.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from mnestoma.core.rules import LIVE_STATES, MnestState, Recorder

__all__ = [
    "DOTTED_ARROW",
    "FADED_COLOUR",
    "FAILING_ARROW",
    "FAILING_COLOUR",
    "FAILING_DOT_STYLE",
    "PICTURE_STATES",
    "RECORDER_NAMES",
    "SOLID_ARROW",
    "STATE_STYLES",
    "SUPERSEDED_COLOUR",
    "WISHED_COLOUR",
    "StateStyle",
    "json_for_terminal",
    "lines_for_terminal",
    "recorder_name",
    "state_word",
    "style_of",
    "text_for_terminal",
]

WISHED_COLOUR = "#b35c00"
FADED_COLOUR = "#9e9e9e"
SUPERSEDED_COLOUR = "#c8c8c8"
FAILING_COLOUR = "#c62828"
SOLID_ARROW = "-->"
DOTTED_ARROW = "-.->"
# A failing edge: red, and not solid (dashed in DOT unless its state already gives a style).
FAILING_DOT_STYLE = "dashed"
FAILING_ARROW = DOTTED_ARROW


@dataclass(frozen=True, slots=True)
class StateStyle:
    """How the edges in one state are shown, in pictures and in the command line's tables;
    what a state does not set is the plain look (an active edge's)."""

    word: str  # the text of a STATE column in the command line's tables
    label: str = ""  # added after a graph edge's weight and uses ("": nothing added)
    colour: str | None = None  # DOT color and fontcolor, Mermaid stroke and color
    dot_style: str | None = None  # DOT's edge style, "dashed" or "dotted" (None: solid)
    mermaid_arrow: str = SOLID_ARROW  # Mermaid's link, SOLID_ARROW or DOTTED_ARROW
    lit: bool = True  # its edges keep their nodes out of the grey of nodes only faded edges touch
    pictured: bool = True  # drawn by a picture unless its states are given
    summary: str = ""  # how the help of ``mnestoma graph`` says it is drawn ("": nothing to say)


_PROTO = MnestState.PROTO.value
_SUPERSEDED = MnestState.SUPERSEDED.value

# The states drawn in a look of their own.
_OWN_LOOKS: Mapping[MnestState, StateStyle] = {
    MnestState.PROTO: StateStyle(
        word=_PROTO,
        label="wished",
        colour=WISHED_COLOUR,
        dot_style="dashed",
        mermaid_arrow=DOTTED_ARROW,
        summary=f"{_PROTO}s dashed toward a wished node",
    ),
    MnestState.SUPERSEDED: StateStyle(
        word=_SUPERSEDED,
        label=_SUPERSEDED,
        colour=SUPERSEDED_COLOUR,
        dot_style="dotted",
        mermaid_arrow=DOTTED_ARROW,
        lit=False,
        pictured=False,
        summary=f"{_SUPERSEDED} hidden unless asked (--states {_SUPERSEDED})",
    ),
}


def _look(state: MnestState) -> StateStyle:
    """A state's look: its own, else the one its place in the rules gives it (a live state
    plain, any other greyed and named on its edges), so that a new state has a look
    without an entry here."""
    if state in _OWN_LOOKS:
        return _OWN_LOOKS[state]
    if state in LIVE_STATES:
        return StateStyle(word=state.value)
    return StateStyle(
        word=state.value,
        label=state.value,
        colour=FADED_COLOUR,
        lit=False,
        summary=f"{state.value} greyed",
    )


STATE_STYLES: Mapping[MnestState, StateStyle] = {state: _look(state) for state in MnestState}

# What a picture shows unless told otherwise (superseded edges are history, hidden).
PICTURE_STATES: tuple[str, ...] = tuple(s.value for s in MnestState if STATE_STYLES[s].pictured)


def style_of(state: str) -> StateStyle:
    """The look of a stored state (a member of :class:`MnestState` or its value)."""
    return STATE_STYLES[MnestState(state)]


def state_word(state: str | None) -> str | None:
    """The command line's word for a stored state; None (no state) stays None."""
    return None if state is None else style_of(state).word


# How ``status`` names each recorder of the rules (the ``events.recorder`` values).
RECORDER_NAMES: Mapping[Recorder, str] = {
    Recorder.CALL: "calls of the API",
    Recorder.TRACER: "the in-process tracer (mnestoma.tracing)",
    Recorder.OTEL: "the OpenTelemetry processor (mnestoma.otel)",
    Recorder.AGER: "the ager",
    Recorder.CLI: "the command line",
}


def recorder_name(value: str) -> str:
    """The words for a recorder; one without words of its own is named by its value."""
    try:
        return RECORDER_NAMES[Recorder(value)]
    except (KeyError, ValueError):
        return f"the recorder {value!r}"


# --- stored text on a terminal ------------------------------------------------------------

# What a terminal acts on: the C0 controls (ESC, and newline, tab, carriage return in a
# table's one line), DEL and the C1 controls (U+009B is an 8-bit CSI to xterm and its kin).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]")
# What ``json.dumps(..., ensure_ascii=False)`` leaves raw: it escapes C0 itself.
_RAW_IN_JSON = re.compile("[\x7f-\x9f]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED_ESCAPES.get(char) or f"\\x{ord(char):02x}"


def text_for_terminal(value: str) -> str:
    """Stored text for one line of the command line's output: each control character written
    as Python writes it in a string (``\\n``, ``\\x1b``, ``\\x9b``), so that text a row holds,
    whoever wrote it, never reaches a terminal raw."""
    return _CONTROLS.sub(_escaped, value)


def lines_for_terminal(text: str) -> str:
    """Text of many lines (a picture in DOT, Mermaid or GraphML) for a terminal: each control
    character escaped as :func:`text_for_terminal` does, but newlines and tabs."""
    return _CONTROLS.sub(lambda m: m.group() if m.group() in "\n\t" else _escaped(m), text)


def json_for_terminal(text: str) -> str:
    """JSON text with DEL and the C1 controls written as ``\\u`` escapes (``\\u009b``): the
    same JSON value, which no terminal acts on (``json.dumps`` without ``ensure_ascii``
    leaves them raw; it escapes C0 itself)."""
    return _RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
