"""Alembic environment of mnestoma.

What to migrate comes from ``config.attributes["connection"]``: an Engine, a Connection, or
an object whose ``connect()`` yields a Connection (pytest-alembic's wrapper, a DBA's own).
Whatever was handed is migrated or refused (InvalidInput), never swapped for another
database. With nothing handed (``alembic`` run from a checkout), the database is ``-x
database_url=URL``, else ``sqlalchemy.url``, else MNESTOMA_DATABASE_URL, MNESTOMA_DB_PATH or
METNOS_WORKSPACE, never the default ``./.mnestoma`` of the current folder; an async driver's
URL is migrated through the sync driver of the same database.

On PostgreSQL, when this file opens the connection (from an Engine or a URL), each revision
commits in its own transaction under a ``lock_timeout`` (``config.attributes["lock_timeout"]``,
else ``-x lock_timeout=SECONDS``, else MNESTOMA_MIGRATION_LOCK_TIMEOUT, else 3 s), and one
that times out is tried again; the offline script opens each revision with ``SET
lock_timeout``. SQLite, and a connection handed over, migrate in one transaction.
"""

from __future__ import annotations

import logging.config
from typing import Any

from alembic import context
from alembic.util import CommandError
from sqlalchemy import Connection
from sqlalchemy.engine import URL

from mnestoma.core.errors import InvalidInput
from mnestoma.engines import make_engine
from mnestoma.maintenance.migration import (
    HANDED,
    VERSION_TABLE,
    checkout_database_url,
    compared_objects,
    handed_connection,
    lock_timeout_sql,
    migration_lock_timeout,
    note_left,
    prepare_for_migration,
    retry_lock_timeouts,
    revision_session,
)
from mnestoma.schema.models import Base

config = context.config
if config.config_file_name is not None and not config.attributes.get("skip_logging"):
    logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Leave out of autogenerate the view (managed by hand in the revisions) and what the
    models build on another engine only (see :func:`mnestoma.migration.compared_objects`)."""
    dialect = context.get_context().dialect.name
    return compared_objects(dialect)(obj, name, type_, reflected, compare_to)


def _configure(connection: Connection, *, per_revision: bool = False) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_object=include_object,
        compare_type=True,
        compare_server_default=False,
        render_as_batch=connection.dialect.name == "sqlite",
        # SQLite: one transaction for the whole upgrade (its DDL is transactional, although
        # Alembic assumes otherwise), holding the write lock to the end. PostgreSQL, per
        # revision: each commits on its own, under the session's migration lock.
        transactional_ddl=True,
        transaction_per_migration=per_revision,
        version_table=VERSION_TABLE,
    )


def _lock_timeout() -> float:
    """The seconds a PostgreSQL revision waits for a lock per attempt."""
    given = config.attributes.get("lock_timeout")
    if given is None:
        given = context.get_x_argument(as_dictionary=True).get("lock_timeout")
    return migration_lock_timeout(given)


def run_migrations_offline() -> None:
    """Write the SQL script instead of running it (``mnestoma db sql``)."""
    sync_url = _named_url()
    postgresql = sync_url.get_backend_name() == "postgresql"
    context.configure(
        url=str(sync_url),
        target_metadata=target_metadata,
        include_object=include_object,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_as_batch=False,
        transaction_per_migration=postgresql,
        version_table=VERSION_TABLE,
    )
    if postgresql:
        _set_lock_timeout_after_begin(lock_timeout_sql(_lock_timeout()))
    with context.begin_transaction():
        context.run_migrations()


def _set_lock_timeout_after_begin(timeout: str) -> None:
    """Offline PostgreSQL: each revision's transaction starts ``BEGIN; SET lock_timeout``,
    as the online upgrade runs it."""
    impl = context.get_context().impl
    emit_begin = impl.emit_begin

    def begin() -> None:
        emit_begin()
        impl.static_output(f"SET lock_timeout = '{timeout}'{impl.command_terminator}")

    impl.emit_begin = begin  # type: ignore[method-assign]


def _moves_the_revision() -> bool:
    """True for upgrade, downgrade and stamp (they have a destination revision)."""
    try:
        context.get_revision_argument()
    except KeyError:
        return False
    return True


def _run_per_revision(connection: Connection) -> None:
    """PostgreSQL, on a connection this file opened: every revision in its own transaction,
    the migration lock held across all of them, a revision whose lock times out retried.

    The first revision's transaction also holds what :func:`prepare_for_migration` did (a
    seed store's repair commits with 0002); a retry rolls both back and starts again from
    the revision the store is at.
    """
    timeout = _lock_timeout()
    with revision_session(connection, timeout):
        _configure(connection, per_revision=True)
        migration = context.get_context()
        callbacks = migration.on_version_apply_callbacks

        def attempt() -> None:
            migration.on_version_apply_callbacks = callbacks  # a failed try's are dropped
            prepare_for_migration(connection, config.attributes)
            context.run_migrations()
            connection.commit()  # an upgrade with nothing to do leaves prepare's reads

        retry_lock_timeouts(connection, attempt, lock_timeout=timeout)
        note_left(connection, config.attributes)  # still under the session's lock


def _run(connection: Connection) -> None:
    _configure(connection)
    with context.begin_transaction():
        # Under the migration lock: a second process migrating at once waits here, then
        # reads the revision the first one wrote. A legacy stamp in alembic_version moves.
        # Commands that only read (`alembic current`, `history`) change nothing.
        if _moves_the_revision():
            prepare_for_migration(connection, config.attributes)
        context.run_migrations()
        if _moves_the_revision():
            note_left(connection, config.attributes)


def _named_url() -> URL:
    """The database ``alembic`` names when nothing was handed; a refusal is Alembic's
    CommandError, which its command line prints as one line."""
    try:
        return checkout_database_url(
            context.get_x_argument(as_dictionary=True).get("database_url"),
            config.get_main_option("sqlalchemy.url"),
        )
    except InvalidInput as err:
        raise CommandError(str(err)) from None


def run_migrations_online() -> None:
    """Run the migrations on a live connection."""
    if HANDED in config.attributes:
        with handed_connection(config.attributes[HANDED]) as (connection, owned):
            if owned:
                _run_owned(connection)
            else:
                _run(connection)
        return
    engine = make_engine(_named_url())
    try:
        with engine.connect() as connection:
            _run_owned(connection)
    finally:
        engine.dispose()


def _run_owned(connection: Connection) -> None:
    """Migrate on a connection this file opened, and commit."""
    if connection.dialect.name == "postgresql" and _moves_the_revision():
        _run_per_revision(connection)
    else:
        _run(connection)
        connection.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
