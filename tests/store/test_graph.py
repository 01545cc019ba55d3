"""A picture of the graph (contract §9): DOT, Mermaid, GraphML, JSON, networkx, the command."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cli_kit import MNEST_KEYS, run
from click.testing import Result
from conftest import REPO

from mnestoma import InvalidInput, Mnestoma, MnestomaError, UnitOfWork, make_session_factory
from mnestoma.planner.graph import (
    PICTURE_STATES,
    GraphReads,
    MissingExtra,
    MnestGraph,
    render,
    to_dot,
    to_graphml,
    to_mermaid,
    to_networkx,
)

GRAPH_GUIDE = REPO / "docs" / "graph.md"
TRICKY = ['we"ird\\name', "uni·cødé", "a#b|c;d", "<b>&amp;</b>", "`tick`", "end\\"]


def _edges(graph: MnestGraph) -> set[tuple[str, str, str]]:
    return {(e.source, e.target, e.mnest.state) for e in graph.edges}


def _fixture_graph(store: Mnestoma) -> dict[str, str]:
    """a→b→c→d with a cycle c→a, a wish, a decaying and a superseded edge, a version gap."""
    ids = {}
    for _ in range(4):
        store.record_passing("a", "1", "b", "1")  # strong
    store.record_passing("b", "1", "c", "1")
    store.record_passing("c", "1", "d", "1")
    store.record_passing("c", "1", "a", "1")
    store.record_passing("a", "1", "pdf", dst_exists=False, desired_sig={"summary": "s"})
    ids["fading"] = store.record_passing("b", "1", "x", "1").id
    store.transition_state(ids["fading"], "decaying")
    store.record_passing("x", "1", "y", "1")  # reached only through a decaying edge
    ids["old"] = store.record_passing("a", "1", "old", "1").id
    store.transition_state(ids["old"], "superseded")
    store.record_passing("b", "2", "z", "1")  # b@2 is not what a fed
    return ids


# --- building -------------------------------------------------------------------------------


def test_the_whole_graph_has_every_edge_in_the_states_asked(store: Mnestoma) -> None:
    _fixture_graph(store)
    everything = store.graph()
    assert len(everything.edges) == 9
    assert ("a@1", "old@1", "superseded") in _edges(everything)
    picture = store.graph(states=PICTURE_STATES)
    assert len(picture.edges) == 8
    assert all(e.mnest.state != "superseded" for e in picture.edges)
    wished = [n for n in picture.nodes if n.wished]
    assert [(n.id, n.executor, n.version) for n in wished] == [("pdf", "pdf", None)]
    assert [n.id for n in picture.nodes] == sorted(n.id for n in picture.nodes)


def test_from_a_source_the_graph_follows_active_edges_to_the_depth_asked(store: Mnestoma) -> None:
    _fixture_graph(store)
    one = store.graph("a", depth=1, states=PICTURE_STATES)
    assert _edges(one) == {("a@1", "b@1", "active"), ("a@1", "pdf", "proto")}
    two = store.graph("a", depth=2, states=PICTURE_STATES)
    assert _edges(two) == _edges(one) | {
        ("b@1", "c@1", "active"),
        ("b@1", "x@1", "decaying"),
    }
    three = store.graph("a", depth=3, states=PICTURE_STATES)
    assert _edges(three) == _edges(two) | {("c@1", "d@1", "active"), ("c@1", "a@1", "active")}
    deep = store.graph("a", depth=16, states=PICTURE_STATES)
    assert _edges(deep) == _edges(three)  # the cycle ends
    assert "z@1" not in {n.id for n in three.nodes}  # b@2's edges are not b@1's
    assert "y@1" not in {n.id for n in three.nodes}  # decaying edges are not followed
    assert three.src == "a"


def test_a_source_version_narrows_the_start(store: Mnestoma) -> None:
    _fixture_graph(store)
    assert _edges(store.graph("b", src_version="2", depth=1)) == {("b@2", "z@1", "active")}
    assert store.graph("a", src_version="9").edges == ()
    assert store.graph("nobody").edges == ()


def test_states_hide_edges_but_active_ones_are_still_followed(store: Mnestoma) -> None:
    _fixture_graph(store)
    got = store.graph("a", depth=2, states=["decaying"])
    assert _edges(got) == {("b@1", "x@1", "decaying")}


def test_the_graph_reads_each_executor_once_whatever_versions_of_it_are_reached(
    store: Mnestoma,
) -> None:
    """b is reached at version 1 (one edge from a) and at version 2 (two edges from a): its
    edges are read once and serve both."""
    for src, dst in [("a@1", "b@1"), ("a@1", "c@1"), ("c@1", "b@2"), ("b@2", "d@1")]:
        store.record_passing(*src.split("@"), *dst.split("@"))
    store.record_passing("b", "1", "e", "1")
    reads: list[str] = []
    with UnitOfWork(make_session_factory(store.engine)) as uow:

        class CountingRepository:
            settings = uow.mnests.settings
            _ex = uow.mnests._ex  # the chains among the edges, read once

            def edges(self, **kwargs: Any) -> Any:
                reads.append(kwargs["src_executor"])
                return uow.mnests.edges(**kwargs)

        graph = GraphReads.graph(CountingRepository(), "a", depth=3)  # type: ignore[arg-type]
    assert sorted(reads) == ["a", "b", "c", "e"]
    assert {(e.source, e.target) for e in graph.edges} == {
        ("a@1", "b@1"),
        ("a@1", "c@1"),
        ("c@1", "b@2"),
        ("b@2", "d@1"),
        ("b@1", "e@1"),
    }


@pytest.mark.parametrize(
    "kwargs",
    [{"depth": 0}, {"depth": 17}, {"states": ["bogus"]}, {"src_version": ""}],
    ids=repr,
)
def test_bad_graph_arguments_are_invalid_input(store: Mnestoma, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        store.graph("a", **kwargs)
    with pytest.raises(InvalidInput):
        store.graph("")


def test_render_refuses_an_unknown_format(store: Mnestoma) -> None:
    with pytest.raises(InvalidInput, match="dot, mermaid, graphml, json"):
        render(store.graph(), "png")


# --- DOT ------------------------------------------------------------------------------------


def _dot_svg(source: str) -> str:
    dot = shutil.which("dot")
    if dot is None:
        pytest.skip("Graphviz is not installed (no `dot` on PATH): apt-get install graphviz")
    done = subprocess.run(
        [dot, "-Tsvg"], input=source, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and not done.stderr, done.stderr
    return done.stdout


def test_dot_renders_with_graphviz(store: Mnestoma) -> None:
    _fixture_graph(store)
    for name in TRICKY:
        store.record_passing("a", "1", name, "1")
        store.record_passing(name, "1", "pdf", dst_exists=False)
    svg = _dot_svg(to_dot(store.graph()))
    assert svg.count('class="node"') == len(store.graph().nodes)
    assert svg.count('class="edge"') == len(store.graph().edges)
    assert "uni·cødé" in svg and "we&quot;ird\\name" in svg


def test_dot_draws_weight_as_pen_width_protos_dashed_and_decaying_grey(store: Mnestoma) -> None:
    _fixture_graph(store)
    lines = to_dot(store.graph()).splitlines()

    def edge_line(src: str, dst: str) -> str:
        [line] = [x for x in lines if x.strip().startswith(f'"{src}" -> "{dst}"')]
        return line

    def pen(line: str) -> float:
        return float(re.search(r"penwidth=([\d.]+)", line).group(1))  # type: ignore[union-attr]

    assert pen(edge_line("a@1", "b@1")) > pen(edge_line("b@1", "c@1"))
    assert "0.75 (4 uses)" in edge_line("a@1", "b@1")
    assert 'style="dashed"' in edge_line("a@1", "pdf")
    assert "#9e9e9e" in edge_line("b@1", "x@1")
    assert 'style="dotted"' in edge_line("a@1", "old@1")
    [wished] = [x for x in lines if x.strip().startswith('"pdf" [')]
    assert "dashed" in wished and "(wished)" in wished


# --- Mermaid --------------------------------------------------------------------------------

_ID = r"n\d+"
_TEXT = r'"((?:[^"#]|#(?:quot|lt|gt|amp|\d+);)*)"'
_STYLE = r"[a-z-]+:[^,;\s]+(?: [^,;\s]+)*(?:,[a-z-]+:[^,;\s]+(?: [^,;\s]+)*)*"
_NODE = re.compile(rf"^    ({_ID})(?:\[{_TEXT}\]|\(\[{_TEXT}\]\))$")
_LINK = re.compile(rf"^    ({_ID}) (-->|-\.->)\|{_TEXT}\| ({_ID})$")
_CLASSDEF = re.compile(rf"^    classDef ([a-z]+) ({_STYLE});$")
_CLASS = re.compile(rf"^    class ({_ID}(?:,{_ID})*) ([a-z]+);$")
_LINKSTYLE = re.compile(rf"^    linkStyle (\d+) ({_STYLE});$")
_ENTITIES = {"quot": '"', "lt": "<", "gt": ">", "amp": "&"}


def _unescape(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        return _ENTITIES[name] if name in _ENTITIES else chr(int(name))

    return re.sub(r"#(\w+);", one, text)


def parse_mermaid(source: str) -> dict[str, Any]:
    """A strict parser of the ``flowchart LR`` subset that to_mermaid emits; raises on
    anything else (unknown statement, undeclared node, unknown class, link index out of
    range, a raw quote or '#' inside a label)."""
    lines = source.splitlines()
    assert lines[0] == "flowchart LR", lines[0]
    nodes: dict[str, tuple[str, str]] = {}
    links: list[tuple[str, str, str, str]] = []
    classdefs: dict[str, str] = {}
    classes: dict[str, str] = {}
    styles: dict[int, str] = {}
    for line in lines[1:]:
        if line.startswith("    %% "):
            continue
        if m := _NODE.match(line):
            assert m.group(1) not in nodes, f"node declared twice: {line}"
            shape = "rect" if m.group(2) is not None else "stadium"
            nodes[m.group(1)] = (shape, _unescape(m.group(2) or m.group(3)))
        elif m := _LINK.match(line):
            assert m.group(1) in nodes and m.group(4) in nodes, f"undeclared node: {line}"
            links.append((m.group(1), m.group(2), _unescape(m.group(3)), m.group(4)))
        elif m := _CLASSDEF.match(line):
            classdefs[m.group(1)] = m.group(2)
        elif m := _CLASS.match(line):
            assert m.group(2) in classdefs, f"class before its classDef: {line}"
            for member in m.group(1).split(","):
                assert member in nodes, f"undeclared node: {line}"
                classes[member] = m.group(2)
        elif m := _LINKSTYLE.match(line):
            assert int(m.group(1)) < len(links), f"no link {m.group(1)}: {line}"
            styles[int(m.group(1))] = m.group(2)
        else:
            raise AssertionError(f"not Mermaid flowchart syntax: {line!r}")
    return {"nodes": nodes, "links": links, "classes": classes, "styles": styles}


def test_the_mermaid_parser_rejects_what_mermaid_would(store: Mnestoma) -> None:
    for bad in (
        'flowchart LR\n    n0["a"b"]',
        'flowchart LR\n    n0["a"]\n    n0 -->|"x"| n1',
        'flowchart LR\n    n0["a # b"]',
        'flowchart LR\n    n0["a"]\n    linkStyle 0 stroke-width:1px;',
        'flowchart LR\n    n0["a"]\n    class n0 nope;',
        "graph TD\n",
    ):
        with pytest.raises(AssertionError):
            parse_mermaid(bad)


def test_mermaid_parses_and_says_what_the_graph_holds(store: Mnestoma) -> None:
    _fixture_graph(store)
    for name in TRICKY:
        store.record_passing("a", "1", name, "1")
    graph = store.graph()
    parsed = parse_mermaid(to_mermaid(graph))
    by_text = {text: ident for ident, (_, text) in parsed["nodes"].items()}
    assert set(by_text) == {n.id if not n.wished else f"{n.id} (wished)" for n in graph.nodes}
    assert len(parsed["links"]) == len(graph.edges)
    for (src, arrow, label, dst), e in zip(parsed["links"], graph.edges, strict=True):
        assert parsed["nodes"][src][1] == e.source
        assert parsed["nodes"][dst][1].removesuffix(" (wished)") == e.target
        assert arrow == ("-->" if e.mnest.state in ("active", "decaying") else "-.->")
        assert label.startswith(f"{e.effective_weight:.2f} ({e.mnest.uses} use")
    wished = by_text["pdf (wished)"]
    assert parsed["nodes"][wished][0] == "stadium" and parsed["classes"][wished] == "wished"
    assert parsed["classes"][by_text["old@1"]] == "faded"  # only a superseded edge
    assert by_text["x@1"] not in parsed["classes"]  # a decaying edge in, an active one out
    assert set(parsed["styles"]) == set(range(len(graph.edges)))


def test_dot_and_mermaid_mark_the_same_source_never_a_wished_node_named_like_it(
    store: Mnestoma,
) -> None:
    """A proto a@1 -> a (wished) puts a node named "a" beside the source a@1: it does not
    exist yet, so neither drawing marks it as where the graph starts."""
    store.record_passing("a", "1", "b", "1")
    store.record_passing("a", "1", "a", dst_exists=False)
    graph = store.graph("a", depth=1)
    assert {n.id for n in graph.nodes} == {"a", "a@1", "b@1"}
    assert [n.id for n in graph.nodes if graph.is_source(n)] == ["a@1"]
    dot_marked = {
        line.split(" [", 1)[0].strip().strip('"')
        for line in to_dot(graph).splitlines()
        if "->" not in line and "penwidth=2" in line
    }
    parsed = parse_mermaid(to_mermaid(graph))
    mermaid_marked = {
        parsed["nodes"][ident][1] for ident, name in parsed["classes"].items() if name == "source"
    }
    assert dot_marked == mermaid_marked == {"a@1"}


def test_a_wish_named_like_a_versioned_source_gets_a_node_of_its_own(store: Mnestoma) -> None:
    """A proto x@1 -> "a@1" wishes for an executor named "a@1": it must not point into the
    source a@1 that exists (nor make it look wished), in any format."""
    store.record_passing("a", "1", "x", "1")
    store.record_passing("x", "1", "a@1", dst_exists=False)
    graph = store.graph("a", depth=2)
    nodes = {n.id: (n.executor, n.version, n.wished) for n in graph.nodes}
    assert nodes == {
        "a@1": ("a", "1", False),
        "x@1": ("x", "1", False),
        "a@1 (wished)": ("a@1", None, True),
    }
    assert _edges(graph) == {("a@1", "x@1", "active"), ("x@1", "a@1 (wished)", "proto")}
    assert [n.id for n in graph.nodes if graph.is_source(n)] == ["a@1"]
    parsed = parse_mermaid(to_mermaid(graph))
    marked = {parsed["nodes"][i][1] for i, c in parsed["classes"].items() if c == "source"}
    assert marked == {"a@1"} and len(parsed["nodes"]) == 3
    assert '"x@1" -> "a@1 (wished)"' in to_dot(graph)


# --- networkx and GraphML -------------------------------------------------------------------


def test_graphml_round_trips_through_networkx(store: Mnestoma) -> None:
    import networkx as nx

    ids = _fixture_graph(store)
    graph = store.graph()
    back = nx.read_graphml(io.BytesIO(to_graphml(graph).encode("utf-8")), force_multigraph=True)
    assert isinstance(back, nx.MultiDiGraph)
    assert set(back.nodes) == {n.id for n in graph.nodes}
    assert {k for _, _, k in back.edges(keys=True)} == {e.mnest.id for e in graph.edges}
    old = next(d for _, _, k, d in back.edges(keys=True, data=True) if k == ids["old"])
    assert old["state"] == "superseded" and old["uses"] == 1 and old["dst_version"] == "1"
    assert isinstance(old["weight"], float) and isinstance(old["effective_weight"], float)
    assert datetime.fromisoformat(old["ts_first"]).tzinfo is not None
    wish = next(d for u, v, d in back.edges(data=True) if v == "pdf")
    assert "dst_version" not in wish and json.loads(wish["desired_sig"]) == {"summary": "s"}
    assert back.nodes["pdf"]["wished"] is True and "version" not in back.nodes["pdf"]
    assert back.nodes["a@1"] == {"executor": "a", "version": "1", "wished": False}


def test_to_networkx_gives_analysts_every_column_and_the_effective_weight(
    store: Mnestoma, clock
) -> None:
    import networkx as nx

    _fixture_graph(store)
    clock.advance(days=10)
    g = store.to_networkx()
    assert isinstance(g, nx.MultiDiGraph)
    assert g.number_of_edges() == 9 and "a@1" in g and g.nodes["pdf"]["wished"]
    [(key, data)] = [
        (k, d) for _, v, k, d in g.out_edges("a@1", keys=True, data=True) if v == "b@1"
    ]
    assert set(data) == {*MNEST_KEYS, "failing"}
    assert data["id"] == key and data["uses"] == 4
    assert data["effective_weight"] == pytest.approx(data["weight"] * 0.835270211411272)
    assert data["ts_first"].tzinfo is not None
    assert nx.has_path(g, "a@1", "d@1")
    assert to_networkx(store.graph("a", depth=1)).number_of_edges() == 3  # superseded too


# --- outcomes (contract §11) ----------------------------------------------------------------


def _outcome_graph(store: Mnestoma) -> MnestGraph:
    """a→b failing (1 ok, 2 error), a→c fine (2 ok), a→d without outcomes, a wish failing."""
    for outcome in ("ok", "error", "error"):
        store.record_passing("a", "1", "b", "1", outcome=outcome)
    for _ in range(2):
        store.record_passing("a", "1", "c", "1", outcome="ok")
    store.record_passing("a", "1", "d", "1")
    store.record_passing("a", "1", "pdf", dst_exists=False)
    return store.graph()


def test_dot_writes_outcome_counts_and_draws_a_failing_edge_red_and_dashed(
    store: Mnestoma,
) -> None:
    lines = to_dot(_outcome_graph(store)).splitlines()

    def edge_line(dst: str) -> str:
        [line] = [x for x in lines if x.strip().startswith(f'"a@1" -> "{dst}"')]
        return line

    failing, fine, plain, wish = (edge_line(d) for d in ("b@1", "c@1", "d@1", "pdf"))
    assert "(3 uses: 1 ok, 2 error)" in failing
    assert 'style="dashed"' in failing and 'color="#c62828"' in failing
    assert "(2 uses: 2 ok, 0 error)" in fine and "#c62828" not in fine
    assert 'style="dashed"' not in fine
    assert " ok" not in plain and "#c62828" not in plain
    assert "(1 use) wished" in wish and 'style="dashed"' in wish and "#c62828" not in wish


def test_mermaid_draws_a_failing_edge_dotted_and_red(store: Mnestoma) -> None:
    graph = _outcome_graph(store)
    parsed = parse_mermaid(to_mermaid(graph))
    for i, ((_, arrow, label, _), e) in enumerate(zip(parsed["links"], graph.edges, strict=True)):
        target = e.target
        red = "stroke:#c62828" in parsed["styles"][i]
        if target == "b@1":
            assert (arrow, red) == ("-.->", True) and "(3 uses: 1 ok, 2 error)" in label
        elif target == "c@1":
            assert (arrow, red) == ("-->", False) and "(2 uses: 2 ok, 0 error)" in label
        elif target == "d@1":
            assert (arrow, red) == ("-->", False) and "ok" not in label
        else:
            assert (arrow, red) == ("-.->", False)


def test_json_graphml_and_networkx_carry_the_counts_and_say_which_edges_fail(
    store: Mnestoma,
) -> None:
    import networkx as nx

    graph = _outcome_graph(store)
    expected = {"b@1": (1, 2, True), "c@1": (2, 0, False), "d@1": (0, 0, False)}
    expected["pdf"] = (0, 0, False)
    records = json.loads(render(graph, "json"))
    assert {r["target"]: (r["ok_count"], r["error_count"], r["failing"]) for r in records} == (
        expected
    )
    back = nx.read_graphml(io.BytesIO(to_graphml(graph).encode("utf-8")), force_multigraph=True)
    assert {
        v: (d["ok_count"], d["error_count"], d["failing"]) for _, v, d in back.edges(data=True)
    } == expected
    g = to_networkx(graph)
    assert {
        v: (d["ok_count"], d["error_count"], d["failing"]) for _, v, d in g.edges(data=True)
    } == expected


def test_as_many_errors_as_successes_is_not_failing(store: Mnestoma) -> None:
    store.record_passing("a", "1", "b", "1", outcome="ok")
    store.record_passing("a", "1", "b", "1", outcome="error")
    [edge] = store.graph().edges
    assert not edge.failing and "#c62828" not in to_dot(store.graph())


def test_without_networkx_the_error_names_the_extra(
    store: Mnestoma, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.record_passing("a", "1", "b", "1")
    monkeypatch.setitem(sys.modules, "networkx", None)
    for call in (store.to_networkx, lambda: to_graphml(store.graph())):
        with pytest.raises(MissingExtra, match=re.escape("mnestoma[graph]")) as err:
            call()
        assert isinstance(err.value, MnestomaError) and isinstance(err.value, ImportError)
    assert to_dot(store.graph())  # the text formats need nothing more


# --- the command ----------------------------------------------------------------------------


def _ok(*args: str) -> str:
    result = run(*args)
    assert result.exit_code == 0, result.output
    return result.output


def test_graph_json_is_keyed_like_the_other_listings(store_url: str, store: Mnestoma) -> None:
    _fixture_graph(store)
    at = ("--at", "2026-02-01T00:00:00Z")
    rows = json.loads(_ok("graph", "--json", *at, "--database-url", store_url))
    assert [list(r) for r in rows] == [[*MNEST_KEYS, "source", "target", "failing"]] * 8
    assert json.loads(_ok("graph", "--format", "json", *at, "--database-url", store_url)) == rows
    assert {r["state"] for r in rows} == set(PICTURE_STATES)
    assert rows[0]["ts_first"].endswith("Z")


def test_graph_states_repeat_or_separate_with_commas(store_url: str, store: Mnestoma) -> None:
    _fixture_graph(store)

    def states(*extra: str) -> set[str]:
        out = _ok("graph", "--json", *extra, "--database-url", store_url)
        return {r["state"] for r in json.loads(out)}

    assert states("--states", "superseded") == {"superseded"}
    assert states("--states", "active,proto") == {"active", "proto"}
    assert states("--states", "active", "--states", "superseded") == {"active", "superseded"}


def test_graph_from_a_source_with_a_depth(store_url: str, store: Mnestoma) -> None:
    _fixture_graph(store)
    out = _ok("graph", "a@1", "--depth", "1", "--format", "mermaid", "--database-url", store_url)
    parsed = parse_mermaid(out)
    assert len(parsed["links"]) == 2 and "from a@1" in out


def test_graph_writes_a_file_with_output(store_url: str, store: Mnestoma, tmp_path: Path) -> None:
    _fixture_graph(store)
    target = tmp_path / "g.graphml"
    result = run("graph", "--format", "graphml", "-o", str(target), "--database-url", store_url)
    assert result.exit_code == 0, result.output
    assert result.stdout == "" and target.read_text(encoding="utf-8").startswith("<?xml")
    dot = _ok("graph", "--database-url", store_url)
    assert dot.startswith("digraph mnestoma {")  # DOT by default


def test_graph_output_says_on_stderr_what_it_wrote(
    store_url: str, store: Mnestoma, tmp_path: Path
) -> None:
    _fixture_graph(store)
    target = tmp_path / "g.mmd"
    result = run("graph", "--format", "mermaid", "-o", str(target), "--database-url", store_url)
    assert result.exit_code == 0, result.output
    from mnestoma.cli.render import megabytes

    size = megabytes(len(target.read_bytes()))
    picture = store.graph(states=list(PICTURE_STATES))
    nodes, edges = len(picture.nodes), len(picture.edges)
    assert result.stdout == ""
    assert result.stderr == (
        f"wrote {target}: {edges} edges between {nodes} nodes, {size} of mermaid\n"
    )


@pytest.mark.parametrize("to_file", [True, False], ids=["to a file", "to stdout"])
def test_a_graph_past_the_large_size_is_noted_on_stderr(
    store_url: str, store: Mnestoma, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, to_file: bool
) -> None:
    from mnestoma.cli import commands

    _fixture_graph(store)
    monkeypatch.setattr(commands, "GRAPH_LARGE_BYTES", 100)
    args = ["--at", "2026-02-01T00:00:00Z", "--database-url", store_url]
    target = ["-o", str(tmp_path / "g.dot")] if to_file else []
    result = run("graph", *target, *args)
    assert result.exit_code == 0, result.output
    note = result.stderr.splitlines()[-1]
    assert note.startswith("note: this graph is ") and "past 100 bytes" in note
    assert "--depth" in note and "--states" in note
    assert result.stdout.startswith("digraph") != to_file
    noted = run("graph", *args)
    monkeypatch.setattr(commands, "GRAPH_LARGE_BYTES", 10_000_000)
    plain = run("graph", *args)
    assert plain.stderr == "" and noted.stdout == plain.stdout  # the picture is the same


def _one_plain_line(result: Result) -> str:
    """The failure's stderr: one line, no traceback, no Python exception name."""
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert "Traceback" not in line and "Error:" not in line.removeprefix("Error:")
    return line


