"""A picture of the graph (contract §9): the store's edges as DOT, Mermaid, GraphML or JSON.

A node is an executor at a version (``"executor@version"``), or the bare name of an
executor that a proto-mnest wishes for (it has no version yet; " (wished)" is added where
that name is already an ``executor@version`` node). Effective weight is drawn
as pen width and written on the edge; protos are dashed toward a "wished" node, decaying
edges are greyed, superseded ones are left out unless asked for. Each edge carries its
outcome counts (``ok_count``, ``error_count``, contract §11): written on the label once any
outcome is recorded, and an edge whose errors outnumber its successes is *failing*: drawn
red and dashed (DOT) or dotted (Mermaid), and marked ``failing`` in GraphML, JSON and
networkx. ``networkx`` (extra ``mnestoma[graph]``) is imported only by GraphML and
:func:`to_networkx`.

The graph also holds the planner's chains among its edges (contract §13): each pair of
consecutive links ``prev → src → dst`` whose two links, by executor names, are edges of
the picture, with its decayed count at the graph's instant. :func:`to_networkx` lists them
in the graph's attributes (``G.graph["chains"]``); DOT and Mermaid say how many in a
comment (chains are by name, not drawn: an edge is a versioned row); GraphML and JSON, a
file of edges, leave them out.
"""

from __future__ import annotations

import inspect
import io
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, ParamSpec

from mnestoma.core.display import (
    FADED_COLOUR,
    FAILING_ARROW,
    FAILING_COLOUR,
    FAILING_DOT_STYLE,
    PICTURE_STATES,
    STATE_STYLES,
    WISHED_COLOUR,
    style_of,
)
from mnestoma.core.errors import InvalidInput, MissingExtra
from mnestoma.core.records import fields_record, mnest_record
from mnestoma.core.rules import CHAIN_DECAY_LAMBDA, MnestState, decayed_count
from mnestoma.core.timefmt import iso_utc
from mnestoma.core.types import parse_sqlite_timestamp
from mnestoma.core.validation import (
    check_name,
    check_optional_name,
    check_positive_int,
    check_states,
)
from mnestoma.schema.models import Mnest
from mnestoma.schema.sql import chains as chains_sql

if TYPE_CHECKING:
    from mnestoma.core.settings import Settings
    from mnestoma.schema.runner import StatementRunner

__all__ = [
    "DEFAULT_DEPTH",
    "GRAPH_FORMATS",
    "PICTURE_STATES",
    "GraphChain",
    "GraphEdge",
    "GraphNode",
    "GraphReads",
    "MissingExtra",
    "MnestGraph",
    "build_graph",
    "render",
    "to_dot",
    "to_graphml",
    "to_json",
    "to_mermaid",
    "to_networkx",
]

P = ParamSpec("P")

GRAPH_FORMATS = ("dot", "mermaid", "graphml", "json")
DEFAULT_DEPTH = 3
MAX_DEPTH = 16

# Pen width grows linearly with the effective weight: 1 (weight 0) to 5 (weight 1).
PEN_MIN = 1.0
PEN_SPAN = 4.0


@dataclass(frozen=True, slots=True)
class GraphNode:
    """An executor at a version, or (``wished``) an executor a proto wishes for."""

    id: str
    executor: str
    version: str | None
    wished: bool


@dataclass(frozen=True, slots=True)
class GraphEdge:
    """One mnest between two nodes, with its effective weight at the graph's instant."""

    source: str
    target: str
    mnest: Mnest
    effective_weight: float

    @property
    def failing(self) -> bool:
        """More errors than successes recorded after passings along this edge."""
        return self.mnest.error_count > self.mnest.ok_count


@dataclass(frozen=True, slots=True)
class GraphChain:
    """A chain among the graph's edges (``mnest_chains``, by executor names): ``prev → src →
    dst``, its decayed count of passings at the graph's instant (``decayed_uses``), their
    raw count, first and last."""

    prev: str
    src: str
    dst: str
    decayed_uses: float
    uses: int
    ts_first: datetime
    ts_last: datetime

    def as_dict(self) -> dict[str, Any]:
        """Its fields, by name (times as datetimes)."""
        return fields_record(self)


