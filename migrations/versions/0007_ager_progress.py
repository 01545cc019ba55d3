"""``ager_progress``: the ager's runs that have begun and not yet completed.

The ager commits in batches. A run inserts its row here when it begins, moves it on with
each batch it commits, and deletes it in the transaction that writes its ``ager_runs`` row.
A row whose run holds no lock any more is a run that was interrupted (killed, or its
connection dropped): ``status`` says so, and the next run completes it.

A new, empty table: nothing else is locked, safe on a live database.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)
BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "ager_progress",
        sa.Column("id", BIGID, sa.Identity(), nullable=False),
        sa.Column("ts", TS, nullable=False),
        sa.Column("started", TS, nullable=False),
        sa.Column("updated", TS, nullable=False),
        sa.Column("batches", sa.BigInteger(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("end_position", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_ager_progress"),
        sa.CheckConstraint("batches >= 0", name="batches_nonneg"),
    )


def downgrade() -> None:
    op.drop_table("ager_progress")
