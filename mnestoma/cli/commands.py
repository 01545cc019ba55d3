"""The ``mnestoma`` group and its commands (contract §6): status, recording, reading,
changing state, ageing, copy; ``db`` and ``demo`` have their own modules.

Each command reads its arguments (:mod:`.options`), calls the store, and prints through
:mod:`.render`; failures become one line and an exit status in :mod:`.errors`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import click

from mnestoma.cli.db import db
from mnestoma.cli.demo import demo
from mnestoma.cli.errors import MnestomaGroup
from mnestoma.cli.options import (
    command_url,
    database_url_option,
    json_option,
    limit_option,
    number_option,
    parse_cutoff,
    parse_endpoint,
    parse_instant,
    parse_tags,
    replicas_of,
    url_option_callback,
)
from mnestoma.cli.progress import batch_progress, partition_progress, progress_bar, spinner
from mnestoma.cli.render import (
    check_output_path,
    echo_json,
    render_ager,
    render_copy,
    render_edges,
    render_events,
    render_forecast,
    render_graph_report,
    render_one,
    render_protos,
    render_prune,
    render_recent_queries,
    render_split,
    render_store,
    render_suggestions,
    render_top_queries,
    render_verdict,
    render_walk,
    write_output,
)
from mnestoma.core.clock import utc_now
from mnestoma.core.display import (
    PICTURE_STATES,
    STATE_STYLES,
    json_for_terminal,
    lines_for_terminal,
)
from mnestoma.core.errors import InvalidInput, InvalidTransition
from mnestoma.core.rules import (
    AGER_BATCH_QUIET_TARGET_S,
    AGER_BATCH_TARGET_S,
    AGER_WRITERS_SEEN_S,
    DECAYING_BELOW,
    GRAPH_LARGE_BYTES,
    PROMOTE_HINT,
    PROTO_PRUNE_BELOW,
    RECURRING_MIN_USES,
    RECURRING_MIN_WEIGHT,
    SPLIT_BATCH_ROWS,
    SPLIT_LOCK_TIMEOUT_S,
    MnestState,
    Recorder,
    check_transition,
)
from mnestoma.core.settings import DEFAULT_SETTINGS, Settings
from mnestoma.core.validation import check_positive_int
from mnestoma.doors.sync import Mnestoma
from mnestoma.engines import resolve_database_url
from mnestoma.engines.locking import DEFAULT_LOCK_TIMEOUT_S, ENV_LOCK_TIMEOUT, store_files
from mnestoma.maintenance.retention import months_dropped_whole
from mnestoma.maintenance.status import collect_status, render_status
from mnestoma.planner.ranking import SUGGEST_ORDER_BY
from mnestoma.planner.vetting import normalise_steps
from mnestoma.store.repository import WALK_LIMIT

__all__ = ["cli", "main"]


# The settings of a command that writes: its events say the command line recorded them.
_WRITES = Settings(recorder=Recorder.CLI.value)


@contextlib.contextmanager
def _store(
    database_url: str | None,
    settings: Settings = DEFAULT_SETTINGS,
    *,
    write: bool = False,
) -> Iterator[Mnestoma]:
    """The store of this command, with ``settings`` (:data:`_WRITES`' recorder, ``cli``, on
    the events of a writing command).

    Only a writing command may create a missing SQLite store; a reading one says there is
    no store there and creates nothing. Once the command is done, the store is named on
    stderr (:func:`~.render.render_store`).
    """
    url = command_url(database_url)
    replicas = None if write else replicas_of(url)
    store = Mnestoma(url, settings=settings, create=write, replicas=replicas)
    try:
        yield store
        render_store(store.engine.url)  # not after a failure: its one line says it all
    finally:
        store.close()


# --- the group ----------------------------------------------------------------------------


@click.group(
    cls=MnestomaGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=(
        "Exit status: 0 success; 2 bad input (an invalid name, version, state or option), "
        "nothing written; 1 any other failure (no such mnest, a refused transition, a "
        "conflict, a database behind head or unreachable), nothing written."
    ),
)
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@database_url_option
@click.version_option(package_name="mnestoma")
def cli(debug: bool, database_url: str | None) -> None:
    """mnestoma: a durable memory of how an agent runtime's executors feed each other.

    The database is --database-url, else MNESTOMA_DATABASE_URL, else MNESTOMA_DB_PATH,
    else $METNOS_WORKSPACE/.mnestoma/mnest.sqlite, else ./.mnestoma/mnest.sqlite.
    """


cli.add_command(db)
cli.add_command(demo)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of the ``mnestoma`` script and of ``python -m mnestoma``."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="mnestoma")
    raise SystemExit(0)  # pragma: no cover - cli.main always exits


# --- status -------------------------------------------------------------------------------


@cli.command()
@json_option
@database_url_option
@click.option(
    "--exact",
    is_flag=True,
    help="Count every event exactly (PostgreSQL: a scan of the events; by default the "
    "counts are the catalogue's estimates, shown as 'about N').",
)
def status(as_json: bool, database_url: str | None, exact: bool) -> None:
    """Where the store is, what it holds, who recorded its passings, whether the ager runs.

    From the rows only; it reads, never migrates or creates anything. With
    MNESTOMA_REPLICA_URLS, the lag of each read replica.
    """
    url = command_url(database_url)
    st = collect_status(url, exact=exact, replicas=replicas_of(url))
    if as_json:
        echo_json(st.as_dict())
    else:
        click.echo(render_status(st))


# --- recording ----------------------------------------------------------------------------


@cli.command()
@click.argument("src", metavar="SRC@VERSION")
@click.argument("dst", metavar="DST[@VERSION]")
@click.option("--proto", is_flag=True, help="DST does not exist yet (a proto-mnest).")
@click.option("--summary", help="With --proto: what the missing executor should do.")
@click.option("--sig", "sig_json", metavar="JSON", help="With --proto: a full desired_sig.")
@click.option("--turn", "turn_id", metavar="ID", help="The turn this passing belongs to.")
@click.option("--tag", "tag_pairs", multiple=True, metavar="K=V", help="A free label (repeat).")
@json_option
@database_url_option
def record(
    src: str,
    dst: str,
    proto: bool,
    summary: str | None,
    sig_json: str | None,
    turn_id: str | None,
    tag_pairs: tuple[str, ...],
    as_json: bool,
    database_url: str | None,
) -> None:
    """Record that SRC@VERSION passed its output to DST@VERSION (or to a missing DST)."""
    src_exec, src_version = parse_endpoint(src, "SRC", version_required=True)
    tags = parse_tags(tag_pairs)
    desired_sig: dict[str, Any] | None = None
    if proto:
        if "@" in dst:
            raise InvalidInput(f"a proto's destination has no version yet: give DST, not {dst!r}")
        dst_exec, dst_version = dst, None
        if sig_json is not None:
            try:
                desired_sig = json.loads(sig_json)
            except (ValueError, RecursionError) as err:  # RecursionError: nested too deep
                raise InvalidInput(f"--sig is not JSON: {err}") from None
            if not isinstance(desired_sig, dict):
                raise InvalidInput("--sig must be a JSON object")
        if summary is not None:
            desired_sig = {**(desired_sig or {}), "summary": summary}
    else:
        if summary is not None or sig_json is not None:
            raise InvalidInput("--summary and --sig describe a missing executor: add --proto")
        dst_exec, dst_version = parse_endpoint(dst, "DST", version_required=True)
    with _store(database_url, _WRITES, write=True) as store:
        m = store.record_passing(
            src_exec,
            src_version or "",
            dst_exec,
            dst_version,
            dst_exists=not proto,
            turn_id=turn_id,
            tags=tags,
            desired_sig=desired_sig,
        )
        render_one(m, as_json)


# --- reading ------------------------------------------------------------------------------


@cli.command()
@click.option("--src", "src_executor", metavar="EXECUTOR", help="Only edges from it.")
@click.option("--dst", "dst_executor", metavar="EXECUTOR", help="Only edges to it.")
@click.option("--state", "states", multiple=True, metavar="STATE", help="Only this state (repeat).")
@limit_option("edges, oldest first; read no more than that")
@json_option
@database_url_option
def edges(
    src_executor: str | None,
    dst_executor: str | None,
    states: tuple[str, ...],
    limit: int | None,
    as_json: bool,
    database_url: str | None,
) -> None:
    """List mnests (every state unless --state), oldest first."""
    with _store(database_url) as store:
        rows = store.edges(
            src_executor=src_executor,
            dst_executor=dst_executor,
            states=list(states) or None,
            limit=limit,
        )
        render_edges(rows, utc_now(), as_json, "(no edge)")


@cli.command()
@click.option("--mnest", "mnest_id", metavar="ID", help="Only the events of this mnest.")
@click.option("--turn", "turn_id", metavar="ID", help="Only the events of this turn.")
@limit_option("events, oldest first; read no more than that")
@json_option
@database_url_option
def events(
    mnest_id: str | None,
    turn_id: str | None,
    limit: int | None,
    as_json: bool,
    database_url: str | None,
) -> None:
    """List events, oldest first (they outlive pruned mnests)."""
    with _store(database_url) as store:
        render_events(store.events(mnest_id=mnest_id, turn_id=turn_id, limit=limit), as_json)


@cli.command()
@click.argument("src")
@click.option("--depth", default=3, show_default=True, type=int, help="Longest path, in edges.")
@click.option("--min-weight", default=0.0, show_default=True, type=float, help="Weakest edge.")
@click.option(
    "--limit",
    "limit",
    type=int,
    default=WALK_LIMIT,
    show_default=True,
    metavar="N",
    help="Print the N best paths; only those are computed.",
)
@json_option
@database_url_option
def walk(
    src: str,
    depth: int,
    min_weight: float,
    limit: int,
    as_json: bool,
    database_url: str | None,
) -> None:
    """The best paths of active edges starting at SRC (any version), best score first."""
    with _store(database_url) as store:
        paths = store.walk(src, max_depth=depth, min_weight=min_weight, limit=limit)
        render_walk(paths, utc_now(), as_json)


@cli.command()
@click.argument("src", metavar="SRC[@VERSION]")
@click.option("-k", "k", default=5, show_default=True, type=int, help="How many suggestions.")
@click.option(
    "--order",
    "order_by",
    type=click.Choice(SUGGEST_ORDER_BY),
    default="weight",
    show_default=True,
    help="weight: effective weight first; decayed_uses: decayed count of passings first.",
)
@json_option
@database_url_option
def suggest(src: str, k: int, order_by: str, as_json: bool, database_url: str | None) -> None:
    """The K active edges out of SRC a planner should try first: highest effective weight
    (SCORE), ties broken by ACTIVATION (more uses, more recent use); with --order
    decayed_uses, the highest decayed count of passings (COUNT) first."""
    executor, version = parse_endpoint(src, "SRC", version_required=False)
    now = utc_now()
    with _store(database_url, Settings(clock=lambda: now)) as store:
        suggestions = store.suggest_next(executor, version, k=k, order_by=order_by)
        render_suggestions(suggestions, now, as_json, order_by=order_by)


@cli.command()
@click.argument("executors", nargs=-1, required=True, metavar="EXECUTOR [EXECUTOR]")
@click.option(
    "--version",
    "version",
    metavar="V",
    help="The last executor's version: only its edges from that version [any version].",
)
@click.option(
    "-k", "k", default=5, show_default=True, type=int, help="How many candidates to print."
)
@json_option
@database_url_option
def predict(
    executors: tuple[str, ...], version: str | None, k: int, as_json: bool, database_url: str | None
) -> None:
    """What follows the last one or two executors of a turn (oldest first), with P(next):
    each executor seen after them, most likely first, with its probability, the decayed
    count of passings to it in the context that answered (SUPPORT) and their number (USES);
    then the probability left to the executors never seen after them, and which context
    answered: the chain of the two (by name), or the last executor alone when the chain was
    seen too rarely."""
    if len(executors) > 2:
        raise InvalidInput(
            f"give the last one or two executors of the turn, oldest first; got {len(executors)}"
        )
    with _store(database_url) as store:
        forecast = store.predict_next(list(executors), src_version=version, k=k)
        render_forecast(forecast, executors, version, as_json)


@cli.command()
@click.argument("steps", nargs=-1, required=True, metavar="STEP STEP [STEP ...]")
@click.option("--at", "at", metavar="TIME", help="Weights at this ISO-8601 instant [now].")
@json_option
@database_url_option
def vet(steps: tuple[str, ...], at: str | None, as_json: bool, database_url: str | None) -> None:
    """What the store knows of a proposed chain of executors, link by link: each STEP is
    EXECUTOR or EXECUTOR@VERSION (any version where none is given); 2 to 64 steps.

    A link is known when an active edge matches; its weight (effective now), uses, ok and
    error counts and success ((ok + 1) / (ok + error + 2)) are those of its best matching
    row in any state. The chain's score is the product of the links' weights, 0 when a
    link is unknown. Evidence, never proof: an unknown link was never seen, not seen wrong.
    """
    chain = normalise_steps(
        [parse_endpoint(s, f"STEP {i + 1}", version_required=False) for i, s in enumerate(steps)]
    )  # checked before the store is opened: bad input reads nothing
    now = utc_now() if at is None else parse_instant(at, "--at")
    with _store(database_url, Settings(clock=lambda: now)) as store:
        render_verdict(store.vet(chain), as_json)


def _graph_help() -> str:
    """The graph command's help; how each state is drawn comes from the table of looks."""
    looks = ", ".join(style.summary for style in STATE_STYLES.values() if style.summary)
    return (
        "Print the graph (or what SRC reaches) as DOT, Mermaid, GraphML or JSON: weight as "
        f"pen width and label, {looks}; ok and error counts on the label once recorded, an "
        'edge with more errors than successes drawn red (marked "failing" in GraphML and JSON).'
    )