@dataclass(frozen=True, slots=True)
class MnestGraph:
    """Nodes and edges, sorted so that every rendering of the same store is the same text;
    the chains among the edges, in key order."""

    nodes: tuple[GraphNode, ...]
    edges: tuple[GraphEdge, ...]
    at: datetime
    src: str | None = None
    chains: tuple[GraphChain, ...] = ()

    def is_source(self, node: GraphNode) -> bool:
        """True for a node the graph starts from: ``src`` is its id (``executor@version``)
        or its executor (any version). A wished node never is: it does not exist yet, even
        where it bears the source's name."""
        return not node.wished and self.src is not None and self.src in (node.id, node.executor)


def node_id(executor: str, version: str | None) -> str:
    """``executor@version``; a wished executor (no version) is its bare name."""
    return executor if version is None else f"{executor}@{version}"


def wished_node_id(executor: str, taken: set[str]) -> str:
    """A wished executor's node: its bare name, unless an executor at a version already has
    that id (a wish for "a@1" beside a@1): then " (wished)" is added, so that a proto never
    points into an executor that exists."""
    ident = executor
    while ident in taken:
        ident += " (wished)"
    return ident


def _as_networkx(read: Callable[P, MnestGraph]) -> Callable[P, Any]:
    """``read``, with the graph it returns given as :func:`to_networkx` gives it."""

    def to_networkx_of(*args: P.args, **kwargs: P.kwargs) -> Any:
        return to_networkx(read(*args, **kwargs))

    # read's parameters, its own result
    to_networkx_of.__signature__ = inspect.signature(read).replace(  # type: ignore[attr-defined]
        return_annotation=Any
    )
    to_networkx_of.__name__ = "to_networkx"
    to_networkx_of.__qualname__ = "GraphReads.to_networkx"
    to_networkx_of.__doc__ = (
        "The graph as a ``networkx.MultiDiGraph`` (extra ``mnestoma[graph]``): nodes "
        '``"executor@version"``, one edge per mnest keyed by its id, with its columns, '
        "``effective_weight`` and ``failing``; the chains among its edges in "
        '``G.graph["chains"]`` (see :meth:`graph` for the arguments).\n\n'
        "Returns:\n"
        "    The ``networkx.MultiDiGraph``.\n\n"
        "Raises:\n"
        "    MissingExtra: networkx is not installed (extra ``mnestoma[graph]``).\n"
        "    InvalidInput: an argument :meth:`graph` refuses.\n"
        "    StoreError: the database failed.\n"
    )
    return to_networkx_of


