"""The ``mnestoma`` command line (contract §6): schema, status, recording, reading, ageing, copy.

Errors never show a traceback (unless ``--debug``) and never a password: bad input is one
line on stderr and exit status 2, with nothing written; any other failure exits 1.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

import click
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from ..config import (
    ENV_DATABASE_URL,
    is_secret_key,
    redact_text,
    redact_url,
    resolve_database_url,
)
from ..errors import InvalidInput, InvalidTransition, MnestomaError
from ..facade import Mnestoma
from ..migration import (
    alembic_config,
    current_revision,
    downgrade,
    head_revision,
    offline_sql,
    upgrade,
)
from ..models import CanonicalQuery, Event, Mnest
from ..repository import WALK_LIMIT, QueryFrequency
from ..rules import (
    PROMOTE_HINT,
    RECURRING_MIN_USES,
    RECURRING_MIN_WEIGHT,
    AgerReport,
    Recorder,
    activation,
)
from ..status import collect_status, iso_utc, missing_sqlite_file, render_status
from ..validation import Clock, Passing, check_positive_int, utc_now

__all__ = ["cli", "main"]

PROGRESS_THRESHOLD = 10_000
SPINNER_DELAY_S = 0.5  # a quick run shows nothing; a long one (a big store) a spinner
SPINNER_INTERVAL_S = 0.1
_SECRETS: set[str] = set()


# --- errors and secrets -------------------------------------------------------------------


def _remember_secret(url: str | None) -> None:
    """Note the secrets of a URL the user gave (its password, the values of its secret query
    keys such as ``?password=``), so that no message can repeat them."""
    if not url:
        return
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return
    found = [parsed.password] if parsed.password else []
    for key, value in parsed.query.items():
        if is_secret_key(key):
            found.extend([value] if isinstance(value, str) else value)
    _SECRETS.update(str(s) for s in found if len(str(s)) >= 4)


def scrub(message: str) -> str:
    """The message with every URL password and every known secret hidden."""
    _remember_secret(os.environ.get(ENV_DATABASE_URL))
    message = redact_text(message)
    for secret in _SECRETS:
        message = message.replace(secret, "***")
    return message


def _url_option_callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Remember the URL's secrets; an empty URL (an unset shell variable) is bad input."""
    _remember_secret(value)
    if isinstance(value, str) and not value.strip():
        raise click.BadParameter(
            "the URL is empty (an unset variable?): give a URL, or leave the option out"
        )
    return value


class _DriverEcho(logging.Filter):
    """Drops psycopg's "error ignored terminating <psycopg.Pipeline ...>" warning: the
    error that ended the pipeline is the one the command reports, on its one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("error ignored terminating")


_DRIVER_ECHO = _DriverEcho()


def _quiet_driver_echoes() -> None:
    """Keep a failure on one stderr line: no second line from the driver's logger."""
    logger = logging.getLogger("psycopg")
    if _DRIVER_ECHO not in logger.filters:
        logger.addFilter(_DRIVER_ECHO)


class CliFailure(click.ClickException):
    """A failure shown as one line, exit status 1 (not found, refused, conflict, ...)."""

    exit_code = 1


class CliBadInput(CliFailure):
    """Bad input (``InvalidInput``) shown as one line, exit status 2."""

    exit_code = 2


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    if not isinstance(err, MnestomaError):
        text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    first = text.splitlines()[0] if text else type(err).__name__
    return scrub(first)


def _error_line(message: str) -> None:
    click.echo(f"Error: {scrub(message)}", err=True)