@cli.command("graph", help=_graph_help())
@click.argument("src", required=False, metavar="[SRC[@VERSION]]")
@click.option(
    "--depth",
    type=int,
    default=None,
    metavar="N",
    help="With SRC: the edges out of what SRC reaches in fewer than N active edges [3].",
)
@click.option(
    "--states",
    "states",
    multiple=True,
    metavar="STATE[,STATE]",
    help=f"Only these states (repeat or comma-separate) [{','.join(PICTURE_STATES)}].",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["dot", "mermaid", "graphml", "json"]),
    default=None,
    help="Output format [dot; json with --json].",
)
@click.option(
    "--output",
    "-o",
    "output",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help=(
        "Write to FILE instead of standard output, replaced whole once the graph is drawn; "
        "its directory must exist and be writable, and it must not be a file of the store "
        "(else exit 2, nothing read or written)."
    ),
)
@click.option("--at", "at", metavar="TIME", help="Weights at this ISO-8601 instant [now].")
@json_option
@database_url_option
def graph_cmd(
    src: str | None,
    depth: int | None,
    states: tuple[str, ...],
    fmt: str | None,
    output: str | None,
    at: str | None,
    as_json: bool,
    database_url: str | None,
) -> None:
    """``mnestoma graph``; its help, built above, says how each state is drawn."""
    from mnestoma.planner.graph import DEFAULT_DEPTH, render

    if as_json and fmt not in (None, "json"):
        raise InvalidInput(f"--json and --format {fmt} disagree: give one of them")
    if depth is not None and src is None:
        raise InvalidInput("--depth needs SRC")
    chosen = [s.strip() for item in states for s in item.split(",") if s.strip()]
    now = utc_now() if at is None else parse_instant(at, "--at")
    executor, version = (None, None)
    if src is not None:
        executor, version = parse_endpoint(src, "SRC", version_required=False)
    files = store_files(resolve_database_url(command_url(database_url)))
    target = None if output is None else check_output_path(output, files)
    with _store(database_url, Settings(clock=lambda: now)) as store:
        picture = store.graph(
            executor,
            src_version=version,
            depth=DEFAULT_DEPTH if depth is None else depth,
            states=chosen or list(PICTURE_STATES),
        )
    chosen_format = "json" if as_json else fmt or "dot"
    text = render(picture, chosen_format)
    if target is None:  # on a terminal maybe: no stored name's control character raw
        shown = json_for_terminal(text) if chosen_format == "json" else lines_for_terminal(text)
        click.echo(shown, nl=False)
        size = len(shown.encode("utf-8"))
    else:
        size = write_output(target, text)
    nodes, edges = len(picture.nodes), len(picture.edges)
    render_graph_report(nodes, edges, size, chosen_format, target, GRAPH_LARGE_BYTES)


