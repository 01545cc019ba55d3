"""What the schema tests share: how the migrated database differs from the models, and what
``create_all`` builds next to what the revisions build."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, text

import mnestoma
from mnestoma.engines import make_engine
from mnestoma.maintenance.migration import VERSION_TABLE, compared_objects
from mnestoma.schema.models import Base

T = TypeVar("T")

# An active row in the columns that ``mnests`` has had since revision 0001: raw SQL, as a
# store at an older revision holds it (the models describe head).
_OLD_MNEST = text(
    "INSERT INTO mnests (id, src_executor, src_version, dst_executor, dst_version, weight,"
    " uses, ts_first, ts_last, ts_weight, decay_lambda, state) VALUES (:id, :src,"
    " :src_version, :dst, :dst_version, :weight, :uses, :first, :last, :last, :lam, 'active')"
)


def insert_old_mnests(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` (``id``, ``dst``, ``uses``, ``first``, ``last``, ``lam``; ``src``,
    ``src_version``, ``dst_version`` and ``weight`` default to plan@1, 1 and 0.45) into a
    store at any revision; ``ts_weight`` is ``last``."""
    defaults = {"src": "plan", "src_version": "1", "dst_version": "1", "weight": 0.45}
    conn.execute(_OLD_MNEST, [defaults | row for row in rows])


def schema_diff(conn: Connection) -> list[Any]:
    """Alembic's differences between the database and the models (the view, and what one
    engine builds beside the models' tables, left aside: see ``compared_objects``)."""
    ctx = MigrationContext.configure(
        conn,
        opts={
            "version_table": VERSION_TABLE,
            "compare_type": True,
            "include_object": compared_objects(conn.dialect.name),
        },
    )
    return list(compare_metadata(ctx, Base.metadata))


def built_then_migrated(empty_url: str, read: Callable[[str], T]) -> tuple[T, T]:
    """``read`` of what ``create_all`` builds in the empty database at ``empty_url``, then,
    the tables dropped, of what the revisions build there."""
    engine = make_engine(empty_url)
    try:
        Base.metadata.create_all(engine)
        built = read(empty_url)
        Base.metadata.drop_all(engine)
    finally:
        engine.dispose()
    mnestoma.upgrade(empty_url)
    return built, read(empty_url)
