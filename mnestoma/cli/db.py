"""``mnestoma db``: the schema's migrations (Alembic) from the command line."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import click
from alembic.script import ScriptDirectory

from mnestoma.cli.errors import MnestomaGroup
from mnestoma.cli.options import command_url, database_url_option, number_option
from mnestoma.cli.render import render_store
from mnestoma.core.errors import InvalidInput
from mnestoma.engines import redact_url, resolve_database_url
from mnestoma.maintenance.migration import (
    DEFAULT_MIGRATION_LOCK_TIMEOUT_S,
    ENV_MIGRATION_LOCK_TIMEOUT,
    alembic_config,
    current_revision,
    downgrade,
    head_revision,
    missing_sqlite_file,
    offline_sql,
    sqlite_store_missing,
    upgrade,
)

__all__ = ["db"]


def lock_timeout_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--lock-timeout SECONDS``: how long a PostgreSQL revision waits for a lock per try."""
    return number_option(
        "--lock-timeout",
        float,
        0,
        "SECONDS",
        "PostgreSQL: seconds each revision waits for a table lock before it is rolled back and "
        f"tried again (default: {ENV_MIGRATION_LOCK_TIMEOUT}, else "
        f"{DEFAULT_MIGRATION_LOCK_TIMEOUT_S:g}; 0: no limit).",
    )(f)


# Alembic's logger says "Running upgrade 0007 -> 0008, ..." as each revision begins.
_ALEMBIC_RUNS = logging.getLogger("alembic.runtime.migration")
_RUNNING = ("Running upgrade ", "Running downgrade ")


class _RevisionEcho(logging.Handler):
    """Each revision on stderr as it begins, with the seconds since the command began, so
    that a long upgrade says where it is (nothing else of Alembic's log)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.start = time.monotonic()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(_RUNNING):
            step, _, doc = message.partition(", ")  # "Running upgrade 0007 -> 0008", its doc
            line = f"{step.replace('  -> ', ' base -> ')}, {_first_sentence(doc)}"
            click.echo(f"{time.monotonic() - self.start:6.1f} s  {line}", err=True)


def _first_sentence(doc: str) -> str:
    """A revision's first sentence on one line (a docstring's first line may stop halfway
    through it), without reST's double backticks."""
    paragraph = _summary(doc)
    found = re.match(r"(.+?[.!?])(?=\s|$)", paragraph)
    return found.group(1) if found else paragraph


@contextlib.contextmanager
def revisions_on_stderr() -> Iterator[None]:
    """While the block migrates, say each revision on stderr as Alembic begins it."""
    echo = _RevisionEcho()
    level = _ALEMBIC_RUNS.level
    _ALEMBIC_RUNS.addHandler(echo)
    if _ALEMBIC_RUNS.getEffectiveLevel() > logging.INFO:
        _ALEMBIC_RUNS.setLevel(logging.INFO)
    try:
        yield
    finally:
        _ALEMBIC_RUNS.removeHandler(echo)
        _ALEMBIC_RUNS.setLevel(level)


def _head_mark(revision: str | None) -> str:
    return " (head)" if revision is not None and revision == head_revision() else ""


@click.group(cls=MnestomaGroup)
def db() -> None:
    """Schema migrations (Alembic): upgrade, downgrade, current, history, sql."""


@db.command("upgrade")
@click.argument("revision", default="head")
@database_url_option
@lock_timeout_option
def db_upgrade(revision: str, database_url: str | None, lock_timeout: float | None) -> None:
    """Migrate the database up to REVISION (default: head).

    PostgreSQL: each revision commits on its own; one that waits longer than the lock
    timeout for a table lock is rolled back and tried again, so live writers wait briefly.
    Each revision is named on stderr as it begins.
    """
    url = resolve_database_url(command_url(database_url))
    with revisions_on_stderr():
        report = upgrade(url, revision, lock_timeout=lock_timeout)
    where, after = redact_url(url), report.after
    if not report.moved:
        click.echo(f"{where}: already at revision {after}{_head_mark(after)}")
    else:
        click.echo(
            f"{where}: upgraded from {report.before or 'empty'} to {after}{_head_mark(after)}"
        )