@cli.command()
@click.option(
    "--min-uses",
    default=RECURRING_MIN_USES,
    show_default=True,
    type=int,
    metavar="N",
    help="Only protos wished for at least N times.",
)
@click.option(
    "--min-weight",
    default=RECURRING_MIN_WEIGHT,
    show_default=True,
    type=float,
    metavar="W",
    help="Only protos whose effective weight now is at least W (0 to 1).",
)
@limit_option("protos, most used first")
@json_option
@database_url_option
def protos(
    min_uses: int, min_weight: float, limit: int | None, as_json: bool, database_url: str | None
) -> None:
    """Recurring proto-mnests: missing executors wished for again and again."""
    n = None if limit is None else check_positive_int(limit, "limit")
    with _store(database_url) as store:
        rows = store.recurring_protos(min_uses=min_uses, min_weight=min_weight)
        render_protos(rows[:n], utc_now(), as_json)


@cli.command()
@click.option("--top", "top", type=int, default=None, help="The N most frequent forms (default).")
@click.option("--recent", "recent", type=int, default=None, help="The N latest entries.")
@json_option
@database_url_option
def queries(top: int | None, recent: int | None, as_json: bool, database_url: str | None) -> None:
    """The canonical query log: most frequent forms, or the latest entries."""
    if top is not None and recent is not None:
        raise InvalidInput("give --top or --recent, not both")
    with _store(database_url) as store:
        if recent is not None:
            render_recent_queries(store.recent_queries(limit=recent), as_json)
        else:
            render_top_queries(store.top_queries(limit=10 if top is None else top), as_json)