class MnestomaGroup(click.Group):
    """A group that turns every failure into one redacted line and an exit status."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, BrokenPipeError):
            raise
        except Exception as err:
            if ctx.find_root().params.get("debug"):
                raise
            failure = CliBadInput if isinstance(err, InvalidInput) else CliFailure
            raise failure(_one_line(err)) from err

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        _quiet_driver_echoes()
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as err:
            err.show()
            sys.exit(err.exit_code)
        except click.UsageError as err:
            hint = f" (see '{err.ctx.command_path} --help')" if err.ctx is not None else ""
            _error_line(err.format_message() + hint)
            sys.exit(err.exit_code)
        except click.ClickException as err:
            _error_line(err.format_message())
            sys.exit(err.exit_code)
        except click.Abort:
            _error_line("aborted")
            sys.exit(1)
        except BrokenPipeError:
            # The reader went away (``mnestoma edges | head``): stop quietly. Python's own
            # advice: point stdout at devnull so that the flush at exit cannot fail again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


# --- shared options -----------------------------------------------------------------------


def database_url_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--database-url URL``: overrides MNESTOMA_DATABASE_URL and the default SQLite file."""
    return click.option(
        "--database-url",
        "database_url",
        metavar="URL",
        default=None,
        callback=_url_option_callback,
        expose_value=True,
        help="SQLAlchemy URL of the store (overrides MNESTOMA_DATABASE_URL, MNESTOMA_DB_PATH).",
    )(f)


def limit_option(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--limit N``: print at most N rows (the first ones in the listing's order)."""
    return click.option(
        "--limit",
        "limit",
        type=int,
        default=None,
        metavar="N",
        help=f"Print at most N {what} (default: all).",
    )


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--json``: machine-readable output instead of a table."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(f)


def _url(database_url: str | None) -> str | None:
    """The URL given on this subcommand, else the group's ``--database-url``, else None."""
    if database_url is not None:
        return database_url
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    return root.params.get("database_url") if root is not None else None


@contextlib.contextmanager
def _store(
    database_url: str | None,
    clock: Clock | None = None,
    *,
    recorder: str = Recorder.CALL.value,
    write: bool = False,
) -> Iterator[Mnestoma]:
    """The store of this command; ``recorder`` is written on its events (``cli`` for writes).

    Only a writing command may create a missing SQLite store; a reading one says there is
    no store there and creates nothing.
    """
    store = Mnestoma(_url(database_url), clock=clock, recorder=recorder, create=write)
    try:
        yield store
    finally:
        store.close()


def _now() -> datetime:
    return utc_now()


# --- rendering ----------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso_utc(value)
    return value


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def _fmt_time(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _fmt_weight(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: set[str]) -> str:
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, v in enumerate(row):
            widths[i] = max(widths[i], len(v))

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(widths[i]) if headers[i] in right else v.ljust(widths[i])
            for i, v in enumerate(values)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in cells)])


def _endpoint(executor: str, version: str | None) -> str:
    return executor if version is None else f"{executor}@{version}"


def mnest_record(m: Mnest, at: datetime, effective: float | None = None) -> dict[str, Any]:
    """Every column of a mnest, JSON-ready, plus its effective weight at ``at``."""
    out = {k: _jsonable(v) for k, v in m.as_dict().items()}
    out["effective_weight"] = effective if effective is not None else m.effective_weight(at)
    return out


def _summary(m: Mnest) -> str | None:
    if isinstance(m.desired_sig, dict):
        summary = m.desired_sig.get("summary")
        return str(summary) if summary is not None else None
    return None


def render_edges(edges: Sequence[Mnest], at: datetime, as_json: bool, empty: str) -> None:
    """Print mnests as a table (effective weight at ``at``) or as a JSON array."""
    if as_json:
        _echo_json([mnest_record(m, at) for m in edges])
        return
    if not edges:
        click.echo(empty)
        return
    rows = [
        (
            m.id,
            _endpoint(m.src_executor, m.src_version),
            _endpoint(m.dst_executor, m.dst_version),
            m.state,
            _fmt_weight(m.effective_weight(at)),
            m.uses,
            _fmt_time(m.ts_last),
        )
        for m in edges
    ]
    headers = ("ID", "SOURCE", "DESTINATION", "STATE", "WEIGHT", "USES", "LAST")
    click.echo(_table(headers, rows, {"WEIGHT", "USES"}))


