"""Chains as the planner's context (contract §13): ``mnest_chains``, one row per pair of
consecutive links of recorded turns (``prev → src → dst`` by executor names) with the
decayed count of its passings.

A new table: nothing else is locked, rewritten or scanned, safe on a live database. The
table starts empty: turns recorded before this revision left no order of their links behind
(a turn's events keep no order within it), so chains count from the first turn recorded
after it.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-15
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)
NAME = sa.Text()


def upgrade() -> None:
    op.create_table(
        "mnest_chains",
        sa.Column("prev_executor", NAME, nullable=False),
        sa.Column("src_executor", NAME, nullable=False),
        sa.Column("dst_executor", NAME, nullable=False),
        sa.Column("decayed_uses", sa.Float(), nullable=False),
        sa.Column("uses", sa.BigInteger(), nullable=False),
        sa.Column("ts_first", TS, nullable=False),
        sa.Column("ts_last", TS, nullable=False),
        sa.PrimaryKeyConstraint(
            "prev_executor", "src_executor", "dst_executor", name="pk_mnest_chains"
        ),
        sa.CheckConstraint("decayed_uses >= 0", name="decayed_uses_nonneg"),
        sa.CheckConstraint("uses >= 1", name="uses_positive"),
        sa.CheckConstraint("ts_last >= ts_first", name="ts_order"),
    )


def downgrade() -> None:
    op.drop_table("mnest_chains")