# --- changing state -----------------------------------------------------------------------


@cli.command()
@click.argument("mnest_id", metavar="ID")
@click.argument("version")
@json_option
@database_url_option
def promote(mnest_id: str, version: str, as_json: bool, database_url: str | None) -> None:
    """The executor a proto wished for now exists at VERSION: make the edge active."""
    with _store(database_url, _WRITES, write=True) as store:
        m = store.promote_proto_to_active(mnest_id, version)
        render_one(m, as_json)


def _transition_targets() -> list[MnestState]:
    """The states some row may be moved to by ``transition``, as the rules allow."""
    return [
        target
        for target in MnestState
        if any(
            check_transition(s, target, has_version=True) is None for s in MnestState if s != target
        )
    ]


@cli.command(
    help=(
        f"Move a mnest to STATE ({', '.join(_transition_targets())}).\n\n"
        f"A {MnestState.PROTO.value} becomes {MnestState.ACTIVE.value} only through "
        '"mnestoma promote ID VERSION".'
    )
)
@click.argument("mnest_id", metavar="ID")
@click.argument("state")
@click.option("--reason", help="Why (kept in the event).")
@json_option
@database_url_option
def transition(
    mnest_id: str, state: str, reason: str | None, as_json: bool, database_url: str | None
) -> None:
    """``mnestoma transition``; its help, built above, names the states the rules allow."""
    with _store(database_url, _WRITES, write=True) as store:
        try:
            m = store.transition_state(mnest_id, state, reason=reason)
        except InvalidTransition as err:
            raise InvalidTransition(_command_wording(str(err), mnest_id)) from None
        render_one(m, as_json)