class GraphReads:
    """The graph operations of :class:`~mnestoma.MnestRepository` (a mixin: they read the
    store through its listings, so the facades get them from their tables as any other)."""

    if TYPE_CHECKING:  # what they read of the repository
        settings: Settings
        edges: Callable[..., list[Mnest]]
        _ex: Callable[[], StatementRunner]

    def graph(
        self,
        src_executor: str | None = None,
        *,
        src_version: str | None = None,
        depth: int = DEFAULT_DEPTH,
        states: Iterable[str] | str | None = None,
    ) -> MnestGraph:
        """The graph of the store, or what ``src_executor`` reaches within ``depth`` edges,
        at the now of the settings' clock.

        Without ``src_executor``: every edge in ``states`` (None: every state). With it: the
        edges in ``states`` out of the nodes that ``src_executor`` (at ``src_version``, else
        any version) reaches through at most ``depth − 1`` active edges, as ``walk`` follows
        them, so that ``depth`` = 1 shows the edges out of the source only.

        Returns:
            The :class:`MnestGraph`: its nodes and edges, with each edge's effective weight
            at that now, and the chains among its edges (both links edges of the graph,
            by executor names) with their decayed counts at that now.

        Raises:
            InvalidInput: ``src_version`` without ``src_executor``, or a name, version, state
                or ``depth`` the contract refuses.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        at = self.settings.now()
        chosen = check_states(states)
        shown = None if chosen is None else {s.value for s in chosen}
        if src_executor is None:
            if src_version is not None:
                raise InvalidInput("src_version needs src_executor")
            rows = self.edges(states=None if shown is None else sorted(shown))
            graph = _graph(rows, at, None)
            return _with_chains(graph, _chain_rows(self._ex(), None))
        src = check_name(src_executor, "src_executor")
        version = check_optional_name(src_version, "src_version")
        hops = check_positive_int(depth, "depth", maximum=MAX_DEPTH)
        # Read the shown states and ``active`` (followed even when not shown).
        wanted = None if shown is None else sorted(shown | {MnestState.ACTIVE.value})
        frontier: dict[str, set[str] | None] = {src: None if version is None else {version}}
        reached: set[tuple[str, str]] = set()
        found: dict[str, Mnest] = {}
        # Each executor's edges are read once, whichever versions of it the walk reaches later.
        read: dict[str, list[Mnest]] = {}
        for _ in range(hops):
            following: dict[str, set[str]] = {}
            for executor in sorted(frontier):
                versions = frontier[executor]
                if executor not in read:
                    read[executor] = self.edges(src_executor=executor, states=wanted)
                for m in read[executor]:
                    if versions is not None and m.src_version not in versions:
                        continue
                    reached.add((m.src_executor, m.src_version))
                    if shown is None or m.state in shown:
                        found[m.id] = m
                    if m.state != MnestState.ACTIVE.value or m.dst_version is None:
                        continue
                    nxt = (m.dst_executor, m.dst_version)
                    if nxt in reached:
                        continue
                    following.setdefault(m.dst_executor, set()).add(m.dst_version)
            frontier = dict(following)
            if not frontier:
                break
        graph = _graph(found.values(), at, node_id(src, version))
        middles = {e.mnest.dst_executor for e in graph.edges}
        return _with_chains(graph, _chain_rows(self._ex(), middles))

    to_networkx = _as_networkx(graph)


# The graph read through a repository, as a function: ``build_graph(repo, ...)``.
build_graph = GraphReads.graph


def _graph(rows: Iterable[Mnest], at: datetime, src: str | None) -> MnestGraph:
    rows = list(rows)
    real = {node_id(m.src_executor, m.src_version) for m in rows} | {
        node_id(m.dst_executor, m.dst_version) for m in rows if m.dst_version is not None
    }
    nodes: dict[str, GraphNode] = {}
    edges: list[GraphEdge] = []
    for m in rows:
        source = node_id(m.src_executor, m.src_version)
        nodes.setdefault(source, GraphNode(source, m.src_executor, m.src_version, False))
        wished = m.dst_version is None
        target = (
            wished_node_id(m.dst_executor, real)
            if wished
            else node_id(m.dst_executor, m.dst_version)
        )
        nodes.setdefault(target, GraphNode(target, m.dst_executor, m.dst_version, wished))
        edges.append(GraphEdge(source, target, m, m.effective_weight(at)))
    edges.sort(key=lambda e: (e.source, e.target, e.mnest.state, e.mnest.id))
    return MnestGraph(tuple(nodes[k] for k in sorted(nodes)), tuple(edges), at, src)


def _chain_rows(ex: StatementRunner, srcs: set[str] | None) -> list[tuple[Any, ...]]:
    """The stored chains (``mnest_chains``) whose middle executor is one of ``srcs`` (None:
    every chain), in key order."""
    if srcs is not None and not srcs:
        return []
    stmt = chains_sql.chains_from(ex.dialect, srcs is not None)
    return ex.rows(stmt, {} if srcs is None else {"srcs": sorted(srcs)})


def _with_chains(graph: MnestGraph, rows: Iterable[Sequence[Any]]) -> MnestGraph:
    """``graph`` with the chains among its edges: those of ``rows`` (``mnest_chains`` rows,
    its columns in order) whose two links, by executor names, are edges of the graph to a
    versioned node (chains leave links to protos out); each decayed to the graph's instant."""
    links = {(e.mnest.src_executor, e.mnest.dst_executor) for e in graph.edges if not _wished(e)}
    chains = []
    for prev, src, dst, counted, uses, first, last in rows:
        if (prev, src) not in links or (src, dst) not in links:
            continue
        first, last = parse_sqlite_timestamp(first), parse_sqlite_timestamp(last)
        count = decayed_count(float(counted), CHAIN_DECAY_LAMBDA, last, graph.at)
        chains.append(GraphChain(prev, src, dst, count, int(uses), first, last))
    return replace(graph, chains=tuple(chains))


