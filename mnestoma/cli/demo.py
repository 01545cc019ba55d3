"""``mnestoma demo``: a traced runtime answers a week of made-up turns on a clock moved by
hand; 30 days pass; the ager runs; the commands show what is left."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

import click

from mnestoma.cli.options import command_url, database_url_option
from mnestoma.cli.render import (
    endpoint,
    render_ager,
    render_edges,
    render_protos,
    render_suggestions,
    render_walk,
)
from mnestoma.core.clock import MovableClock
from mnestoma.core.errors import InvalidInput
from mnestoma.core.timefmt import short_utc
from mnestoma.core.validation import Passing
from mnestoma.doors.sync import Mnestoma
from mnestoma.engines import redact_url, resolve_database_url
from mnestoma.maintenance.migration import current_revision, sqlite_store_missing, upgrade
from mnestoma.maintenance.status import collect_status, render_status

__all__ = ["DEMO_START", "demo", "run_demo"]

DEMO_START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def _turn_line(passings: Sequence[Passing]) -> str:
    """A turn's passings as chains: ``a@1 -> b@2 -> c@3; b@2 -> wished (wished)``."""
    chains: list[list[str]] = []
    for p in passings:
        src = endpoint(p.src_executor, p.src_version)
        dst = endpoint(p.dst_executor, p.dst_version) + ("" if p.dst_exists else " (wished)")
        if chains and chains[-1][-1] == src:
            chains[-1].append(dst)
        else:
            chains.append([src, dst])
    return "; ".join(" -> ".join(chain) for chain in chains)


def _section(title: str) -> None:
    click.echo("")
    click.echo(f"== {title}")


def run_demo(url: str | None) -> None:
    """A traced runtime answers a week of turns; 30 days pass; age, and show what is left."""
    from mnestoma.cli.demo_agent import (  # the demo's executors: only for the demo
        DEMO_TURNS,
        run_demo_turn,
    )

    clock = MovableClock(DEMO_START)
    with contextlib.ExitStack() as stack:
        if url is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="mnestoma-demo-"))
            url = f"sqlite:///{folder}/demo.sqlite"
            where = "a temporary SQLite file (deleted when the demo ends)"
        else:
            where = redact_url(resolve_database_url(url))
            _prepare_demo_database(url)
        store = Mnestoma(url, clock=clock)
        stack.callback(store.close)
        if store.edges() or store.events() or store.recent_queries(limit=1):
            raise InvalidInput(
                f"the demo writes made-up rows: give it an empty database, not {where}"
            )
        click.echo(f"mnestoma demo in {where}")
        lines = []
        for i, spec in enumerate(DEMO_TURNS):
            if i:
                clock.advance(hours=3)
            if spec.raw_query is not None:
                store.log_canonical_query(spec.raw_query, spec.query, turn_id=spec.turn_id)
            traced = run_demo_turn(store, spec)
            lines.append(f"  {spec.turn_id}  {_turn_line(traced.passings)}")
        click.echo(
            f"{len(DEMO_TURNS)} turns of a made-up runtime, {short_utc(DEMO_START)} to "
            f"{short_utc(clock.now)}: its executors\n"
            "are decorated with @executor and each turn runs in `with turn(store, turn_id)`\n"
            "(mnestoma.tracing); nothing calls record_passing. What the tracer recorded, from\n"
            "the values each executor received from another:"
        )
        click.echo("\n".join(lines))
        _section("edges right after the turns")
        render_edges(store.edges(), clock.now, False, "(no edge)")
        clock.advance(days=30)
        _section(f"30 days later ({short_utc(clock.now)}): mnestoma age")
        render_ager(store.apply_ager(), clock.now, False, False)
        _section("mnestoma edges")
        render_edges(store.edges(), clock.now, False, "(no edge)")
        _section("mnestoma walk web.search")
        render_walk(store.walk("web.search"), clock.now, False)
        _section("mnestoma suggest http.fetch@1.4")
        render_suggestions(store.suggest_next("http.fetch", "1.4"), clock.now, False)
        _section("mnestoma protos")
        render_protos(store.recurring_protos(), clock.now, False)
        _section("mnestoma status")
        st = collect_status(store.engine, clock=clock)
        click.echo(render_status(replace(st, database=where)))


def _prepare_demo_database(url: str) -> None:
    """An empty database given to the demo gets the schema (it asked for rows there)."""
    resolved = resolve_database_url(url)
    if not sqlite_store_missing(resolved) and current_revision(resolved) is None:
        upgrade(resolved)


@click.command()
@database_url_option
def demo(database_url: str | None) -> None:
    """Show mnestoma at work on made-up turns (a throwaway SQLite file unless --database-url)."""
    run_demo(command_url(database_url))