@db.command("downgrade")
@click.argument("revision")
@database_url_option
@lock_timeout_option
def db_downgrade(revision: str, database_url: str | None, lock_timeout: float | None) -> None:
    """Migrate the database down to REVISION ("base" removes the schema); each revision is
    named on stderr as it begins."""
    url = resolve_database_url(command_url(database_url))
    missing = missing_sqlite_file(url)
    if missing is not None:
        raise InvalidInput(f"no database at {missing}")
    with revisions_on_stderr():
        report = downgrade(url, revision, lock_timeout=lock_timeout)
    where = redact_url(url)
    if not report.moved:
        at = f"revision {report.after}" if report.after else "base (no schema)"
        click.echo(f"{where}: already at {at}")
    else:
        click.echo(
            f"{where}: downgraded from {report.before} to {report.after or 'base (no schema)'}"
        )


@db.command("current")
@database_url_option
def db_current(database_url: str | None) -> None:
    """Print the database's revision, followed by (head) when it is at head.

    A database without the mnestoma schema (or a missing SQLite file, never created here)
    prints "none (...)" on stdout and exits 0, so scripts always read one line; the store
    is named on stderr.
    """
    url = resolve_database_url(command_url(database_url))
    missing = missing_sqlite_file(url)
    if missing is not None:
        click.echo(f"none (no database file at {missing}; head is {head_revision()})")
    else:
        rev = current_revision(url)
        if rev is None:
            click.echo(f"none (no mnestoma schema here; head is {head_revision()})")
        else:
            click.echo(f"{rev}{_head_mark(rev)}")
    render_store(url)


def _summary(doc: str) -> str:
    """A revision's first paragraph on one line, without reST's double backticks."""
    paragraph = doc.strip().split("\n\n")[0]
    return " ".join(paragraph.split()).replace("``", "")


@db.command("history")
@click.option("--indicate-current", is_flag=True, help="Mark the database's revision (reads it).")
@database_url_option
def db_history(indicate_current: bool, database_url: str | None) -> None:
    """List the migration scripts, newest first."""
    current, url = None, None
    if indicate_current:
        url = resolve_database_url(command_url(database_url))
        current = None if sqlite_store_missing(url) else current_revision(url)
    script = ScriptDirectory.from_config(alembic_config())
    for rev in script.walk_revisions():
        marks = []
        if rev.is_head:
            marks.append("head")
        if current is not None and rev.revision == current:
            marks.append("current")
        mark = f" ({', '.join(marks)})" if marks else ""
        down = rev.down_revision or "<base>"
        doc = _summary(rev.doc or "")
        click.echo(f"{down} -> {rev.revision}{mark}, {doc}")
    if url is not None:
        render_store(url)


@db.command("sql")
@click.option(
    "--dialect",
    type=click.Choice(["sqlite", "postgresql"]),
    default=None,
    help="Dialect of the script (default: that of the resolved database URL).",
)
@click.argument("revision_range", metavar="[RANGE]", default="head")
@database_url_option
@lock_timeout_option
def db_sql(
    dialect: str | None, revision_range: str, database_url: str | None, lock_timeout: float | None
) -> None:
    """Print the SQL a DBA reviews before migrating; nothing is run, nothing connected.

    RANGE is a target ("head", the default: the whole script from an empty database) or
    START:END. START:END with END below START ("0002:0001", "head:base", "head:-1") prints
    the downgrade script. PostgreSQL: one transaction a revision, each opened by
    SET lock_timeout.
    """
    if dialect is None:
        dialect = resolve_database_url(command_url(database_url)).get_backend_name()
    script = offline_sql(f"{dialect}://", revision_range, lock_timeout=lock_timeout)
    click.echo(script, nl=False)