def _wished(e: GraphEdge) -> bool:
    return e.mnest.dst_version is None


# --- shared look --------------------------------------------------------------------------


def _pen(weight: float) -> float:
    return round(PEN_MIN + PEN_SPAN * min(1.0, max(0.0, weight)), 2)


def _edge_label(e: GraphEdge) -> str:
    uses = e.mnest.uses
    ok, error = e.mnest.ok_count, e.mnest.error_count
    outcomes = f": {ok} ok, {error} error" if ok or error else ""
    text = f"{e.effective_weight:.2f} ({uses} use{'' if uses == 1 else 's'}{outcomes})"
    suffix = style_of(e.mnest.state).label
    return f"{text} {suffix}" if suffix else text


def _faded_nodes(graph: MnestGraph) -> set[str]:
    """Nodes that only edges of unlit states (decaying, superseded) touch: drawn grey."""
    alive = {s.value for s, style in STATE_STYLES.items() if style.lit}
    lit = {n for e in graph.edges if e.mnest.state in alive for n in (e.source, e.target)}
    return {n.id for n in graph.nodes if n.id not in lit}


def _title(graph: MnestGraph) -> str:
    where = f"from {graph.src}, " if graph.src is not None else ""
    return f"mnestoma: {where}effective weights at {iso_utc(graph.at.replace(microsecond=0))}"


def _chains_note(graph: MnestGraph) -> str | None:
    """What a picture says of its chains (a comment: chains are by name, not drawn); None
    when there are none."""
    n = len(graph.chains)
    if not n:
        return None
    return (
        f"{n} chain{'' if n == 1 else 's'} among these edges (pairs of consecutive links, by "
        "executor names, read by predict_next): to_networkx() lists them"
    )


# --- DOT ----------------------------------------------------------------------------------


def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _dot_attrs(attrs: dict[str, Any]) -> str:
    parts = []
    for k, v in attrs.items():
        if isinstance(v, float):
            parts.append(f"{k}={v:g}")
        elif isinstance(v, str) and k == "label":
            # labels keep their own \n line breaks; everything else is quoted verbatim
            parts.append(f"{k}=" + '"' + v.replace('"', '\\"') + '"')
        else:
            parts.append(f"{k}={_dot_quote(str(v))}")
    return "[" + ", ".join(parts) + "]"


def _dot_label(*lines: str) -> str:
    return "\\n".join(line.replace("\\", "\\\\") for line in lines)


def to_dot(graph: MnestGraph) -> str:
    """Graphviz DOT: ``dot -Tsvg`` draws it."""
    faded = _faded_nodes(graph)
    out = [
        "digraph mnestoma {",
        f"  graph {_dot_attrs({'rankdir': 'LR', 'label': _dot_label(_title(graph))})};",
        '  graph [labelloc="t", fontname="Helvetica", fontsize=11];',
        '  node [shape="box", style="rounded", fontname="Helvetica", fontsize=11];',
        '  edge [fontname="Helvetica", fontsize=10];',
    ]
    note = _chains_note(graph)
    if note is not None:
        out.append(f"  // {note}")
    for n in graph.nodes:
        attrs: dict[str, Any]
        if n.wished:
            attrs = {
                "label": _dot_label(n.executor, "(wished)"),
                "style": "rounded,dashed",
                "color": WISHED_COLOUR,
                "fontcolor": WISHED_COLOUR,
            }
        else:
            attrs = {"label": _dot_label(n.executor, n.version or "")}
            if n.id in faded:
                attrs.update(color=FADED_COLOUR, fontcolor=FADED_COLOUR)
        if graph.is_source(n):
            attrs["penwidth"] = 2.0
        out.append(f"  {_dot_quote(n.id)} {_dot_attrs(attrs)};")
    for e in graph.edges:
        attrs = {"label": _dot_label(_edge_label(e)), "penwidth": _pen(e.effective_weight)}
        look = style_of(e.mnest.state)
        if look.dot_style is not None:
            attrs["style"] = look.dot_style
        if look.colour is not None:
            attrs.update(color=look.colour, fontcolor=look.colour)
        if e.failing:  # over the state's look: red, and dashed unless it has a style
            attrs.setdefault("style", FAILING_DOT_STYLE)
            attrs.update(color=FAILING_COLOUR, fontcolor=FAILING_COLOUR)
        out.append(f"  {_dot_quote(e.source)} -> {_dot_quote(e.target)} {_dot_attrs(attrs)};")
    out.append("}")
    return "\n".join(out) + "\n"