def _command_wording(message: str, mnest_id: str) -> str:
    """An API error message as a command-line user reads it: commands, not method names."""
    return message.replace(
        PROMOTE_HINT,
        f"once the executor exists, use 'mnestoma promote {mnest_id} VERSION'",
    )


# The help of ``mnestoma age``, its thresholds and lock timeout taken where they are set.
_AGE_HELP = f"""Run the ager now: decay, demote below {DECAYING_BELOW:.2f}, merge, prune protos
below {PROTO_PRUNE_BELOW:.2f}.

Online: the run commits in batches, each its own short transaction, so a service's
writers wait for one batch at most, never for the run. On a terminal it shows its
progress by batch on stderr. A second run started meanwhile waits for the first. A run
stopped midway (killed, its connection dropped) is completed by the next run; `mnestoma
status` says when one was interrupted.

A dry run is the ager itself in one transaction, rolled back, so that its report is
exactly what a run would do at that instant: it takes the same locks as a one-batch run
for its whole length. Behind a writer it waits: on SQLite for the write lock, up to
{ENV_LOCK_TIMEOUT} seconds ({DEFAULT_LOCK_TIMEOUT_S:g} by default), then exits 1; on PostgreSQL for
the table lock, as long as the writer's transaction lasts (PGOPTIONS='-c lock_timeout=5s' bounds
it, then exits 1). Writers wait for it while it runs.
"""