def render_walk(paths: Sequence[Sequence[Mnest]], at: datetime, as_json: bool) -> None:
    """Print the paths of a walk, best score first."""
    records = []
    for rank, path in enumerate(paths, 1):
        score = 1.0
        for m in path:
            score *= m.effective_weight(at)
        text = " -> ".join(
            [_endpoint(path[0].src_executor, path[0].src_version)]
            + [_endpoint(m.dst_executor, m.dst_version) for m in path]
        )
        records.append(
            {
                "rank": rank,
                "score": score,
                "depth": len(path),
                "path": text,
                "mnest_ids": [m.id for m in path],
                "edges": [mnest_record(m, at) for m in path],
            }
        )
    if as_json:
        _echo_json(records)
    elif not records:
        click.echo("(no path)")
    else:
        rows = [(r["rank"], _fmt_weight(r["score"]), r["depth"], r["path"]) for r in records]
        click.echo(_table(("RANK", "SCORE", "DEPTH", "PATH"), rows, {"RANK", "SCORE", "DEPTH"}))


def render_suggestions(
    suggestions: Sequence[tuple[Mnest, float]], at: datetime, as_json: bool
) -> None:
    """Print what a planner would be told to try next, best first: the score (effective
    weight) and the activation that breaks its ties."""
    records: list[dict[str, Any]] = [
        {
            "rank": i,
            **mnest_record(m, at, effective=w),
            "score": w,
            "activation": activation(m.uses, m.ts_first, m.ts_last, at),
        }
        for i, (m, w) in enumerate(suggestions, 1)
    ]
    if as_json:
        _echo_json(records)
        return
    if not suggestions:
        click.echo("(no suggestion)")
        return
    rows = [
        (
            r["rank"],
            _endpoint(m.dst_executor, m.dst_version),
            _fmt_weight(r["score"]),
            f"{r['activation']:.3f}",
            m.uses,
            _fmt_time(m.ts_last),
            m.id,
        )
        for r, (m, _) in zip(records, suggestions, strict=True)
    ]
    headers = ("RANK", "NEXT", "SCORE", "ACTIVATION", "USES", "LAST", "ID")
    click.echo(_table(headers, rows, {"RANK", "SCORE", "ACTIVATION", "USES"}))


def render_protos(protos: Sequence[Mnest], at: datetime, as_json: bool) -> None:
    """Print proto-mnests: executors wished for that do not exist yet."""
    if as_json:
        _echo_json([mnest_record(m, at) for m in protos])
        return
    if not protos:
        click.echo("(no recurring proto)")
        return
    rows = [
        (
            m.id,
            _endpoint(m.src_executor, m.src_version),
            m.dst_executor,
            m.uses,
            _fmt_weight(m.effective_weight(at)),
            _summary(m),
        )
        for m in protos
    ]
    headers = ("ID", "SOURCE", "WISHED FOR", "USES", "WEIGHT", "SUMMARY")
    click.echo(_table(headers, rows, {"USES", "WEIGHT"}))


def render_events(events: Sequence[Event], as_json: bool) -> None:
    """Print events, oldest first."""
    if as_json:
        _echo_json([{k: _jsonable(v) for k, v in e.as_dict().items()} for e in events])
        return
    if not events:
        click.echo("(no event)")
        return
    rows = [
        (
            e.id,
            _fmt_time(e.ts),
            e.kind,
            e.mnest_id,
            e.turn_id,
            f"{_fmt_weight(e.weight_before)} -> {_fmt_weight(e.weight_after)}",
            f"{e.state_before or '-'} -> {e.state_after or '-'}",
        )
        for e in events
    ]
    headers = ("ID", "TS", "KIND", "MNEST", "TURN", "WEIGHT", "STATE")
    click.echo(_table(headers, rows, {"ID"}))


def render_ager(report: AgerReport, at: datetime, dry_run: bool, as_json: bool) -> None:
    """Print what one run of the ager did, or would do."""
    data = {**asdict(report), "dry_run": dry_run, "at": iso_utc(at)}
    if as_json:
        _echo_json(data)
        return
    head = "ager (dry run: nothing changed)" if dry_run else "ager"
    click.echo(f"{head} at {_fmt_time(at)}")
    for key in ("decayed", "to_decaying", "merged", "protos_pruned", "archive_candidates"):
        click.echo(f"  {key:<19}{data[key]}")


# --- argument parsing ---------------------------------------------------------------------