def test_graph_output_into_a_missing_directory_exits_2_in_plain_words(
    store_url: str, store: Mnestoma, tmp_path: Path
) -> None:
    """Bad input (contract §6): the path names no directory; said before the store is read."""
    _fixture_graph(store)
    target = tmp_path / "missing" / "g.dot"
    result = run("graph", "-o", str(target), "--database-url", store_url)
    assert result.exit_code == 2, result.output
    line = _one_plain_line(result)
    assert line == f"Error: cannot write {target}: no such directory {target.parent}"
    assert not target.parent.exists()


def test_graph_output_below_a_file_exits_2_in_plain_words(
    store_url: str, store: Mnestoma, tmp_path: Path
) -> None:
    _fixture_graph(store)
    (tmp_path / "notes.txt").write_text("kept", encoding="utf-8")
    target = tmp_path / "notes.txt" / "g.dot"
    result = run("graph", "-o", str(target), "--database-url", store_url)
    assert result.exit_code == 2, result.output
    line = _one_plain_line(result)
    assert line == f"Error: cannot write {target}: {tmp_path / 'notes.txt'} is not a directory"
    assert (tmp_path / "notes.txt").read_text(encoding="utf-8") == "kept"


def test_graph_output_that_fails_while_writing_exits_1_in_plain_words(
    store_url: str, store: Mnestoma
) -> None:
    """A place that can be written but fails the write (here a full device) is not bad input."""
    _fixture_graph(store)
    result = run("graph", "-o", "/dev/full", "--database-url", store_url)
    assert result.exit_code == 1, result.output
    assert _one_plain_line(result) == "Error: cannot write /dev/full: no space left on device"


