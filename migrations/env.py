"""Alembic environment of mnestoma.

The connection comes from ``config.attributes["connection"]`` (an Engine or a Connection
handed over by ``mnestoma.upgrade`` or a test), else ``-x database_url=URL``, else the
package's own resolution (MNESTOMA_DATABASE_URL, MNESTOMA_DB_PATH, the default workspace);
an async driver's URL is migrated through the sync driver of the same database.
"""

from __future__ import annotations

import logging.config
from typing import Any

from alembic import context
from sqlalchemy import Connection, Engine

from mnestoma.config import make_engine
from mnestoma.migration import VERSION_TABLE, prepare_for_migration, sync_database_url
from mnestoma.models import VIEW_NAME, Base

config = context.config
if config.config_file_name is not None and not config.attributes.get("skip_logging"):
    logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Leave the view out of autogenerate: it is managed by hand in the revisions."""
    return not (type_ == "table" and name == VIEW_NAME)


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_object=include_object,
        compare_type=True,
        compare_server_default=False,
        render_as_batch=connection.dialect.name == "sqlite",
        # One transaction for the whole upgrade, on SQLite too (its DDL is transactional,
        # although Alembic assumes otherwise): the migration lock is held to the end.
        transactional_ddl=True,
        transaction_per_migration=False,
        version_table=VERSION_TABLE,
    )


def run_migrations_offline() -> None:
    """Write the SQL script instead of running it (``mnestoma db sql``)."""
    url = context.get_x_argument(as_dictionary=True).get("database_url") or config.get_main_option(
        "sqlalchemy.url"
    )
    context.configure(
        url=str(sync_database_url(url)),
        target_metadata=target_metadata,
        include_object=include_object,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_as_batch=False,
        version_table=VERSION_TABLE,
    )
    with context.begin_transaction():
        context.run_migrations()


def _moves_the_revision() -> bool:
    """True for upgrade, downgrade and stamp (they have a destination revision)."""
    try:
        context.get_revision_argument()
    except KeyError:
        return False
    return True


def _run(connection: Connection) -> None:
    _configure(connection)
    with context.begin_transaction():
        # Under the migration lock: a second process migrating at once waits here, then
        # reads the revision the first one wrote. A legacy stamp in alembic_version moves.
        # Commands that only read (`alembic current`, `history`) change nothing.
        if _moves_the_revision():
            prepare_for_migration(connection)
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on a live connection."""
    handed: Engine | Connection | None = config.attributes.get("connection")
    if isinstance(handed, Connection):
        _run(handed)
        return
    if isinstance(handed, Engine):
        with handed.connect() as connection:
            _run(connection)
            connection.commit()
        return
    url = context.get_x_argument(as_dictionary=True).get("database_url")
    engine = make_engine(sync_database_url(url))
    try:
        with engine.connect() as connection:
            _run(connection)
            connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