def parse_endpoint(value: str, what: str, *, version_required: bool) -> tuple[str, str | None]:
    """``EXECUTOR@VERSION`` → (executor, version); the last ``@`` separates them."""
    executor, sep, version = value.rpartition("@")
    if not sep:
        if version_required:
            raise InvalidInput(f"{what} must be EXECUTOR@VERSION, got {value!r}")
        return value, None
    if not executor or not version:
        raise InvalidInput(f"{what} must be EXECUTOR@VERSION, got {value!r}")
    return executor, version


def parse_tags(pairs: Sequence[str]) -> dict[str, str] | None:
    """``K=V`` pairs → a dict (None when there are none)."""
    tags: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(f"--tag must be KEY=VALUE, got {pair!r}")
        tags[key.strip()] = value
    return tags or None


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


# --- db -----------------------------------------------------------------------------------


@cli.group(cls=MnestomaGroup)
def db() -> None:
    """Schema migrations (Alembic): upgrade, downgrade, current, history, sql."""


@db.command("upgrade")
@click.argument("revision", default="head")
@database_url_option
def db_upgrade(revision: str, database_url: str | None) -> None:
    """Migrate the database up to REVISION (default: head)."""
    url = resolve_database_url(_url(database_url))
    before = current_revision(url)
    upgrade(url, revision)
    after = current_revision(url)
    where = redact_url(url)
    if before == after:
        click.echo(f"{where}: already at revision {after}{_head_mark(after)}")
    else:
        click.echo(f"{where}: upgraded from {before or 'empty'} to {after}{_head_mark(after)}")


@db.command("downgrade")
@click.argument("revision")
@database_url_option
def db_downgrade(revision: str, database_url: str | None) -> None:
    """Migrate the database down to REVISION ("base" removes the schema)."""
    url = resolve_database_url(_url(database_url))
    if missing_sqlite_file(url) is not None:
        raise InvalidInput(f"no database at {missing_sqlite_file(url)}")
    before = current_revision(url)
    downgrade(url, revision)
    after = current_revision(url)
    click.echo(f"{redact_url(url)}: downgraded from {before} to {after or 'base (no schema)'}")


def _head_mark(revision: str | None) -> str:
    return " (head)" if revision is not None and revision == head_revision() else ""


@db.command("current")
@database_url_option
def db_current(database_url: str | None) -> None:
    """Print the database's revision, followed by (head) when it is at head.

    A database without the mnestoma schema (or a missing SQLite file, never created here)
    prints "none (...)" on stdout and exits 0, so scripts always read one line.
    """
    url = resolve_database_url(_url(database_url))
    missing = missing_sqlite_file(url)
    if missing is not None:
        click.echo(f"none (no database file at {missing}; head is {head_revision()})")
        return
    rev = current_revision(url)
    if rev is None:
        click.echo(f"none (no mnestoma schema here; head is {head_revision()})")
        return
    click.echo(f"{rev}{_head_mark(rev)}")


@db.command("history")
@click.option("--indicate-current", is_flag=True, help="Mark the database's revision (reads it).")
@database_url_option
def db_history(indicate_current: bool, database_url: str | None) -> None:
    """List the migration scripts, newest first."""
    current = None
    if indicate_current:
        url = resolve_database_url(_url(database_url))
        current = None if missing_sqlite_file(url) is not None else current_revision(url)
    script = ScriptDirectory.from_config(alembic_config())
    for rev in script.walk_revisions():
        marks = []
        if rev.is_head:
            marks.append("head")
        if current is not None and rev.revision == current:
            marks.append("current")
        mark = f" ({', '.join(marks)})" if marks else ""
        down = rev.down_revision or "<base>"
        doc = (rev.doc or "").strip().splitlines()[0] if rev.doc else ""
        click.echo(f"{down} -> {rev.revision}{mark}, {doc}")