# --- -o never overwrites the store it draws, and never leaves half a file -------------------
# (SQLite only: a PostgreSQL store has no file that -o could name)


@pytest.fixture
def graph_store(tmp_path: Path, _sqlite_template: Path) -> tuple[str, Path]:
    """The URL and file of a SQLite store in ``tmp_path`` holding the fixture graph."""
    path = tmp_path / "store.sqlite"
    shutil.copy(_sqlite_template, path)
    url = f"sqlite:///{path}"
    with Mnestoma(url) as store:
        _fixture_graph(store)
    return url, path


def _rows(url: str) -> list[dict[str, Any]]:
    with Mnestoma(url) as store:
        return [m.as_dict() for m in store.edges()]


STORE_SUFFIXES = ["", "-wal", "-shm", "-journal", "-writers.lock", "-writers.bell", "-ager.lock"]


@pytest.mark.parametrize("how", ["its path", "a symlink", "a path through ..", "a link's path"])
@pytest.mark.parametrize("suffix", STORE_SUFFIXES, ids=lambda s: s or "database")
def test_graph_output_onto_a_file_of_the_store_is_refused_and_the_store_still_opens(
    tmp_path: Path, graph_store: tuple[str, Path], suffix: str, how: str
) -> None:
    url, path = graph_store
    rows, content = _rows(url), path.read_bytes()
    named = path.with_name(path.name + suffix)
    (tmp_path / "sub").mkdir()
    if how == "a symlink":
        named = tmp_path / "sub" / "picture.dot"
        named.symlink_to(path.with_name(path.name + suffix))  # dangling where none exists yet
    elif how == "a path through ..":
        named = tmp_path / "sub" / ".." / named.name
    elif how == "a link's path":  # the URL names a link to the store: its real files count
        link = tmp_path / "sub" / "alias.sqlite"
        link.symlink_to(path)
        url = f"sqlite:///{link}"
    result = run("graph", "-o", str(named), "--database-url", url)
    assert result.exit_code == 2, result.output
    line = _one_plain_line(result)
    assert "a file of the store being read" in line and "give another file" in line
    assert path.read_bytes() == content and _rows(url) == rows
    expected = {"store.sqlite", "sub"} | ({"store.sqlite" + suffix} if suffix else set())
    assert expected >= {p.name for p in tmp_path.iterdir()}  # nothing else made


