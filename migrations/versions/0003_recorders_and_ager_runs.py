"""Who recorded each event, and a log of the ager's runs.

- ``events.recorder``: ``call`` (a caller of the API), ``tracer`` (in-process tracing),
  ``otel`` (the OpenTelemetry processor), ``ager`` or ``cli``; existing rows read as ``call``;
- ``ager_runs``: one row per committed run of the ager, so that ``status`` can say from facts
  whether and when the ager runs.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)
BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
RECORDERS_SQL = "'call', 'tracer', 'otel', 'ager', 'cli'"
TURN_EDGE_WHERE = "turn_id IS NOT NULL AND kind IN ('created', 'reinforced')"
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _events_table(*, with_recorder: bool) -> sa.Table:
    """``events`` as it stands when a batch block starts: batch mode copies from it instead
    of reflecting, so CHECK constraints and partial indexes survive SQLite's table rebuild and
    the offline SQL script works."""
    extra: list[sa.SchemaItem] = []
    if with_recorder:
        extra += [
            sa.Column("recorder", sa.String(16), server_default=sa.text("'call'"), nullable=False),
            sa.CheckConstraint(f"recorder IN ({RECORDERS_SQL})", name="ck_events_recorder_known"),
        ]
    return sa.Table(
        "events",
        sa.MetaData(),
        sa.Column("id", BIGID, autoincrement=True, nullable=False),
        sa.Column("mnest_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("ts", TS, nullable=False),
        sa.Column("turn_id", sa.String(255), nullable=True),
        sa.Column("weight_before", sa.Float(), nullable=True),
        sa.Column("weight_after", sa.Float(), nullable=True),
        sa.Column("state_before", sa.String(16), nullable=True),
        sa.Column("state_after", sa.String(16), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("related_id", sa.String(64), nullable=True),
        *extra,
        sa.PrimaryKeyConstraint("id", name="pk_events"),
        sa.CheckConstraint(
            "kind IN ('created', 'reinforced', 'transition', 'promoted', 'merged', 'pruned')",
            name="ck_events_kind_known",
        ),
        sa.Index("ix_events_mnest_id", "mnest_id"),
        sa.Index("ix_events_turn_id", "turn_id"),
        sa.Index(
            "ux_events_turn_edge",
            "turn_id",
            "mnest_id",
            unique=True,
            sqlite_where=sa.text(TURN_EDGE_WHERE),
            postgresql_where=sa.text(TURN_EDGE_WHERE),
        ),
    )


def upgrade() -> None:
    with op.batch_alter_table(
        "events", naming_convention=NAMING, copy_from=_events_table(with_recorder=False)
    ) as batch:
        batch.add_column(
            sa.Column("recorder", sa.String(16), server_default=sa.text("'call'"), nullable=False)
        )
        batch.create_check_constraint(
            op.f("ck_events_recorder_known"), sa.text(f"recorder IN ({RECORDERS_SQL})")
        )
    op.create_table(
        "ager_runs",
        sa.Column("id", BIGID, autoincrement=True, nullable=False),
        sa.Column("ts", TS, nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("decayed", sa.Integer(), nullable=False),
        sa.Column("to_decaying", sa.Integer(), nullable=False),
        sa.Column("merged", sa.Integer(), nullable=False),
        sa.Column("protos_pruned", sa.Integer(), nullable=False),
        sa.Column("archive_candidates", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_ager_runs"),
        sa.CheckConstraint("duration_s >= 0", name="ck_ager_runs_duration_nonneg"),
    )
    op.create_index("ix_ager_runs_ts", "ager_runs", ["ts"])


def downgrade() -> None:
    op.drop_index("ix_ager_runs_ts", table_name="ager_runs")
    op.drop_table("ager_runs")
    with op.batch_alter_table(
        "events", naming_convention=NAMING, copy_from=_events_table(with_recorder=True)
    ) as batch:
        batch.drop_constraint(op.f("ck_events_recorder_known"), type_="check")
        batch.drop_column("recorder")