@db.command("sql")
@click.option(
    "--dialect",
    type=click.Choice(["sqlite", "postgresql"]),
    default=None,
    help="Dialect of the script (default: that of the resolved database URL).",
)
@click.argument("revision_range", metavar="[RANGE]", default="head")
@database_url_option
def db_sql(dialect: str | None, revision_range: str, database_url: str | None) -> None:
    """Print the SQL a DBA reviews before migrating; nothing is run, nothing connected.

    RANGE is a target ("head", the default: the whole script from an empty database) or
    START:END. START:END with END below START ("0002:0001", "head:base", "head:-1") prints
    the downgrade script.
    """
    if dialect is None:
        dialect = resolve_database_url(_url(database_url)).get_backend_name()
    script = offline_sql(f"{dialect}://", revision_range)
    click.echo(script, nl=False)


# --- status -------------------------------------------------------------------------------


@cli.command()
@json_option
@database_url_option
def status(as_json: bool, database_url: str | None) -> None:
    """Where the store is, what it holds, who recorded its passings, whether the ager runs.

    From the rows only; it reads, never migrates or creates anything.
    """
    st = collect_status(_url(database_url))
    if as_json:
        _echo_json(st.as_dict())
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
    with _store(database_url, recorder=Recorder.CLI.value, write=True) as store:
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
        _render_one(m, as_json)


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
        render_edges(rows, _now(), as_json, "(no edge)")


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
        render_walk(paths, _now(), as_json)


@cli.command()
@click.argument("src", metavar="SRC[@VERSION]")
@click.option("-k", "k", default=5, show_default=True, type=int, help="How many suggestions.")
@json_option
@database_url_option
def suggest(src: str, k: int, as_json: bool, database_url: str | None) -> None:
    """The K active edges out of SRC a planner should try first: highest effective weight
    (SCORE), ties broken by ACTIVATION (more uses, more recent use)."""
    executor, version = parse_endpoint(src, "SRC", version_required=False)
    now = _now()
    with _store(database_url, clock=lambda: now) as store:
        render_suggestions(store.suggest_next(executor, version, k=k), now, as_json)


def _parse_instant(value: str, what: str) -> datetime:
    """An ISO-8601 instant with a zone, in UTC."""
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInput(f"{what} must be an ISO-8601 time, got {value!r}") from None
    if when.tzinfo is None:
        raise InvalidInput(f"{what} needs a time zone, e.g. 2026-04-02T03:00:00Z")
    return when.astimezone(UTC)


@cli.command("graph")
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
    help="Only these states (repeat or comma-separate) [active,proto,decaying].",
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
    help="Write to FILE instead of standard output.",
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
    """Print the graph (or what SRC reaches) as DOT, Mermaid, GraphML or JSON: weight as pen
    width and label, protos dashed toward a wished node, decaying greyed, superseded hidden
    unless asked (--states superseded)."""
    from pathlib import Path

    from ..graph import DEFAULT_DEPTH, PICTURE_STATES, render

    if as_json and fmt not in (None, "json"):
        raise InvalidInput(f"--json and --format {fmt} disagree: give one of them")
    if depth is not None and src is None:
        raise InvalidInput("--depth needs SRC")
    chosen = [s.strip() for item in states for s in item.split(",") if s.strip()]
    now = _now() if at is None else _parse_instant(at, "--at")
    executor, version = (None, None)
    if src is not None:
        executor, version = parse_endpoint(src, "SRC", version_required=False)
    with _store(database_url, clock=lambda: now) as store:
        picture = store.graph(
            executor,
            src_version=version,
            depth=DEFAULT_DEPTH if depth is None else depth,
            states=chosen or list(PICTURE_STATES),
        )
    text = render(picture, "json" if as_json else fmt or "dot")
    if output is None:
        click.echo(text, nl=False)
    else:
        Path(output).write_text(text, encoding="utf-8")


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
        render_protos(rows[:n], _now(), as_json)


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
            _render_recent(store.recent_queries(limit=recent), as_json)
        else:
            _render_top(store.top_queries(limit=10 if top is None else top), as_json)


def _render_top(rows: Sequence[QueryFrequency], as_json: bool) -> None:
    if as_json:
        _echo_json(
            [
                {
                    "canonical_query": r.canonical_query,
                    "canonical_hash": r.canonical_hash,
                    "count": r.count,
                    "last_ts": iso_utc(r.last_ts),
                }
                for r in rows
            ]
        )
    elif not rows:
        click.echo("(no query logged)")
    else:
        table = [(r.count, _fmt_time(r.last_ts), r.canonical_query) for r in rows]
        click.echo(_table(("COUNT", "LAST", "CANONICAL QUERY"), table, {"COUNT"}))