def test_graph_output_onto_a_hard_link_of_the_store_is_refused(
    tmp_path: Path, graph_store: tuple[str, Path]
) -> None:
    url, path = graph_store
    rows, content = _rows(url), path.read_bytes()
    other = tmp_path / "elsewhere.dot"
    other.hardlink_to(path)
    result = run("graph", "-o", str(other), "--database-url", url)
    assert result.exit_code == 2, result.output
    assert f"that is {path}," in _one_plain_line(result)
    assert path.read_bytes() == content == other.read_bytes() and _rows(url) == rows


def test_graph_output_onto_the_default_store_is_refused(
    tmp_path: Path, graph_store: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, path = graph_store
    monkeypatch.setenv("MNESTOMA_DB_PATH", str(path))
    monkeypatch.delenv("MNESTOMA_DATABASE_URL", raising=False)
    result = run("graph", "-o", str(path))
    assert result.exit_code == 2, result.output
    assert _rows(url)


def test_graph_output_that_fails_while_writing_leaves_the_file_as_it_was(
    tmp_path: Path, graph_store: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The picture goes to a new file beside the target and is renamed over it once whole."""
    from mnestoma.cli import render

    url, _ = graph_store
    target = tmp_path / "out" / "g.dot"
    target.parent.mkdir()
    target.write_text("the last picture", encoding="utf-8")

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(render.os, "fsync", disk_full)
    result = run("graph", "-o", str(target), "--database-url", url)
    assert result.exit_code == 1, result.output
    assert _one_plain_line(result) == f"Error: cannot write {target}: no space left on device"
    assert target.read_text(encoding="utf-8") == "the last picture"
    assert [p.name for p in target.parent.iterdir()] == ["g.dot"]  # no partial file left


def test_graph_output_replaces_the_file_whole_keeping_its_mode_and_links(
    tmp_path: Path, graph_store: tuple[str, Path]
) -> None:
    url, _ = graph_store
    # The title names the instant drawn, to the second: two pictures of "now" drawn either
    # side of a second's edge differ (a loaded machine draws them further apart).
    at = ("--at", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    target = tmp_path / "g.dot"
    target.write_text("old " * 10_000, encoding="utf-8")
    target.chmod(0o640)
    alias = tmp_path / "latest.dot"
    alias.symlink_to(target)
    _ok("graph", "-o", str(alias), *at, "--database-url", url)
    assert alias.is_symlink()  # written through the link, which stays a link
    assert target.read_text(encoding="utf-8").startswith("digraph mnestoma {")
    assert target.stat().st_mode & 0o777 == 0o640
    fresh = tmp_path / "new.dot"
    _ok("graph", "-o", str(fresh), *at, "--database-url", url)
    assert fresh.read_text(encoding="utf-8") == target.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "args",
    [
        ["--depth", "2"],
        ["a", "--depth", "0"],
        ["--states", "bogus"],
        ["--json", "--format", "dot"],
        ["--at", "yesterday"],
        ["--at", "2026-04-02T03:00:00"],
        ["--format", "png"],
        ["a@"],
    ],
    ids=" ".join,
)
def test_bad_graph_input_exits_2_and_writes_nothing(
    store_url: str, tmp_path: Path, args: list[str]
) -> None:
    target = tmp_path / "out.txt"
    result = run("graph", *args, "-o", str(target), "--database-url", store_url)
    assert result.exit_code == 2, result.output
    assert not target.exists()


def test_graph_weights_at_a_given_instant(store_url: str, clock) -> None:
    m = Mnestoma(store_url, clock=clock)
    m.record_passing("a", "1", "b", "1")
    m.close()
    later = clock.now.replace(year=clock.now.year + 1).isoformat()
    rows = json.loads(_ok("graph", "--json", "--at", later, "--database-url", store_url))
    assert rows[0]["effective_weight"] == pytest.approx(0.30 * 0.0014, rel=0.05)


def test_the_guide_picture_is_what_the_command_draws_of_the_demo(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.sqlite'}"
    _ok("demo", "--database-url", url)
    section = GRAPH_GUIDE.read_text(encoding="utf-8").split("## A picture of the graph", 1)[1]
    command = re.search(r"mnestoma (graph [^\n]*--format mermaid[^\n]*)", section)
    assert command is not None
    args = command.group(1).replace("sqlite:///demo.sqlite", url).split()
    drawn = _ok(*args)
    shown = re.search(r"```mermaid\n(.*?)```", section, re.S)
    assert shown is not None
    assert shown.group(1) == drawn
    parsed = parse_mermaid(drawn)
    texts = {t for _, t in parsed["nodes"].values()}
    assert {"web.search@2.1", "http.fetch@1.4", "text.summarise@1.0", "pdf.to_text (wished)"} <= (
        texts
    )
    labels = [(parsed["nodes"][s][1], parsed["nodes"][d][1]) for s, _, _, d in parsed["links"]]
    assert ("web.search@2.1", "http.fetch@1.4") in labels
    assert ("http.fetch@1.4", "pdf.to_text (wished)") in labels


def test_the_demo_graph_renders_with_graphviz(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.sqlite'}"
    _ok("demo", "--database-url", url)
    svg = _dot_svg(_ok("graph", "--at", "2026-04-02T03:00:00Z", "--database-url", url))
    assert "pdf.to_text" in svg and "(wished)" in svg


def test_graph_is_listed_in_the_help() -> None:
    assert "  graph " in _ok("--help")
    assert "--database-url" in _ok("graph", "--help")
