"""The store's identity (``mnestoma_store``) and the record of the stores whose rows it took
(``mnestoma_copied_stores``), by which ``copy --append`` refuses a source whose rows the
target already holds, whatever retention has deleted since.

``mnestoma_store`` holds one row (``id = 1``): ``store_id``, 32 random hex digits made here,
in SQL (SQLite's ``randomblob``, PostgreSQL's ``gen_random_uuid``), so that every database
this revision runs on, the script of ``mnestoma db sql`` included, gets its own.
``mnestoma_copied_stores`` holds one row per store whose rows a copy brought in: straight
from it (``via_store_id`` NULL) or through the store copied (``via_store_id``, whose own
record named it), when, and how many rows of each table that copy took.

Two new tables, one row written: nothing else is locked, safe on a live database.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-12
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)
# 32 random lowercase hex digits, made by the database.
NEW_STORE_ID = {
    "sqlite": "lower(hex(randomblob(16)))",
    "postgresql": "replace(CAST(gen_random_uuid() AS TEXT), '-', '')",
}


def upgrade() -> None:
    op.create_table(
        "mnestoma_store",
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("store_id", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_mnestoma_store"),
        sa.CheckConstraint("id = 1", name="one_row"),
        sa.CheckConstraint("length(store_id) > 0", name="store_id_given"),
    )
    new_id = NEW_STORE_ID[op.get_context().dialect.name]
    op.execute(f"INSERT INTO mnestoma_store (id, store_id) VALUES (1, {new_id})")
    op.create_table(
        "mnestoma_copied_stores",
        sa.Column("store_id", sa.Text(), nullable=False),
        sa.Column("via_store_id", sa.Text(), nullable=True),
        sa.Column("copied_at", TS, nullable=False),
        sa.Column("mnests", sa.BigInteger(), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("queries", sa.BigInteger(), nullable=False),
        sa.Column("ager_runs", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("store_id", name="pk_mnestoma_copied_stores"),
    )


def downgrade() -> None:
    op.drop_table("mnestoma_copied_stores")
    op.drop_table("mnestoma_store")