def _render_recent(rows: Sequence[CanonicalQuery], as_json: bool) -> None:
    if as_json:
        _echo_json([{k: _jsonable(v) for k, v in r.as_dict().items()} for r in rows])
    elif not rows:
        click.echo("(no query logged)")
    else:
        table = [(r.id, _fmt_time(r.ts), r.turn_id, r.canonical_query, r.raw_query) for r in rows]
        click.echo(_table(("ID", "TS", "TURN", "CANONICAL", "RAW"), table, {"ID"}))


# --- changing state -----------------------------------------------------------------------


@cli.command()
@click.argument("mnest_id", metavar="ID")
@click.argument("version")
@json_option
@database_url_option
def promote(mnest_id: str, version: str, as_json: bool, database_url: str | None) -> None:
    """The executor a proto wished for now exists at VERSION: make the edge active."""
    with _store(database_url, recorder=Recorder.CLI.value, write=True) as store:
        m = store.promote_proto_to_active(mnest_id, version)
        _render_one(m, as_json)


@cli.command()
@click.argument("mnest_id", metavar="ID")
@click.argument("state")
@click.option("--reason", help="Why (kept in the event).")
@json_option
@database_url_option
def transition(
    mnest_id: str, state: str, reason: str | None, as_json: bool, database_url: str | None
) -> None:
    """Move a mnest to STATE (active, decaying, superseded).

    A proto becomes active only through "mnestoma promote ID VERSION".
    """
    with _store(database_url, recorder=Recorder.CLI.value, write=True) as store:
        try:
            m = store.transition_state(mnest_id, state, reason=reason)
        except InvalidTransition as err:
            raise InvalidTransition(_command_wording(str(err), mnest_id)) from None
        _render_one(m, as_json)


def _command_wording(message: str, mnest_id: str) -> str:
    """An API error message as a command-line user reads it: commands, not method names."""
    return message.replace(
        PROMOTE_HINT,
        f"once the executor exists, use 'mnestoma promote {mnest_id} VERSION'",
    )


def _render_one(m: Mnest, as_json: bool) -> None:
    now = _now()
    if as_json:
        _echo_json(mnest_record(m, now))
    else:
        render_edges([m], now, False, "")


@cli.command()
@click.option("--dry-run", is_flag=True, help="Report what would change, change nothing.")
@json_option
@database_url_option
def age(dry_run: bool, as_json: bool, database_url: str | None) -> None:
    """Run the ager now: decay, demote below 0.20, merge, prune protos below 0.05.

    On a terminal, a run that takes a while shows a spinner on stderr.
    """
    with _store(database_url) as store:
        now = _now()
        with _spinner("ageing: decay, demote, merge, prune in one transaction"):
            report = store.apply_ager(dry_run=dry_run)
        render_ager(report, now, dry_run, as_json)