@cli.command(help=_AGE_HELP)
@click.option(
    "--dry-run",
    is_flag=True,
    help=(
        "Report what would change, change nothing: the same run in one transaction, rolled "
        "back, so it waits for writers and they wait for it (see below)."
    ),
)
@number_option(
    "--batch-rows",
    int,
    1,
    "N",
    "About how many rows one batch covers (default: sized as the run goes, so that each "
    f"batch takes about {AGER_BATCH_TARGET_S * 1000:g} ms while writers are about, "
    f"{AGER_BATCH_QUIET_TARGET_S * 1000:g} ms once none has been seen for "
    f"{AGER_WRITERS_SEEN_S:g} s).",
)
@json_option
@database_url_option
def age(dry_run: bool, batch_rows: int | None, as_json: bool, database_url: str | None) -> None:
    """``mnestoma age``; its help is ``_AGE_HELP``, its thresholds those of the rules."""
    with _store(database_url) as store:
        now = utc_now()
        if dry_run:
            with spinner("ageing (dry run): decay, demote, merge, prune in one transaction"):
                report = store.apply_ager(dry_run=True, batch_rows=batch_rows)
        else:
            with batch_progress("ageing") as progress:
                report = store.apply_ager(batch_rows=batch_rows, progress=progress)
        render_ager(report, now, dry_run, as_json)


# --- retention ----------------------------------------------------------------------------


@cli.command("prune-events")
@click.option(
    "--before",
    "before",
    metavar="DATE",
    help="Delete the events before this ISO-8601 date or time (UTC when it names no zone).",
)
@click.option(
    "--older-than",
    "older_than",
    type=float,
    metavar="DAYS",
    help="Delete the events older than DAYS days (a positive number) from now.",
)
@click.option("--dry-run", is_flag=True, help="Count the events it would delete, delete none.")
@json_option
@database_url_option
def prune_events(
    before: str | None,
    older_than: float | None,
    dry_run: bool,
    as_json: bool,
    database_url: str | None,
) -> None:
    """Delete old events, online: give exactly one of --before and --older-than.

    Each mnest still in the store keeps its created event; the events of pruned or
    merged-away rows go too. The events go in batches of ids, each its own short
    transaction (on SQLite with a pause between batches), so writers wait for one batch at
    most. A turn is counted once per edge through its events: replayed after its events
    are gone, it counts again on each edge whose event of that turn was deleted. On
    PostgreSQL the months wholly before the cutoff are dropped unread, their events counted
    from the catalogue: the count is then "about N".
    """
    cutoff = parse_cutoff(before, older_than, utc_now())
    estimated = False
    with _store(database_url) as store:
        if dry_run:
            with spinner("counting the events to delete (dry run), in one read"):
                n = store.prune_events(cutoff, dry_run=True)
        else:
            with store.engine.connect() as conn:  # a read of the catalogue
                estimated = months_dropped_whole(conn, cutoff) > 0
            with (
                spinner("finding the events to delete") as found,
                batch_progress("pruning events", "events deleted") as batch_done,
            ):

                def progress(done: int, total: int, deleted: int) -> None:
                    found()  # the batches are known: their line takes the spinner's place
                    batch_done(done, total, deleted)

                n = store.prune_events(cutoff, progress=progress)
        render_prune(n, cutoff, dry_run, as_json, estimated=estimated)