# --- Mermaid ------------------------------------------------------------------------------

# Inside a quoted Mermaid label, these would end the string or be read as markup.
_MERMAID_ENTITIES = {
    "#": "#35;",
    '"': "#quot;",
    "<": "#lt;",
    ">": "#gt;",
    "&": "#amp;",
    "`": "#96;",
    "|": "#124;",
}


def mermaid_text(text: str) -> str:
    """``text`` as the inside of a quoted Mermaid label."""
    return "".join(_MERMAID_ENTITIES.get(ch, ch) for ch in text)


def to_mermaid(graph: MnestGraph) -> str:
    """A Mermaid ``flowchart LR`` (GitHub and most Markdown viewers draw it)."""
    ids = {n.id: f"n{i}" for i, n in enumerate(graph.nodes)}
    faded = _faded_nodes(graph)
    out = ["flowchart LR", f"    %% {_title(graph)}"]
    note = _chains_note(graph)
    if note is not None:
        out.append(f"    %% {note}")
    for n in graph.nodes:
        if n.wished:
            out.append(f'    {ids[n.id]}(["{mermaid_text(n.executor)} (wished)"])')
        else:
            out.append(f'    {ids[n.id]}["{mermaid_text(n.id)}"]')
    styles: list[str] = []
    for i, e in enumerate(graph.edges):
        look = style_of(e.mnest.state)
        arrow = FAILING_ARROW if e.failing else look.mermaid_arrow
        label = mermaid_text(_edge_label(e))
        out.append(f'    {ids[e.source]} {arrow}|"{label}"| {ids[e.target]}')
        style = f"stroke-width:{_pen(e.effective_weight)}px"
        # the state's colour, then (over it, the last one winning) a failing edge's red
        for colour in (look.colour, FAILING_COLOUR if e.failing else None):
            if colour is not None:
                style += f",stroke:{colour},color:{colour}"
        styles.append(f"    linkStyle {i} {style};")
    out.append(
        f"    classDef wished stroke-dasharray:5 5,stroke:{WISHED_COLOUR},"
        f"color:{WISHED_COLOUR},fill:#fff5e6;"
    )
    out.append(f"    classDef faded stroke:{FADED_COLOUR},color:{FADED_COLOUR},fill:#f5f5f5;")
    out.append("    classDef source stroke-width:3px;")
    wished = [ids[n.id] for n in graph.nodes if n.wished]
    grey = [ids[n.id] for n in graph.nodes if n.id in faded and not n.wished]
    start = [ids[n.id] for n in graph.nodes if graph.is_source(n)]
    for name, members in (("wished", wished), ("faded", grey), ("source", start)):
        if members:
            out.append(f"    class {','.join(members)} {name};")
    out.extend(styles)
    return "\n".join(out) + "\n"


# --- JSON ---------------------------------------------------------------------------------


def edge_records(graph: MnestGraph) -> list[dict[str, Any]]:
    """One object per edge, keyed like the command line's other listings (every column,
    ``ok_count`` and ``error_count`` among them, ISO-8601 UTC times, ``effective_weight``),
    plus its ``source`` and ``target`` nodes and ``failing``."""
    return [
        {
            **mnest_record(e.mnest, graph.at, effective=e.effective_weight),
            "source": e.source,
            "target": e.target,
            "failing": e.failing,
        }
        for e in graph.edges
    ]