def _stderr_is_terminal() -> bool:
    """True when stderr is a terminal (progress is for people, never for logs or pipes)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def _spinner(label: str) -> Iterator[None]:
    """While the block runs, a spinner and the elapsed seconds on stderr, on a terminal only.

    Nothing is drawn before ``SPINNER_DELAY_S`` (0: at once); the line is cleared at the end.
    """
    if not _stderr_is_terminal():
        yield
        return
    done = threading.Event()
    start = time.monotonic()
    frames = itertools.cycle("|/-\\")
    width = 0  # of the line drawn last, to blank it at the end

    def draw() -> None:
        nonlocal width
        line = f"{next(frames)} {label}  {time.monotonic() - start:.1f} s"
        click.echo(f"\r{line}", nl=False, err=True)
        width = max(width, len(line))

    def spin() -> None:
        if done.wait(SPINNER_DELAY_S):
            return
        while not done.is_set():
            draw()
            done.wait(SPINNER_INTERVAL_S)

    if SPINNER_DELAY_S <= 0:
        draw()
    thread = threading.Thread(target=spin, name="mnestoma-spinner", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if width:
            click.echo("\r" + " " * width + "\r", nl=False, err=True)


# --- copy ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _progress_bar(total: int) -> Iterator[Callable[[int], Any]]:
    if total <= PROGRESS_THRESHOLD:
        yield lambda n: None
        return
    with click.progressbar(length=total, label="copying rows", file=sys.stderr) as bar:
        yield bar.update


@cli.command("copy")
@click.option(
    "--from", "source", metavar="URL", callback=_url_option_callback, help="Source store."
)
@click.option(
    "--to", "target", metavar="URL", required=True, callback=_url_option_callback,
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
      id) counts once: the source's event is kept, its turn id moved
      into its reason;
    - first use the earlier, last use the later;
    - weight: the larger of the two effective weights now, decaying from
      now;
    - decay speed, tags and desired_sig: the target's (tags and
      desired_sig: the source's where the target has none);
    - every event of both kept, the source row's moved to the target
      row, and a merged event on each of the two ids naming the other.

    A mnest id held by both stores (one was copied from the other) is refused: nothing
    is copied.
    """
    from ..copying import copy_store

    report = copy_store(
        source or _url(database_url),
        target,
        append=append,
        progress=_progress_bar,
        recorder=Recorder.CLI.value,
    )
    if as_json:
        _echo_json(
            {
                "source": report.source,
                "target": report.target,
                "rows": report.rows,
                "checksums": report.checksums,
                "appended": report.appended,
                "id_offsets": report.id_offsets,
                "merged": report.merged,
                "turns_counted_once": report.turns_counted_once,
                "verified": True,
            }
        )
        return
    labels = {
        "mnests": "mnests",
        "events": "events",
        "canonical_query_log": "query-log entries",
        "ager_runs": "ager runs",
    }
    counts = ", ".join(f"{n} {labels.get(name, name)}" for name, n in report.rows.items())
    click.echo(f"copied {counts}")
    click.echo(f"  from {report.source}")
    click.echo(f"  to   {report.target}")
    if report.appended:
        click.echo(
            f"merged {report.merged} edges that both stores held "
            f"({report.turns_counted_once} turns counted once)"
        )
    click.echo("verified: row counts and content checksums match")


# --- demo ---------------------------------------------------------------------------------


class _DemoClock:
    """A clock the demo moves by hand."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


DEMO_START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def _turn_line(passings: Sequence[Passing]) -> str:
    """A turn's passings as chains: ``a@1 -> b@2 -> c@3; b@2 -> wished (wished)``."""
    chains: list[list[str]] = []
    for p in passings:
        src = _endpoint(p.src_executor, p.src_version)
        dst = _endpoint(p.dst_executor, p.dst_version) + ("" if p.dst_exists else " (wished)")
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
    from ..demo import DEMO_TURNS, run_demo_turn  # the demo's executors: only for the demo

    clock = _DemoClock(DEMO_START)
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
            f"{len(DEMO_TURNS)} turns of a made-up runtime, {_fmt_time(DEMO_START)} to "
            f"{_fmt_time(clock.now)}: its executors\n"
            "are decorated with @executor and each turn runs in `with turn(store, turn_id)`\n"
            "(mnestoma.tracing); nothing calls record_passing. What the tracer recorded, from\n"
            "the values each executor received from another:"
        )
        click.echo("\n".join(lines))
        _section("edges right after the turns")
        render_edges(store.edges(), clock.now, False, "(no edge)")
        clock.advance(days=30)
        _section(f"30 days later ({_fmt_time(clock.now)}): mnestoma age")
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
    if missing_sqlite_file(resolved) is None and current_revision(resolved) is None:
        upgrade(resolved)


@cli.command()
@database_url_option
def demo(database_url: str | None) -> None:
    """Show mnestoma at work on made-up turns (a throwaway SQLite file unless --database-url)."""
    run_demo(_url(database_url))


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of the ``mnestoma`` script and of ``python -m mnestoma``."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="mnestoma")
    raise SystemExit(0)  # pragma: no cover - cli.main always exits
