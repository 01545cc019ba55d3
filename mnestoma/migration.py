"""The migration door: run the packaged Alembic scripts, read current and head revisions."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL

from .config import make_engine, redact_url
from .errors import InvalidInput, SchemaError, translate_errors

__all__ = [
    "alembic_config",
    "current_revision",
    "downgrade",
    "ensure_at_head",
    "head_revision",
    "migrations_path",
    "offline_sql",
    "upgrade",
]


def migrations_path() -> Path:
    """Where the Alembic scripts are: inside the installed wheel, else the checkout's."""
    here = Path(__file__).resolve().parent
    packaged = here / "migrations"
    if (packaged / "env.py").is_file():
        return packaged
    checkout = here.parent / "migrations"
    if (checkout / "env.py").is_file():
        return checkout
    raise SchemaError("the migration scripts are missing from this installation")


def alembic_config(
    bind: Engine | Connection | None = None, *, stdout: io.TextIOBase | None = None
) -> Config:
    """An Alembic Config for the packaged scripts, optionally handing over a connection."""
    cfg = Config(stdout=stdout) if stdout is not None else Config()
    cfg.set_main_option("script_location", str(migrations_path()))
    cfg.attributes["skip_logging"] = True
    if bind is not None:
        cfg.attributes["connection"] = bind
    return cfg


def head_revision() -> str:
    """The revision the package's models describe."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def known_revisions() -> set[str]:
    """Every revision this package's scripts know."""
    script = ScriptDirectory.from_config(alembic_config())
    return {rev.revision for rev in script.walk_revisions()}


@contextmanager
def _engine_for(url_or_engine: str | URL | Engine | None) -> Iterator[Engine]:
    if isinstance(url_or_engine, Engine):
        yield url_or_engine
        return
    engine = make_engine(url_or_engine)
    try:
        yield engine
    finally:
        engine.dispose()


def current_revision(url_or_engine: str | URL | Engine | None = None) -> str | None:
    """The revision stamped in the database, or None for a database never migrated."""
    with _engine_for(url_or_engine) as engine, translate_errors(), engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


@contextmanager
def _revision_errors() -> Iterator[None]:
    """An unknown or unreachable revision is the caller's input error."""
    try:
        yield
    except CommandError as err:
        first_line = str(err).splitlines()[0] if str(err) else "unknown revision"
        raise InvalidInput(f"revision: {first_line}") from None


def upgrade(
    url_or_engine: str | URL | Engine | Connection | None = None, revision: str = "head"
) -> None:
    """Migrate the database up to ``revision`` with the packaged Alembic scripts.

    A Connection with an open transaction is migrated inside it (the caller commits or
    rolls back); without one, Alembic begins and commits its own.
    """
    if isinstance(url_or_engine, Connection):
        with translate_errors(), _revision_errors():
            command.upgrade(alembic_config(url_or_engine), revision)
        return
    with _engine_for(url_or_engine) as engine, translate_errors(), _revision_errors():
        command.upgrade(alembic_config(engine), revision)


def downgrade(url_or_engine: str | URL | Engine | None, revision: str) -> None:
    """Migrate the database down to ``revision``."""
    with _engine_for(url_or_engine) as engine, translate_errors(), _revision_errors():
        command.downgrade(alembic_config(engine), revision)


def offline_sql(dialect_url: str, revision_range: str = "head") -> str:
    """The SQL script a DBA reviews before applying it (Alembic's offline mode).

    A range ``START:END`` whose END is below START (``0002:0001``, ``head:base``) is a
    downgrade, and the script is the downgrade's; anything else is an upgrade script.
    """
    buf = io.StringIO()
    cfg = Config(output_buffer=buf)
    cfg.set_main_option("script_location", str(migrations_path()))
    cfg.attributes["skip_logging"] = True
    cfg.set_main_option("sqlalchemy.url", dialect_url)
    with _revision_errors():
        if _is_downgrade_range(ScriptDirectory.from_config(cfg), revision_range):
            command.downgrade(cfg, revision_range, sql=True)
        else:
            command.upgrade(cfg, revision_range, sql=True)
    return buf.getvalue()


def _is_downgrade_range(script: ScriptDirectory, revision_range: str) -> bool:
    """True for ``START:END`` where END is ``base``, ``-N`` or a strict ancestor of START."""
    start, sep, end = revision_range.partition(":")
    if not sep or not start or not end or start == "base":
        return False
    if end == "base" or end.startswith("-"):
        return True
    try:
        top = script.get_revision(start)
        bottom = script.get_revision(end)
        if top is None or bottom is None or top.revision == bottom.revision:
            return False
        below = {r.revision for r in script.walk_revisions(base="base", head=top.revision)}
    except CommandError:
        return False  # the upgrade command then reports the bad range itself
    return bottom.revision in below


def ensure_at_head(engine: Engine, *, auto_migrate: bool) -> None:
    """Check the schema is at head; migrate it when allowed (the embedded SQLite default).

    A PostgreSQL database is never migrated implicitly: behind head is an error that says
    what to run.
    """
    head = head_revision()
    current = current_revision(engine)
    if current == head:
        return
    where = redact_url(engine.url)
    if current is not None and current not in known_revisions():
        raise SchemaError(
            f"database {where} is at revision {current}, unknown to this version of mnestoma "
            "(written by a newer release?): upgrade the mnestoma package"
        )
    if auto_migrate:
        upgrade(engine)
        return
    state = "has no mnestoma schema" if current is None else f"is at revision {current}"
    raise SchemaError(
        f"database {where} {state}, behind head {head}: "
        f"run `mnestoma db upgrade --database-url URL`"
    )