def to_json(graph: MnestGraph) -> str:
    """A JSON array of :func:`edge_records`."""
    return json.dumps(edge_records(graph), indent=2, ensure_ascii=False) + "\n"


# --- networkx and GraphML -----------------------------------------------------------------


def _networkx() -> Any:
    try:
        import networkx  # type: ignore[import-untyped,unused-ignore]
    except ImportError as err:
        raise MissingExtra(
            "networkx is not installed: pip install 'mnestoma[graph]' for GraphML and to_networkx()"
        ) from err
    return networkx


def _multidigraph(
    graph: MnestGraph,
    attrs: dict[str, Any],
    node_attrs: Callable[[GraphNode], dict[str, Any]],
    edge_attrs: Callable[[GraphEdge], dict[str, Any]],
) -> Any:
    """A ``networkx.MultiDiGraph`` of ``graph``: one node per node, one edge per mnest keyed
    by its id, with the attributes each caller gives them."""
    nx = _networkx()
    g = nx.MultiDiGraph(**attrs)
    for n in graph.nodes:
        g.add_node(n.id, **node_attrs(n))
    for e in graph.edges:
        g.add_edge(e.source, e.target, key=e.mnest.id, **edge_attrs(e))
    return g


def _derived(e: GraphEdge) -> dict[str, Any]:
    """What an edge carries beside the mnest's columns."""
    return {"effective_weight": e.effective_weight, "failing": e.failing}


def to_networkx(graph: MnestGraph) -> Any:
    """A ``networkx.MultiDiGraph``: node ``"executor@version"`` (a wished executor: its bare
    name) with ``executor``, ``version``, ``wished``; one edge per mnest, keyed by its id,
    with every column of the mnest (``ok_count`` and ``error_count`` among them),
    ``effective_weight`` and ``failing``. The graph's attributes: ``at``, ``src``, and
    ``chains``, one dict per chain among the edges (:meth:`GraphChain.as_dict`: ``prev``,
    ``src``, ``dst`` executor names, ``decayed_uses`` at ``at``, ``uses``, ``ts_first``,
    ``ts_last``), in key order."""
    return _multidigraph(
        graph,
        {"at": graph.at, "src": graph.src, "chains": [c.as_dict() for c in graph.chains]},
        lambda n: {"executor": n.executor, "version": n.version, "wished": n.wished},
        lambda e: {**e.mnest.as_dict(), **_derived(e)},
    )


def _graphml_value(value: Any) -> Any:
    """GraphML holds strings, numbers and booleans: times as ISO text, JSON as JSON text."""
    if isinstance(value, datetime):
        return iso_utc(value)
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return value


def _present(values: dict[str, Any]) -> dict[str, Any]:
    """The values that are not None, as GraphML holds them (it has no null)."""
    return {k: _graphml_value(v) for k, v in values.items() if v is not None}


def to_graphml(graph: MnestGraph) -> str:
    """GraphML through networkx (absent values are left out, as GraphML does); each edge
    with its columns, ``effective_weight`` and ``failing``."""
    g = _multidigraph(
        graph,
        _present({"at": graph.at, "src": graph.src}),
        lambda n: _present({"executor": n.executor, "wished": n.wished, "version": n.version}),
        # the id is the edge's key already: left out of its data
        lambda e: {**_derived(e), **_present({**e.mnest.as_dict(), "id": None})},
    )
    buf = io.BytesIO()
    _networkx().write_graphml(g, buf, encoding="utf-8")
    return buf.getvalue().decode("utf-8")


_RENDERERS = {"dot": to_dot, "mermaid": to_mermaid, "graphml": to_graphml, "json": to_json}


def render(graph: MnestGraph, fmt: str) -> str:
    """The graph as text in one of :data:`GRAPH_FORMATS`."""
    try:
        renderer = _RENDERERS[fmt]
    except (KeyError, TypeError):
        raise InvalidInput(
            f"unknown graph format {fmt!r}: use one of {', '.join(GRAPH_FORMATS)}"
        ) from None
    return renderer(graph)