# The help of ``mnestoma split-history``, its numbers taken where they are set.
_SPLIT_HELP = f"""PostgreSQL: put every event in its month. Each partition of events in
the old layout that holds rows (a plain table revision 0015 kept: a month written to before
it, or every event before a month, as revision 0011 made it) is rebuilt into months of the
new layout, one at a time, oldest first, while services write. A store made at 0015 or
later has none. Then the rows the default partition caught (months no partition covered:
a clock far off, the months not made while it is over 4 MiB) go into their months, and a
new empty default partition takes its place.

Its rows are copied into a staging table in batches of ids, each its own short
transaction during which writes into that partition wait; writes made meanwhile are
mirrored by triggers. Then one short transaction (each lock waited for
{SPLIT_LOCK_TIMEOUT_S * 1000:g} ms at most, tried again) puts the months in the partition's
place, and the old table is dropped. It needs the disk of the partition being rebuilt twice
over, until that drop. On a terminal it shows its progress by batch on stderr. A run
stopped midway (killed, its connection dropped) is completed by the next; `mnestoma
status` says how much history waits. On SQLite there is nothing to split.
"""


@cli.command("split-history", help=_SPLIT_HELP)
@number_option(
    "--batch",
    int,
    1,
    "N",
    f"How many event ids one batch copies (default {SPLIT_BATCH_ROWS}).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="List the partitions that wait, with their rows as the catalogue estimates them; "
    "change nothing.",
)
@json_option
@database_url_option
def split_history(
    batch: int | None, dry_run: bool, as_json: bool, database_url: str | None
) -> None:
    """``mnestoma split-history``; its help is ``_SPLIT_HELP``."""
    with _store(database_url) as store:
        if dry_run:
            report = store.split_history(dry_run=True)
        else:
            with partition_progress("splitting", "rows copied") as progress:
                report = store.split_history(batch_rows=batch, progress=progress)
        render_split(report, as_json)


# --- copy ---------------------------------------------------------------------------------


@cli.command("copy")
@click.option("--from", "source", metavar="URL", callback=url_option_callback, help="Source store.")
@click.option(
    "--to", "target", metavar="URL", required=True, callback=url_option_callback,
    help="Target store (migrated to head; must be empty unless --append).",
)  # fmt: skip
@click.option(
    "--append",
    is_flag=True,
    help="Add to a target that already holds rows, merging the edges both stores hold.",
)
@json_option
@database_url_option
def copy_cmd(
    source: str | None, target: str, append: bool, as_json: bool, database_url: str | None
) -> None:
    """Copy a whole store (mnests, events, query log, ager runs; ids kept) to another
    database, in one transaction, verified by row counts and checksums before it commits.

    The source is --from, else --database-url, else the resolved default store. A failed
    copy leaves the target as it was (a SQLite file it created is removed).

    With --append, event and log ids are shifted past the target's, and an edge both
    stores hold (same src, src version, dst, dst version and state) is merged into the
    target's row with the ager's rule:

    \b
    - uses summed; a turn counted on the edge in both stores (same turn
      id) counts once: the source's event of that turn stays, unchanged,
      on the source row's id;
    - first use the earlier, last use the later;
    - weight: the larger of the two effective weights now, decaying from
      now;
    - decay speed, tags and desired_sig: the target's (tags and
      desired_sig: the source's where the target has none);
    - every event of both kept, the source row's moved to the target
      row, and a merged event on each of the two ids naming the other:
      the target row's keeps its state, the source row's has no state
      before (it was absorbed), as the ager writes a merge.

    A mnest id known to both stores, as a row or in the events of a row merged into
    another (one was copied from the other, or appended before), is refused: nothing is
    copied.
    """
    from mnestoma.maintenance.copying import copy_store

    report = copy_store(
        source or command_url(database_url),
        target,
        append=append,
        progress=progress_bar,
        recorder=Recorder.CLI.value,
    )
    render_copy(report, as_json)
